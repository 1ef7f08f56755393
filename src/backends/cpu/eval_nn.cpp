// CPU kernels for softmax/log_softmax, layer_norm/rms_norm (forward and backward) and the
// fused cross-entropy. Rows are split over the thread pool; storage types (f16, bf16) are
// loaded into f32 and every sum accumulates in f32 (f64 for f64).

// GCC does not if-convert float compares under the default -ftrapping-math, which keeps the
// clamps in cpu::vexp and the NaN-aware max loops scalar. Nothing here reads FP exception
// flags, so this file opts out (measured: softmax 4096x4096 f32 355 ms -> 125 ms).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <cmath>
#include <vector>

#include "backends/cpu/isa.h"
#include "backends/cpu/vec_math.h"
#include "graph/prims/elementwise.h"
#include "graph/prims/nn.h"
#include "hetrain/base/dispatch.h"
#include "hetrain/base/thread_pool.h"

namespace hetrain {

using cpu::row_grain;
using cpu::row_max;
using cpu::row_sum;
using cpu::vexp;

namespace {

constexpr int64_t kColBlock = 64;

// ---- softmax ------------------------------------------------------------------------------

/// Softmax (or log-softmax) of rows [b, e), each n long; t is n compute values of scratch where
/// T is a storage type (f16, bf16).
template <class T>
struct SoftmaxRows {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* x, T* y, int64_t n, int64_t b, int64_t e,
                                                bool log, compute_t<T>* scratch) {
    using C = compute_t<T>;
    for (int64_t r = b; r < e; ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      const C m = row_max(xr, n);
      if (log) {
        const C s = row_sum(xr, n, [m](C v) { return vexp(v - m); });
        // (x - m) - log(s), not x - (m + log(s)): no cancellation when |m| is large.
        const C ls = std::log(s);
        for (int64_t i = 0; i < n; ++i)
          yr[i] = from_compute<T>((cpu::load_compute(xr + i) - m) - ls);
        continue;
      }
      C* t;
      if constexpr (std::is_same_v<T, C>)
        t = yr;
      else
        t = scratch;
      for (int64_t i = 0; i < n; ++i) t[i] = vexp(cpu::load_compute(xr + i) - m);
      const C inv = C(1) / row_sum(t, n, [](C v) { return v; });
      for (int64_t i = 0; i < n; ++i) yr[i] = from_compute<T>(t[i] * inv);
    }
  }
};

template <class T>
void softmax_rows(const T* x, T* y, int64_t rows, int64_t n, bool log) {
  using C = compute_t<T>;
  parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    std::vector<C> scratch;
    if constexpr (!std::is_same_v<T, C>) scratch.resize(static_cast<size_t>(n));
    cpu::isa_dispatch<SoftmaxRows<T>>(x, y, n, b, e, log, scratch.data());
  });
}

/// Softmax over the middle axis of (O, R, I) with I > 1: blocks of columns, each a
/// vectorisable loop over contiguous inner elements.
template <class T>
void softmax_cols(const T* x, T* y, const ORI& d, bool log) {
  using C = compute_t<T>;
  const int64_t nblk = (d.I + kColBlock - 1) / kColBlock;
  parallel_for(d.O * nblk, row_grain(d.R * kColBlock), [&](int64_t b, int64_t e) {
    C m[kColBlock], s[kColBlock];
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / nblk, i0 = (t % nblk) * kColBlock;
      const int64_t len = std::min(kColBlock, d.I - i0);
      const T* xb = x + o * d.R * d.I + i0;
      T* yb = y + o * d.R * d.I + i0;
      for (int64_t i = 0; i < len; ++i) {
        m[i] = -INFINITY;
        s[i] = 0;
      }
      for (int64_t r = 0; r < d.R; ++r)
        for (int64_t i = 0; i < len; ++i) {
          C v = cpu::load_compute(xb + r * d.I + i);
          m[i] = (v > m[i] || std::isnan(v)) ? v : m[i];
        }
      for (int64_t r = 0; r < d.R; ++r)
        for (int64_t i = 0; i < len; ++i) s[i] += vexp(cpu::load_compute(xb + r * d.I + i) - m[i]);
      for (int64_t i = 0; i < len; ++i) {
        s[i] = log ? std::log(s[i]) : C(1) / s[i];
      }
      for (int64_t r = 0; r < d.R; ++r)
        for (int64_t i = 0; i < len; ++i) {
          C v = cpu::load_compute(xb + r * d.I + i);
          yb[r * d.I + i] = from_compute<T>(log ? (v - m[i]) - s[i] : vexp(v - m[i]) * s[i]);
        }
    }
  });
}

}  // namespace

