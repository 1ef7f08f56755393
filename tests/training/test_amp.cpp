// Mixed precision: the autocast policy (node dtypes), f32 master weights and their memory by
// tag, a bf16 step against the f32 one, and GradScaler against PyTorch's
// torch.amp.GradScaler (tests/data/grad_scaler_reference.json, from
// tools/gen_grad_scaler_reference.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hetrain/base/error.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/autocast.h"
#include "hetrain/graph/autodiff.h"
#include "hetrain/graph/primitive.h"
#include "hetrain/memory/allocator.h"
#include "hetrain/training/amp.h"
#include "hetrain/training/nn.h"
#include "hetrain/training/optim.h"

using namespace hetrain;
using amp::Autocast;
using amp::CastPolicy;
using amp::Precision;

namespace {

std::string prim_name(const Tensor& t) { return t.node()->prim ? t.node()->prim->name() : "leaf"; }

/// Dtypes of the inputs of the node that produced t.
std::vector<Dtype> input_dtypes(const Tensor& t) {
  std::vector<Dtype> r;
  for (const auto& i : t.node()->inputs) r.push_back(i.dtype());
  return r;
}

/// ||a - b|| / ||b||.
double rel_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

// ---- the policy ------------------------------------------------------------------------------

TEST(Autocast, PolicyTable) {
  EXPECT_EQ(amp::cast_policy("matmul"), CastPolicy::low_precision);
  EXPECT_EQ(amp::cast_policy("conv2d"), CastPolicy::low_precision);
  EXPECT_EQ(amp::cast_policy("sdpa"), CastPolicy::low_precision);
  for (const char* f32 :
       {"softmax", "log_softmax", "layer_norm", "rms_norm", "cross_entropy", "sum", "exp", "log"})
    EXPECT_EQ(amp::cast_policy(f32), CastPolicy::f32) << f32;
  // batch_norm2d follows: its kernel computes in f32 whatever its input (below).
  for (const char* follow :
       {"add", "mul", "relu", "gelu_tanh", "reshape", "max", "cast", "batch_norm2d"})
    EXPECT_EQ(amp::cast_policy(follow), CastPolicy::follow) << follow;
  // One entry per primitive.
  auto table = amp::autocast_table();
  for (size_t i = 0; i < table.size(); ++i)
    for (size_t j = i + 1; j < table.size(); ++j) EXPECT_NE(table[i].primitive, table[j].primitive);
  EXPECT_EQ(amp::precision_from_name("bf16"), Precision::bf16);
  EXPECT_EQ(amp::compute_dtype(Precision::fp16), Dtype::f16);
  try {
    amp::precision_from_name("fp8");
    FAIL() << "no error for fp8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown precision 'fp8'; expected fp32, bf16 or fp16"),
              std::string::npos)
        << e.what();
  }
}

