// Memory accounting of a loaded model (measure_weights) and plans made from it: a file's own mix,
// with expert sizes that differ by layer, priced exactly and carried through the plan file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "formats/gguf.h"
#include "model/gguf_export.h"
#include "model/model.h"
#include "model/quantize_on_load.h"
#include "offload/plan_file.h"
#include "placement/measured_bytes.h"
#include "placement/planner.h"

namespace spill::placement {

namespace fs = std::filesystem;

namespace {

const fs::path kTiny = fs::path(SPILL_SOURCE_DIR) / "models/spill-tiny";

void expect_same_bytes(const ModelBytes& got, const ModelBytes& want) {
  for (int c = 0; c < kNumTensorClasses; ++c)
    EXPECT_EQ(got.total[TensorClass(c)], want.total[TensorClass(c)]) << tensor_class_key(TensorClass(c));
  EXPECT_EQ(got.embedding, want.embedding);
  EXPECT_EQ(got.embedding_row, want.embedding_row);
  EXPECT_EQ(got.lm_head, want.lm_head);
  EXPECT_EQ(got.tied_embedding, want.tied_embedding);
  EXPECT_EQ(got.routed_expert_bytes, want.routed_expert_bytes);
  EXPECT_EQ(got.routed_expert_weights, want.routed_expert_weights);
  ASSERT_EQ(got.layers.size(), want.layers.size());
  for (size_t l = 0; l < got.layers.size(); ++l) {
    for (int c = 0; c < kNumTensorClasses; ++c)
      EXPECT_EQ(got.layers[l].weights[TensorClass(c)], want.layers[l].weights[TensorClass(c)])
          << "layer " << l << " " << tensor_class_key(TensorClass(c));
    EXPECT_EQ(got.layers[l].n_routed_experts, want.layers[l].n_routed_experts) << "layer " << l;
    EXPECT_EQ(got.layers[l].routed_expert_bytes, want.layers[l].routed_expert_bytes) << "layer " << l;
  }
}

// The bundled model as it ships (bf16 safetensors): what the loader holds is what account_weights
// predicts from its config alone, class by class and layer by layer.
TEST(PlacementMeasured, BundledModelAsLoadedEqualsThePrediction) {
  auto model = Model::load(kTiny.string());
  const ModelBytes measured = measure_weights(*model);
  const ModelBytes predicted = account_weights(load_model_shape(kTiny.string()), parse_tensor_class_types("bf16,norms=bf16,router=bf16"));
  expect_same_bytes(measured, predicted);
  EXPECT_GT(measured.routed_expert_bytes, 0);
}

// Q4_K_M gives the down projections of llama.cpp's "more bits" layers (2 and 5 of 6) Q6_K, stored as
// Q8_0 because spill-tiny's 128-wide rows are not whole 256-blocks; the others Q4_K, stored as Q5_0.
// So experts of layers 2 and 5 are larger, and each layer is priced with its own.
struct Q4kmTiny : ::testing::Test {
  static void SetUpTestSuite() {
    model = Model::load(kTiny.string()).release();
    quantize_as_asked(*model, {.quant = "q4_k_m", .imatrix = "", .n_threads = 0});
  }
  static void TearDownTestSuite() {
    delete model;
    model = nullptr;
  }
  static Model* model;
};
Model* Q4kmTiny::model = nullptr;

TEST_F(Q4kmTiny, ExpertBytesFollowEachLayersTypes) {
  const ModelSpec& s = model->spec();
  const ModelBytes mb = measure_weights(*model);
  const int64_t H = s.hidden_size, I = s.moe_intermediate_size;
  std::set<int64_t> sizes;
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const ExpertWeights& e = model->layers[size_t(l)].experts[0];
    const DType down = (l == 2 || l == 5) ? DType::Q8_0 : DType::Q5_0;
    ASSERT_EQ(e.gate.dtype, DType::Q4_K) << "layer " << l;
    ASSERT_EQ(e.down.dtype, down) << "layer " << l;
    // gate and up: I rows of H; down: H rows of I; each row in its type's blocks.
    const int64_t want = 2 * I * row_bytes(DType::Q4_K, H) + H * row_bytes(down, I);
    EXPECT_EQ(mb.layers[size_t(l)].routed_expert_bytes, want) << "layer " << l;
    EXPECT_EQ(mb.layers[size_t(l)].n_routed_experts, s.n_experts);
    sizes.insert(want);
  }
  ASSERT_EQ(sizes.size(), 2u);
  EXPECT_EQ(mb.routed_expert_bytes, *sizes.rbegin()) << "the model-wide figure is the largest layer's";
  int64_t routed = 0;
  for (const LayerBytes& lb : mb.layers) routed += lb.routed_bytes();
  EXPECT_EQ(mb.total[TensorClass::RoutedExperts], routed);
  EXPECT_EQ(dominant_types(*model)[TensorClass::RoutedExperts], DType::Q4_K);
}

// A plan of the file's own mix: the GPU holds what its budget allows, host bytes are each layer's
// count times that layer's expert, and the plan file carries per-layer sizes through the strict reader.
TEST_F(Q4kmTiny, PlanPricesEachLayerAndItsFileRoundTrips) {
  PlanRequest req;
  req.shape = shape_of(*model);
  req.measured = measure_weights(*model);
  req.types = dominant_types(*model);
  req.max_model_len = 1024;
  req.max_seqs = 1;
  req.max_batch_tokens = 256;
  const ModelBytes& mb = *req.measured;
  // Room for everything but about half the routed experts.
  PlanRequest probe = req;
  probe.gpu_mem = {int64_t(1) << 40};
  const PlanOutcome all = make_plan(probe);
  ASSERT_TRUE(all.fits) << all.refusal;
  req.gpu_mem = {all.no_offload[0].vram_total() - mb.total[TensorClass::RoutedExperts] / 2};
  const PlanOutcome o = make_plan(req);
  ASSERT_TRUE(o.fits) << o.refusal;
  const Plan& p = o.plan;
  EXPECT_GE(o.plan.gpus[0].room(), 0);
  int64_t host = 0, host_experts = 0;
  for (const LayerPlan& lp : p.layers) {
    host += int64_t(lp.host_experts.size()) * mb.layers[size_t(lp.layer)].routed_expert_bytes;
    host_experts += int64_t(lp.host_experts.size());
  }
  EXPECT_GT(host_experts, 0);
  EXPECT_EQ(p.host_bytes(), host + (p.embedding_on_host ? mb.embedding : 0));
  EXPECT_EQ(p.gpus[0].host_bytes, host);

  const offload::PlacementPlan file = offload::parse_plan(plan_to_json(o), "measured plan");
  EXPECT_EQ(file.routed_expert_bytes, mb.routed_expert_bytes);
  ASSERT_EQ(file.layers.size(), mb.layers.size());
  for (size_t l = 0; l < file.layers.size(); ++l) EXPECT_EQ(file.layers[l].expert_bytes, mb.layers[l].routed_expert_bytes);
  EXPECT_EQ(file.host_expert_bytes(), host);
}

// The GGUF spill writes of that model: measured as loaded, it comes to exactly the bytes of the
// file's tensors (which hold norms and router in f32, as llama.cpp's files do), and each layer's
// experts keep the size they had in memory (their blocks are written as they are).
TEST_F(Q4kmTiny, ItsGgufMeasuresAsTheFileStoresIt) {
  const fs::path path = fs::temp_directory_path() / ("spill_measured_" + std::to_string(::getpid()) + ".gguf");
  write_gguf(*model, path.string(), {.hf_dir = kTiny.string(), .name = "", .quant = "q4_k_m"});
  auto loaded = Model::load(path.string());
  int64_t file_bytes = 0;
  {
    const std::unique_ptr<gguf::GgufFile> file = gguf::GgufFile::open(path.string());
    for (const gguf::TensorInfo& t : file->tensors()) file_bytes += int64_t(t.nbytes);
  }
  fs::remove(path);
  const ModelBytes in_memory = measure_weights(*model), from_file = measure_weights(*loaded);
  EXPECT_EQ(from_file.total.total(), file_bytes);
  EXPECT_EQ(from_file.total[TensorClass::RoutedExperts], in_memory.total[TensorClass::RoutedExperts]);
  ASSERT_EQ(from_file.layers.size(), in_memory.layers.size());
  for (size_t l = 0; l < from_file.layers.size(); ++l)
    EXPECT_EQ(from_file.layers[l].routed_expert_bytes, in_memory.layers[l].routed_expert_bytes) << "layer " << l;
  EXPECT_EQ(from_file.routed_expert_bytes, in_memory.routed_expert_bytes);
}

}  // namespace

}  // namespace spill::placement
