// Reading placement plans (src/offload/plan_file.h): what the planner writes reads back as the
// planner decided, and every field the runtime relies on is validated with a message that names
// the file and the field.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "offload/plan_file.h"
#include "placement/memory.h"
#include "placement/planner.h"
#include "placement/profile.h"

namespace spill {
namespace {

using json = nlohmann::json;

// The planner's plan for S30 (tests/data/shapes/s30.json) at Q4_K experts with 30% of them in
// host RAM, and its JSON.
struct PlannedS30 {
  placement::PlanOutcome outcome;
  std::string text;
  PlannedS30() {
    placement::PlanRequest req;
    req.shape = placement::load_model_shape(std::string(SPILL_TEST_DATA) + "/shapes/s30.json");
    req.types = placement::parse_tensor_class_types("q4_k_m,experts=q4_k");
    req.gpu_mem = {int64_t(140) << 30};
    req.max_model_len = 8192;
    req.max_seqs = 4;
    req.min_host_fraction = 0.3;
    outcome = placement::make_plan(req);
    text = placement::plan_to_json(outcome);
  }
};
const PlannedS30& s30() {
  static const PlannedS30 p;
  return p;
}

// The error message of parsing `j`, or "" when it parses.
std::string error_of(const json& j) {
  try {
    offload::parse_plan(j.dump(), "plan.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// One edit of a good plan, and the field its refusal must name.
struct BrokenPlan {
  const char* field;
  std::function<void(json&)> edit;
};
// Each edit of `good` is refused with "plan.json: FIELD" in the message.
void expect_refused_by_field(const json& good, const std::vector<BrokenPlan>& cases) {
  for (const BrokenPlan& c : cases) {
    json j = good;
    c.edit(j);
    const std::string why = error_of(j);
    EXPECT_NE(why.find(std::string("plan.json: ") + c.field), std::string::npos)
        << "field " << c.field << ": " << (why.empty() ? "accepted" : why);
  }
}

TEST(OffloadPlan, ReadsBackWhatThePlannerDecided) {
  const PlannedS30& p = s30();
  ASSERT_TRUE(p.outcome.fits) << p.outcome.refusal;
  const offload::PlacementPlan plan = offload::parse_plan(p.text, "plan.json");
  const placement::Plan& want = p.outcome.plan;
  EXPECT_EQ(plan.n_layers, 48);
  EXPECT_EQ(plan.n_experts, 128);
  EXPECT_EQ(plan.top_k, 8);
  EXPECT_EQ(plan.hidden_size, 2048);
  EXPECT_EQ(plan.moe_intermediate_size, 768);
  EXPECT_EQ(plan.expert_type, DType::Q4_K);
  EXPECT_EQ(plan.n_gpus, 1);
  EXPECT_EQ(plan.routed_expert_bytes, want.bytes.routed_expert_bytes);
  ASSERT_EQ(plan.layers.size(), want.layers.size());
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    EXPECT_EQ(plan.layers[l].host, want.layers[l].host_experts) << "layer " << l;
    EXPECT_EQ(plan.layers[l].gpu, want.layers[l].gpu);
    EXPECT_EQ(plan.layers[l].moe, want.layers[l].moe);
    EXPECT_EQ(plan.layers[l].expert_bytes, want.bytes.layers[l].routed_expert_bytes);
  }
  EXPECT_EQ(plan.host_expert_count(), want.host_experts());
  EXPECT_GE(double(plan.host_expert_count()), 0.3 * 48 * 128);
  // Host bytes: the plan's own total is the placement module's figure, experts (and embedding).
  EXPECT_EQ(plan.host_bytes, want.host_bytes());
  EXPECT_EQ(plan.host_expert_bytes(), want.host_experts() * want.bytes.routed_expert_bytes);
}

TEST(OffloadPlan, LoadsAFileAndNamesAMissingOne) {
  const std::string path = (std::filesystem::temp_directory_path() / "spill-offload-plan-test.json").string();
  {
    std::ofstream out(path);
    out << s30().text;
  }
  EXPECT_EQ(offload::load_plan(path).host_expert_count(), s30().outcome.plan.host_experts());
  std::filesystem::remove(path);
  try {
    offload::load_plan(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

// Each broken plan is refused with the field it breaks in the message.
TEST(OffloadPlan, RefusesBrokenPlansNamingTheField) {
  const json good = json::parse(s30().text);
  ASSERT_EQ(error_of(good), "");
  // Layer 5's host list, for edits.
  const json host5 = good["layers"][5]["host"];
  ASSERT_GE(host5.size(), 2u);
  const std::vector<BrokenPlan> cases = {
      {"format", [](json& j) { j["format"] = "spill-routing-profile"; }},
      {"version", [](json& j) { j["version"] = 3; }},
      {"parallel", [](json& j) { j["version"] = 2; }},  // version 2 says how the GPUs share the layers
      {"parallel", [](json& j) { j["parallel"] = {{"kind", "experts"}}; }},  // ... version 1 does not
      {"layers[5].owners", [](json& j) { j["layers"][5]["owners"] = json::array(); }},
      {"version", [](json& j) { j.erase("version"); }},
      {"model.n_layers", [](json& j) { j["model"].erase("n_layers"); }},
      {"model.n_layers", [](json& j) { j["model"]["n_layers"] = 48.5; }},
      {"model.n_layers", [](json& j) { j["model"]["n_layers"] = "48"; }},
      {"model.n_experts", [](json& j) { j["model"]["n_experts"] = -1; }},
      {"model.top_k", [](json& j) { j["model"]["top_k"] = 129; }},
      {"types.experts", [](json& j) { j["types"]["experts"] = "Q4_X"; }},
      {"routed_expert_bytes", [](json& j) { j["routed_expert_bytes"] = uint64_t(1) << 63; }},
      {"layers", [](json& j) { j["layers"].erase(j["layers"].end() - 1); }},
      {"layers[3].layer", [](json& j) { j["layers"][3]["layer"] = 4; }},
      {"layers[3].gpu", [](json& j) { j["layers"][3]["gpu"] = 1; }},
      {"layers[3].moe", [](json& j) { j["layers"][3]["moe"] = 1; }},
      {"layers[3].experts", [](json& j) { j["layers"][3]["experts"] = 64; }},
      // Layers may differ in size, but none may exceed routed_expert_bytes, which must be the largest.
      {"layers[3].expert_bytes", [](json& j) { j["layers"][3]["expert_bytes"] = j["routed_expert_bytes"].get<int64_t>() + 1; }},
      {"routed_expert_bytes", [](json& j) { j["routed_expert_bytes"] = j["routed_expert_bytes"].get<int64_t>() + 1; }},
      {"host.bytes", [](json& j) { j["layers"][5]["expert_bytes"] = j["layers"][5]["expert_bytes"].get<int64_t>() - 1; }},
      {"layers[5].host[1]", [&](json& j) { j["layers"][5]["host"][1] = host5[0]; }},            // repeated
      {"layers[5].host[1]", [&](json& j) { std::swap(j["layers"][5]["host"][0], j["layers"][5]["host"][1]); }},  // order
      {"layers[5].host[0]", [](json& j) { j["layers"][5]["host"][0] = 128; }},                  // out of range
      {"layers[5].host[0]", [](json& j) { j["layers"][5]["host"][0] = -1; }},
      {"layers[5].host", [](json& j) { j["layers"][5]["host"] = "all"; }},
      {"layers[5].host", [](json& j) { j["layers"][5].erase("host"); }},
      {"host.experts", [](json& j) { j["layers"][5]["host"].erase(j["layers"][5]["host"].end() - 1); }},
      {"host.bytes", [](json& j) { j["host"]["bytes"] = j["host"]["bytes"].get<int64_t>() + 1; }},
      {"gpus", [](json& j) { j["gpus"] = json::array(); }},
      {"gpus[0].layers", [](json& j) { j["gpus"][0]["layers"] = {1, 48}; }},
      {"gpus", [](json& j) { j["gpus"][0]["layers"] = {0, 47}; }},
      {"gpus[0].gpu", [](json& j) { j["gpus"][0]["gpu"] = 3; }},
      {"(top level)", [](json& j) { j = json::array(); }},
  };
  expect_refused_by_field(good, cases);
}

// Two GPUs sharing every layer's experts (plan version 2): owners come back as planned, and a
// broken owner list, range or kind is refused naming its field.
TEST(OffloadPlan, ReadsBackAnExpertParallelPlan) {
  placement::PlanRequest req;
  req.shape = placement::load_model_shape(std::string(SPILL_TEST_DATA) + "/shapes/s30.json");
  req.types = placement::parse_tensor_class_types("q4_k_m,experts=q4_k");
  req.gpu_mem = {int64_t(70) << 30, int64_t(70) << 30};
  req.max_model_len = 8192;
  req.max_seqs = 4;
  req.min_host_fraction = 0.3;
  const placement::PlanOutcome outcome = placement::make_plan(req);
  ASSERT_TRUE(outcome.fits) << outcome.refusal;
  ASSERT_EQ(outcome.plan.parallel, placement::Parallelism::Experts);
  const std::string text = placement::plan_to_json(outcome);
  const offload::PlacementPlan plan = offload::parse_plan(text, "plan.json");
  EXPECT_TRUE(plan.expert_parallel);
  EXPECT_EQ(plan.n_gpus, 2);
  EXPECT_EQ(plan.split.attention, outcome.plan.split.attention);
  EXPECT_EQ(plan.split.shared, outcome.plan.split.shared);
  EXPECT_EQ(plan.split.dense, outcome.plan.split.dense);
  EXPECT_EQ(plan.split.vocab, outcome.plan.split.vocab);
  EXPECT_TRUE(plan.split.vocab);  // whole rows: any count splits
  ASSERT_EQ(plan.layers.size(), 48u);
  for (size_t l = 0; l < 48; ++l) {
    EXPECT_EQ(plan.layers[l].gpu, -1);
    EXPECT_EQ(plan.layers[l].host, outcome.plan.layers[l].host_experts) << "layer " << l;
    EXPECT_EQ(plan.layers[l].owners, outcome.plan.layers[l].owner) << "layer " << l;
  }
  EXPECT_EQ(plan.host_expert_count(), outcome.plan.host_experts());

  const json good = json::parse(text);
  const std::vector<BrokenPlan> cases = {
      {"parallel.kind", [](json& j) { j["parallel"]["kind"] = "layers"; }},
      {"parallel", [](json& j) { j.erase("parallel"); }},
      {"parallel.split", [](json& j) { j["parallel"].erase("split"); }},
      {"parallel.split.attention", [](json& j) { j["parallel"]["split"]["attention"] = "yes"; }},
      {"gpus[1].layers", [](json& j) { j["gpus"][1]["layers"] = {0, 47}; }},
      {"layers[4].gpu", [](json& j) { j["layers"][4]["gpu"] = 0; }},
      {"layers[4].owners", [](json& j) { j["layers"][4].erase("owners"); }},
      {"layers[4].owners", [](json& j) { j["layers"][4]["owners"].erase(j["layers"][4]["owners"].end() - 1); }},
      {"layers[4].owners[3]", [](json& j) { j["layers"][4]["owners"][3] = 2; }},
      {"layers[4].owners[3]", [](json& j) { j["layers"][4]["owners"][3] = -1; }},
      {"layers[4].owners[3]", [](json& j) { j["layers"][4]["owners"][3] = "gpu0"; }},
  };
  expect_refused_by_field(good, cases);
}

// Expert-parallel plans of random shapes and budgets (1-4 GPUs, each its own budget, forced host
// shares, profiles with uneven usage): each either refuses with a reason or holds every invariant
// the runtime relies on: every expert owned by one GPU, a layer's host experts within one of each
// other across GPUs, every GPU within its budget, and the JSON read back to the same owners.
TEST(OffloadPlan, ExpertParallelPlansOfRandomBudgetsHoldTheirInvariants) {
  std::mt19937 rng(2026);
  int planned = 0, refused = 0, expert_parallel = 0;
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t layers = 2 + int64_t(rng() % 6), experts = 4 + int64_t(rng() % 29), top_k = 1 + int64_t(rng() % 4);
    placement::PlanRequest req;
    req.shape = placement::parse_model_shape(
        fmt::format(R"({{"model_type": "qwen3_moe", "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": {},
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
            "num_experts": {}, "num_experts_per_tok": {}, "moe_intermediate_size": 256, "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "norm_topk_prob": true, "eos_token_id": 1}})",
                    layers, experts, std::min(top_k, experts)),
        "random.json");
    req.types = placement::parse_tensor_class_types("q8_0,experts=q4_k");
    req.max_model_len = 512;
    req.max_seqs = 1 + int64_t(rng() % 3);
    req.max_batch_tokens = 64;
    req.min_host_fraction = (rng() % 3 == 0) ? double(rng() % 50) / 100.0 : 0.0;
    if (rng() % 2) req.profile = placement::zipf_profile(req.shape.spec, double(rng() % 15) / 10.0, rng());
    const int gpus = 1 + int(rng() % 4);
    req.gpu_mem.clear();
    req.gpu_mem.push_back(int64_t(1) << 30);
    const placement::PlanOutcome one = placement::make_plan(req);
    // Every GPU holds a whole workspace; the rest of the model is shared out, 10% to 110% of it.
    const int64_t workspace = one.plan.workspace_per_gpu, rest = one.no_offload[0].vram_total() - workspace;
    req.gpu_mem.clear();
    for (int g = 0; g < gpus; ++g)
      req.gpu_mem.push_back(workspace + int64_t(double(rest) * (0.10 + double(rng() % 100) / 100.0) / gpus));
    const placement::PlanOutcome o = placement::make_plan(req);
    if (!o.fits) {
      EXPECT_FALSE(o.refusal.empty());
      EXPECT_EQ(o.refusal.find("internal"), std::string::npos) << o.refusal;
      ++refused;
      continue;
    }
    ++planned;
    const placement::Plan& p = o.plan;
    for (const placement::GpuPlan& g : p.gpus) EXPECT_LE(g.vram_total(), g.budget) << "trial " << trial << " gpu" << g.gpu;
    EXPECT_GE(double(p.host_experts()) + 1e-9, req.min_host_fraction * double(layers * experts) - 1) << "trial " << trial;
    if (gpus == 1) {
      EXPECT_EQ(p.parallel, placement::Parallelism::Layers);
      continue;
    }
    ASSERT_EQ(p.parallel, placement::Parallelism::Experts);
    ++expert_parallel;
    std::vector<int64_t> host_total(size_t(gpus), 0);
    for (const placement::LayerPlan& l : p.layers) {
      ASSERT_EQ(int64_t(l.owner.size()), experts);
      std::vector<int64_t> host_of(size_t(gpus), 0);
      for (int32_t g : l.owner) ASSERT_TRUE(g >= 0 && g < gpus) << g;
      for (int32_t e : l.host_experts) ++host_of[size_t(l.owner[size_t(e)])];
      const auto [lo, hi] = std::minmax_element(host_of.begin(), host_of.end());
      EXPECT_LE(*hi - *lo, 1) << "trial " << trial << " layer " << l.layer;
      for (int g = 0; g < gpus; ++g) host_total[size_t(g)] += host_of[size_t(g)];
    }
    const auto [lo, hi] = std::minmax_element(host_total.begin(), host_total.end());
    EXPECT_LE(*hi - *lo, 1) << "trial " << trial;  // the GPUs' links share the host reads evenly
    const offload::PlacementPlan back = offload::parse_plan(placement::plan_to_json(o), "plan.json");
    ASSERT_TRUE(back.expert_parallel);
    for (size_t l = 0; l < p.layers.size(); ++l) EXPECT_EQ(back.layers[l].owners, p.layers[l].owner);
  }
  // Budgets from 10% to 110% of the model: both outcomes occur.
  EXPECT_GT(planned, 25);  // coverage: the trials reach both outcomes, and many plans over several GPUs
  EXPECT_GT(expert_parallel, 10);
  EXPECT_GT(refused, 0);
  std::printf("%d plans (%d over several GPUs), %d refusals\n", planned, expert_parallel, refused);
}

TEST(OffloadPlan, DenseLayersHaveNoExperts) {
  json j = json::parse(s30().text);
  // A plan of a model whose layer 0 is dense: it lists no experts, and a host list there is refused.
  j["layers"][0] = {{"layer", 0}, {"gpu", 0}, {"moe", false}};
  const int64_t dropped = int64_t(json::parse(s30().text)["layers"][0]["host"].size());
  j["host"]["experts"] = j["host"]["experts"].get<int64_t>() - dropped;
  j["host"]["bytes"] = j["host"]["bytes"].get<int64_t>() - dropped * j["routed_expert_bytes"].get<int64_t>();
  EXPECT_EQ(error_of(j), "");
  const offload::PlacementPlan p = offload::parse_plan(j.dump(), "plan.json");
  EXPECT_FALSE(p.layers[0].moe);
  EXPECT_TRUE(p.layers[0].host.empty());
  j["layers"][0]["host"] = {1};
  EXPECT_NE(error_of(j).find("layers[0].host"), std::string::npos);
}

TEST(OffloadPlan, RefusesTextThatIsNotAPlan) {
  for (const std::string& text : std::vector<std::string>{"", "{", "null", "[1,2]", std::string(100, '[') + std::string(100, ']')}) {
    try {
      offload::parse_plan(text, "plan.json");
      ADD_FAILURE() << "accepted: " << text.substr(0, 20);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("plan.json"), std::string::npos) << e.what();
    }
  }
}

TEST(OffloadPlan, UniformPlanPutsTheShareOfEveryLayerOnHost) {
  const offload::PlacementPlan p = offload::uniform_plan(
      {.n_layers = 4, .n_experts = 10, .top_k = 2, .hidden_size = 256, .moe_intermediate_size = 256,
       .layer_is_moe = {true, false, true, true}, .expert_bytes = 1000, .host_share = 0.3});
  EXPECT_EQ(p.host_expert_count(), 9);  // 3 of 10 in each of 3 MoE layers
  EXPECT_TRUE(p.layers[1].host.empty());
  for (const offload::PlannedLayer& l : p.layers)
    for (size_t i = 1; i < l.host.size(); ++i) EXPECT_LT(l.host[i - 1], l.host[i]);
  EXPECT_EQ(p.host_bytes, 9000);
  // And it is a plan the reader would accept (same checks, through JSON written by hand).
  EXPECT_EQ(offload::uniform_plan({.n_layers = 2, .n_experts = 4, .expert_bytes = 8, .host_share = 1.0}).host_expert_count(), 8);
}

// The fuzz target's seeds (tests/fuzz/corpus/plan/) are plans the reader accepts, so the fuzzer
// starts from inputs that reach the layout.
TEST(OffloadPlan, FuzzSeedsAreValidPlans) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(SPILL_TEST_DATA) + "/../fuzz/corpus/plan")) {
    const offload::PlacementPlan p = offload::load_plan(entry.path().string());
    EXPECT_EQ(p.n_layers, 6) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 3);
}

}  // namespace
}  // namespace spill