TEST(Autocast, NodeDtypesFollowThePolicy) {
  Tensor x = randn({4, 8});
  Tensor w = randn({8, 6}).requires_grad_();
  Tensor gamma = ones({6}).requires_grad_(), beta = zeros({6}).requires_grad_();
  Tensor targets = from_vector<int64_t>({0, 5, 2, 3}, {4});
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    const Dtype low = amp::compute_dtype(p);
    Autocast scope(p);
    EXPECT_EQ(Autocast::current(), p);
    Tensor y = matmul(x, w);
    EXPECT_EQ(prim_name(y), "matmul");
    EXPECT_EQ(y.dtype(), low);
    EXPECT_EQ(input_dtypes(y), (std::vector<Dtype>{low, low}));
    // The casts are graph nodes over the f32 originals.
    EXPECT_EQ(prim_name(y.node()->inputs[1]), "cast");
    EXPECT_EQ(y.node()->inputs[1].node()->inputs[0].node(), w.node());

    Tensor s = softmax(y, -1);
    EXPECT_EQ(s.dtype(), Dtype::f32);
    EXPECT_EQ(input_dtypes(s), std::vector<Dtype>{Dtype::f32});
    Tensor ls = log_softmax(y, -1);
    EXPECT_EQ(ls.dtype(), Dtype::f32);

    Tensor n = layer_norm(y, {6}, gamma, beta);
    EXPECT_EQ(prim_name(n), "layer_norm");
    EXPECT_EQ(n.dtype(), Dtype::f32);
    EXPECT_EQ(input_dtypes(n), (std::vector<Dtype>{Dtype::f32, Dtype::f32, Dtype::f32}));
    // The f32 weight reaches the f32 primitive as itself, not rounded through bf16/f16.
    EXPECT_EQ(n.node()->inputs[1].node(), gamma.node());

    Tensor loss = cross_entropy(y, targets);
    EXPECT_EQ(loss.dtype(), Dtype::f32);
    // Find the fused loss primitive under the mean and check what it ran in.
    std::vector<Tensor> todo{loss};
    bool seen = false;
    while (!todo.empty()) {
      Tensor t = todo.back();
      todo.pop_back();
      if (prim_name(t) == "cross_entropy") {
        EXPECT_EQ(t.node()->inputs[0].dtype(), Dtype::f32);
        seen = true;
      }
      for (const auto& i : t.node()->inputs) todo.push_back(i);
    }
    EXPECT_TRUE(seen);

    EXPECT_EQ(sum(y).dtype(), Dtype::f32);               // accumulating reduction
    EXPECT_EQ(relu(y).dtype(), low);                     // follows
    EXPECT_EQ((y + randn({4, 6})).dtype(), Dtype::f32);  // promotion, as PyTorch
    EXPECT_EQ(max(y).dtype(), low);
    EXPECT_EQ(linear(x, transpose(w, 0, 1), beta).dtype(), low);  // bias joins the product
    {
      Autocast off(Precision::fp32);
      EXPECT_EQ(matmul(x, w).dtype(), Dtype::f32);
    }
    EXPECT_EQ(Autocast::current(), p);
    // f64 is never lowered.
    EXPECT_EQ(matmul(x.detach(), w).dtype(), low);
    EXPECT_EQ(matmul(cast(x, Dtype::f64), cast(w, Dtype::f64)).dtype(), Dtype::f64);
  }
  EXPECT_EQ(Autocast::current(), Precision::fp32);
  EXPECT_EQ(matmul(x, w).dtype(), Dtype::f32);
}

TEST(Autocast, GradientsReachF32MasterWeights) {
  Tensor x = randn({16, 8});
  Tensor w = randn({5, 8}).requires_grad_(), b = zeros({5}).requires_grad_();
  Tensor t = from_vector<int64_t>(std::vector<int64_t>(16, 3), {16});
  Tensor loss;
  {
    Autocast scope(Precision::bf16);
    loss = cross_entropy(linear(x, w, b), t);
  }
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), Dtype::f32);
  EXPECT_EQ(b.grad().dtype(), Dtype::f32);
  EXPECT_EQ(w.dtype(), Dtype::f32);
}

// A linear layer's weight (matmul(x, wᵀ)) is cast as stored and read transposed; its gradient is
// one GEMM in the weight's own layout, cast to f32, with no transposed view a leaf would copy.
TEST(Autocast, TransposedWeightGradientComesInTheWeightsLayout) {
  Tensor x = randn({16, 8});
  Tensor w = randn({5, 8}).requires_grad_(), b = zeros({5}).requires_grad_();
  Tensor t = from_vector<int64_t>({0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0}, {16});
  std::vector<Tensor> g32 = grad({cross_entropy(linear(x, w, b), t)}, {w});
  Tensor y, g;
  {
    Autocast scope(Precision::bf16);
    y = linear(x, w, b);
    g = grad({cross_entropy(y, t)}, {w})[0];
  }
  // Forward: the product reads a transpose of the bf16 copy of w.
  const Tensor* prod = &y;
  while (prim_name(*prod) != "matmul") prod = &prod->node()->inputs[0];
  const Tensor& wt = prod->node()->inputs[1];
  ASSERT_EQ(prim_name(wt), "permute");
  ASSERT_EQ(prim_name(wt.node()->inputs[0]), "cast");
  EXPECT_EQ(wt.node()->inputs[0].node()->inputs[0].node(), w.node());
  // Backward: f32 from a (5, 8) product, not a view of an (8, 5) one.
  EXPECT_EQ(g.dtype(), Dtype::f32);
  ASSERT_EQ(prim_name(g), "cast");
  EXPECT_EQ(prim_name(g.node()->inputs[0]), "matmul");
  EXPECT_EQ(g.node()->inputs[0].shape(), (Shape{5, 8}));
  EXPECT_TRUE(g.array().contiguous());
  EXPECT_LT(rel_l2(g.to_vector<double>(), g32[0].to_vector<double>()), 2e-2);
}