void Softmax::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]);
  Array& y = *out[0];
  y.allocate();
  const ORI d = split_at(x.shape, axis_);
  if (x.numel() == 0) return;
  dispatch_float(x.dtype, name(), [&]<class T>() {
    if (d.I == 1)
      softmax_rows<T>(x.data<T>(), y.data<T>(), d.O, d.R, log_);
    else
      softmax_cols<T>(x.data<T>(), y.data<T>(), d, log_);
  });
}

// ---- layer_norm / rms_norm ------------------------------------------------------------------

namespace {

/// Rows [b, e) of layer norm (rms norm without center): y = (x - mean) * rstd * w + bias, and
/// (mean, rstd) per row into stats.
template <class T>
struct NormRows {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* xp, const T* wp, const T* bp, T* yp,
                                                compute_t<T>* sp, int64_t n, int64_t b, int64_t e,
                                                compute_t<T> inv_n, compute_t<T> eps, bool center) {
    using C = compute_t<T>;
    for (int64_t r = b; r < e; ++r) {
      const T* xr = xp + r * n;
      T* yr = yp + r * n;
      // Two passes (mean, then squared deviations): stable when |mean| >> std.
      const C mean = center ? row_sum(xr, n, [](C v) { return v; }) * inv_n : C(0);
      const C var = row_sum(xr, n, [mean](C v) { return (v - mean) * (v - mean); }) * inv_n;
      const C rstd = C(1) / std::sqrt(var + eps);
      sp[2 * r] = mean;
      sp[2 * r + 1] = rstd;
      if (wp && bp) {
        for (int64_t i = 0; i < n; ++i)
          yr[i] = from_compute<T>((cpu::load_compute(xr + i) - mean) * rstd *
                                      cpu::load_compute(wp + i) +
                                  cpu::load_compute(bp + i));
      } else if (wp) {
        for (int64_t i = 0; i < n; ++i)
          yr[i] = from_compute<T>((cpu::load_compute(xr + i) - mean) * rstd *
                                  cpu::load_compute(wp + i));
      } else if (bp) {
        for (int64_t i = 0; i < n; ++i)
          yr[i] = from_compute<T>((cpu::load_compute(xr + i) - mean) * rstd +
                                  cpu::load_compute(bp + i));
      } else {
        for (int64_t i = 0; i < n; ++i)
          yr[i] = from_compute<T>((cpu::load_compute(xr + i) - mean) * rstd);
      }
    }
  }
};

/// What one chunk of layer-norm backward rows reads and writes.
template <class T>
struct NormBackwardArgs {
  const T *xp, *gp, *wp;
  const compute_t<T>* sp;
  T* dxp;
  int64_t n, rows, per;
  compute_t<T> inv_n;
  bool center;
};

