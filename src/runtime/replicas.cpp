// Replica coherence: the valid copies of an output are its array (on the device that produced
// it) and the replicas whose source is still that array's buffer. Replicas are added by copy
// tasks while other tasks read them, hence the lock.
#include <algorithm>
#include <mutex>

#include "hetrain/base/error.h"
#include "hetrain/runtime/eval.h"
#include "runtime/internal.h"

namespace hetrain::runtime {

namespace {

std::mutex g_replica_mu;

bool replica_valid(const Replica& r, const Array& primary) {
  // An expired source locks to null: a freed buffer never matches, even at a reused address.
  return r.source.lock() == primary.buffer && r.source_offset == primary.offset;
}

/// The copy of output idx of p on device d, or nullptr (caller holds g_replica_mu). A sharded
/// leaf without data (ZeRO 3) is where its gathers will put it, the leaf's device.
const Array* valid_copy(const Node* p, int idx, Device d) {
  const Array& a = p->outs[static_cast<size_t>(idx)];
  if ((p->sharded && !a.has_data() ? p->device : a.device()) == d) return &a;
  if (p->runtime_state)
    for (const Replica& r : p->runtime_state->replicas)
      if (r.index == idx && r.array.device() == d && replica_valid(r, a)) return &r.array;
  return nullptr;
}

/// p's replicas, its runtime state made if it has none (caller holds g_replica_mu).
std::vector<Replica>& replicas_of(Node* p) {
  if (!p->runtime_state) p->runtime_state = std::make_shared<NodeState>();
  return p->runtime_state->replicas;
}

}  // namespace

bool has_valid_copy(const Node* p, int idx, Device d) {
  std::lock_guard<std::mutex> lk(g_replica_mu);
  return valid_copy(p, idx, d) != nullptr;
}

std::vector<Array> input_copies(const Node& n, Device d) {
  std::vector<Array> held;
  held.reserve(n.inputs.size());
  std::lock_guard<std::mutex> lk(g_replica_mu);
  for (const auto& t : n.inputs) {
    const Array* a = valid_copy(t.node(), t.index(), d);
    HT_ASSERT(a != nullptr);  // the scheduler inserted a copy task before this node
    held.push_back(*a);
  }
  return held;
}

void run_copy(Node* p, int idx, Device dst) {
  Array src;
  {
    std::lock_guard<std::mutex> lk(g_replica_mu);
    if (valid_copy(p, idx, dst)) return;  // already there (another eval made it)
    src = p->outs[static_cast<size_t>(idx)];
  }
  Replica r;
  r.index = idx;
  r.array = copy_to_device(src, dst);
  r.source = src.buffer;
  r.source_offset = src.offset;
  std::lock_guard<std::mutex> lk(g_replica_mu);
  // Drop stale copies of this output while here.
  std::vector<Replica>& list = replicas_of(p);
  std::erase_if(list, [&](const Replica& x) {
    return x.index == idx && !replica_valid(x, p->outs[static_cast<size_t>(idx)]);
  });
  list.push_back(std::move(r));
}

void drop_replicas(Node* p) {
  if (!p->runtime_state) return;  // never copied (the common case): no lock
  std::lock_guard<std::mutex> lk(g_replica_mu);
  p->runtime_state->replicas.clear();
}

size_t replica_count(const Node* p) {
  std::lock_guard<std::mutex> lk(g_replica_mu);
  return p->runtime_state ? p->runtime_state->replicas.size() : 0;
}

Array placeholder_copy(Node* p, int idx, Device d) {
  std::lock_guard<std::mutex> lk(g_replica_mu);
  if (const Array* a = valid_copy(p, idx, d)) return *a;
  const Array& src = p->outs[static_cast<size_t>(idx)];
  Replica r;
  r.index = idx;
  r.array = src;
  r.array.buffer =
      allocator_for(d).allocate(std::max<size_t>(src.buffer->bytes(), 1), src.buffer->tag());
  r.source = src.buffer;
  r.source_offset = src.offset;
  std::vector<Replica>& list = replicas_of(p);
  list.push_back(std::move(r));
  return list.back().array;
}

}  // namespace hetrain::runtime

namespace hetrain {

void values_changed(const Tensor& t) {
  if (t.defined() && t.node()) runtime::drop_replicas(t.node());
}

}  // namespace hetrain
