// oneDNN convolutions for f32 and bf16 (the same code, the data type a parameter; bf16 only
// where the CPU computes in bf16: AVX512-BF16 or AMX, whose kernels oneDNN picks). Each call splits
// the batch into one chunk per hetrain thread and runs a single-threaded oneDNN primitive on each
// chunk inside hetrain's pool: oneDNN's OpenMP team stays at one thread, so kernels that the
// executor runs side by side (inter-op parallelism) do not oversubscribe the cores, and the thread
// count is hetrain's num_threads(). Primitives are built once per (pass, shape, chunk) and cached.
//
// Layouts: the primitives run in the layout oneDNN picks (nChw8c / OIhw8i8o on AVX2), with
// reorders from and to the caller's NCHW arrays. That pays for kernels larger than 1x1 with at
// least 8 input and output channels (2-4.5x the im2col path on fashion-cnn's 3x3 convs); 1x1
// convolutions and thin ones (the 1-channel stem) are left to im2col, as fast or faster there
// than both the blocked kernel with its reorders and oneDNN's own NCHW (GEMM-based) kernel
// (measured with bench/bench_conv.cpp).
//
// In bf16, 1x1 convolutions without padding skip oneDNN's convolution and its reorders: on NCHW
// arrays they are products over the images, Y_n = W X_n (stride 2 first samples X), so they run
// as one batched bf16 matmul each pass (conv1x1_* below). fashion-cnn's 1x1 shortcuts moved about
// 5 MB of reorders a pass for 0.03 GFLOP.
#include "backends/cpu/conv_dnnl.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cpu/compute_buffers.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/omp_single.h"
#include "hetrain/base/cpu_features.h"
#include "hetrain/base/dtype.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain::cpu {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

enum class Pass : int64_t { forward, backward_data, backward_weights };

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

/// One primitive argument: the plain layout the caller holds, the layout the primitive wants, and
/// the reorder between them (caller -> primitive for inputs, back for outputs).
struct Operand {
  int arg;
  bool output;
  memory::desc plain, inner;
  std::optional<dnnl::reorder> convert;
};

struct Plan {
  dnnl::primitive prim;
  memory::desc scratch;
  std::vector<Operand> operands;  // in the order of the pointers passed to run()
};

Operand operand(int arg, bool output, const memory::desc& plain, const memory::desc& inner) {
  Operand op{arg, output, plain, inner, std::nullopt};
  if (plain != inner) {
    dnnl::engine& eng = cpu_engine();
    op.convert = output ? dnnl::reorder(dnnl::reorder::primitive_desc(eng, inner, eng, plain))
                        : dnnl::reorder(dnnl::reorder::primitive_desc(eng, plain, eng, inner));
  }
  return op;
}

/// In f32 Hetrain's own kernels take 1x1 convolutions and narrow ones (fewer than 8 channels in
/// or out). In bf16 oneDNN's kernels are the only 16-bit ones: the alternative converts to f32
/// and back around an f32 kernel, so oneDNN takes every shape it has a real kernel for.
bool dnnl_pays(const ConvShape& s, Dt dt) {
  return dt != Dt::f32 || (s.kh * s.kw > 1 && s.C >= 8 && s.O >= 8);
}

