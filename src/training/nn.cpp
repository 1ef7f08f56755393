#include "hetrain/training/nn.h"

#include <cmath>
#include <sstream>

#include "hetrain/base/error.h"
#include "hetrain/runtime/eval.h"

namespace hetrain::nn {

namespace {
Tensor uniform_init(const Shape& shape, double bound, Generator& gen) {
  MemoryTagScope tag(MemoryTag::parameters);
  return rand(shape, -bound, bound, Dtype::f32, gen);
}
Tensor normal_init(const Shape& shape, double stddev, Generator& gen) {
  MemoryTagScope tag(MemoryTag::parameters);
  Tensor t = randn(shape, Dtype::f32, gen);
  if (stddev == 1.0) return t;
  return (t * stddev).detach();
}
Tensor constant(const Shape& shape, double v) {
  MemoryTagScope tag(MemoryTag::parameters);
  return full(shape, v, Dtype::f32);
}
}  // namespace

// ---- Module -------------------------------------------------------------------------------

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  t = t.detach();
  Array& a = t.node()->outs[0];
  if (a.buffer && a.tag != MemoryTag::parameters) {
    a.buffer->retag(MemoryTag::parameters);
    a.tag = MemoryTag::parameters;
  }
  t.requires_grad_(true);
  params_.emplace_back(name, t);
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, t.detach());
  return buffers_.back().second;
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor*>>& out,
                     bool buffers) {
  for (auto& [n, t] : buffers ? buffers_ : params_) out.emplace_back(prefix + n, &t);
  for (auto& [n, m] : children_) m->collect(prefix + n + ".", out, buffers);
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameters() {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", out, false);
  return out;
}
std::vector<Tensor*> Module::parameters() {
  std::vector<Tensor*> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}
std::vector<std::pair<std::string, Tensor*>> Module::named_buffers() {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", out, true);
  return out;
}
int64_t Module::num_parameters() {
  int64_t n = 0;
  for (auto& [name, p] : named_parameters()) n += p->numel();
  return n;
}
void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}
void Module::zero_grad() {
  for (auto* p : parameters()) p->zero_grad();
}

std::map<std::string, Tensor> Module::state_dict() {
  std::map<std::string, Tensor> s;
  for (auto& [n, p] : named_parameters()) s[n] = *p;
  for (auto& [n, b] : named_buffers()) s[n] = *b;
  return s;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto entries = named_parameters();
  size_t nparams = entries.size();
  for (auto& e : named_buffers()) entries.push_back(e);
  std::ostringstream problems;
  int bad = 0;
  std::map<std::string, bool> used;
  for (auto& [name, t] : entries) {
    auto it = state.find(name);
    if (it == state.end()) {
      problems << "\n  missing: " << name << " " << shape_str(t->shape());
      ++bad;
      continue;
    }
    used[name] = true;
    if (it->second.shape() != t->shape()) {
      problems << "\n  shape mismatch: " << name << " checkpoint " << shape_str(it->second.shape())
               << " vs model " << shape_str(t->shape());
      ++bad;
    }
    // Floating values convert (an f64 reference into an f32 model); a change of kind does not
    // (an f32 tensor relabelled i32 would load as garbage).
    if (is_floating(it->second.dtype()) != is_floating(t->dtype())) {
      problems << "\n  dtype mismatch: " << name << " checkpoint " << dtype_name(it->second.dtype())
               << " vs model " << dtype_name(t->dtype());
      ++bad;
    }
  }
  for (auto& [name, t] : state)
    if (!used.count(name)) {
      problems << "\n  unexpected: " << name << " " << shape_str(t.shape());
      ++bad;
    }
  if (bad) fail("[load_state_dict] ", bad, " problem(s), nothing loaded:", problems.str());
  for (size_t i = 0; i < entries.size(); ++i) {
    auto& [name, t] = entries[i];
    const Tensor& src = state.at(name);
    MemoryTagScope tag(i < nparams ? MemoryTag::parameters : MemoryTag::activations);
    Tensor v = copy(cast(src, t->dtype()));
    v.node()->outs[0].tag = i < nparams ? MemoryTag::parameters : MemoryTag::activations;
    v = v.detach();
    if (i < nparams) v.requires_grad_(true);
    *t = v;
  }
}

// ---- layers -------------------------------------------------------------------------------

