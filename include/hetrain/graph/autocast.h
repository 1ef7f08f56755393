// Autocast: mixed precision as a policy over graph building.
//
//   using namespace hetrain;
//   {
//     amp::Autocast scope(amp::Precision::bf16);
//     Tensor logits = model.forward(x);        // matmul/conv/attention nodes run in bf16
//     Tensor loss = cross_entropy(logits, y);  // softmax, norms, losses run in f32
//   }
//   loss.backward();  // parameters stay f32; their gradients come back f32 through the casts
//
// While a scope is active, every node built consults one table (autocast_table(), keyed by
// primitive name) before its shapes are inferred: `low_precision` primitives get their f32
// inputs cast to the scope's dtype, `f32` primitives get f16/bf16 inputs cast to f32, and
// `follow` primitives keep their inputs (their own dtype promotion applies). The casts are
// ordinary graph nodes, so autodiff flows through them and the f32 master weights receive f32
// gradients. Backward graphs are built with autocast off: each gradient runs in the dtype its
// forward ran in. f64 and integer inputs are never touched.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "hetrain/base/dtype.h"
#include "hetrain/graph/tensor.h"

namespace hetrain::amp {

/// Training precision: fp32 (autocast off), bf16 or fp16 autocast.
enum class Precision : uint8_t { fp32, bf16, fp16 };
std::string_view precision_name(Precision p);
/// Parses "fp32", "bf16", "fp16"; throws Error naming the value and the choices.
Precision precision_from_name(std::string_view name);
/// The dtype low-precision primitives run in: f32, bf16 or f16.
Dtype compute_dtype(Precision p);

enum class CastPolicy : uint8_t {
  low_precision,  // run in the autocast dtype (GEMMs, convolutions, attention)
  f32,            // always run in f32 (softmax, norms, losses, accumulating reductions, exp/log)
  follow,         // run in the dtype of the inputs (everything not in the table)
};
std::string_view cast_policy_name(CastPolicy p);

struct PolicyEntry {
  std::string_view primitive;  // Primitive::name()
  CastPolicy policy;
};
/// The whole policy, one entry per primitive that does not follow its inputs.
std::span<const PolicyEntry> autocast_table();
/// The policy of a primitive name (follow when it is not in the table).
CastPolicy cast_policy(std::string_view primitive);

/// Sets the autocast precision of this thread for its lifetime (nesting restores the outer
/// one). Precision::fp32 turns autocast off inside the scope.
class Autocast {
 public:
  explicit Autocast(Precision p);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;
  /// The precision in force on this thread (fp32 outside any scope).
  static Precision current();

 private:
  Precision prev_;
};

/// Casts the floating inputs of a node of `primitive` as the current scope's policy says.
/// Called by make_node for every node; a no-op outside an autocast scope. A cast that the op
/// itself just inserted (an unevaluated cast node) is looked through rather than cast back, so
/// an f32 weight that an op conformed to a bf16 input reaches an f32 primitive unrounded.
void apply_autocast(std::string_view primitive, std::vector<Tensor>& inputs);

}  // namespace hetrain::amp