/// The plan for one pass over a batch of s.N images of data type dt, or null when oneDNN offers
/// only its reference kernel (the im2col path is faster than that). bf16 weight gradients are
/// written in f32 (the chunks' partial sums are added in f32 and rounded once).
std::shared_ptr<const Plan> make_plan(Pass pass, const ConvShape& s, bool bias, Dt dt) {
  using Fwd = dnnl::convolution_forward;
  using BwdData = dnnl::convolution_backward_data;
  using BwdWeights = dnnl::convolution_backward_weights;
  dnnl::engine& eng = cpu_engine();
  const memory::dims xd{s.N, s.C, s.H, s.W}, wd{s.O, s.C, s.kh, s.kw}, yd{s.N, s.O, s.Ho, s.Wo};
  const memory::desc x_plain(xd, dt, Tag::nchw), w_plain(wd, dt, Tag::oihw),
      y_plain(yd, dt, Tag::nchw), b_plain({s.O}, dt, Tag::x);
  const memory::desc x_md(xd, dt, Tag::any), w_md(wd, dt, Tag::any), y_md(yd, dt, Tag::any);
  const memory::desc dw_plain(wd, Dt::f32, Tag::oihw), dw_md(wd, Dt::f32, Tag::any);
  const memory::dims strides{s.sh, s.sw}, pad{s.ph, s.pw};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // safe to run concurrently

  const bool fwd_bias = pass == Pass::forward && bias;
  Fwd::desc fd =
      fwd_bias ? Fwd::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                           x_md, w_md, b_plain, y_md, strides, pad, pad)
               : Fwd::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                           x_md, w_md, y_md, strides, pad, pad);
  Fwd::primitive_desc fpd(fd, attr, eng);
  auto plan = std::make_shared<Plan>();
  std::string impl;
  switch (pass) {
    case Pass::forward: {
      impl = fpd.impl_info_str();
      plan->prim = Fwd(fpd);
      plan->scratch = fpd.scratchpad_desc();
      plan->operands = {operand(DNNL_ARG_SRC, false, x_plain, fpd.src_desc()),
                        operand(DNNL_ARG_WEIGHTS, false, w_plain, fpd.weights_desc())};
      if (bias) plan->operands.push_back(operand(DNNL_ARG_BIAS, false, b_plain, b_plain));
      plan->operands.push_back(operand(DNNL_ARG_DST, true, y_plain, fpd.dst_desc()));
      break;
    }
    case Pass::backward_data: {
      BwdData::primitive_desc pd(
          BwdData::desc(dnnl::algorithm::convolution_direct, x_md, w_md, y_md, strides, pad, pad),
          attr, eng, fpd);
      impl = pd.impl_info_str();
      plan->prim = BwdData(pd);
      plan->scratch = pd.scratchpad_desc();
      plan->operands = {operand(DNNL_ARG_DIFF_DST, false, y_plain, pd.diff_dst_desc()),
                        operand(DNNL_ARG_WEIGHTS, false, w_plain, pd.weights_desc()),
                        operand(DNNL_ARG_DIFF_SRC, true, x_plain, pd.diff_src_desc())};
      break;
    }
    case Pass::backward_weights: {
      BwdWeights::primitive_desc pd(BwdWeights::desc(dnnl::algorithm::convolution_direct, x_md,
                                                     dw_md, y_md, strides, pad, pad),
                                    attr, eng, fpd);
      impl = pd.impl_info_str();
      plan->prim = BwdWeights(pd);
      plan->scratch = pd.scratchpad_desc();
      plan->operands = {operand(DNNL_ARG_SRC, false, x_plain, pd.src_desc()),
                        operand(DNNL_ARG_DIFF_DST, false, y_plain, pd.diff_dst_desc()),
                        operand(DNNL_ARG_DIFF_WEIGHTS, true, dw_plain, pd.diff_weights_desc())};
      break;
    }
  }
  if (impl.rfind("ref", 0) == 0) return nullptr;
  return plan;
}

/// Cached plans; a null entry records that oneDNN has no fast kernel for the key.
std::shared_ptr<const Plan> find_plan(Pass pass, const ConvShape& s, bool bias, Dt dt) {
  using Key = std::array<int64_t, 16>;
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const Plan>> cache;
  const Key key{static_cast<int64_t>(pass),
                bias,
                s.N,
                s.C,
                s.H,
                s.W,
                s.O,
                s.Ho,
                s.Wo,
                s.kh,
                s.kw,
                s.sh,
                s.sw,
                s.ph,
                s.pw,
                static_cast<int64_t>(dt)};
  std::lock_guard<std::mutex> lk(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::shared_ptr<const Plan> plan;
  try {
    // Kernels fix their thread count when built: build them for the one thread they run on,
    // or each run starts an OpenMP team of its own beside hetrain's threads.
    SingleOmpThread one;
    plan = make_plan(pass, s, bias, dt);
  } catch (const dnnl::error&) {
    plan = nullptr;  // unimplemented for this shape: the caller falls back
  }
  cache.emplace(key, plan);
  return plan;
}

Array byte_workspace(size_t bytes) {
  return workspace({static_cast<int64_t>((bytes + 3) / 4)}, Dtype::f32);
}

/// Runs a plan on the calling thread; ptrs follow plan.operands.
void run(const Plan& plan, const std::vector<const void*>& ptrs) {
  dnnl::engine& eng = cpu_engine();
  thread_local dnnl::stream stream(cpu_engine());
  std::unordered_map<int, memory> args;
  std::vector<Array> buffers;  // keeps the reorder targets and the scratchpad alive
  std::vector<std::pair<const Operand*, memory>> outputs;
  for (size_t i = 0; i < plan.operands.size(); ++i) {
    const Operand& op = plan.operands[i];
    memory user(op.plain, eng, const_cast<void*>(ptrs[i]));
    if (!op.convert) {
      args.emplace(op.arg, user);
      continue;
    }
    buffers.push_back(byte_workspace(op.inner.get_size()));
    memory inner(op.inner, eng, buffers.back().raw());
    if (op.output)
      outputs.emplace_back(&op, user);
    else
      op.convert->execute(stream, user, inner);
    args.emplace(op.arg, inner);
  }
  if (plan.scratch.get_size() > 0) {
    buffers.push_back(byte_workspace(plan.scratch.get_size()));
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(plan.scratch, eng, buffers.back().raw()));
  }
  plan.prim.execute(stream, args);
  for (auto& [op, user] : outputs) op->convert->execute(stream, args.at(op->arg), user);
  stream.wait();
}

