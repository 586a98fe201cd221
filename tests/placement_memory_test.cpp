// Memory accounting against sizes computed by hand from ggml's block layouts, and against real
// allocations: the bundled model's safetensors file and the CPU runner's KV blocks.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "formats/safetensors.h"
#include "model/runner.h"
#include "placement/memory.h"

namespace spill::placement {
namespace {

namespace fs = std::filesystem;
const fs::path kShapes = fs::path(SPILL_TEST_DATA) / "shapes";

// Bytes per 256-weight block, from ggml's structs (ggml-common.h):
//   block_q3_K: hmask[32] + qs[64] + scales[12] + d (f16)      = 110
//   block_q2_K: scales[16] + qs[64] + d, dmin (f16)             = 84
//   block_q6_K: ql[128] + qh[64] + scales[16] + d (f16)         = 210
// and per 32-weight block: block_q8_0: d (f16) + qs[32]         = 34
constexpr int64_t kQ3K = 110, kQ2K = 84, kQ6K = 210, kQ8_0 = 34, kQ5_0 = 22;

TensorClassTypes seed_mix(const char* experts) {
  return parse_tensor_class_types(std::string("experts=") + experts + ",attention=q8_0,embed=q8_0,head=q6_k,shared=q6_k");
}

TEST(PlacementMemory, SeedShapeRoutedExpertAtQ3KAndQ2K) {
  const ModelShape shape = load_model_shape((kShapes / "seed.json").string());
  ASSERT_EQ(shape.shared.count, 1);
  ASSERT_EQ(shape.shared.intermediate_size, 2304);
  // gate and up: 2304 rows of 5120 weights = 20 blocks; down: 5120 rows of 2304 weights = 9 blocks.
  const int64_t q3 = 2 * 2304 * (20 * kQ3K) + 5120 * (9 * kQ3K);
  const int64_t q2 = 2 * 2304 * (20 * kQ2K) + 5120 * (9 * kQ2K);
  EXPECT_EQ(q3, 15206400);
  const ModelBytes b3 = account_weights(shape, seed_mix("q3_k"));
  const ModelBytes b2 = account_weights(shape, seed_mix("q2_k"));
  EXPECT_EQ(b3.routed_expert_bytes, q3);
  EXPECT_EQ(b2.routed_expert_bytes, q2);
  EXPECT_EQ(b3.routed_expert_weights, 3 * 5120 * 2304);
  EXPECT_EQ(b3.total[TensorClass::RoutedExperts], 40 * 384 * q3);
  EXPECT_EQ(b2.total[TensorClass::RoutedExperts], 40 * 384 * q2);
  EXPECT_TRUE(b3.notes.empty());

  // Everything else, by hand.
  const int64_t attention = 5120 * (160 * kQ8_0)        // q: 5120 rows of 5120 (160 Q8_0 blocks)
                            + 2 * 1024 * (160 * kQ8_0)  // k, v: 1024 rows each
                            + 5120 * (160 * kQ8_0);     // o: 5120 rows of 5120
  const int64_t shared = 2 * 2304 * (20 * kQ6K) + 5120 * (9 * kQ6K);
  const int64_t router = 384 * 5120 * 4;                // f32
  const int64_t norms = 2 * 5120 * 4 + 2 * 128 * 4;     // two RMSNorms + q/k norms per head, f32
  EXPECT_EQ(b3.total[TensorClass::Attention], 40 * attention);
  EXPECT_EQ(b3.total[TensorClass::SharedExperts], 40 * shared);
  EXPECT_EQ(b3.total[TensorClass::Router], 40 * router);
  EXPECT_EQ(b3.total[TensorClass::Norms], 40 * norms + 5120 * 4);
  EXPECT_EQ(b3.total[TensorClass::DenseMlp], 0);
  EXPECT_EQ(b3.total[TensorClass::Embedding], 129280 * (160 * kQ8_0));
  EXPECT_EQ(b3.total[TensorClass::LmHead], 129280 * (20 * kQ6K));
  EXPECT_EQ(b3.embedding_row, 160 * kQ8_0);
  EXPECT_EQ(b3.total.total(), 40 * (attention + shared + router + norms + 384 * q3) + 5120 * 4 +
                                  129280 * (160 * kQ8_0) + 129280 * (20 * kQ6K));
}

TEST(PlacementMemory, S235RoutedExpertAtQ3KAndQ2K) {
  const ModelShape shape = load_model_shape((kShapes / "s235.json").string());
  EXPECT_EQ(shape.shared.count, 0);
  // gate/up: 1536 rows of 4096 (16 blocks); down: 4096 rows of 1536 (6 blocks).
  const int64_t q3 = 2 * 1536 * (16 * kQ3K) + 4096 * (6 * kQ3K);
  const int64_t q2 = 2 * 1536 * (16 * kQ2K) + 4096 * (6 * kQ2K);
  const ModelBytes b3 = account_weights(shape, parse_tensor_class_types("experts=q3_k,attention=q8_0"));
  const ModelBytes b2 = account_weights(shape, parse_tensor_class_types("experts=q2_k,attention=q8_0"));
  EXPECT_EQ(b3.routed_expert_bytes, q3);
  EXPECT_EQ(b2.routed_expert_bytes, q2);
  EXPECT_EQ(b3.total[TensorClass::RoutedExperts], 94 * 128 * q3);
  // q: 8192 rows of 4096 (128 Q8_0 blocks); k, v: 512 rows; o: 4096 rows of 8192 (256 blocks).
  EXPECT_EQ(b3.total[TensorClass::Attention],
            94 * (8192 * 128 * kQ8_0 + 2 * 512 * 128 * kQ8_0 + 4096 * 256 * kQ8_0));
  // Embedding and head stay bf16 here: 151936 x 4096 x 2 each.
  EXPECT_EQ(b3.total[TensorClass::Embedding], 151936LL * 4096 * 2);
  EXPECT_EQ(b3.total[TensorClass::LmHead], 151936LL * 4096 * 2);
  // 227.1B routed parameters (shapes/README.md).
  EXPECT_NEAR(double(94 * 128 * b3.routed_expert_weights) / 1e9, 227.1, 0.05);
}

TEST(PlacementMemory, KvBytesPerTokenForEachFormat) {
  const ModelShape s235 = load_model_shape((kShapes / "s235.json").string());
  // 94 layers x (K and V) x 4 kv heads x 128.
  EXPECT_EQ(kv_bytes_per_token(s235.spec, KvFormat::F32), 94 * 2 * 4 * 128 * 4);
  EXPECT_EQ(kv_bytes_per_token(s235.spec, KvFormat::BF16), 94 * 2 * 4 * 128 * 2);
  // fp8: one byte per element plus an f32 scale per head, for K and for V.
  EXPECT_EQ(kv_bytes_per_token(s235.spec, KvFormat::Fp8E4m3), 94 * 2 * (4 * 128 + 4 * 4));
  const ModelShape seed = load_model_shape((kShapes / "seed.json").string());
  EXPECT_EQ(kv_bytes_per_token(seed.spec, KvFormat::BF16), 40 * 2 * 8 * 128 * 2);
}

TEST(PlacementMemory, F32KvMatchesTheCpuRunnersAllocation) {
  for (const char* name : {"s30.json", "s235.json", "seed.json"}) {
    const ModelShape shape = load_model_shape((kShapes / name).string());
    for (int32_t block : {1, 16, 64})
      EXPECT_EQ(kv_bytes_per_token(shape.spec, KvFormat::F32) * block, cpu_kv_bytes_per_block(shape.spec, block)) << name;
  }
}

// The bundled model in bf16 must come to exactly the bytes of its safetensors file's tensors.
TEST(PlacementMemory, BundledModelBf16EqualsItsSafetensorsTensors) {
  const fs::path dir = fs::path(SPILL_SOURCE_DIR) / "models/spill-tiny";
  const ModelShape shape = load_model_shape(dir.string());
  SafetensorsFile file((dir / "model.safetensors").string());
  int64_t file_bytes = 0, expert_bytes = 0;
  for (const auto& [name, view] : file.tensors()) {
    file_bytes += int64_t(view.nbytes());
    if (name.find(".mlp.experts.") != std::string::npos) expert_bytes += int64_t(view.nbytes());
  }
  TensorClassTypes all_bf16 = parse_tensor_class_types("bf16,norms=bf16,router=bf16");
  const ModelBytes b = account_weights(shape, all_bf16);
  EXPECT_TRUE(b.tied_embedding);
  EXPECT_EQ(b.total.total(), file_bytes);
  EXPECT_EQ(b.total[TensorClass::RoutedExperts], expert_bytes);
  EXPECT_EQ(b.routed_expert_bytes * shape.spec.n_experts * shape.spec.n_moe_layers(), expert_bytes);
}

TEST(PlacementMemory, RowsThatAreNotWholeBlocksFallBackAndSaySo) {
  // spill-tiny: hidden 256, expert width 128: down's rows (128 weights) are not whole Q4_K blocks.
  const ModelShape shape = load_model_shape((fs::path(SPILL_SOURCE_DIR) / "models/spill-tiny").string());
  const ModelBytes b = account_weights(shape, parse_tensor_class_types("experts=q4_k"));
  // gate/up: 128 rows of 256 (one 144-byte Q4_K block); down: 256 rows of 128 (4 Q5_0 blocks, as
  // llama-quantize falls back).
  EXPECT_EQ(b.routed_expert_bytes, 2 * 128 * 144 + 256 * 4 * kQ5_0);
  ASSERT_EQ(b.notes.size(), 1u);
  EXPECT_NE(b.notes[0].find("stored as Q5_0"), std::string::npos) << b.notes[0];
}

TEST(PlacementMemory, WorkspaceCountedByHand) {
  const ModelShape shape = load_model_shape((fs::path(SPILL_SOURCE_DIR) / "models/spill-tiny").string());
  // T = 7 tokens, 3 logit rows. hidden 256, q 4x64 = 256, kv 2x64 = 128, 16 experts top-2, width 128, vocab 8192.
  const int64_t T = 7, H = 256, Q = 256, KV = 128, E = 16, k = 2, I = 128, V = 8192, rows = 3;
  const int64_t floats = 3 * T * H + 2 * T * Q + 2 * T * KV + (T * E + T * k * (2 * H + 2 * I)) + rows * (H + V);
  const int64_t ints = T /*positions*/ + T * k * 2 /*ids and weights*/;
  EXPECT_EQ(workspace_bytes(shape, {.max_batch_tokens = T, .max_logit_rows = rows}), 4 * floats + 4 * ints);
}

TEST(PlacementMemory, QuantParserPresetsOverridesAndErrors) {
  const TensorClassTypes t = parse_tensor_class_types("q4_k_m,experts=q3_k, Attention=Q8_0");
  EXPECT_EQ(t[TensorClass::RoutedExperts], DType::Q3_K);
  EXPECT_EQ(t[TensorClass::Attention], DType::Q8_0);
  EXPECT_EQ(t[TensorClass::LmHead], DType::Q6_K);
  EXPECT_EQ(t[TensorClass::Embedding], DType::Q4_K);
  EXPECT_EQ(t[TensorClass::Norms], DType::F32);
  EXPECT_EQ(parse_tensor_class_types(""), TensorClassTypes{});
  auto message = [](const char* text) {
    try {
      parse_tensor_class_types(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("experts=q3").find("unknown type \"q3\""), std::string::npos) << message("experts=q3");
  EXPECT_NE(message("expert=q3_k").find("unknown tensor class \"expert\""), std::string::npos);
  EXPECT_NE(message("q5_k_s").find("unknown preset"), std::string::npos);
  EXPECT_THROW(parse_kv_format("int4"), Error);
  EXPECT_EQ(parse_kv_format("FP8"), KvFormat::Fp8E4m3);
}

TEST(PlacementMemory, ConfigErrorsNameTheFile) {
  try {
    parse_model_shape(R"({"model_type": "qwen3_moe", "n_shared_experts": -1})", "cfg.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_model_shape("/nonexistent/config.json"), Error);
}

}  // namespace
}  // namespace spill::placement