/// Chunks [cb, ce) of layer-norm backward: dx per row, and each chunk's partial dweight (pw)
/// and dbias (pb) sums where those are wanted (non-null). xhat and gw are n values of scratch.
template <class T>
struct NormBackwardRows {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const NormBackwardArgs<T>& a, int64_t cb,
                                                int64_t ce, compute_t<T>* pw, compute_t<T>* pb,
                                                compute_t<T>* xhat, compute_t<T>* gw) {
    using C = compute_t<T>;
    const int64_t n = a.n;
    for (int64_t c = cb; c < ce; ++c) {
      C* pwc = pw ? pw + c * n : nullptr;
      C* pbc = pb ? pb + c * n : nullptr;
      for (int64_t r = c * a.per; r < std::min(a.rows, (c + 1) * a.per); ++r) {
        const T* xr = a.xp + r * n;
        const T* gr = a.gp + r * n;
        T* dxr = a.dxp + r * n;
        const C mean = a.sp[2 * r], rstd = a.sp[2 * r + 1];
        for (int64_t i = 0; i < n; ++i) {
          xhat[i] = (cpu::load_compute(xr + i) - mean) * rstd;
          const C gi = cpu::load_compute(gr + i);
          gw[i] = a.wp ? gi * cpu::load_compute(a.wp + i) : gi;
        }
        const C av = a.center ? row_sum(gw, n, [](C v) { return v; }) * a.inv_n : C(0);
        const C bdot = cpu::row_dot(gw, xhat, n) * a.inv_n;
        for (int64_t i = 0; i < n; ++i)
          dxr[i] = from_compute<T>(rstd * (gw[i] - av - xhat[i] * bdot));
        if (pwc)
          for (int64_t i = 0; i < n; ++i) pwc[i] += cpu::load_compute(gr + i) * xhat[i];
        if (pbc)
          for (int64_t i = 0; i < n; ++i) pbc[i] += cpu::load_compute(gr + i);
      }
    }
  }
};

}  // namespace

void Norm::eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]);
  Array w, bias;
  size_t k = 1;
  if (has_w_) w = contiguous_array(*in[k++]);
  if (has_b_) bias = contiguous_array(*in[k++]);
  Array& y = *out[0];
  Array& stats = *out[1];
  y.allocate();
  stats.allocate();
  const int64_t n = cols_, rows = stats.shape[0];
  if (x.numel() == 0) return;
  dispatch_float(x.dtype, name(), [&]<class T>() {
    using C = compute_t<T>;
    const T* xp = x.data<T>();
    const T* wp = has_w_ ? w.data<T>() : nullptr;
    const T* bp = has_b_ ? bias.data<T>() : nullptr;
    T* yp = y.data<T>();
    C* sp = stats.data<C>();
    const C inv_n = C(1) / static_cast<C>(n), eps = static_cast<C>(eps_);
    parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
      cpu::isa_dispatch<NormRows<T>>(xp, wp, bp, yp, sp, n, b, e, inv_n, eps, center_);
    });
  });
}

void NormBackward::eval_cpu(const std::vector<const Array*>& in,
                            const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]);
  Array stats = contiguous_array(*in[1]);
  Array g = contiguous_array(*in[2]);
  Array w;
  if (has_w_) w = contiguous_array(*in[3]);
  Array& dx = *out[0];
  dx.allocate();
  Array* dw = has_w_ ? out[1] : nullptr;
  Array* db = has_b_ ? out[has_w_ ? 2 : 1] : nullptr;
  if (dw) dw->allocate();
  if (db) db->allocate();
  const int64_t n = cols_, rows = stats.shape[0];
  dispatch_float(x.dtype, name(), [&]<class T>() {
    using C = compute_t<T>;
    const T* xp = x.data<T>();
    const T* gp = g.data<T>();
    const T* wp = has_w_ ? w.data<T>() : nullptr;
    const C* sp = stats.data<C>();
    T* dxp = dx.data<T>();
    // dweight/dbias: per-chunk partial sums, then a sum over chunks in a fixed order. The
    // chunking depends only on the row count, so results do not depend on the thread count.
    const int64_t nchunk = std::min<int64_t>(rows, 64);
    const int64_t per = nchunk > 0 ? (rows + nchunk - 1) / nchunk : 0;
    const bool want_w = dw != nullptr, want_b = db != nullptr;
    std::vector<C> pw(want_w ? static_cast<size_t>(nchunk * n) : 0, C(0));
    std::vector<C> pb(want_b ? static_cast<size_t>(nchunk * n) : 0, C(0));
    const C inv_n = C(1) / static_cast<C>(n);
    const NormBackwardArgs<T> args{xp, gp, wp, sp, dxp, n, rows, per, inv_n, center_};
    parallel_for(nchunk, 1, [&](int64_t cb, int64_t ce) {
      std::vector<C> xhat(static_cast<size_t>(n)), gw(static_cast<size_t>(n));
      cpu::isa_dispatch<NormBackwardRows<T>>(args, cb, ce, want_w ? pw.data() : nullptr,
                                             want_b ? pb.data() : nullptr, xhat.data(), gw.data());
    });
    auto finish = [&](const std::vector<C>& part, Array* dst) {
      T* d = dst->data<T>();
      parallel_for(n, 1024, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          C s = 0;
          for (int64_t c = 0; c < nchunk; ++c) s += part[static_cast<size_t>(c * n + i)];
          d[i] = from_compute<T>(s);
        }
      });
    };
    if (want_w) finish(pw, dw);
    if (want_b) finish(pb, db);
  });
}

