// The autocast policy table and the cast that make_node applies through it.
#include "hetrain/graph/autocast.h"

#include <array>

#include "graph/prims/views.h"
#include "hetrain/base/error.h"
#include "hetrain/graph/ops.h"
#include "hetrain/graph/primitive.h"

namespace hetrain::amp {

namespace {

// The policy, in one place. Primitives not listed follow their inputs: elementwise ops,
// views, max/min, pooling, dropout masks, embedding lookups and the like, whose results are
// exact or as accurate in the inputs' dtype. batch_norm2d follows too, as under PyTorch's CPU
// autocast: its kernel computes the statistics and the normalisation in f32 and returns the
// statistics in f32, so only its input and output are 16-bit, and a conv net's activations
// stay 16-bit from conv to conv. Every listed f32 primitive accumulates (or
// amplifies relative error: exp, log, pow, rsqrt) where f16/bf16 would lose accuracy.
constexpr std::array kTable{
    // Matrix products: the work that low precision speeds up (AMX/AVX512-BF16 via oneDNN).
    PolicyEntry{"matmul", CastPolicy::low_precision},
    PolicyEntry{"conv2d", CastPolicy::low_precision},
    PolicyEntry{"sdpa", CastPolicy::low_precision},
    // Always f32.
    PolicyEntry{"softmax", CastPolicy::f32},
    PolicyEntry{"log_softmax", CastPolicy::f32},
    PolicyEntry{"layer_norm", CastPolicy::f32},
    PolicyEntry{"rms_norm", CastPolicy::f32},
    PolicyEntry{"cross_entropy", CastPolicy::f32},
    PolicyEntry{"sum", CastPolicy::f32},
    PolicyEntry{"exp", CastPolicy::f32},
    PolicyEntry{"log", CastPolicy::f32},
    PolicyEntry{"pow", CastPolicy::f32},
    PolicyEntry{"rsqrt", CastPolicy::f32},
};

thread_local Precision g_precision = Precision::fp32;

bool autocastable(Dtype dt) { return dt == Dtype::f32 || dt == Dtype::bf16 || dt == Dtype::f16; }

}  // namespace

std::string_view precision_name(Precision p) {
  switch (p) {
    case Precision::fp32:
      return "fp32";
    case Precision::bf16:
      return "bf16";
    case Precision::fp16:
      return "fp16";
  }
  return "?";
}

Precision precision_from_name(std::string_view name) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    if (name == precision_name(p)) return p;
  fail("[autocast] unknown precision '", name, "'; expected fp32, bf16 or fp16");
}

Dtype compute_dtype(Precision p) {
  switch (p) {
    case Precision::bf16:
      return Dtype::bf16;
    case Precision::fp16:
      return Dtype::f16;
    case Precision::fp32:
      break;
  }
  return Dtype::f32;
}

std::string_view cast_policy_name(CastPolicy p) {
  switch (p) {
    case CastPolicy::low_precision:
      return "low_precision";
    case CastPolicy::f32:
      return "f32";
    case CastPolicy::follow:
      return "follow";
  }
  return "?";
}

std::span<const PolicyEntry> autocast_table() { return kTable; }

CastPolicy cast_policy(std::string_view primitive) {
  for (const PolicyEntry& e : kTable)
    if (e.primitive == primitive) return e.policy;
  return CastPolicy::follow;
}

Autocast::Autocast(Precision p) : prev_(g_precision) { g_precision = p; }
Autocast::~Autocast() { g_precision = prev_; }
Precision Autocast::current() { return g_precision; }

void apply_autocast(std::string_view primitive, std::vector<Tensor>& inputs) {
  if (g_precision == Precision::fp32) return;
  const CastPolicy policy = cast_policy(primitive);
  if (policy == CastPolicy::follow) return;
  const Dtype target = policy == CastPolicy::f32 ? Dtype::f32 : compute_dtype(g_precision);
  for (Tensor& t : inputs) {
    if (!t.defined() || t.dtype() == target || !autocastable(t.dtype())) continue;
    // Look through a cast the op inserted to conform this input to another one's dtype.
    const Node* n = t.node();
    if (n->prim && !n->evaluated() && std::string_view(n->prim->name()) == "cast" &&
        n->inputs.size() == 1 && n->inputs[0].dtype() == target) {
      // A copy first: assigning n->inputs[0] straight to t frees n (t held its last reference)
      // while the assignment still reads from it.
      Tensor source = n->inputs[0];
      t = std::move(source);
      continue;
    }
    // A transposed matrix (a linear layer's weight, as matmul(x, wᵀ)) is cast before the
    // transpose: the cast copies the matrix as stored and the GEMM reads the transpose as a view.
    // Its gradient then comes out in the stored layout (Matmul::vjp computes (gᵀ a)ᵀ for a
    // transposed operand), where a cast of the transpose made the leaf's gradient a transposed
    // view that backward() copied once more (a copy per weight and step, 2% of gpt-mini's bf16
    // step on an AMX Xeon).
    const auto* perm = n->prim ? dynamic_cast<const Permute*>(n->prim.get()) : nullptr;
    if (perm && perm->dims() == std::vector<int>{1, 0} && n->inputs.size() == 1) {
      Tensor base = n->inputs[0];
      t = transpose(cast(base, target), 0, 1);
      continue;
    }
    t = cast(t, target);
  }
}

}  // namespace hetrain::amp
