// Fused scaled-dot-product attention (flash-attention style: memory linear in sequence length).
#pragma once

#include <optional>

#include "hetrain/graph/primitive.h"

namespace hetrain {

/// q (B..., Lq, E), k (B..., Lk, E), v (B..., Lk, Ev) with equal batch dims and dtype. Outputs
/// o (B..., Lq, Ev) and the row logsumexp of the scaled scores, lse (B..., Lq), in the
/// compute dtype (f64 for f64, else f32); backward recomputes the probabilities from it.
/// causal: query i sees keys j <= i (top-left aligned, as torch's is_causal).
/// heads > 0: the packed layout of a transformer's attention instead. The one input is the fused
/// projection qkv (N, L, 3D) (q, k and v side by side, each with `heads` heads of D / heads
/// columns); o is (N, L, D) with the heads side by side again, lse (N, heads, L). The kernel
/// reads and writes these layouts in place, so the head split and merge cost no copies.
class SdpaForward final : public Primitive {
 public:
  SdpaForward(bool causal, double scale, int64_t heads = 0)
      : causal_(causal), scale_(scale), heads_(heads) {}
  const char* name() const override { return "sdpa"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::vector<Tensor> vjp(const std::vector<Tensor>& x, const std::vector<Tensor>& y,
                          const std::vector<Tensor>& g, const std::vector<int>&) const override;
  std::string attrs() const override;

 private:
  bool causal_;
  double scale_;
  int64_t heads_;
};

/// Inputs q, k, v, o, do, lse; outputs dq, dk, dv. Recomputes P block by block from q, k and
/// lse (flash-attention-2 backward), so it too needs memory linear in sequence length.
/// heads > 0 (the packed layout): inputs qkv, o, do, lse; one output dqkv, packed as qkv.
class SdpaBackward final : public Primitive {
 public:
  SdpaBackward(bool causal, double scale, int64_t heads = 0)
      : causal_(causal), scale_(scale), heads_(heads) {}
  const char* name() const override { return "sdpa_backward"; }
  std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const override;
  Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const override;
  void eval_cpu(const std::vector<const Array*>& in, const std::vector<Array*>& out) const override;
#if HETRAIN_HAVE_CUDA
  void eval_cuda(const std::vector<const Array*>& in,
                 const std::vector<Array*>& out) const override;
  bool has_kernel(DeviceKind) const override { return true; }
#endif
  std::string attrs() const override;

 private:
  bool causal_;
  double scale_;
  int64_t heads_;
};

/// The unfused composition softmax(q k^T * scale + mask) v built from simple ops: the
/// reference for the fused kernel and its gradient (memory quadratic in sequence length).
Tensor scaled_dot_product_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                              bool causal = false,
                                              std::optional<double> scale = {});

}  // namespace hetrain
