#include "hetrain/insight/profiler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "hetrain/base/error.h"
#include "hetrain/graph/primitive.h"

namespace hetrain::insight {

using nlohmann::json;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::atomic<uint64_t> g_sessions{0};
std::atomic<bool> g_active{false};

// Each thread's worker number, valid for one profiling session.
struct WorkerSlot {
  uint64_t session = 0;
  int index = 0;
};
thread_local WorkerSlot t_worker;

}  // namespace

std::string meta_str(const TensorMeta& m) {
  std::string s(dtype_name(m.dtype));
  s += '[';
  for (size_t i = 0; i < m.shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(m.shape[i]);
  }
  s += ']';
  return s;
}

Profiler::~Profiler() { stop(); }

void Profiler::start() {
  if (running_) return;
  bool expected = false;
  if (!g_active.compare_exchange_strong(expected, true))
    fail("[profiler] another profiler is already running");
  session_ = ++g_sessions;
  next_worker_ = 0;
  worker_index();  // the caller is worker 0
  running_ = true;
  host_allocator().set_observer(this);
  add_node_observer(this);
}

void Profiler::stop() {
  if (!running_) return;
  remove_node_observer(this);
  host_allocator().set_observer(nullptr);
  running_ = false;
  g_active = false;
}

void Profiler::clear() {
  std::lock_guard<std::mutex> lk(mu_);
  nodes_.clear();
  steps_.clear();
  memory_.clear();
  current_step_ = -1;
}

int Profiler::worker_index() {
  if (t_worker.session != session_) t_worker = {session_, next_worker_++};
  return t_worker.index;
}

void Profiler::begin_step(int64_t index) {
  std::lock_guard<std::mutex> lk(mu_);
  if (current_step_ >= 0) fail("[profiler] begin_step(", index, ") inside an open step");
  steps_.push_back({index, now_ns(), 0, std::numeric_limits<double>::quiet_NaN()});
  current_step_ = static_cast<int64_t>(steps_.size()) - 1;
}

void Profiler::end_step(double loss) {
  std::lock_guard<std::mutex> lk(mu_);
  if (current_step_ < 0) fail("[profiler] end_step() without begin_step()");
  StepSpan& s = steps_[static_cast<size_t>(current_step_)];
  s.end_ns = now_ns();
  s.loss = loss;
  current_step_ = -1;
}

void Profiler::on_node(const Node& node, int64_t start_ns, int64_t end_ns) {
  if (!node.prim) return;
  NodeEvent e;
  e.primitive = node.prim->name();
  e.device = node.device;
  e.start_ns = start_ns;
  e.end_ns = end_ns;
  std::vector<TensorMeta> in, out;
  in.reserve(node.inputs.size());
  out.reserve(node.outs.size());
  for (const auto& t : node.inputs) in.push_back({t.shape(), t.dtype()});
  for (const auto& o : node.outs) out.push_back({o.shape, o.dtype});
  const Cost c = node.prim->cost(in, out);
  e.flops = c.flops;
  e.bytes_read = c.bytes_read;
  e.bytes_written = c.bytes_written;
  if (!out.empty()) e.dtype = out[0].dtype;
  e.compute_dtype = e.dtype;
  const auto floating =
      std::find_if(in.begin(), in.end(), [](const TensorMeta& m) { return is_floating(m.dtype); });
  if (floating != in.end()) e.compute_dtype = floating->dtype;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i) e.shapes += ' ';
    e.shapes += meta_str(in[i]);
  }
  e.shapes += in.empty() ? "-> " : " -> ";
  for (size_t i = 0; i < out.size(); ++i) {
    if (i) e.shapes += ' ';
    e.shapes += meta_str(out[i]);
  }
  e.worker = worker_index();
  std::lock_guard<std::mutex> lk(mu_);
  e.step = current_step_;
  nodes_.push_back(std::move(e));
}

void Profiler::on_memory(MemoryTag, int64_t, const MemoryStats& stats) {
  MemorySample m;
  m.t_ns = now_ns();
  m.bytes = stats.current;
  m.total = stats.current_total;
  std::lock_guard<std::mutex> lk(mu_);
  memory_.push_back(m);
}

std::string PrimitiveSummary::label() const {
  return dtype == Dtype::f32 ? name : name + " " + std::string(dtype_name(dtype));
}

std::vector<PrimitiveSummary> summarize(const std::vector<NodeEvent>& nodes) {
  std::map<std::pair<std::string, Dtype>, PrimitiveSummary> by;
  for (const auto& e : nodes) {
    PrimitiveSummary& s = by[{e.primitive, e.compute_dtype}];
    s.name = e.primitive;
    s.dtype = e.compute_dtype;
    ++s.calls;
    s.total_s += e.seconds();
    s.flops += e.flops;
    s.bytes_read += e.bytes_read;
    s.bytes_written += e.bytes_written;
  }
  std::vector<PrimitiveSummary> v;
  v.reserve(by.size());
  for (auto& [k, s] : by) v.push_back(std::move(s));
  std::stable_sort(v.begin(), v.end(), [](const PrimitiveSummary& a, const PrimitiveSummary& b) {
    return a.total_s > b.total_s;
  });
  return v;
}