Linear::Linear(int64_t in, int64_t out, bool bias, Generator& gen) {
  if (in <= 0 || out <= 0) fail("[Linear] sizes must be positive, got in=", in, " out=", out);
  double bound = 1.0 / std::sqrt(static_cast<double>(in));
  weight_ = &register_parameter("weight", uniform_init({out, in}, bound, gen));
  if (bias) bias_ = &register_parameter("bias", uniform_init({out}, bound, gen));
}
Tensor Linear::forward(const Tensor& x) { return linear(x, *weight_, bias_ ? *bias_ : Tensor()); }

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool bias,
               Generator& gen)
    : stride_(stride), padding_(padding) {
  double bound = 1.0 / std::sqrt(static_cast<double>(in * kernel * kernel));
  weight_ = &register_parameter("weight", uniform_init({out, in, kernel, kernel}, bound, gen));
  if (bias) bias_ = &register_parameter("bias", uniform_init({out}, bound, gen));
}
Tensor Conv2d::forward(const Tensor& x) {
  return conv2d(x, *weight_, bias_ ? *bias_ : Tensor(), {stride_, stride_}, {padding_, padding_});
}

BatchNorm2d::BatchNorm2d(int64_t c, double eps, double momentum) : eps_(eps), momentum_(momentum) {
  weight_ = &register_parameter("weight", constant({c}, 1.0));
  bias_ = &register_parameter("bias", constant({c}, 0.0));
  running_mean_ = &register_buffer("running_mean", zeros({c}));
  running_var_ = &register_buffer("running_var", ones({c}));
  num_batches_ = &register_buffer("num_batches_tracked", zeros({}, Dtype::i64));
}
Tensor BatchNorm2d::forward(const Tensor& x) { return normalize(x, false); }
Tensor BatchNorm2d::forward_relu(const Tensor& x) { return normalize(x, true); }
Tensor BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& residual) {
  return normalize(x, true, residual);
}

Tensor BatchNorm2d::normalize(const Tensor& x, bool relu, const Tensor& residual) {
  if (x.ndim() != 4 || x.shape()[1] != weight_->shape()[0])
    fail("[BatchNorm2d] expected input (N, ", weight_->shape()[0], ", H, W), got ",
         shape_str(x.shape()));
  if (residual.defined() && residual.shape() != x.shape())
    fail("[BatchNorm2d] residual must have the input's shape ", shape_str(x.shape()), ", got ",
         shape_str(residual.shape()));
  const int64_t c = x.shape()[1];
  if (!training()) {
    // The running statistics folded into one per-channel scale and shift (C values), so the
    // activations take two passes (x * scale, + shift) rather than four.
    Shape bshape{1, c, 1, 1};
    Tensor scale = *weight_ * rsqrt(*running_var_ + eps_);
    Tensor shift = *bias_ - *running_mean_ * scale;
    Tensor y = x * reshape(scale, bshape) + reshape(shift, bshape);
    if (residual.defined()) y = y + residual;
    return relu ? hetrain::relu(y) : y;
  }
  // One fused kernel each way (batch_norm2d and its backward) instead of ~15 elementwise and
  // reduction passes.
  auto [y, mu, v] = batch_norm2d(x, *weight_, *bias_, eps_, relu, residual);
  {
    // Running statistics: evaluated by the trainer after the step (Module buffers).
    NoGradScope ng;
    double n = static_cast<double>(x.numel() / c);
    Tensor unbiased = cast(v, running_var_->dtype()) * (n / std::max(n - 1.0, 1.0));
    *running_mean_ =
        *running_mean_ * (1.0 - momentum_) + cast(mu, running_mean_->dtype()) * momentum_;
    *running_var_ = *running_var_ * (1.0 - momentum_) + unbiased * momentum_;
    *num_batches_ = *num_batches_ + 1.0;
  }
  return y;
}

LayerNorm::LayerNorm(int64_t dim, double eps, bool bias) : dim_(dim), eps_(eps) {
  weight_ = &register_parameter("weight", constant({dim}, 1.0));
  if (bias) bias_ = &register_parameter("bias", constant({dim}, 0.0));
}
Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, {dim_}, *weight_, bias_ ? *bias_ : Tensor(), eps_);
}