// Reductions and GEMMs over bf16/f16 accumulate in f32: 4096 ones sum to 4096 (a bf16
// accumulator stalls at 256, an f16 one at 2048), with and without autocast.
TEST(Autocast, ReductionsAccumulateInF32) {
  for (Dtype dt : {Dtype::bf16, Dtype::f16}) {
    Tensor x = ones({4096}, dt);
    EXPECT_EQ(sum(x).dtype(), dt);
    EXPECT_EQ(sum(x).item<float>(), 4096.0f) << dtype_name(dt);
    EXPECT_EQ(matmul(ones({1, 4096}, dt), ones({4096, 1}, dt)).item<float>(), 4096.0f)
        << dtype_name(dt);
    Autocast scope(dt == Dtype::bf16 ? Precision::bf16 : Precision::fp16);
    EXPECT_EQ(sum(x).dtype(), Dtype::f32);
    EXPECT_EQ(sum(x).item<float>(), 4096.0f);
  }
}

// Batch norm under autocast keeps a conv's 16-bit output 16-bit, with f32 statistics: its
// output is the f32 batch norm of the same (16-bit) values, rounded once.
TEST(Autocast, BatchNormComputesInF32WithLowPrecisionInputAndOutput) {
  Generator gen(5);
  Tensor x32 = add(mul(randn({4, 3, 5, 7}, Dtype::f32, gen), full({}, 3.0)), full({}, 10.0));
  Tensor w = randn({3}, Dtype::f32, gen), b = randn({3}, Dtype::f32, gen);
  for (auto [p, dt, ulp] : {std::tuple{Precision::bf16, Dtype::bf16, 1.0 / 256},
                            std::tuple{Precision::fp16, Dtype::f16, 1.0 / 2048}}) {
    Tensor x = cast(x32, dt).eval();
    auto ref = batch_norm2d(cast(x, Dtype::f32), cast(cast(w, dt), Dtype::f32),
                            cast(cast(b, dt), Dtype::f32));
    Autocast scope(p);
    auto [y, mean, var] = batch_norm2d(x, w, b);
    ASSERT_EQ(y.dtype(), dt);
    ASSERT_EQ(mean.dtype(), Dtype::f32);
    EXPECT_NEAR(mean.to_vector<double>()[1], ref[1].to_vector<double>()[1], 1e-5);
    EXPECT_NEAR(var.to_vector<double>()[2], ref[2].to_vector<double>()[2], 1e-4);
    const auto got = y.to_vector<double>(), want = ref[0].to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], ulp * std::abs(want[i]) + 1e-6) << dtype_name(dt) << " " << i;
  }
}

// ---- a bf16 step against the f32 step -------------------------------------------------------

namespace {
struct StepResult {
  double loss;
  std::map<std::string, std::vector<double>> grads;
};
StepResult gpt_step(Precision p) {
  Generator init(7);
  nn::Gpt model({.vocab = 64, .context = 16, .layers = 2, .heads = 2, .dim = 32}, init);
  Generator data(11);
  Tensor ids = cast(rand({4, 16}, 0, 64, Dtype::f32, data), Dtype::i64);
  Tensor next = cast(rand({4, 16}, 0, 64, Dtype::f32, data), Dtype::i64);
  Tensor loss;
  {
    Autocast scope(p);
    Tensor logits = model.forward(ids);
    loss = cross_entropy(reshape(logits, {-1, 64}), reshape(next, {-1}));
  }
  EXPECT_EQ(loss.dtype(), Dtype::f32);
  loss.backward();
  StepResult r{loss.item<double>(), {}};
  for (auto& [name, t] : model.named_parameters()) {
    EXPECT_EQ(t->dtype(), Dtype::f32) << name;
    EXPECT_EQ(t->grad().dtype(), Dtype::f32) << name;
    r.grads[name] = t->grad().to_vector<double>();
  }
  return r;
}
}  // namespace

// bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%): the loss must agree with
// f32 to 1% and every gradient to 5% in relative L2 norm. fp16 (11 bits) to 0.5% / 2%.
TEST(Autocast, LowPrecisionStepCloseToF32) {
  StepResult f32 = gpt_step(Precision::fp32);
  for (auto [p, loss_tol, grad_tol] :
       {std::tuple{Precision::bf16, 1e-2, 5e-2}, std::tuple{Precision::fp16, 5e-3, 2e-2}}) {
    StepResult low = gpt_step(p);
    const std::string what(amp::precision_name(p));
    EXPECT_NEAR(low.loss, f32.loss, loss_tol * f32.loss) << what;
    EXPECT_NE(low.loss, f32.loss) << what << ": the low-precision path did not run";
    double worst = 0;
    std::string worst_name;
    for (auto& [name, g] : f32.grads) {
      double e = rel_l2(low.grads.at(name), g);
      if (e > worst) worst = e, worst_name = name;
      EXPECT_LT(e, grad_tol) << what << " gradient of " << name;
    }
    std::printf("%s: loss %.6f vs f32 %.6f, worst gradient rel. L2 error %.4f (%s)\n", what.c_str(),
                low.loss, f32.loss, worst, worst_name.c_str());
  }
}

// ---- master weights: memory by tag ----------------------------------------------------------

namespace {
struct TagBytes {
  int64_t parameters, gradients, optimizer_state, activation_peak;
};
TagBytes mlp_step(Precision p) {
  Generator init(3);
  // A large batch: activations, not the weight gradients, decide the activation peak.
  auto model = nn::make_mlp(256, {256, 256}, 10, init);
  optim::AdamW opt(model->named_parameters(), {.lr = 1e-3});
  Generator data(5);
  Tensor x = randn({2048, 256}, Dtype::f32, data);
  Tensor y = cast(rand({2048}, 0, 10, Dtype::f32, data), Dtype::i64);
  x.eval();
  y.eval();
  const auto before = host_allocator().stats();
  host_allocator().reset_peak();
  Tensor loss;
  {
    Autocast scope(p);
    loss = cross_entropy(model->forward(x), y);
  }
  loss.backward();
  const auto after_backward = host_allocator().stats();
  opt.step();
  const auto after = host_allocator().stats();
  const auto idx = [](MemoryTag t) { return static_cast<size_t>(t); };
  for (Tensor* t : model->parameters()) EXPECT_EQ(t->dtype(), Dtype::f32);
  TagBytes r;
  r.parameters = after.current[idx(MemoryTag::parameters)];
  r.gradients =
      after_backward.current[idx(MemoryTag::gradients)] - before.current[idx(MemoryTag::gradients)];
  r.optimizer_state = after.current[idx(MemoryTag::optimizer_state)] -
                      before.current[idx(MemoryTag::optimizer_state)];
  r.activation_peak =
      after.peak[idx(MemoryTag::activations)] - before.current[idx(MemoryTag::activations)];
  opt.zero_grad();
  return r;
}
}  // namespace