std::vector<PrimitiveSummary> Profiler::summary() const {
  if (steps_.empty()) return summarize(nodes_);
  std::vector<NodeEvent> in_steps;
  in_steps.reserve(nodes_.size());
  for (const auto& e : nodes_)
    if (e.step >= 0) in_steps.push_back(e);
  return summarize(in_steps);
}

double Profiler::step_seconds() const {
  double s = 0;
  for (const auto& st : steps_)
    if (st.end_ns > st.start_ns) s += st.seconds();
  return s;
}

json Profiler::chrome_trace() const {
  // Times in microseconds from the first recorded instant.
  int64_t t0 = std::numeric_limits<int64_t>::max();
  for (const auto& s : steps_) t0 = std::min(t0, s.start_ns);
  for (const auto& e : nodes_) t0 = std::min(t0, e.start_ns);
  for (const auto& m : memory_) t0 = std::min(t0, m.t_ns);
  if (t0 == std::numeric_limits<int64_t>::max()) t0 = 0;
  auto us = [t0](int64_t ns) { return 1e-3 * static_cast<double>(ns - t0); };
  constexpr int kPid = 1;

  json ev = json::array();
  ev.push_back(
      {{"ph", "M"}, {"pid", kPid}, {"name", "process_name"}, {"args", {{"name", "hetrain"}}}});
  const int nworkers = std::max(1, workers());
  for (int w = 0; w < nworkers; ++w)
    ev.push_back(
        {{"ph", "M"},
         {"pid", kPid},
         {"tid", w},
         {"name", "thread_name"},
         {"args",
          {{"name", w == 0 ? std::string("worker 0 (main)") : "worker " + std::to_string(w)}}}});
  // A step appears on each worker track that ran nodes in it, so every node event nests
  // inside a step event on its own track.
  std::vector<std::vector<bool>> step_on(steps_.size(), std::vector<bool>(nworkers, false));
  for (const auto& e : nodes_)
    if (e.step >= 0 && e.worker < nworkers)
      step_on[static_cast<size_t>(e.step)][static_cast<size_t>(e.worker)] = true;
  for (size_t i = 0; i < steps_.size(); ++i) {
    const StepSpan& s = steps_[i];
    if (s.end_ns <= s.start_ns) continue;
    step_on[i][0] = true;
    for (int w = 0; w < nworkers; ++w) {
      if (!step_on[i][static_cast<size_t>(w)]) continue;
      json args = {{"step", s.index}};
      if (std::isfinite(s.loss)) args["loss"] = s.loss;
      ev.push_back({{"ph", "X"},
                    {"cat", "step"},
                    {"name", "step " + std::to_string(s.index)},
                    {"pid", kPid},
                    {"tid", w},
                    {"ts", us(s.start_ns)},
                    {"dur", us(s.end_ns) - us(s.start_ns)},
                    {"args", args}});
    }
  }
  for (const auto& e : nodes_) {
    // A node shorter than the clock's resolution still gets a visible, positive duration.
    const double dur = std::max(1e-3, us(e.end_ns) - us(e.start_ns));
    ev.push_back({{"ph", "X"},
                  {"cat", "node"},
                  {"name", e.primitive},
                  {"pid", kPid},
                  {"tid", e.worker},
                  {"ts", us(e.start_ns)},
                  {"dur", dur},
                  {"args",
                   {{"device", e.device.str()},
                    {"flops", e.flops},
                    {"bytes_read", e.bytes_read},
                    {"bytes_written", e.bytes_written},
                    {"dtype", std::string(dtype_name(e.dtype))},
                    {"compute_dtype", std::string(dtype_name(e.compute_dtype))},
                    {"shapes", e.shapes},
                    {"step", e.step >= 0 ? steps_[static_cast<size_t>(e.step)].index : -1}}}});
  }
  for (const auto& m : memory_) {
    json args = json::object();
    for (int t = 0; t < kNumMemoryTags; ++t)
      args[std::string(memory_tag_name(static_cast<MemoryTag>(t)))] =
          static_cast<double>(m.bytes[static_cast<size_t>(t)]) / (1024.0 * 1024.0);
    ev.push_back({{"ph", "C"},
                  {"name", "host memory (MiB)"},
                  {"pid", kPid},
                  {"ts", us(m.t_ns)},
                  {"args", args}});
  }
  return {{"traceEvents", ev}, {"displayTimeUnit", "ms"}};
}

}  // namespace hetrain::insight