// ---- cross_entropy ---------------------------------------------------------------------------

namespace {

/// Cross-entropy of rows [b, e) of (N, n) logits: loss and logsumexp per row.
template <class T, class I>
struct CeRowsForward {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* x, const I* tg, compute_t<T>* loss,
                                                compute_t<T>* lse, int64_t n, int64_t b, int64_t e,
                                                int64_t ignore) {
    using C = compute_t<T>;
    for (int64_t r = b; r < e; ++r) {
      const T* xr = x + r * n;
      const C m = row_max(xr, n);
      const C ls = std::log(row_sum(xr, n, [m](C v) { return vexp(v - m); }));
      const int64_t t = static_cast<int64_t>(tg[r]);
      lse[r] = m + ls;
      loss[r] = t == ignore ? C(0) : (m - cpu::load_compute(xr + t)) + ls;
    }
  }
};

/// Its gradient for rows [b, e): dx = (softmax(x) - onehot(target)) * g.
template <class T, class I>
struct CeRowsBackward {
  template <cpu::Isa>
  [[gnu::always_inline]] static inline void run(const T* x, const I* tg, const compute_t<T>* lse,
                                                const compute_t<T>* g, T* dx, int64_t n, int64_t b,
                                                int64_t e, int64_t ignore) {
    using C = compute_t<T>;
    for (int64_t o = b; o < e; ++o) {
      const T* xr = x + o * n;
      T* dr = dx + o * n;
      const int64_t t = static_cast<int64_t>(tg[o]);
      const C gg = t == ignore ? C(0) : g[o], l = lse[o];
      for (int64_t r = 0; r < n; ++r)
        dr[r] = from_compute<T>(vexp(cpu::load_compute(xr + r) - l) * gg);
      if (t != ignore) dr[t] = from_compute<T>(vexp(cpu::load_compute(xr + t) - l) * gg - gg);
    }
  }
};

template <class T, class I>
void ce_forward(const T* x, const I* tg, compute_t<T>* loss, compute_t<T>* lse, const ORI& d,
                int64_t ignore) {
  using C = compute_t<T>;
  if (d.I == 1) {
    parallel_for(d.O, row_grain(d.R), [&](int64_t b, int64_t e) {
      cpu::isa_dispatch<CeRowsForward<T, I>>(x, tg, loss, lse, d.R, b, e, ignore);
    });
    return;
  }
  const int64_t nblk = (d.I + kColBlock - 1) / kColBlock;
  parallel_for(d.O * nblk, row_grain(d.R * kColBlock), [&](int64_t b, int64_t e) {
    C m[kColBlock], s[kColBlock];
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / nblk, i0 = (t % nblk) * kColBlock;
      const int64_t len = std::min(kColBlock, d.I - i0);
      const T* xb = x + o * d.R * d.I + i0;
      for (int64_t i = 0; i < len; ++i) {
        m[i] = -INFINITY;
        s[i] = 0;
      }
      for (int64_t r = 0; r < d.R; ++r)
        for (int64_t i = 0; i < len; ++i) {
          C v = cpu::load_compute(xb + r * d.I + i);
          m[i] = (v > m[i] || std::isnan(v)) ? v : m[i];
        }
      for (int64_t r = 0; r < d.R; ++r)
        for (int64_t i = 0; i < len; ++i) s[i] += vexp(cpu::load_compute(xb + r * d.I + i) - m[i]);
      for (int64_t i = 0; i < len; ++i) {
        const int64_t k = o * d.I + i0 + i;
        const C ls = std::log(s[i]);
        const int64_t tt = static_cast<int64_t>(tg[k]);
        lse[k] = m[i] + ls;
        loss[k] = tt == ignore ? C(0) : (m[i] - cpu::load_compute(xb + tt * d.I + i)) + ls;
      }
    }
  });
}

