// Optimizer offload: the optimizer step on the host, parameters and gradients on the state
// device.
#include "training/offload.h"

#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::training {

bool offloads_optimizer(const TrainConfig& cfg) { return cfg.offload == "optimizer"; }

void check_offload(const TrainConfig& cfg) {
  if (cfg.offload == "none") return;
  if (cfg.offload == "optimizer+params")
    fail(
        "[train] offload optimizer+params (parameter shards on the host under --zero 3) is not "
        "implemented yet; --offload optimizer keeps the optimizer state and step on the host");
  if (cfg.offload != "optimizer")
    fail("[train] offload must be none, optimizer or optimizer+params, got '", cfg.offload, "'");
  if (cfg.zero > 0)
    fail(
        "[train] offload optimizer runs under --zero 0: ZeRO's optimizer shards already live on "
        "the host (this run has --zero ",
        cfg.zero, ")");
  const std::optional<Device> home = resolve_state_device(cfg);
  if (!home || home->kind == DeviceKind::cpu)
    fail(
        "[train] offload optimizer moves the optimizer state from an accelerator to the host, "
        "but this run's parameters already live on the host (state-device ",
        cfg.state_device,
        ", no GPU among --devices): add a GPU or sim device to --devices and, for sim, "
        "--state-device sim:N");
}

std::optional<Device> optimizer_step_device(const TrainConfig& cfg) {
  if (offloads_optimizer(cfg)) return Device::cpu();
  return resolve_state_device(cfg);
}

void place_parameters(nn::Module& model, const TrainConfig& cfg) {
  if (!offloads_optimizer(cfg)) return;
  const Device home = *resolve_state_device(cfg);
  NoGradScope ng;
  DeviceScope on(home);
  std::vector<Tensor*> moved;
  std::vector<Tensor> copies;
  for (auto& [name, p] : model.named_parameters()) {
    if (p->array().device() == home) continue;
    Tensor c = copy(*p);
    c.node()->outs[c.index()].tag = MemoryTag::parameters;
    moved.push_back(p);
    copies.push_back(c);
  }
  if (copies.empty()) return;
  eval(copies);
  for (size_t i = 0; i < moved.size(); ++i) {
    Tensor leaf = copies[i].detach();
    leaf.requires_grad_(true);
    *moved[i] = leaf;
  }
}

}  // namespace hetrain::training