/// Batch chunks, one per thread, and their plans; empty when a plan is missing.
struct ChunkedPlans {
  int64_t chunks = 0, small_n = 0;
  std::shared_ptr<const Plan> small,
      large;  // for small_n and small_n + 1 images
  int64_t begin(int64_t c, int64_t n) const { return c * n / chunks; }
  const Plan& plan_for(int64_t images) const { return images == small_n ? *small : *large; }
};

std::optional<ChunkedPlans> chunked_plans(Pass pass, const ConvShape& s, bool bias, Dt dt) {
  if (s.N <= 0 || !dnnl_pays(s, dt)) return std::nullopt;
  ChunkedPlans cp;
  cp.chunks = std::min<int64_t>(s.N, num_threads());
  cp.small_n = s.N / cp.chunks;
  ConvShape part = s;
  part.N = cp.small_n;
  cp.small = find_plan(pass, part, bias, dt);
  if (!cp.small) return std::nullopt;
  if (s.N % cp.chunks != 0) {
    part.N = cp.small_n + 1;
    cp.large = find_plan(pass, part, bias, dt);
    if (!cp.large) return std::nullopt;
  }
  return cp;
}

/// fn(chunk, first image, image count) for every chunk, in parallel on hetrain's pool.
template <class F>
void for_chunks(const ChunkedPlans& cp, int64_t n, F&& fn) {
  parallel_for(cp.chunks, 1, [&](int64_t cb, int64_t ce) {
    SingleOmpThread one;
    for (int64_t c = cb; c < ce; ++c) {
      const int64_t n0 = cp.begin(c, n), n1 = cp.begin(c + 1, n);
      fn(c, n0, n1 - n0);
    }
  });
}

bool env_disabled() {
  const char* v = std::getenv("HETRAIN_CONV_DNNL");
  return v && std::strcmp(v, "0") == 0;
}
std::atomic<bool>& disabled_flag() {
  static std::atomic<bool> flag{env_disabled()};
  return flag;
}
std::atomic<int64_t> runs{0};

}  // namespace

void set_dnnl_conv_disabled(bool disabled) { disabled_flag() = disabled; }
bool dnnl_conv_disabled() { return disabled_flag(); }
int64_t dnnl_conv_runs() { return runs; }

ConvPath conv_rule_path() { return ConvPath::own; }

PathChoice& conv_choice() {
  static_assert(static_cast<int>(ConvPath::own) == 0);
  static PathChoice c("HETRAIN_CONV_PATH", {"own", "onednn"}, "own or onednn",
                      [] { return static_cast<int>(conv_rule_path()); });
  return c;
}

ConvPath conv_path() { return static_cast<ConvPath>(conv_choice().get()); }

namespace {

/// Bytes of one element of dt (f32 or bf16).
int64_t elem(Dt dt) { return dt == Dt::bf16 ? 2 : 4; }
const void* at(const void* p, int64_t elements, Dt dt) {
  return static_cast<const char*>(p) + elements * elem(dt);
}
void* at(void* p, int64_t elements, Dt dt) { return static_cast<char*>(p) + elements * elem(dt); }

/// Whether a pass over s runs as a batched matmul: bf16, a 1x1 kernel, no padding.
bool is_1x1(const ConvShape& s, Dt dt) {
  return dt == Dt::bf16 && s.kh == 1 && s.kw == 1 && s.ph == 0 && s.pw == 0 &&
         onednn_has_bf16_matmul();
}

/// The pixels a strided 1x1 convolution reads, (N, C, Ho, Wo) from (N, C, H, W).
void sample_pixels(const ConvShape& s, const BFloat16* x, BFloat16* xs) {
  parallel_for(s.N * s.C, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t i = 0; i < s.Ho; ++i) {
        const BFloat16* row = x + (p * s.H + i * s.sh) * s.W;
        BFloat16* out = xs + (p * s.Ho + i) * s.Wo;
        for (int64_t j = 0; j < s.Wo; ++j) out[j] = row[j * s.sw];
      }
  });
}

