// Offload: the optimizer step on the host, parameters (or under ZeRO 3 only the gathered ones)
// and gradients on the state device.
#include "training/offload.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::training {

bool offloads_optimizer(const TrainConfig& cfg) { return cfg.offload != "none"; }

void check_offload(const TrainConfig& cfg) {
  if (cfg.offload == "none") return;
  if (cfg.offload != "optimizer" && cfg.offload != "optimizer+params")
    fail("[train] offload must be none, optimizer or optimizer+params, got '", cfg.offload, "'");
  if (cfg.offload == "optimizer+params" && cfg.zero != 3)
    fail(
        "[train] offload optimizer+params keeps ZeRO stage 3's parameter shards on the host, but "
        "this run has --zero ",
        cfg.zero,
        ", where every rank holds the whole parameters for its forward and backward: use "
        "--zero 3, or --offload optimizer");
  const std::optional<Device> home = resolve_state_device(cfg);
  if (!home || home->kind == DeviceKind::cpu)
    fail("[train] offload ", cfg.offload,
         " moves model state from an accelerator to the host, but this run's parameters already "
         "live on the host (state-device ",
         cfg.state_device, cfg.zero > 0 ? ", which under --zero is the host unless named" : "",
         ", no GPU among --devices): add a GPU or sim device to --devices and, for sim or under "
         "--zero, --state-device sim:N");
}

bool streams_updates(const TrainConfig& cfg, bool grad_scaler) {
  if (!offloads_optimizer(cfg) || cfg.clip > 0 || grad_scaler) return false;
  const char* e = std::getenv("HETRAIN_OFFLOAD_STREAM");
  const std::string v = e ? e : "";
  if (v.empty() || v == "on") return true;
  if (v == "off") return false;
  fail("[train] HETRAIN_OFFLOAD_STREAM must be on or off, got '", v, "'");
}

std::optional<Device> optimizer_step_device(const TrainConfig& cfg) {
  if (offloads_optimizer(cfg)) return Device::cpu();
  return resolve_state_device(cfg);
}

Device flat_buffer_home(const TrainConfig& cfg) {
  return resolve_state_device(cfg).value_or(Device::cpu());
}

distributed::StateHomes state_homes(const TrainConfig& cfg) {
  const Device home = flat_buffer_home(cfg);
  return {.parameters = cfg.offload == "optimizer+params" ? Device::cpu() : home,
          .optimizer = offloads_optimizer(cfg) ? Device::cpu() : home,
          .gathered = home};
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
