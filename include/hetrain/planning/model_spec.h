// Model descriptions for the planner: parameter counts from the exact architecture, FLOPs
// per sample and activation bytes per layer.
//
//   auto m = hetrain::planning::preset("llama-7b");
//   int64_t n = m.params();                  // 6'738'415'616
//   double f = m.forward_flops_per_sample(); // one sequence of m.tf.seq tokens
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace hetrain::planning {

enum class ModelFamily { gpt, llama, bert, vit, convnet };
enum class Norm { layernorm, rmsnorm };
enum class MlpKind { gelu, swiglu };
enum class Recompute { none, selective, full };
/// Whose engine lays out the activations: Megatron-LM's (Korthikanti et al. 2022: 16-bit
/// tensors, 1-byte dropout masks) or Hetrain's own (its presets: fp32 masks, flash-style
/// attention, the backward's working set; see hetrain_activation_bytes).
enum class Engine { megatron, hetrain };

/// A transformer by its hyper-parameters (GPT, LLaMA, BERT, ViT are all this).
struct TransformerSpec {
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0;
  int64_t seq = 0;            // tokens per sample (ViT: patches + class token)
  int64_t vocab = 0;          // 0 for ViT
  int64_t ffn_hidden = 0;     // MLP inner size
  int64_t max_positions = 0;  // learned position table rows; 0 for RoPE
  Norm norm = Norm::layernorm;
  MlpKind mlp = MlpKind::gelu;
  bool bias = true;  // linear layers carry biases
  bool tied_embeddings = true;
  bool final_norm = true;       // a norm after the last block (pre-LN models)
  int64_t token_types = 0;      // BERT segment embeddings
  bool embedding_norm = false;  // BERT: LayerNorm after the embeddings
  bool pooler = false;          // BERT pooler (hidden x hidden + bias)
  bool dropout = true;          // dropout masks are stored for backward
  bool lm_head = true;          // logits over the vocabulary at every position
  // ViT patch embedding and classifier.
  int64_t image = 0, patch = 0, channels = 0, classes = 0;
};

/// One layer of a conv net; sizes are for one sample at the preset's image size.
struct ConvLayer {
  /// batchnorm: a BatchNorm (with the ReLU after it, if any); activation: an elementwise
  /// function on its own (an MLP's ReLU, a residual add).
  enum class Kind { conv, batchnorm, linear, activation } kind = Kind::conv;
  int64_t in = 0, out = 0, kernel = 1, stride = 1;
  int64_t out_h = 1, out_w = 1;  // spatial size of the output
  bool bias = false;
  int block = 0;  // residual block index (for recompute by block)
};

struct ConvNetSpec {
  int64_t image = 224, channels = 3;
  std::vector<ConvLayer> layers;
  /// The exact parameter count when the layers do not give it (a graph read from a file,
  /// whose layers describe work; its embeddings, biases and norms hold parameters too).
  std::optional<int64_t> params;
};

/// Split of the parameters, used to place them on pipeline stages.
struct ParamLayout {
  int64_t embedding = 0;  // first stage
  int64_t per_layer = 0;  // each transformer block
  int64_t head = 0;       // last stage: final norm, untied LM head, pooler, classifier
  int64_t total = 0;
};

struct ModelSpec {
  std::string name;
  ModelFamily family = ModelFamily::gpt;
  TransformerSpec tf;
  ConvNetSpec conv;
  Engine engine = Engine::megatron;

  bool is_transformer() const { return family != ModelFamily::convnet; }
  int64_t params() const { return layout().total; }
  ParamLayout layout() const;
  /// Tokens in one sample (a sequence, or an image's patches; 1 for a conv net's image).
  int64_t tokens_per_sample() const { return is_transformer() ? tf.seq : 1; }
  /// Forward FLOPs of one sample: 2 per multiply-add of every matmul/conv, plus the
  /// attention score and value products (4·s²·h per layer, causal masking not discounted,
  /// as Megatron-LM counts them).
  double forward_flops_per_sample() const;
  /// Forward FLOPs of the attention core (QKᵀ and attention·V) of one sample: what
  /// selective recompute runs again.
  double attention_core_flops_per_sample() const;
  /// Validates the hyper-parameters; throws Error naming the field.
  void check() const;
};

/// Preset ids (kebab case) in a stable order.
const std::vector<std::string>& preset_ids();
/// A preset by id; throws Error listing the ids for an unknown one.
ModelSpec preset(const std::string& id);
/// A multi-layer perceptron over flattened inputs: Linear (+bias) and ReLU per hidden layer,
/// then a Linear classifier (Hetrain's `mlp` model).
ModelSpec mlp_model(int64_t inputs, const std::vector<int64_t>& hidden, int64_t classes);
/// Hetrain's small ResNet (`cnn`): 3x3 conv-BN-ReLU stem, per stage `blocks` residual blocks
/// of two 3x3 conv-BN (1x1 conv-BN shortcut where the shape changes, stride 2 entering
/// each stage after the first), global average pooling, Linear classifier.
ModelSpec small_resnet(int64_t channels, int64_t image, const std::vector<int64_t>& widths,
                       int64_t blocks, int64_t classes);
/// A GPT-2-style model (learned positions, LayerNorm, GELU 4h MLP, biases, tied embeddings).
ModelSpec gpt_model(int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t vocab);

/// Activation bytes one transformer layer keeps for backward, for `micro_batch` samples,
/// with 16-bit activations and 1-byte dropout masks. Generalises Korthikanti et al. 2022
/// ("Reducing Activation Recomputation in Large Transformer Models", Table 2):
/// sbh(U + S/t) + A·a·s²·b/t, where for GPT U = 10, S = 24, A = 5, giving sbh(34 + 5as/h)
/// at t = 1. With sequence parallelism U is divided by t too. Selective recompute drops
/// the A term; full recompute keeps only the layer input (2sbh, /t with sequence parallel).
double transformer_layer_activation_bytes(const TransformerSpec& tf, int64_t micro_batch,
                                          int64_t tp, bool sequence_parallel, Recompute rc);

/// Elementwise passes of one transformer layer as Hetrain's engine runs it unfused, in tensor
/// widths per token (multiply by tokens and element bytes for bytes moved). Forward: two norms
/// (read, write), two residual adds (two reads, a write), the activation (GELU: read, write;
/// SwiGLU: two reads, a write), the bias adds (read, write) and dropout (read, write, mask).
/// Backward: the norms (read the input and the gradient, write), the residual gradients' sums,
/// the activation (GELU: two reads, a write; SwiGLU: three reads, two writes), the bias
/// gradients (a read) and dropout. Columns split by tensor parallelism divide by tp; the
/// (tokens x hidden) ones only with sequence parallelism. The attention core is not included.
struct ElementwisePasses {
  double forward = 0, backward = 0;
};
ElementwisePasses transformer_elementwise_passes(const TransformerSpec& tf, int64_t tp,
                                                 bool sequence_parallel);

/// Activation bytes of a conv net for `micro_batch` images (16-bit): each conv/BN/linear
/// output is kept (BN input and ReLU output); with full recompute only block inputs plus
/// the largest block's activations.
double convnet_activation_bytes(const ConvNetSpec& c, int64_t micro_batch, Recompute rc);

/// Activation bytes of a whole model as Hetrain's engine runs it without recompute (fp32:
/// `elem` = 4 bytes; 16-bit autocast approximated with 2), for `micro_batch` samples: the peak
/// of its activations over a step, which its memory model (training/memory_plan.h) predicts
/// from the graph. Transformer (GPT): per layer the block's input, both norms' outputs, the
/// residual sum, Q, K, V, attention's output, the MLP's inner input and GELU output and two
/// dropout masks in the activation dtype, sbh(6 + 2kv/h + 2f/h + 2m), plus per token f32
/// statistics: two norms' mean and 1/std and attention's log-sum-exp per head, 4sb(4 + a)
/// (flash-style attention: no s x s scores); then the last block's output, the final norm's
/// output, the embedding's dropout mask and the backward's working set at the last block's
/// MLP (the gradients of its inner activations and of the residual stream, the loss's f32
/// gradient over the vocabulary, 4sbV, held until the tied embedding's gradient is formed):
/// sbh(3 + f/h + m) + 4sbV. Conv net: each conv/BN/linear/activation output but a BN's that
/// feeds a residual sum (the sum's gradient passes through), plus twice the largest output
/// (the gradient arriving at a layer and the one leaving it).
double hetrain_activation_bytes(const ModelSpec& m, int64_t micro_batch, double elem);

/// The peak of live bytes over one of Hetrain's f32 training steps on one of `ranks` data-parallel
/// ranks under ZeRO stage `zero` (0..3), for `params` parameters (W = G = 4 bytes each, AdamW's
/// state O = 8) and an activation peak `activations` (hetrain_activation_bytes). It is the
/// largest of three moments, as the allocator's at_peak_bytes shows them (training/trainer's
/// JSON log): the end of the forward (the activations at their peak, with stage 2's bucket
/// buffers and stage 3's gathered parameters); the end of the backward (every bucket's exchange
/// buffer, plus stages 2-3's accumulation buffer, next to the backward's own gradient tensors,
/// which stage 3 has let go before it reduces); and the update (new parameter and state values
/// evaluated before the old ones go). Bucket sizes are the trainer's defaults (25 MiB, the first
/// 1 MiB); stage 3 gathers at most three buckets at a time. One rank is the single-process step.
/// Under offload (training/offload.h) it is the state device's peak: offload_optimizer moves the
/// optimizer state and the update to the host (the updated values are copied into the device's
/// buffers in place), offload_params (stage 3) the parameter shards too; the gradient buffers
/// and the gathered parameters stay on the device.
double hetrain_step_peak_bytes(double params, int ranks, int zero, double activations,
                               bool offload_optimizer = false, bool offload_params = false);

const char* to_string(Recompute r);
Recompute recompute_from_string(const std::string& s);

}  // namespace hetrain::planning
