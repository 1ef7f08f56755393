// Parameter counts and FLOPs against published figures.
#include <gtest/gtest.h>

#include <cmath>

#include "hetrain/base/error.h"
#include "hetrain/planning/model_spec.h"

using namespace hetrain;
using namespace hetrain::planning;

// Exact counts: Hugging Face model cards / `sum(p.numel())` of the reference implementations
// (GPT-2 with tied embeddings and 1024 positions; LLaMA untied, SwiGLU, RMSNorm; BERT-large
// with pooler, without the MLM head; timm vit_large_patch16_224; torchvision resnet50/152).
TEST(PlanModels, ParameterCountsMatchPublishedFigures) {
  EXPECT_EQ(preset("gpt2-124m").params(), 124'439'808);
  EXPECT_EQ(preset("gpt2-350m").params(), 354'823'168);
  EXPECT_EQ(preset("gpt2-774m").params(), 774'030'080);
  EXPECT_EQ(preset("gpt2-1.5b").params(), 1'557'611'200);
  EXPECT_EQ(preset("llama-7b").params(), 6'738'415'616);
  EXPECT_EQ(preset("llama-13b").params(), 13'015'864'320);
  EXPECT_EQ(preset("llama-70b").params(), 68'976'648'192);  // LLaMA-2 70B, GQA with 8 KV heads
  EXPECT_EQ(preset("bert-large").params(), 335'141'888);
  EXPECT_EQ(preset("vit-l16").params(), 304'326'632);
  EXPECT_EQ(preset("resnet-50").params(), 25'557'032);
  EXPECT_EQ(preset("resnet-152").params(), 60'192'808);
  // GPT-3 paper (Brown et al. 2020, Table 2.1): "175.0B"; with a 50257 vocabulary: 174.6B.
  EXPECT_NEAR(preset("gpt3-175b").params() / 1e9, 175.0, 0.5);
  // LLaMA paper (Touvron et al. 2023, Table 2): 65.2B.
  EXPECT_NEAR(preset("llama-65b").params() / 1e9, 65.2, 0.1);
}

TEST(PlanModels, GptFromFlagsEqualsPreset) {
  EXPECT_EQ(gpt_model(12, 768, 12, 1024, 50257).params(), 124'439'808);
}

// Sizes near 1e9 used to overflow int64 (UBSan at model_spec.cpp) and give a negative parameter
// count that "fit" any device.
TEST(PlanModels, AbsurdSizesAreAnErrorNotAnOverflow) {
  const ModelSpec m = gpt_model(1'000'000'000, 1'000'000'000, 1, 1024, 50257);
  EXPECT_THROW(m.params(), Error);
  EXPECT_THROW(m.check(), Error);
  try {
    m.check();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overflows 64-bit integers"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(gpt_model(1, int64_t{1} << 62, 1, 1, 1), Error);  // 4 x hidden for the MLP
  // Large but representable still counts exactly: 12 h^2 + 13 h per layer, plus embeddings.
  const int64_t h = 1 << 20;
  EXPECT_EQ(gpt_model(2, h, 1, 8, 2).params(), 2 * (12 * h * h + 13 * h) + 2 * h + 8 * h + 2 * h);
}

TEST(PlanModels, ResNet50ForwardMacs) {
  // torchvision model docs: ResNet50_Weights.IMAGENET1K_V1, 4.09 GFLOPS (multiply-adds).
  EXPECT_NEAR(preset("resnet-50").forward_flops_per_sample() / 2 / 1e9, 4.09, 0.04);
}

TEST(PlanModels, ViTL16ForwardMacs) {
  // timm / torchvision ViT_L_16 docs: 61.55 GFLOPS (multiply-adds) at 224x224.
  EXPECT_NEAR(preset("vit-l16").forward_flops_per_sample() / 2 / 1e9, 61.55, 0.62);
}

TEST(PlanModels, TrainingFlopsMatchNarayananFormula) {
  // Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters
  // Using Megatron-LM"), eq. (3): with full recompute, per iteration
  // F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
  ModelSpec m = preset("gpt3-175b");
  double B = 1536, s = 2048, l = 96, h = 12288, V = 50257;
  double expected = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  double fwd = m.forward_flops_per_sample();
  double ours = B * (4 * fwd - 2 * s * h * V);  // recompute reruns the blocks, not the logits
  EXPECT_NEAR(ours / expected, 1.0, 1e-12);
  // ... and without recompute the model FLOPs are close to 6 N per token (Kaplan et al.).
  double six_n = 6.0 * static_cast<double>(m.params()) * s;
  EXPECT_GT(3 * fwd / six_n, 1.0);
  EXPECT_LT(3 * fwd / six_n, 1.1);
}

TEST(PlanModels, ActivationsMatchKorthikantiTable2) {
  // Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  // Models", Table 2, per layer, 16-bit activations.
  ModelSpec m = preset("gpt3-175b");
  const auto& tf = m.tf;
  double s = 2048, b = 1, h = 12288, a = 96, t = 8, sbh = s * b * h;
  auto act = [&](int64_t tp, bool sp, Recompute rc) {
    return transformer_layer_activation_bytes(tf, 1, tp, sp, rc);
  };
  EXPECT_DOUBLE_EQ(act(1, false, Recompute::none), sbh * (34 + 5 * a * s / h));
  EXPECT_DOUBLE_EQ(act(8, false, Recompute::none), sbh * (10 + 24 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(act(8, true, Recompute::none), sbh * (34 / t + 5 * a * s / (h * t)));
  EXPECT_DOUBLE_EQ(act(8, false, Recompute::selective), sbh * (10 + 24 / t));
  EXPECT_DOUBLE_EQ(act(8, true, Recompute::selective), sbh * 34 / t);
  EXPECT_DOUBLE_EQ(act(1, false, Recompute::full), 2 * sbh);
}

TEST(PlanModels, BadShapesAreErrorsNamingTheFlag) {
  ModelSpec m = gpt_model(12, 770, 12, 1024, 50257);
  try {
    m.check();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--heads 12 does not divide --hidden 770"),
              std::string::npos);
  }
  EXPECT_THROW(preset("gpt-5"), Error);
}
