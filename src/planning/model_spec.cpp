#include "hetrain/planning/model_spec.h"

#include <algorithm>
#include <map>

#include "hetrain/base/error.h"

namespace hetrain::planning {

namespace {

/// Parameter counts in int64 with overflow checks: absurd sizes (--hidden 1e9) are an error,
/// not a negative count that "fits".
[[noreturn]] void overflow() {
  fail("[plan] the model's sizes are too large: its parameter count overflows 64-bit integers");
}
int64_t mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}
int64_t mul(int64_t a, int64_t b, int64_t c) { return mul(mul(a, b), c); }
int64_t add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}

int64_t norm_params(const TransformerSpec& t) {
  return t.norm == Norm::layernorm ? mul(2, t.hidden) : t.hidden;
}

int64_t head_dim(const TransformerSpec& t) { return t.hidden / t.heads; }
int64_t kv_width(const TransformerSpec& t) { return mul(t.kv_heads, head_dim(t)); }

// Weights of the matmuls in one block (no biases): what costs 2 FLOPs per token each.
int64_t block_matmul_weights(const TransformerSpec& t) {
  int64_t h = t.hidden, kv = kv_width(t), f = t.ffn_hidden;
  int64_t attn = add(add(mul(h, h), mul(2, h, kv)), mul(h, h));
  int64_t mlp = mul(t.mlp == MlpKind::swiglu ? 3 : 2, h, f);
  return add(attn, mlp);
}

int64_t block_params(const TransformerSpec& t) {
  int64_t h = t.hidden, kv = kv_width(t), f = t.ffn_hidden;
  int64_t p = add(block_matmul_weights(t), mul(2, norm_params(t)));
  if (t.bias) {
    p = add(p, add(mul(2, h), mul(2, kv)));                        // q, k, v, out
    p = add(p, add(t.mlp == MlpKind::swiglu ? mul(2, f) : f, h));  // mlp in (and gate), out
  }
  return p;
}

// ResNet (torchvision v1.5: stride on the 3x3 conv) from its blocks per stage.
ConvNetSpec resnet(const std::vector<int>& blocks, int64_t classes) {
  ConvNetSpec c;
  int64_t hw = 224;
  auto conv = [&](int64_t in, int64_t out, int64_t k, int64_t stride, int block) {
    hw = (hw + stride - 1) / stride;
    c.layers.push_back({ConvLayer::Kind::conv, in, out, k, stride, hw, hw, false, block});
    c.layers.push_back({ConvLayer::Kind::batchnorm, out, out, 1, 1, hw, hw, false, block});
  };
  int block = 0;
  conv(3, 64, 7, 2, block);  // stem: 112x112
  hw = 56;                   // 3x3 max-pool, stride 2
  int64_t in = 64;
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    for (int b = 0; b < blocks[stage]; ++b) {
      ++block;
      int64_t w = widths[stage], out = 4 * w;
      int64_t stride = (b == 0 && stage > 0) ? 2 : 1;
      int64_t hw_in = hw;
      conv(in, w, 1, 1, block);
      conv(w, w, 3, stride, block);
      conv(w, out, 1, 1, block);
      if (b == 0) {  // projection shortcut
        int64_t keep = hw;
        hw = hw_in;
        conv(in, out, 1, stride, block);
        hw = keep;
      }
      in = out;
    }
  }
  ++block;
  c.layers.push_back({ConvLayer::Kind::linear, in, classes, 1, 1, 1, 1, true, block});
  return c;
}

}  // namespace

ModelSpec mlp_model(int64_t inputs, const std::vector<int64_t>& hidden, int64_t classes) {
  ModelSpec m;
  m.name = "mlp";
  m.family = ModelFamily::convnet;
  m.conv.image = 1;
  m.conv.channels = inputs;
  int64_t in = inputs;
  int block = 0;
  for (int64_t h : hidden) {
    m.conv.layers.push_back({ConvLayer::Kind::linear, in, h, 1, 1, 1, 1, true, block});
    m.conv.layers.push_back({ConvLayer::Kind::activation, h, h, 1, 1, 1, 1, false, block});
    in = h, ++block;
  }
  m.conv.layers.push_back({ConvLayer::Kind::linear, in, classes, 1, 1, 1, 1, true, block});
  return m;
}