template <class T, class I>
void ce_backward(const T* x, const I* tg, const compute_t<T>* lse, const compute_t<T>* g, T* dx,
                 const ORI& d, int64_t ignore) {
  using C = compute_t<T>;
  if (d.I == 1) {
    // (N, C) logits: one contiguous row per sample.
    parallel_for(d.O, row_grain(d.R), [&](int64_t b, int64_t e) {
      cpu::isa_dispatch<CeRowsBackward<T, I>>(x, tg, lse, g, dx, d.R, b, e, ignore);
    });
    return;
  }
  // One (outer) sample at a time: its C x S block, S contiguous.
  parallel_for(d.O, row_grain(d.R * d.I), [&](int64_t b, int64_t e) {
    std::vector<C> gs(static_cast<size_t>(d.I));
    for (int64_t o = b; o < e; ++o) {
      const T* xo = x + o * d.R * d.I;
      T* dxo = dx + o * d.R * d.I;
      const C* lo = lse + o * d.I;
      for (int64_t i = 0; i < d.I; ++i) {
        const int64_t k = o * d.I + i;
        gs[static_cast<size_t>(i)] = static_cast<int64_t>(tg[k]) == ignore ? C(0) : g[k];
      }
      const C* gp = gs.data();
      for (int64_t r = 0; r < d.R; ++r)
        for (int64_t i = 0; i < d.I; ++i)
          dxo[r * d.I + i] =
              from_compute<T>(vexp(cpu::load_compute(xo + r * d.I + i) - lo[i]) * gp[i]);
      for (int64_t i = 0; i < d.I; ++i) {
        const int64_t k = o * d.I + i;
        const int64_t t = static_cast<int64_t>(tg[k]);
        if (t == ignore) continue;
        T& v = dxo[t * d.I + i];
        v = from_compute<T>(vexp(cpu::load_compute(xo + t * d.I + i) - lo[i]) * gp[i] - gp[i]);
      }
    }
  });
}

}  // namespace

void CrossEntropy::eval_cpu(const std::vector<const Array*>& in,
                            const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]);
  Array tg = contiguous_array(*in[1]);
  const ORI d = split_at(x.shape, 1);
  // Checked here, before the parallel loop, so the error reaches the caller.
  if (auto bad = find_bad_index(tg, d.R, ignore_)) fail_bad_index(name(), *bad, d.R, 1, ignore_);
  out[0]->allocate();
  out[1]->allocate();
  if (x.numel() == 0) return;
  dispatch_float(x.dtype, name(), [&]<class T>() {
    using C = compute_t<T>;
    dispatch_index(tg.dtype, name(), [&]<class I>() {
      ce_forward<T, I>(x.data<T>(), tg.data<I>(), out[0]->data<C>(), out[1]->data<C>(), d, ignore_);
    });
  });
}

void CrossEntropyBackward::eval_cpu(const std::vector<const Array*>& in,
                                    const std::vector<Array*>& out) const {
  Array x = contiguous_array(*in[0]);
  Array tg = contiguous_array(*in[1]);
  Array lse = contiguous_array(*in[2]);
  Array g = contiguous_array(*in[3]);
  const ORI d = split_at(x.shape, 1);
  out[0]->allocate();
  if (x.numel() == 0) return;
  dispatch_float(x.dtype, name(), [&]<class T>() {
    using C = compute_t<T>;
    dispatch_index(tg.dtype, name(), [&]<class I>() {
      ce_backward<T, I>(x.data<T>(), tg.data<I>(), lse.data<C>(), g.data<C>(), out[0]->data<T>(), d,
                        ignore_);
    });
  });
}

}  // namespace hetrain
