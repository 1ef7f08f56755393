// The task graph of one eval: the order its nodes run in, what placement sees of each node,
// and the dependencies between nodes and the copies a placed run inserts.
#include <unordered_map>

#include "hetrain/base/error.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/runtime/perf_model.h"
#include "runtime/internal.h"

namespace hetrain::runtime {

void OrderIndex::assign(const std::vector<Node*>& order) {
  pos_.clear();
  pos_.reserve(order.size());
  for (size_t i = 0; i < order.size(); ++i) pos_.emplace(order[i], static_cast<int>(i));
}

void collect_order(const std::vector<Tensor>& targets, OrderIndex& index, std::vector<Node*>& order,
                   std::vector<std::pair<Node*, size_t>>& stack, bool* any_pinned) {
  index.clear();
  for (const auto& t : targets) {
    Node* n = t.node();
    if (!n || n->evaluated() || !index.visit(n)) continue;
    stack.emplace_back(n, 0);
    while (!stack.empty()) {
      auto& [cur, i] = stack.back();
      if (i < cur->inputs.size()) {
        Node* in = cur->inputs[i++].node();
        if (!in->evaluated() && index.visit(in)) {
          if (!in->prim)
            fail("[eval] a tensor has neither data nor a producer (was it moved from?)");
          stack.emplace_back(in, 0);
        }
      } else {
        *any_pinned |= cur->pinned;
        order.push_back(cur);
        stack.pop_back();
      }
    }
  }
}

std::pair<uint64_t, double> node_footprint(const Node* n) {
  std::vector<std::vector<int64_t>> shapes;
  double bytes = 0;
  for (const auto& t : n->inputs) {
    shapes.push_back(t.shape());
    bytes += static_cast<double>(numel(t.shape()) * static_cast<int64_t>(dtype_size(t.dtype())));
  }
  for (const auto& o : n->outs) {
    shapes.push_back(o.shape);
    shapes.back().push_back(static_cast<int64_t>(o.dtype) + 1000);
    bytes += static_cast<double>(o.nbytes());
  }
  return {shape_footprint(shapes), bytes};
}

namespace {
/// A node reading a ZeRO-3 parameter (Node::sharded: its data exists only once gathered, in
/// the memory node of the leaf's device) runs where the gather puts it: a copy task could not
/// run before the gather. Throws for a node pinned elsewhere.
int sharded_reader_pin(const Node& reader, const Node& leaf) {
  const int home = device_index(leaf.device);
  if (home < 0)
    fail("[", reader.prim->name(), "] reads a sharded parameter gathered on ", leaf.device.str(),
         ", which is not among the configured devices (", configured_devices(), ")");
  if (reader.pinned && reader.device != leaf.device)
    fail("[", reader.prim->name(), "] is pinned to ", reader.device.str(),
         " but reads a sharded parameter gathered on ", leaf.device.str(),
         " (the --state-device under ZeRO 3); pin it there or drop the pin");
  return home;
}
}  // namespace

uint32_t present_mask(const Node* p, int idx, const std::vector<DeviceModel>& devs) {
  uint32_t m = 0;
  for (size_t d = 0; d < devs.size(); ++d)
    if (has_valid_copy(p, idx, devs[d].device)) m |= 1u << d;
  return m;
}

std::vector<TaskNode> task_graph(const std::vector<Node*>& order, const OrderIndex& index,
                                 const std::vector<DeviceModel>& devs) {
  const size_t n = order.size();
  std::vector<TaskNode> g(n);
  std::unordered_map<const Node*, int> ext_ids;
  std::vector<TensorMeta> in_meta, out_meta;
  for (size_t i = 0; i < n; ++i) {
    const Node* nd = order[i];
    TaskNode& tn = g[i];
    in_meta.clear();
    out_meta.clear();
    for (const Tensor& t : nd->inputs) in_meta.push_back({t.shape(), t.dtype()});
    for (const Array& o : nd->outs) out_meta.push_back({o.shape, o.dtype});
    tn.name = nd->prim->name();
    tn.dtype = nd->outs[0].dtype;
    tn.view = nd->prim->is_view();
    if (!tn.view) {
      const Cost c = nd->prim->cost(in_meta, out_meta);
      tn.flops = c.flops;
      tn.bytes = c.bytes_read + c.bytes_written;
      const auto [fp, size] = node_footprint(nd);
      tn.footprint = fp;
      tn.size = size;
    }
    tn.pin = nd->pinned ? device_index(nd->device) : -1;
    // Devices without a kernel for this primitive (a CUDA device, for most ops without an
    // eval_cuda) are never chosen for it.
    for (size_t d = 0; d < devs.size(); ++d)
      if (!nd->prim->has_kernel(devs[d].device.kind)) tn.forbid |= 1u << d;
    for (const Tensor& t : nd->inputs) {
      const Node* p = t.node();
      if (p->sharded) tn.pin = sharded_reader_pin(*nd, *p);
      TaskInput in;
      in.index = t.index();
      in.bytes = static_cast<double>(p->outs[static_cast<size_t>(t.index())].nbytes());
      if (const int at = index.of(p); at >= 0) {
        in.producer = at;
      } else {
        in.present = present_mask(p, t.index(), devs);
        auto [it, fresh] = ext_ids.emplace(p, static_cast<int>(ext_ids.size()));
        in.external = it->second * 64 + t.index();
      }
      tn.inputs.push_back(in);
    }
  }
  return g;
}

void build_tasks(const std::vector<Node*>& order, const OrderIndex& index,
                 const std::vector<int>* device, TaskDeps& deps) {
  const size_t n = order.size();
  std::vector<int>& edges = deps.edges;
  edges.clear();
  deps.copies.clear();
  auto edge = [&](int from, int to) {
    edges.push_back(from);
    edges.push_back(to);
  };
  if (!device) {
    for (size_t i = 0; i < n; ++i)
      for (const auto& t : order[i]->inputs)
        if (const int p = index.of(t.node()); p >= 0) edge(p, static_cast<int>(i));
  } else {
    const std::vector<int>& dev = *device;
    const auto& devs = config().devices;
    // One copy task per (data, destination): consumers on the same device share it.
    std::unordered_map<uint64_t, int> copy_of;
    auto copy_task = [&](Node* p, int idx, int d, bool& fresh) {
      const uint64_t key = mix(mix(reinterpret_cast<uintptr_t>(p), static_cast<uint64_t>(idx)),
                               static_cast<uint64_t>(d));
      auto [it, ins] = copy_of.emplace(key, static_cast<int>(n + deps.copies.size()));
      fresh = ins;
      if (ins) deps.copies.push_back({p, idx, d});
      return it->second;
    };
    for (size_t i = 0; i < n; ++i) {
      const int d = dev[i];
      const Device target = devs[static_cast<size_t>(d)].device;
      for (const auto& t : order[i]->inputs) {
        Node* in = t.node();
        bool fresh = false;
        if (const int p = index.of(in); p >= 0) {
          if (dev[static_cast<size_t>(p)] == d) {
            edge(p, static_cast<int>(i));
            continue;
          }
          const int c = copy_task(in, t.index(), d, fresh);
          if (fresh) edge(p, c);  // prefetch: the copy runs as soon as its producer is done
          edge(c, static_cast<int>(i));
        } else if (!has_valid_copy(in, t.index(), target)) {
          edge(copy_task(in, t.index(), d, fresh), static_cast<int>(i));
        }
      }
    }
    count_copy_tasks(static_cast<int64_t>(deps.copies.size()));
  }
  const size_t total = n + deps.copies.size();
  deps.total = total;
  std::vector<int>& pending = deps.pending;
  std::vector<int>& cbegin = deps.consumer_begin;
  pending.assign(total, 0);
  cbegin.assign(total + 1, 0);
  for (size_t e = 0; e < edges.size(); e += 2) {
    ++cbegin[static_cast<size_t>(edges[e]) + 1];
    ++pending[static_cast<size_t>(edges[e + 1])];
  }
  for (size_t i = 0; i < total; ++i) cbegin[i + 1] += cbegin[i];
  deps.consumer_list.resize(edges.size() / 2);
  // Fill in order: each consumer list keeps its consumers in graph order.
  deps.cursor.assign(cbegin.begin(), cbegin.end() - 1);
  for (size_t e = 0; e < edges.size(); e += 2)
    deps.consumer_list[static_cast<size_t>(deps.cursor[static_cast<size_t>(edges[e])]++)] =
        edges[e + 1];
}

}  // namespace hetrain::runtime