ModelSpec small_resnet(int64_t channels, int64_t image, const std::vector<int64_t>& widths,
                       int64_t blocks, int64_t classes) {
  if (widths.empty() || blocks < 1 || channels < 1 || image < 1 || classes < 1)
    fail("[plan] small ResNet needs widths, blocks >= 1, channels, image size and classes");
  ModelSpec m;
  m.name = "resnet-small";
  m.family = ModelFamily::convnet;
  ConvNetSpec& c = m.conv;
  c.image = image, c.channels = channels;
  int64_t hw = image;
  int block = 0;
  auto conv_bn = [&](int64_t in, int64_t out, int64_t k, int64_t stride, int64_t at) {
    int64_t o = (at + stride - 1) / stride;
    c.layers.push_back({ConvLayer::Kind::conv, in, out, k, stride, o, o, false, block});
    c.layers.push_back({ConvLayer::Kind::batchnorm, out, out, 1, 1, o, o, false, block});
    return o;
  };
  conv_bn(channels, widths[0], 3, 1, hw);
  int64_t in = widths[0];
  for (size_t s = 0; s < widths.size(); ++s) {
    for (int64_t b = 0; b < blocks; ++b) {
      ++block;
      int64_t stride = (s > 0 && b == 0) ? 2 : 1, w = widths[s];
      int64_t out_hw = conv_bn(in, w, 3, stride, hw);
      conv_bn(w, w, 3, 1, out_hw);
      if (stride != 1 || in != w) conv_bn(in, w, 1, stride, hw);
      // residual add and the ReLU after it
      c.layers.push_back({ConvLayer::Kind::activation, w, w, 1, 1, out_hw, out_hw, false, block});
      hw = out_hw, in = w;
    }
  }
  ++block;
  c.layers.push_back({ConvLayer::Kind::linear, in, classes, 1, 1, 1, 1, true, block});
  return m;
}

namespace {

ModelSpec llama(const std::string& name, int64_t layers, int64_t hidden, int64_t heads,
                int64_t kv_heads, int64_t ffn, int64_t seq) {
  ModelSpec m;
  m.name = name;
  m.family = ModelFamily::llama;
  auto& t = m.tf;
  t.layers = layers, t.hidden = hidden, t.heads = heads, t.kv_heads = kv_heads;
  t.ffn_hidden = ffn, t.seq = seq, t.vocab = 32000, t.max_positions = 0;
  t.norm = Norm::rmsnorm, t.mlp = MlpKind::swiglu, t.bias = false, t.tied_embeddings = false;
  t.dropout = false;
  return m;
}

ModelSpec encoder(const std::string& name, ModelFamily fam, int64_t layers, int64_t hidden,
                  int64_t heads) {
  ModelSpec m;
  m.name = name;
  m.family = fam;
  auto& t = m.tf;
  t.layers = layers, t.hidden = hidden, t.heads = heads, t.kv_heads = heads;
  t.ffn_hidden = mul(4, hidden);
  return m;
}

}  // namespace

ModelSpec gpt_model(int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t vocab) {
  ModelSpec m;
  m.name = "gpt";
  m.family = ModelFamily::gpt;
  auto& t = m.tf;
  t.layers = layers, t.hidden = hidden, t.heads = heads, t.kv_heads = heads;
  t.seq = seq, t.vocab = vocab, t.ffn_hidden = mul(4, hidden), t.max_positions = seq;
  return m;
}

const std::vector<std::string>& preset_ids() {
  static const std::vector<std::string> ids = {
      "gpt2-124m",  "gpt2-350m", "gpt2-774m",   "gpt2-1.5b",  "gpt3-175b", "llama-7b",
      "llama-13b",  "llama-65b", "llama-70b",   "bert-large", "vit-l16",   "resnet-50",
      "resnet-152", "gpt-mini",  "fashion-mlp", "fashion-cnn"};
  return ids;
}

