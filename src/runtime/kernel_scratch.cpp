// Kernels' scratch memory for the memory model: the kernel itself, run once per kind of node
// on a private allocator, says what it takes (no second account of each kernel's sizes).
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <typeinfo>

#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/primitive.h"
#include "runtime/internal.h"

namespace hetrain::runtime {

namespace {

void describe(std::ostringstream& k, const Array& a) {
  k << '[' << dtype_name(a.dtype) << ':';
  for (int64_t d : a.shape) k << d << ',';
  if (a.has_data()) {
    k << " s";
    for (int64_t s : a.strides) k << s << ',';
  }
  k << ']';
}

/// The kind of node: what the kernel's sizes may depend on. An unevaluated view input is
/// described by its own kind (its layout follows from it).
void describe(std::ostringstream& k, const Node& n) {
  const Primitive& prim = *n.prim;
  k << typeid(prim).name() << ' ' << prim.name() << '{' << prim.attrs() << "}(";
  for (const Tensor& t : n.inputs) {
    const Node& p = *t.node();
    const Array& a = p.outs[static_cast<size_t>(t.index())];
    describe(k, a);
    if (!a.has_data() && p.prim && p.prim->is_view()) {
      k << '<' << t.index() << ':';
      describe(k, p);
      k << '>';
    }
  }
  k << ")->";
  for (const Array& a : n.outs) describe(k, a);
}

/// An input for the probe: evaluated data as it is; a view of an unevaluated node, the view's
/// kernel over its own probe inputs; anything else zeros of its shape.
Array probe_input(const Tensor& t) {
  const Node& n = *t.node();
  const Array& meta = n.outs[static_cast<size_t>(t.index())];
  if (meta.has_data()) return meta;
  std::vector<Array> outs(n.outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    outs[i].shape = n.outs[i].shape;
    outs[i].dtype = n.outs[i].dtype;
    outs[i].tag = n.outs[i].tag;
  }
  auto& out = outs[static_cast<size_t>(t.index())];
  if (n.prim && n.prim->is_view() && !n.inputs.empty()) {
    std::vector<Array> in;
    for (const Tensor& i : n.inputs) in.push_back(probe_input(i));
    std::vector<const Array*> ip;
    for (const Array& a : in) ip.push_back(&a);
    std::vector<Array*> op;
    for (Array& a : outs) op.push_back(&a);
    n.prim->eval_cpu(ip, op);
    return out;
  }
  out.allocate();
  std::memset(out.raw(), 0, out.nbytes());
  return out;
}

KernelScratch probe(const Node& n, HostAllocator& alloc) {
  AllocationDeviceScope scope(alloc);
  SerialScope serial;  // the kernel's parallel loops on this thread, so on this allocator
  std::vector<Array> in;
  for (const Tensor& t : n.inputs) in.push_back(probe_input(t));
  std::vector<const Array*> ip;
  for (const Array& a : in) ip.push_back(&a);
  std::vector<Array> outs(n.outs.size());
  std::vector<Array*> op;
  for (size_t i = 0; i < outs.size(); ++i) {
    outs[i].shape = n.outs[i].shape;
    outs[i].dtype = n.outs[i].dtype;
    outs[i].tag = n.outs[i].tag;
    op.push_back(&outs[i]);
  }
  const MemoryStats before = alloc.stats();
  alloc.reset_peak();
  try {
    n.prim->eval_cpu(ip, op);
  } catch (const std::exception&) {
    return {};
  }
  const MemoryStats after = alloc.stats();
  constexpr auto ws = static_cast<size_t>(MemoryTag::workspace);
  return {after.peak_total - before.current_total, after.peak[ws] - before.current[ws]};
}

}  // namespace

KernelScratch kernel_scratch(const Node& n) {
  if (!n.prim || n.prim->is_view() || n.device.kind == DeviceKind::cuda) return {};
  std::ostringstream k;
  describe(k, n);
  k << " threads " << num_threads();
  static std::mutex mu;
  static auto* known = new std::map<std::string, KernelScratch>();  // never destroyed
  static auto* alloc = new HostAllocator();
  std::lock_guard<std::mutex> lk(mu);
  auto [it, fresh] = known->try_emplace(k.str());
  if (fresh) it->second = probe(n, *alloc);
  return it->second;
}

}  // namespace hetrain::runtime
