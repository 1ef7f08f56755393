// The primitive interface: one class per primitive, with its output shapes, cost, vjp and
// name. Device kernels are the eval_* methods, defined by the backends.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hetrain/base/error.h"
#include "hetrain/graph/tensor.h"

namespace hetrain {

/// Work and traffic of one node; compute density = flops / (bytes_read + bytes_written).
struct Cost {
  double flops = 0;
  double bytes_read = 0;
  double bytes_written = 0;
  double intensity() const {
    double b = bytes_read + bytes_written;
    return b > 0 ? flops / b : 0.0;
  }
};

class Primitive {
 public:
  virtual ~Primitive() = default;
  /// Name used in errors, kernel lookup, profiles: "matmul", "add", ...
  virtual const char* name() const = 0;
  /// Output shapes and dtypes; throws Error naming the op on bad arguments.
  virtual std::vector<TensorMeta> infer(const std::vector<TensorMeta>& in) const = 0;
  /// Default: an elementwise cost of one flop per output element.
  virtual Cost cost(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>& out) const;
  /// Runs on the CPU. Outputs have shape, dtype and tag set; the kernel allocates them
  /// (Array::allocate) or makes them views of an input. An elementwise kernel writes an output
  /// that already has data in place (a fused chain hands it a block of the chain's result).
  virtual void eval_cpu(const std::vector<const Array*>& in,
                        const std::vector<Array*>& out) const = 0;
  /// Runs on the CUDA device the calling thread is bound to, queued on that device's
  /// stream (asynchronous: the runtime synchronises at copies back to the host). Same
  /// contract as eval_cpu; inputs are in that device's memory. Default: a view primitive
  /// runs eval_cpu (it only sets strides), any other throws "no CUDA kernel for <name>".
  virtual void eval_cuda(const std::vector<const Array*>& in, const std::vector<Array*>& out) const;
  /// Whether a kernel exists for devices of kind k: the scheduler places an unpinned node
  /// only where one does. CPU and sim devices run eval_cpu; a CUDA device needs an eval_cuda
  /// override, which its class declares together with has_kernel (views run anywhere).
  virtual bool has_kernel(DeviceKind k) const { return k != DeviceKind::cuda || is_view(); }
  /// Cotangents of the inputs listed in argnums, given the cotangents of the outputs
  /// (an undefined Tensor where an output received none).
  virtual std::vector<Tensor> vjp(const std::vector<Tensor>& primals,
                                  const std::vector<Tensor>& outputs,
                                  const std::vector<Tensor>& cotangents,
                                  const std::vector<int>& argnums) const;
  /// True when outputs alias the first input's buffer (no kernel work, no allocation).
  virtual bool is_view() const { return false; }
  /// True when each output element depends only on the element at the same index of each
  /// input, and inputs and the one output have one shape (the fusion pass chains these).
  virtual bool is_elementwise() const { return false; }
  /// Attributes for display, e.g. "axes=(0, 1)".
  virtual std::string attrs() const { return ""; }
};

}  // namespace hetrain