ModelSpec preset(const std::string& id) {
  ModelSpec m;
  if (id == "gpt2-124m") {
    m = gpt_model(12, 768, 12, 1024, 50257);
  } else if (id == "gpt2-350m") {
    m = gpt_model(24, 1024, 16, 1024, 50257);
  } else if (id == "gpt2-774m") {
    m = gpt_model(36, 1280, 20, 1024, 50257);
  } else if (id == "gpt2-1.5b") {
    m = gpt_model(48, 1600, 25, 1024, 50257);
  } else if (id == "gpt3-175b") {
    m = gpt_model(96, 12288, 96, 2048, 50257);
  } else if (id == "llama-7b") {
    m = llama(id, 32, 4096, 32, 32, 11008, 2048);
  } else if (id == "llama-13b") {
    m = llama(id, 40, 5120, 40, 40, 13824, 2048);
  } else if (id == "llama-65b") {
    m = llama(id, 80, 8192, 64, 64, 22016, 2048);
  } else if (id == "llama-70b") {  // LLaMA-2 70B: grouped-query attention, 8 KV heads
    m = llama(id, 80, 8192, 64, 8, 28672, 4096);
  } else if (id == "bert-large") {
    m = encoder(id, ModelFamily::bert, 24, 1024, 16);
    auto& t = m.tf;
    t.seq = 512, t.vocab = 30522, t.max_positions = 512, t.token_types = 2;
    t.embedding_norm = true, t.final_norm = false, t.pooler = true;
  } else if (id == "vit-l16") {
    m = encoder(id, ModelFamily::vit, 24, 1024, 16);
    auto& t = m.tf;
    t.image = 224, t.patch = 16, t.channels = 3, t.classes = 1000;
    t.seq = (224 / 16) * (224 / 16) + 1, t.max_positions = t.seq, t.lm_head = false;
    t.tied_embeddings = false;
  } else if (id == "resnet-50" || id == "resnet-152") {
    m.family = ModelFamily::convnet;
    m.conv = resnet(
        id == "resnet-50" ? std::vector<int>{3, 4, 6, 3} : std::vector<int>{3, 8, 36, 3}, 1000);
  } else if (id == "gpt-mini") {  // Hetrain's own presets (hetrain train --preset), its engine
    m = gpt_model(4, 128, 4, 64, 256);
    m.tf.dropout = false;
    m.engine = Engine::hetrain;
  } else if (id == "fashion-mlp") {
    m = mlp_model(784, {512, 256}, 10);
    m.engine = Engine::hetrain;
  } else if (id == "fashion-cnn") {
    m = small_resnet(1, 28, {16, 32, 64}, 1, 10);
    m.engine = Engine::hetrain;
  } else {
    std::string all;
    for (const auto& p : preset_ids()) all += (all.empty() ? "" : ", ") + p;
    fail("[plan] unknown preset '", id, "'; expected one of: ", all);
  }
  m.name = id;
  return m;
}

ParamLayout ModelSpec::layout() const {
  ParamLayout l;
  if (!is_transformer()) {
    for (const auto& c : conv.layers) {
      if (c.kind == ConvLayer::Kind::conv)
        l.per_layer = add(l.per_layer, mul(mul(c.kernel, c.kernel), c.in, c.out));
      if (c.kind == ConvLayer::Kind::batchnorm) l.per_layer = add(l.per_layer, mul(2, c.out));
      if (c.kind == ConvLayer::Kind::linear)
        l.head = add(l.head, add(mul(c.in, c.out), c.bias ? c.out : 0));
    }
    if (conv.params) l.per_layer = 0, l.head = *conv.params;
    l.total = add(l.per_layer, l.head);
    return l;
  }
  const auto& t = tf;
  int64_t h = t.hidden;
  if (family == ModelFamily::vit) {  // patch conv + bias, cls token
    l.embedding = add(mul(mul(t.channels, t.patch), t.patch, h), mul(2, h));
  } else {
    l.embedding = mul(t.vocab, h);
  }
  l.embedding = add(l.embedding, add(mul(t.max_positions, h), mul(t.token_types, h)));
  if (t.embedding_norm) l.embedding = add(l.embedding, norm_params(t));
  l.per_layer = block_params(t);
  if (t.final_norm) l.head = add(l.head, norm_params(t));
  if (t.lm_head && !t.tied_embeddings) l.head = add(l.head, mul(t.vocab, h));
  if (t.pooler) l.head = add(l.head, add(mul(h, h), h));
  if (t.classes > 0) l.head = add(l.head, add(mul(h, t.classes), t.classes));
  l.total = add(add(l.embedding, mul(t.layers, l.per_layer)), l.head);
  return l;
}

double ModelSpec::forward_flops_per_sample() const {
  if (!is_transformer()) {
    double f = 0;
    for (const auto& c : conv.layers) {
      if (c.kind == ConvLayer::Kind::conv)
        f += 2.0 * c.kernel * c.kernel * c.in * c.out * c.out_h * c.out_w;
      if (c.kind == ConvLayer::Kind::linear) f += 2.0 * c.in * c.out;
    }
    return f;
  }
  const auto& t = tf;
  double s = static_cast<double>(t.seq);
  double f = 2.0 * s * t.layers * block_matmul_weights(t) + attention_core_flops_per_sample();
  if (t.lm_head) f += 2.0 * s * t.hidden * t.vocab;
  if (family == ModelFamily::vit) {
    f += 2.0 * (s - 1) * t.channels * t.patch * t.patch * t.hidden;  // patch embedding
    f += 2.0 * t.hidden * t.classes;
  }
  return f;
}

