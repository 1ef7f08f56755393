// Modules: named parameters and buffers, train/eval mode, a state dict.
//
//   auto model = std::make_shared<nn::Sequential>();
//   model->add(std::make_shared<nn::Linear>(784, 256));
//   model->add(std::make_shared<nn::ReLU>());
//   model->add(std::make_shared<nn::Linear>(256, 10));
//   Tensor logits = model->forward(x);
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hetrain/graph/ops.h"

namespace hetrain::nn {

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }

  /// Parameters with dotted names ("blocks.0.attn.qkv.weight"), in registration order.
  std::vector<std::pair<std::string, Tensor*>> named_parameters();
  std::vector<Tensor*> parameters();
  std::vector<std::pair<std::string, Tensor*>> named_buffers();
  int64_t num_parameters();
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }
  /// Parameters and buffers by name.
  std::map<std::string, Tensor> state_dict();
  /// Copies values in. Every missing, unexpected or mis-shaped entry is listed in one error
  /// (with both shapes) and nothing is loaded.
  void load_state_dict(const std::map<std::string, Tensor>& state);
  void zero_grad();

 protected:
  /// Registers a trainable leaf (marked requires_grad, accounted as parameters).
  Tensor& register_parameter(const std::string& name, Tensor t);
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out,
               bool buffers);
  std::deque<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

/// y = x W^T + b; W (out, in), initialised U(-1/sqrt(in), 1/sqrt(in)) as torch.nn.Linear.
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return *weight_; }
  Tensor* bias() { return bias_; }

 private:
  Tensor* weight_;
  Tensor* bias_ = nullptr;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0,
         bool bias = true, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;

 private:
  Tensor* weight_;
  Tensor* bias_ = nullptr;
  int64_t stride_, padding_;
};

/// Batch statistics in training (biased variance for normalising, unbiased for the running
/// estimate, momentum 0.1), running statistics in eval, as torch.nn.BatchNorm2d.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  /// relu(forward(x)), one fused pass each way in training.
  Tensor forward_relu(const Tensor& x);
  /// relu(forward(x) + residual): a residual block's tail, one fused pass forward in training.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);

 private:
  Tensor normalize(const Tensor& x, bool relu, const Tensor& residual = {});
  Tensor *weight_, *bias_, *running_mean_, *running_var_, *num_batches_;
  double eps_, momentum_;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool bias = true);
  Tensor forward(const Tensor& x) override;

 private:
  Tensor* weight_;
  Tensor* bias_ = nullptr;
  int64_t dim_;
  double eps_;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;

 private:
  Tensor* weight_;
  int64_t dim_;
  double eps_;
};

/// Rows of a (num, dim) table, initialised N(0, 1) as torch.nn.Embedding.
class Embedding : public Module {
 public:
  Embedding(int64_t num, int64_t dim, Generator& gen = default_generator());
  Tensor forward(const Tensor& ids) override;
  Tensor& weight() { return *weight_; }

 private:
  Tensor* weight_;
};

class Dropout : public Module {
 public:
  explicit Dropout(double p, Generator& gen = default_generator()) : p_(p), gen_(&gen) {}
  Tensor forward(const Tensor& x) override { return dropout(x, p_, training(), *gen_); }

 private:
  double p_;
  Generator* gen_;
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
};
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : approximate_(std::move(approximate)) {}
  Tensor forward(const Tensor& x) override { return gelu(x, approximate_); }

 private:
  std::string approximate_;
};
class Flatten : public Module {
 public:
  Tensor forward(const Tensor& x) override { return flatten(x, 1); }
};

class Sequential : public Module {
 public:
  Sequential& add(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return layers_.size(); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

/// Causal multi-head self-attention over x (B, T, D) with fused qkv and output projections.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t dim, int64_t heads, double dropout, Generator& gen);
  Tensor forward(const Tensor& x) override;
  Linear& proj() { return *proj_; }

 private:
  std::shared_ptr<Linear> qkv_, proj_;
  std::shared_ptr<Dropout> drop_;
  int64_t dim_, heads_;
};

/// Pre-norm GPT-2 block: x + attn(ln1(x)); x + mlp(ln2(x)), MLP 4x wide with tanh-GELU.
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t dim, int64_t heads, double dropout, Generator& gen);
  Tensor forward(const Tensor& x) override;
  /// Residual output projections (GPT-2 scales their init by 1/sqrt(2 * layers)).
  std::vector<Linear*> residual_projections();

 private:
  std::shared_ptr<LayerNorm> ln1_, ln2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<Linear> fc_, fc_proj_;
  std::shared_ptr<Dropout> drop_;
};

// ---- models -----------------------------------------------------------------------------

/// in -> hidden... (ReLU) -> out.
std::shared_ptr<Sequential> make_mlp(int64_t in, const std::vector<int64_t>& hidden, int64_t out,
                                     Generator& gen = default_generator());

/// A small ResNet for (N, C, H, W) images: conv-bn-relu stem, stages of residual blocks
/// (two 3x3 conv-bn, identity or 1x1-conv shortcut, stride 2 between stages), global average
/// pooling and a linear classifier.
class ResNet : public Module {
 public:
  ResNet(int64_t in_channels, int64_t classes, std::vector<int64_t> widths,
         int64_t blocks_per_stage, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;

 private:
  struct Block;
  std::shared_ptr<Conv2d> stem_conv_;     // registered as stem.0 and stem.1, as in PyTorch
  std::shared_ptr<BatchNorm2d> stem_bn_;  // with the stem's relu fused in
  std::vector<std::shared_ptr<Module>> blocks_;
  std::shared_ptr<Linear> head_;
};

struct GptConfig {
  int64_t vocab = 256, context = 128, layers = 4, heads = 4, dim = 128;
  double dropout = 0.0;
};

/// GPT-2: token + learned position embeddings, pre-norm blocks, final LayerNorm, and a
/// language-model head tied to the token embedding. Initialised as GPT-2 (N(0, 0.02), residual
/// projections N(0, 0.02/sqrt(2L))). forward: ids (B, T) -> logits (B, T, vocab).
class Gpt : public Module {
 public:
  explicit Gpt(const GptConfig& cfg, Generator& gen = default_generator());
  Tensor forward(const Tensor& ids) override;
  const GptConfig& config() const { return cfg_; }

 private:
  GptConfig cfg_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::vector<std::shared_ptr<TransformerBlock>> blocks_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<Dropout> drop_;
};

}  // namespace hetrain::nn