RMSNorm::RMSNorm(int64_t dim, double eps) : dim_(dim), eps_(eps) {
  weight_ = &register_parameter("weight", constant({dim}, 1.0));
}
Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, {dim_}, *weight_, eps_); }

Embedding::Embedding(int64_t num, int64_t dim, Generator& gen) {
  weight_ = &register_parameter("weight", normal_init({num, dim}, 1.0, gen));
}
Tensor Embedding::forward(const Tensor& ids) { return embedding(*weight_, ids); }

Sequential& Sequential::add(std::shared_ptr<Module> m) {
  register_module(std::to_string(layers_.size()), m);
  layers_.push_back(std::move(m));
  return *this;
}
Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& l : layers_) y = l->forward(y);
  return y;
}

CausalSelfAttention::CausalSelfAttention(int64_t dim, int64_t heads, double dropout, Generator& gen)
    : dim_(dim), heads_(heads) {
  if (heads <= 0 || dim % heads != 0)
    fail("[CausalSelfAttention] width ", dim, " is not divisible by heads ", heads);
  qkv_ = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, true, gen));
  proj_ = register_module("proj", std::make_shared<Linear>(dim, dim, true, gen));
  drop_ = register_module("drop", std::make_shared<Dropout>(dropout));
}
Tensor CausalSelfAttention::forward(const Tensor& x) {
  if (x.ndim() != 3 || x.shape()[2] != dim_)
    fail("[CausalSelfAttention] expected (B, T, ", dim_, "), got ", shape_str(x.shape()));
  // On the packed (B, T, 3D) projection: q, k and v and their heads are read where they lie.
  Tensor y = scaled_dot_product_attention_packed(qkv_->forward(x), heads_, true);
  return drop_->forward(proj_->forward(y));
}

TransformerBlock::TransformerBlock(int64_t dim, int64_t heads, double dropout, Generator& gen) {
  ln1_ = register_module("ln1", std::make_shared<LayerNorm>(dim));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(dim, heads, dropout, gen));
  ln2_ = register_module("ln2", std::make_shared<LayerNorm>(dim));
  fc_ = register_module("fc", std::make_shared<Linear>(dim, 4 * dim, true, gen));
  fc_proj_ = register_module("fc_proj", std::make_shared<Linear>(4 * dim, dim, true, gen));
  drop_ = register_module("drop", std::make_shared<Dropout>(dropout));
}
Tensor TransformerBlock::forward(const Tensor& x) {
  Tensor h = x + attn_->forward(ln1_->forward(x));
  return h + drop_->forward(fc_proj_->forward(gelu(fc_->forward(ln2_->forward(h)), "tanh")));
}
std::vector<Linear*> TransformerBlock::residual_projections() {
  return {&attn_->proj(), fc_proj_.get()};
}

// ---- models -----------------------------------------------------------------------------

std::shared_ptr<Sequential> make_mlp(int64_t in, const std::vector<int64_t>& hidden, int64_t out,
                                     Generator& gen) {
  auto m = std::make_shared<Sequential>();
  m->add(std::make_shared<Flatten>());
  int64_t prev = in;
  for (int64_t h : hidden) {
    m->add(std::make_shared<Linear>(prev, h, true, gen));
    m->add(std::make_shared<ReLU>());
    prev = h;
  }
  m->add(std::make_shared<Linear>(prev, out, true, gen));
  return m;
}

struct ResNet::Block : Module {
  std::shared_ptr<Conv2d> c1, c2, shortcut;
  std::shared_ptr<BatchNorm2d> b1, b2, bs;
  Block(int64_t in, int64_t out, int64_t stride, Generator& gen) {
    c1 = register_module("conv1", std::make_shared<Conv2d>(in, out, 3, stride, 1, false, gen));
    b1 = register_module("bn1", std::make_shared<BatchNorm2d>(out));
    c2 = register_module("conv2", std::make_shared<Conv2d>(out, out, 3, 1, 1, false, gen));
    b2 = register_module("bn2", std::make_shared<BatchNorm2d>(out));
    if (stride != 1 || in != out) {
      shortcut =
          register_module("shortcut", std::make_shared<Conv2d>(in, out, 1, stride, 0, false, gen));
      bs = register_module("bn_shortcut", std::make_shared<BatchNorm2d>(out));
    }
  }
  Tensor forward(const Tensor& x) override {
    if (!shortcut) return b2->forward_add_relu(c2->forward(b1->forward_relu(c1->forward(x))), x);
    // The fusion pass runs the 3x3 and the shortcut's 1x1 in one pass over x where a kernel can.
    Tensor h = b1->forward_relu(c1->forward(x));
    Tensor s = bs->forward(shortcut->forward(x));
    return b2->forward_add_relu(c2->forward(h), s);
  }
};