/// x (N, C, H, W) holding xs (N, C, Ho, Wo) at the sampled pixels and zero elsewhere.
void scatter_pixels(const ConvShape& s, const BFloat16* xs, BFloat16* x) {
  parallel_for(s.N * s.C, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t h = 0; h < s.H; ++h) {
        BFloat16* row = x + (p * s.H + h) * s.W;
        std::fill(row, row + s.W, BFloat16{});
        if (h % s.sh != 0 || h / s.sh >= s.Ho) continue;
        const BFloat16* in = xs + (p * s.Ho + h / s.sh) * s.Wo;
        for (int64_t j = 0; j < s.Wo; ++j) row[j * s.sw] = in[j];
      }
  });
}

bool strided(const ConvShape& s) { return s.sh != 1 || s.sw != 1; }

/// x itself at stride 1, else its sampled pixels in keep (a workspace the caller holds).
const BFloat16* unit_stride_input(const ConvShape& s, const BFloat16* x, Array& keep) {
  if (!strided(s)) return x;
  keep = workspace({s.N * s.C * s.Ho * s.Wo}, Dtype::bf16);
  sample_pixels(s, x, keep.data<BFloat16>());
  return keep.data<BFloat16>();
}

/// W (O x C) once per image: oneDNN 2.6 runs a batched matmul whose first operand is shared
/// across the batch (a batch dimension of 1) on its reference kernel, hundreds of times slower,
/// so the first operand is batched like the second (N copies of a small matrix).
Array weight_per_image(const ConvShape& s, const BFloat16* w) {
  Array ws = workspace({s.N * s.O * s.C}, Dtype::bf16);
  BFloat16* p = ws.data<BFloat16>();
  for (int64_t n = 0; n < s.N; ++n) std::copy_n(w, s.O * s.C, p + n * s.O * s.C);
  return ws;
}

/// Y_n (O x HoWo) = W (O x C) X_n (C x HoWo), rounded to bf16 once.
void conv1x1_forward(const ConvShape& s, const BFloat16* x, const BFloat16* w, BFloat16* y) {
  const int64_t hw = s.Ho * s.Wo;
  Array sampled;
  x = unit_stride_input(s, x, sampled);
  const Array ws = weight_per_image(s, w);
  batched_gemm_onednn(Dtype::bf16, Dtype::bf16, s.N, s.O, hw, s.C, 1.0f,
                      {ws.data<BFloat16>(), s.O * s.C, s.C, false}, {x, s.C * hw, hw, false}, 0.0f,
                      y, s.O * hw, hw);
}

/// dX_n (C x HoWo) = Wᵀ dY_n at the sampled pixels, zero elsewhere.
void conv1x1_backward_data(const ConvShape& s, const BFloat16* gy, const BFloat16* w,
                           BFloat16* dx) {
  const int64_t hw = s.Ho * s.Wo;
  Array sampled;
  BFloat16* out = dx;
  if (strided(s)) {
    sampled = workspace({s.N * s.C * hw}, Dtype::bf16);
    out = sampled.data<BFloat16>();
  }
  const Array ws = weight_per_image(s, w);
  batched_gemm_onednn(Dtype::bf16, Dtype::bf16, s.N, s.C, hw, s.O, 1.0f,
                      {ws.data<BFloat16>(), s.O * s.C, s.C, true}, {gy, s.O * hw, hw, false}, 0.0f,
                      out, s.C * hw, hw);
  if (strided(s)) scatter_pixels(s, out, dx);
}

/// dW (O x C, f32) = sum over n of dY_n X_nᵀ: the images' products in f32, added in image order.
void conv1x1_backward_weights(const ConvShape& s, const BFloat16* x, const BFloat16* gy,
                              float* dw) {
  const int64_t hw = s.Ho * s.Wo, wsize = s.O * s.C;
  Array sampled;
  x = unit_stride_input(s, x, sampled);
  Array partial = workspace({s.N * wsize}, Dtype::f32);
  const float* p = partial.data<float>();
  batched_gemm_onednn(Dtype::bf16, Dtype::f32, s.N, s.O, s.C, hw, 1.0f, {gy, s.O * hw, hw, false},
                      {x, s.C * hw, hw, true}, 0.0f, partial.data<float>(), wsize, s.C);
  parallel_for(wsize, 256, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float acc = p[i];
      for (int64_t n = 1; n < s.N; ++n) acc += p[n * wsize + i];
      dw[i] = acc;
    }
  });
}