double ModelSpec::attention_core_flops_per_sample() const {
  if (!is_transformer()) return 0;
  double s = static_cast<double>(tf.seq);
  return 4.0 * s * s * tf.hidden * tf.layers;
}

void ModelSpec::check() const {
  if (!is_transformer()) {
    if (conv.layers.empty()) fail("[plan] conv net '", name, "' has no layers");
    (void)layout();  // throws when the parameter count overflows
    return;
  }
  const auto& t = tf;
  auto positive = [&](int64_t v, const char* field) {
    if (v <= 0) fail("[plan] model ", field, " must be positive, got ", v);
  };
  positive(t.layers, "--layers");
  positive(t.hidden, "--hidden");
  positive(t.heads, "--heads");
  positive(t.seq, "--seq");
  positive(t.ffn_hidden, "ffn hidden size");
  if (t.lm_head) positive(t.vocab, "--vocab");
  if (t.hidden % t.heads != 0)
    fail("[plan] --heads ", t.heads, " does not divide --hidden ", t.hidden);
  if (t.kv_heads <= 0 || t.heads % t.kv_heads != 0)
    fail("[plan] KV heads ", t.kv_heads, " must divide the ", t.heads, " attention heads");
  if (t.max_positions > 0 && t.max_positions < t.seq)
    fail("[plan] --seq ", t.seq, " exceeds the ", t.max_positions, " learned positions");
  (void)layout();  // throws when the parameter count overflows
}

ElementwisePasses transformer_elementwise_passes(const TransformerSpec& tf, int64_t tp,
                                                 bool sequence_parallel) {
  const double t = static_cast<double>(tp), h = static_cast<double>(tf.hidden);
  const double kv = static_cast<double>(tf.kv_heads) * h / static_cast<double>(tf.heads);
  const double hs = h / (sequence_parallel ? t : 1), q3 = (h + 2 * kv) / t;
  const double fi = static_cast<double>(tf.ffn_hidden) / t;
  const bool swiglu = tf.mlp == MlpKind::swiglu;
  const double fo = swiglu ? 2 * fi : fi;  // width of the MLP's first projection
  ElementwisePasses e;
  e.forward = 2 * 2 * hs + 2 * 3 * hs + (swiglu ? 3 : 2) * fi;
  e.backward = 2 * 3 * hs + 2 * 3 * hs + (swiglu ? 5 : 3) * fi;
  if (tf.bias) e.forward += 2 * (q3 + fo + 2 * hs), e.backward += q3 + fo + 2 * hs;
  if (tf.dropout) e.forward += 2 * 3 * hs, e.backward += 2 * 3 * hs;
  return e;
}

double transformer_layer_activation_bytes(const TransformerSpec& t, int64_t b, int64_t tp, bool sp,
                                          Recompute rc) {
  double s = static_cast<double>(t.seq), h = static_cast<double>(t.hidden);
  double a = static_cast<double>(t.heads), sbh = s * static_cast<double>(b) * h;
  double tpd = static_cast<double>(tp);
  if (rc == Recompute::full) return 2.0 * sbh / (sp ? tpd : 1.0);
  double mask = t.dropout ? 1.0 : 0.0;
  // Not split by tensor parallelism: both norm inputs (2+2), the QKV and MLP inputs (2+2),
  // two dropout masks (1+1).
  double unsplit = 8.0 + 2.0 * mask;
  double kv = static_cast<double>(kv_width(t)) / h, f = static_cast<double>(t.ffn_hidden) / h;
  // Split: Q, K, V (2 each, K and V narrower under GQA), the out-projection input (2),
  // the MLP's inner activations (GELU: its input and output; SwiGLU: gate, up, SiLU, product).
  double split = 2.0 + 4.0 * kv + 2.0 + (t.mlp == MlpKind::swiglu ? 8.0 : 4.0) * f;
  // Attention scores: softmax output (2), its dropout mask (1) and dropout output (2).
  double scores = 2.0 + 3.0 * mask;
  double bytes = sbh * (unsplit / (sp ? tpd : 1.0) + split / tpd);
  if (rc == Recompute::none) bytes += scores * a * s * s * static_cast<double>(b) / tpd;
  return bytes;
}