ResNet::ResNet(int64_t in_channels, int64_t classes, std::vector<int64_t> widths,
               int64_t blocks_per_stage, Generator& gen) {
  if (widths.empty()) fail("[ResNet] needs at least one stage width");
  stem_conv_ = std::make_shared<Conv2d>(in_channels, widths[0], 3, 1, 1, false, gen);
  stem_bn_ = std::make_shared<BatchNorm2d>(widths[0]);
  // A Sequential only for the parameter names; forward runs the two with the relu fused.
  register_module("stem", std::make_shared<Sequential>())->add(stem_conv_).add(stem_bn_);
  int64_t prev = widths[0];
  for (size_t s = 0; s < widths.size(); ++s) {
    for (int64_t b = 0; b < blocks_per_stage; ++b) {
      int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      auto blk = std::make_shared<Block>(prev, widths[s], stride, gen);
      register_module("blocks." + std::to_string(blocks_.size()), blk);
      blocks_.push_back(blk);
      prev = widths[s];
    }
  }
  head_ = register_module("head", std::make_shared<Linear>(prev, classes, true, gen));
}
Tensor ResNet::forward(const Tensor& x) {
  Tensor h = stem_bn_->forward_relu(stem_conv_->forward(x));
  for (auto& b : blocks_) h = b->forward(h);
  h = mean(h, {2, 3});  // global average pooling
  return head_->forward(h);
}

Gpt::Gpt(const GptConfig& cfg, Generator& gen) : cfg_(cfg) {
  if (cfg.vocab <= 0 || cfg.context <= 0 || cfg.layers <= 0 || cfg.dim <= 0)
    fail("[gpt] vocab, context, layers and width must be positive");
  wte_ = register_module("wte", std::make_shared<Embedding>(cfg.vocab, cfg.dim, gen));
  wpe_ = register_module("wpe", std::make_shared<Embedding>(cfg.context, cfg.dim, gen));
  drop_ = register_module("drop", std::make_shared<Dropout>(cfg.dropout));
  for (int64_t l = 0; l < cfg.layers; ++l)
    blocks_.push_back(
        register_module("blocks." + std::to_string(l),
                        std::make_shared<TransformerBlock>(cfg.dim, cfg.heads, cfg.dropout, gen)));
  ln_f_ = register_module("ln_f", std::make_shared<LayerNorm>(cfg.dim));
  // GPT-2 initialisation: N(0, 0.02) for weights, zero biases, residual projections scaled.
  std::map<Tensor*, double> residual;
  for (auto& b : blocks_)
    for (Linear* l : b->residual_projections())
      residual[&l->weight()] = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.layers));
  std::vector<std::pair<std::string, Tensor*>> params = named_parameters();
  std::map<std::string, Tensor> init;
  for (auto& [name, p] : params) {
    bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    bool is_norm = name.find("ln") != std::string::npos;
    if (is_norm)
      init[name] = *p;
    else if (is_bias)
      init[name] = constant(p->shape(), 0.0);
    else
      init[name] = normal_init(p->shape(), residual.count(p) ? residual[p] : 0.02, gen);
  }
  for (auto& [name, b] : named_buffers()) init[name] = *b;
  load_state_dict(init);
}

Tensor Gpt::forward(const Tensor& ids) {
  if (ids.ndim() != 2) fail("[gpt] expected token ids (B, T), got ", shape_str(ids.shape()));
  const int64_t T = ids.shape()[1];
  if (T > cfg_.context) fail("[gpt] sequence length ", T, " exceeds the context of ", cfg_.context);
  Tensor pos = arange(0, static_cast<double>(T), 1, Dtype::i64);
  Tensor h = drop_->forward(wte_->forward(ids) + wpe_->forward(pos));
  for (auto& b : blocks_) h = b->forward(h);
  h = ln_f_->forward(h);
  return matmul(h, transpose(wte_->weight(), 0, 1));  // tied head
}

}  // namespace hetrain::nn