TEST(Autocast, MasterWeightsStayF32InMemoryByTag) {
  // One worker: with two, which nodes run side by side depends on timing (a loaded machine
  // moved the bf16/f32 activation peak from under 75% to 76%), and the peak with it.
  struct OneThread {
    int was = num_threads();
    OneThread() { set_num_threads(1); }
    ~OneThread() { set_num_threads(was); }
  } one_thread;
  const int64_t numel = 256 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10;
  const int64_t before_params = host_allocator().stats().current[0];
  TagBytes f32 = mlp_step(Precision::fp32);
  TagBytes bf16 = mlp_step(Precision::bf16);
  // Parameters, their gradients and AdamW's two moments: f32 in both runs.
  EXPECT_GE(f32.parameters - before_params, 4 * numel);
  EXPECT_EQ(bf16.gradients, 4 * numel);
  EXPECT_EQ(f32.gradients, 4 * numel);
  EXPECT_EQ(bf16.optimizer_state, 2 * 4 * numel);
  EXPECT_EQ(f32.optimizer_state, 2 * 4 * numel);
  // The bf16 copies of weights and the bf16 activations are activations, and fewer bytes.
  std::printf(
      "activation peak: f32 %lld bytes, bf16 %lld bytes (%.0f%%)\n",
      static_cast<long long>(f32.activation_peak), static_cast<long long>(bf16.activation_peak),
      100.0 * static_cast<double>(bf16.activation_peak) / static_cast<double>(f32.activation_peak));
  EXPECT_LT(bf16.activation_peak, f32.activation_peak * 3 / 4);
}

// ---- GradScaler -------------------------------------------------------------------------------

namespace {

std::string reference_path() {
  const char* env = std::getenv("HETRAIN_SOURCE_DIR");
  return std::string(env ? env : HETRAIN_SOURCE_DIR) + "/tests/data/grad_scaler_reference.json";
}

/// Overwrites element i of t's gradient with v.
void poison_grad(const Tensor& t, size_t i, float v) {
  std::vector<float> g = t.grad().to_vector<float>();
  g.at(i) = v;
  t.set_grad(from_vector(g, t.shape()));
}

struct TinyModel {
  Generator init{0};
  nn::Linear lin{4, 3, true, init};
  Tensor x;
  TinyModel() {
    Generator g(1);
    x = (randn({8, 4}, Dtype::f32, g) * 0.01).detach();
  }
  Tensor loss() { return mean(square(lin.forward(x))) * 1e-4; }
};

}  // namespace

TEST(GradScaler, ScaleTrajectoryMatchesPyTorch) {
  std::ifstream in(reference_path());
  ASSERT_TRUE(in) << reference_path();
  nlohmann::json ref = nlohmann::json::parse(in);
  ASSERT_EQ(ref["cases"].size(), 3u);
  for (const auto& c : ref["cases"]) {
    const std::string name = c["name"];
    const auto& o = c["options"];
    amp::GradScaler scaler({.init_scale = o["init_scale"].get<double>(),
                            .growth_factor = o["growth_factor"].get<double>(),
                            .backoff_factor = o["backoff_factor"].get<double>(),
                            .growth_interval = o["growth_interval"].get<int64_t>(),
                            .min_scale = 0});
    TinyModel m;
    optim::SGD opt(m.lin.named_parameters(), {.lr = 0.01});
    size_t next = 0;
    int64_t step = 0, taken = 0;
    const auto& records = c["records"];
    for (const auto& seg : c["script"]) {
      const std::string event = seg[0];
      const int64_t repeat = seg[1];
      for (int64_t i = 0; i < repeat; ++i) {
        opt.zero_grad();
        scaler.scale(m.loss()).backward();
        if (event == "inf") poison_grad(m.lin.weight(), 1 * 4 + 2, INFINITY);
        if (event == "nan") poison_grad(*m.lin.named_parameters()[1].second, 0, NAN);
        const int64_t steps_before = opt.steps();
        scaler.step(opt);
        scaler.update();
        const bool stepped = opt.steps() > steps_before;
        taken += stepped;
        ++step;
        if (next < records.size() && records[next]["step"].get<int64_t>() == step) {
          const auto& r = records[next++];
          const float want =
              static_cast<float>(std::strtod(r["scale"].get<std::string>().c_str(), nullptr));
          ASSERT_EQ(scaler.get_scale(), want) << name << " step " << step;
          ASSERT_EQ(scaler.growth_tracker(), r["growth_tracker"].get<int64_t>())
              << name << " step " << step;
          ASSERT_EQ(stepped, r["stepped"].get<bool>()) << name << " step " << step;
        }
      }
    }
    EXPECT_EQ(next, records.size()) << name << ": not every reference record was compared";
    EXPECT_EQ(taken + scaler.skipped_steps(), step) << name;
  }
}