double convnet_activation_bytes(const ConvNetSpec& c, int64_t b, Recompute rc) {
  // Per block: bytes kept for backward, and the block's input.
  std::map<int, double> kept, input;
  for (const auto& l : c.layers) {
    double out = 2.0 * static_cast<double>(l.out * l.out_h * l.out_w) * static_cast<double>(b);
    kept[l.block] += out;
    if (!input.count(l.block)) input[l.block] = out;  // approximates the block input size
  }
  double total = 0, largest = 0, inputs = 0;
  for (const auto& [blk, bytes] : kept) {
    total += bytes;
    largest = std::max(largest, bytes);
    inputs += input[blk];
  }
  return rc == Recompute::full ? inputs + largest : total;
}

double hetrain_activation_bytes(const ModelSpec& m, int64_t b, double e) {
  const double bd = static_cast<double>(b);
  if (m.is_transformer()) {
    const TransformerSpec& t = m.tf;
    const double s = static_cast<double>(t.seq), h = static_cast<double>(t.hidden);
    const double sbh = s * bd * h, sb = s * bd, mask = t.dropout ? 1.0 : 0.0;
    const double kv = static_cast<double>(kv_width(t)) / h,
                 f = static_cast<double>(t.ffn_hidden) / h;
    const double layer = e * sbh * (6.0 + 2.0 * kv + 2.0 * f + 2.0 * mask) +
                         4.0 * sb * (4.0 + static_cast<double>(t.heads));
    const double logits = t.lm_head ? 4.0 * sb * static_cast<double>(t.vocab) : 0.0;
    return static_cast<double>(t.layers) * layer + e * sbh * (3.0 + f + mask) + logits;
  }
  double kept = 0, largest = 0;
  std::map<int, int> norms;  // BatchNorms seen per residual block
  for (const ConvLayer& l : m.conv.layers) {
    const double out = e * static_cast<double>(l.out * l.out_h * l.out_w) * bd;
    largest = std::max(largest, out);
    // In a residual block (not the stem, block 0) the BatchNorms after the first feed the sum.
    const bool into_sum =
        l.kind == ConvLayer::Kind::batchnorm && l.block > 0 && norms[l.block]++ > 0;
    if (!into_sum) kept += out;
  }
  return kept + 2.0 * largest;
}

double hetrain_step_peak_bytes(double params, int ranks, int zero, double activations,
                               bool offload_optimizer, bool offload_params) {
  const double N = std::max(ranks, 1), W = 4 * params, G = W, O = 8 * params;
  const double bucket = 25.0 * 1024 * 1024, first_bucket = 1.0 * 1024 * 1024;
  if (N == 1) zero = 0;  // one rank: nothing is sharded, nothing exchanged
  // Live through the step: the model states of this stage (on the device: less the offloaded).
  const double weights = offload_params ? 0
                         : zero >= 3    ? W / N
                                        : W,
               grads = zero >= 2 ? G / N : G,
               state = offload_optimizer ? 0
                       : zero >= 1       ? O / N
                                         : O,
               states = weights + grads + state;
  // End of the forward. Stage 2 holds each bucket's accumulation buffer from its first gradient
  // on, and the first bucket's exchange starts early in the backward; stage 3 works on
  // gathered parameters.
  double forward = states + activations;
  if (zero == 2 && N > 1) forward += G + std::min(first_bucket, G);
  if (zero == 3) forward += std::min(W, 3 * bucket);
  // End of the backward: the exchange buffers (stages 0-1: receive; 2-3: accumulate and
  // receive); stages 0-2 still hold the backward's gradient tensors (copied into the buckets as
  // they appear, freed when the backward's evaluation ends).
  double backward = states;
  if (N > 1) backward += (zero >= 2 ? 2 : 1) * G + (zero <= 2 ? G : 0);
  // The update: stage 0 evaluates every new parameter and state value before the old go;
  // the sharded stages only their shard's.
  const double update = offload_optimizer ? states
                        : zero == 0       ? states + W + O
                                          : states + (W + O) / N;
  return std::max({forward, backward, update});
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
  }
  return "?";
}

Recompute recompute_from_string(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  fail("[plan] --recompute expects none|selective|full, got '", s, "'");
}

}  // namespace hetrain::planning