bool forward(const ConvShape& s, const void* x, const void* w, const void* b, void* y, Dt dt) {
  if (dnnl_conv_disabled()) return false;
  if (!b && s.N > 0 && is_1x1(s, dt)) {
    conv1x1_forward(s, static_cast<const BFloat16*>(x), static_cast<const BFloat16*>(w),
                    static_cast<BFloat16*>(y));
    ++runs;
    return true;
  }
  auto cp = chunked_plans(Pass::forward, s, b != nullptr, dt);
  if (!cp) return false;
  for_chunks(*cp, s.N, [&](int64_t, int64_t n0, int64_t n) {
    std::vector<const void*> ptrs{at(x, n0 * s.C * s.H * s.W, dt), w};
    if (b) ptrs.push_back(b);
    ptrs.push_back(at(y, n0 * s.O * s.Ho * s.Wo, dt));
    run(cp->plan_for(n), ptrs);
  });
  ++runs;
  return true;
}

bool backward_data(const ConvShape& s, const void* gy, const void* w, void* dx, Dt dt) {
  if (dnnl_conv_disabled()) return false;
  if (s.N > 0 && is_1x1(s, dt)) {
    conv1x1_backward_data(s, static_cast<const BFloat16*>(gy), static_cast<const BFloat16*>(w),
                          static_cast<BFloat16*>(dx));
    ++runs;
    return true;
  }
  auto cp = chunked_plans(Pass::backward_data, s, false, dt);
  if (!cp) return false;
  for_chunks(*cp, s.N, [&](int64_t, int64_t n0, int64_t n) {
    run(cp->plan_for(n), {at(gy, n0 * s.O * s.Ho * s.Wo, dt), w, at(dx, n0 * s.C * s.H * s.W, dt)});
  });
  ++runs;
  return true;
}

/// dw in f32 whatever dt: chunk 0 writes it, the others write partial sums, added in chunk order
/// (deterministic for a given thread count).
bool backward_weights(const ConvShape& s, const void* x, const void* gy, float* dw, Dt dt) {
  if (dnnl_conv_disabled()) return false;
  if (s.N > 0 && is_1x1(s, dt)) {
    conv1x1_backward_weights(s, static_cast<const BFloat16*>(x), static_cast<const BFloat16*>(gy),
                             dw);
    ++runs;
    return true;
  }
  auto cp = chunked_plans(Pass::backward_weights, s, false, dt);
  if (!cp) return false;
  const int64_t wsize = s.O * s.C * s.kh * s.kw;
  Array partial;
  if (cp->chunks > 1) partial = workspace({cp->chunks - 1, wsize}, Dtype::f32);
  for_chunks(*cp, s.N, [&](int64_t c, int64_t n0, int64_t n) {
    float* out = c == 0 ? dw : partial.data<float>() + (c - 1) * wsize;
    run(cp->plan_for(n),
        {at(x, n0 * s.C * s.H * s.W, dt), at(gy, n0 * s.O * s.Ho * s.Wo, dt), out});
  });
  for (int64_t c = 1; c < cp->chunks; ++c) {
    const float* p = partial.data<float>() + (c - 1) * wsize;
    for (int64_t i = 0; i < wsize; ++i) dw[i] += p[i];
  }
  ++runs;
  return true;
}

}  // namespace

bool dnnl_conv_forward(const ConvShape& s, const float* x, const float* w, const float* b,
                       float* y) {
  return forward(s, x, w, b, y, Dt::f32);
}
bool dnnl_conv_backward_data(const ConvShape& s, const float* gy, const float* w, float* dx) {
  return backward_data(s, gy, w, dx, Dt::f32);
}
bool dnnl_conv_backward_weights(const ConvShape& s, const float* x, const float* gy, float* dw) {
  return backward_weights(s, x, gy, dw, Dt::f32);
}

bool dnnl_bf16_conv() {
  const CpuFeatures& f = cpu_features();
  return (f.avx512bf16 || f.amx_bf16) && bf16_gemm_path() == Bf16GemmPath::onednn;
}
bool dnnl_conv_forward(const ConvShape& s, const BFloat16* x, const BFloat16* w, const BFloat16* b,
                       BFloat16* y) {
  return dnnl_bf16_conv() && forward(s, x, w, b, y, Dt::bf16);
}
bool dnnl_conv_backward_data(const ConvShape& s, const BFloat16* gy, const BFloat16* w,
                             BFloat16* dx) {
  return dnnl_bf16_conv() && backward_data(s, gy, w, dx, Dt::bf16);
}
bool dnnl_conv_backward_weights(const ConvShape& s, const BFloat16* x, const BFloat16* gy,
                                float* dw) {
  return dnnl_bf16_conv() && backward_weights(s, x, gy, dw, Dt::bf16);
}

}  // namespace hetrain::cpu