TEST(GradScaler, InfGradientSkipsStepAndHalvesScale) {
  TinyModel m;
  optim::AdamW opt(m.lin.named_parameters(), {.lr = 0.1});
  amp::GradScaler scaler;  // PyTorch's defaults
  EXPECT_EQ(scaler.get_scale(), 65536.0f);

  // A clean step first: unscaling restores exactly the unscaled gradients (power-of-two scale).
  m.loss().backward();
  const auto plain_w = m.lin.weight().grad().to_vector<float>();
  opt.zero_grad();
  scaler.scale(m.loss()).backward();
  scaler.unscale(opt);
  EXPECT_EQ(m.lin.weight().grad().to_vector<float>(), plain_w);
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_EQ(scaler.growth_tracker(), 1);

  // Now an inf in one gradient element.
  opt.zero_grad();
  scaler.scale(m.loss()).backward();
  poison_grad(*m.lin.named_parameters()[1].second, 2, INFINITY);
  const auto w_before = m.lin.weight().to_vector<float>();
  const auto b_before = m.lin.named_parameters()[1].second->to_vector<float>();
  const auto state_before = opt.state_dict().at("exp_avg.weight").to_vector<float>();
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_TRUE(scaler.found_inf() || scaler.skipped_steps() == 1);
  EXPECT_EQ(m.lin.weight().to_vector<float>(), w_before);  // weights unchanged, bit for bit
  EXPECT_EQ(m.lin.named_parameters()[1].second->to_vector<float>(), b_before);
  EXPECT_EQ(opt.state_dict().at("exp_avg.weight").to_vector<float>(), state_before);
  EXPECT_EQ(opt.steps(), 1);                // the optimizer did not step
  EXPECT_EQ(scaler.get_scale(), 32768.0f);  // halved
  EXPECT_EQ(scaler.skipped_steps(), 1);     // counted
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(scaler.first_nonfinite(), "bias");

  // And training goes on.
  opt.zero_grad();
  scaler.scale(m.loss()).backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_NE(m.lin.weight().to_vector<float>(), w_before);
  EXPECT_EQ(scaler.skipped_steps(), 1);
}

TEST(GradScaler, FloorStopsWithParameterName) {
  TinyModel m;
  optim::SGD opt(m.lin.named_parameters(), {.lr = 0.1});
  amp::GradScaler scaler({.init_scale = 4, .min_scale = 1});
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    scaler.scale(m.loss()).backward();
    poison_grad(m.lin.weight(), 0, NAN);
    scaler.step(opt);
    if (i < 2) {
      scaler.update();  // 4 -> 2 -> 1: not below the floor
      continue;
    }
    try {
      scaler.update();  // 1 -> 0.5
      FAIL() << "no error below the floor";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("fell to 0.5, below its floor of 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find("parameter 'weight'"), std::string::npos) << msg;
    }
  }
  EXPECT_EQ(scaler.skipped_steps(), 3);
}

TEST(GradScaler, ChecksOptionsAndState) {
  EXPECT_THROW(amp::GradScaler({.init_scale = 0}), Error);
  EXPECT_THROW(amp::GradScaler({.growth_factor = 1.0}), Error);
  EXPECT_THROW(amp::GradScaler({.backoff_factor = 1.5}), Error);
  EXPECT_THROW(amp::GradScaler({.growth_interval = 0}), Error);
  amp::GradScaler s;
  EXPECT_THROW(s.load_state({.scale = -1}), Error);
  EXPECT_THROW(s.update(), Error);  // nothing unscaled yet
  EXPECT_EQ(amp::float_from_exact_string(amp::float_to_exact_string(1700.85f), "x"), 1700.85f);
  EXPECT_THROW(amp::float_from_exact_string("12x", "x"), Error);
  // f16 parameters are refused: master weights are f32.
  Tensor p = cast(randn({3}), Dtype::f16).detach().requires_grad_();
  optim::SGD opt({{"half", &p}}, {.lr = 0.1});
  s.scale(sum(cast(p, Dtype::f32))).backward();
  try {
    s.unscale(opt);
    FAIL() << "no error for an f16 gradient";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'half' has a f16 gradient"), std::string::npos)
        << e.what();
  }
}
