// Routing profiles: the recorder's arithmetic on hand-fed choices, and on spill-tiny run through
// the real engine, where every routed token must be counted k times and the counts must equal a
// direct tally of the router over each whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <numeric>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/open_engine.h"
#include "model/model.h"
#include "model/runner.h"
#include "placement/profile.h"

namespace spill::placement {
namespace {

namespace fs = std::filesystem;

ModelSpec small_spec() {
  ModelSpec s = parse_model_spec(R"({"model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32,
      "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
      "intermediate_size": 64, "num_experts": 5, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
      "mlp_only_layers": [1], "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "norm_topk_prob": true, "eos_token_id": 1})",
                                 "small");
  return s;
}

// The assumed zipf profile: every token routes to top_k experts in all, no expert above every
// token, exponent 0 uniform, shares ordered by a per-layer shuffle, the same for the same seed.
TEST(PlacementProfile, ZipfProfileRoutesTopKPerTokenWithTheLawsShares) {
  ModelSpec spec;
  spec.n_layers = 3;
  spec.n_experts = 384;
  spec.n_experts_per_token = 6;
  spec.layer_is_moe = {true, false, true};
  for (double S : {0.0, 0.7, 1.2, 3.0}) {
    const RoutingProfile p = zipf_profile(spec, S, 7);
    EXPECT_FALSE(p.layers[1].moe);
    for (int64_t l : {0, 2}) {
      std::vector<double> u;
      double sum = 0;
      for (int64_t e = 0; e < 384; ++e) u.push_back(p.usage(l, e)), sum += u.back();
      EXPECT_NEAR(sum, 6.0, 384 * 1e-6) << "S " << S;  // counts rounded to 1e-6 of a token each
      std::sort(u.begin(), u.end(), std::greater<>());
      EXPECT_LE(u[0], 1.0);
      if (S == 0.0) {
        EXPECT_NEAR(u[383], 6.0 / 384, 1e-6);
      }
      // Below the experts every token takes, the shares follow r^-S: rank 100 against rank 200, to
      // the rounding of each count to a whole token of 1e6 (half a token each, relative).
      const double ratio = std::pow(200.0 / 100.0, S);
      if (u[99] < 1.0) {
        EXPECT_NEAR(u[99] / u[199], ratio, ratio * (0.5e-6 / u[99] + 0.5e-6 / u[199])) << "S " << S;
      }
    }
    if (S > 0) {
      EXPECT_NE(p.layers[0].decode, p.layers[2].decode);  // each layer its own ranking
    }
    EXPECT_EQ(zipf_profile(spec, S, 7).layers[2].decode, p.layers[2].decode);
  }
  // At S = 3 the head of the law is capped: the first experts take every token.
  const RoutingProfile steep = zipf_profile(spec, 3.0, 7);
  int64_t full = 0;
  for (int64_t e = 0; e < 384; ++e) full += steep.usage(0, e) == 1.0;
  EXPECT_GE(full, 1);
  EXPECT_THROW(zipf_profile(spec, -0.5), Error);
  EXPECT_THROW(zipf_profile(spec, 11.0), Error);
}

TEST(PlacementProfile, RecorderSplitsPrefillAndDecodeAndCountsCoactivation) {
  const ModelSpec spec = small_spec();  // layers 0 and 2 MoE, 5 experts top-2
  RoutingRecorder rec(spec, "small", "hand");
  // One step: a 3-token prefill chunk, then two decode tokens.
  const int32_t l0[] = {0, 1, /**/ 0, 2, /**/ 4, 0, /**/ 3, 1, /**/ 1, 2};
  const int32_t l2[] = {4, 3, /**/ 4, 3, /**/ 4, 3, /**/ 0, 4, /**/ 4, 0};
  const float w[10] = {};
  rec.on_router(0, 5, 2, l0, w);
  rec.on_router(2, 5, 2, l2, w);
  const StepChunkKind step[] = {{3, false}, {1, true}, {1, true}};
  rec.end_step(step);
  const RoutingProfile p = rec.snapshot();
  EXPECT_EQ(p.steps, 1);
  EXPECT_FALSE(p.layers[1].moe);
  const LayerRouting& a = p.layers[0];
  EXPECT_EQ(a.prefill_tokens, 3);
  EXPECT_EQ(a.decode_tokens, 2);
  EXPECT_EQ(a.prefill, (std::vector<int64_t>{3, 1, 1, 0, 1}));
  EXPECT_EQ(a.decode, (std::vector<int64_t>{0, 2, 1, 1, 0}));
  EXPECT_EQ(a.decode_steps, 1);
  // Decode tokens of the step used experts {1, 2, 3}: pairs (1,2), (1,3), (2,3) once each.
  auto co = [&](const LayerRouting& l, int a_, int b_) { return l.coactivation[size_t(a_ * 5 + b_)]; };
  EXPECT_EQ(co(a, 1, 2), 1);
  EXPECT_EQ(co(a, 1, 3), 1);
  EXPECT_EQ(co(a, 2, 3), 1);
  EXPECT_EQ(std::accumulate(a.coactivation.begin(), a.coactivation.end(), int64_t(0)), 3);
  EXPECT_EQ(p.layers[2].prefill, (std::vector<int64_t>{0, 0, 0, 3, 3}));
  EXPECT_EQ(co(p.layers[2], 0, 4), 1);
  EXPECT_DOUBLE_EQ(p.usage(0, 1), 2.0 / 2.0);  // decode counts preferred: expert 1 in both decode tokens

  // A forward that failed (no end_step) is dropped when the next one starts.
  rec.on_router(0, 5, 2, l0, w);
  rec.on_router(0, 1, 2, l0, w);
  rec.on_router(2, 1, 2, l2, w);
  const StepChunkKind one[] = {{1, true}};
  rec.end_step(one);
  EXPECT_EQ(rec.snapshot().layers[0].decode_tokens, 3);
  EXPECT_EQ(rec.snapshot().layers[0].prefill_tokens, 3);

  // Round trip through JSON.
  const RoutingProfile q = parse_profile_json(profile_to_json(rec.snapshot()), "x");
  const RoutingProfile r = rec.snapshot();
  for (size_t l = 0; l < 3; ++l) {
    EXPECT_EQ(q.layers[l].prefill, r.layers[l].prefill);
    EXPECT_EQ(q.layers[l].decode, r.layers[l].decode);
    EXPECT_EQ(q.layers[l].coactivation, r.layers[l].coactivation);
    EXPECT_EQ(q.layers[l].decode_steps, r.layers[l].decode_steps);
  }
  EXPECT_EQ(q.steps, r.steps);

  // Bad input names the problem.
  const int32_t bad[] = {7, 0};
  rec.on_router(0, 1, 2, bad, w);
  rec.on_router(2, 1, 2, l2, w);
  EXPECT_THROW(rec.end_step(one), Error);
  EXPECT_THROW(rec.on_router(1, 1, 2, l0, w), Error);  // dense layer
  EXPECT_THROW(parse_profile_json("{}", "p.json"), Error);
  EXPECT_THROW(parse_profile_json(R"({"format": "spill-routing-profile", "version": 2})", "p.json"), Error);
  RoutingProfile wrong = RoutingProfile::empty_for(spec);
  wrong.n_experts = 6;
  EXPECT_THROW(check_profile_matches(wrong, spec, "p.json"), Error);
}

// Tallies router choices of plain forwards.
struct Tally final : ForwardObserver {
  explicit Tally(const ModelSpec& s) : counts(size_t(s.n_layers), std::vector<int64_t>(size_t(s.n_experts), 0)) {}
  void on_router(int layer, int64_t n, int64_t k, const int32_t* ids, const float*) override {
    for (int64_t i = 0; i < n * k; ++i) ++counts[size_t(layer)][size_t(ids[i])];
  }
  std::vector<std::vector<int64_t>> counts;
};

TEST(PlacementProfile, SpillTinyCountsEqualRoutedTokensTimesTopK) {
  const std::string dir = (fs::path(SPILL_SOURCE_DIR) / "models/spill-tiny").string();
  const ModelSpec spec = load_model_spec(dir);
  RoutingRecorder rec(spec);
  std::vector<StepChunkKind> kinds;
  EngineConfig config{.scheduler = {.max_running = 4, .max_batch_tokens = 24},  // chunked prefill beside decodes
                      .prefix_caching = false,
                      .on_step =
                          [&](const StepTrace& t) {
                            kinds.clear();
                            for (const StepTraceChunk& c : t.chunks) kinds.push_back({c.n_tokens, c.decode});
                            rec.end_step(kinds);
                          },
                      .observer = &rec};
  auto engine = open_engine(dir, EngineOptions{.runner = {.device = {Device::Cpu}, .threads = 2}}, config);
  const std::vector<std::string> texts = {"def parse_config(path):\n    with open(path) as f:\n",
                                          "import os\nimport sys\n\nclass Cache:\n    \"\"\"An LRU cache.\"\"\"\n",
                                          "x = 1"};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestStream> streams;
  for (size_t i = 0; i < texts.size(); ++i) {
    prompts.push_back(engine->tokenizer()->encode(texts[i], true));
    GenerationRequest r{.prompt = prompts.back(), .max_tokens = int64_t(3 + 2 * i)};
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    streams.push_back(engine->submit(std::move(r)));
  }
  std::vector<std::vector<int32_t>> outputs;
  int64_t prompt_tokens = 0, decode_tokens = 0;
  for (RequestStream& s : streams) {
    RequestOutput o = s.collect();
    ASSERT_NE(o.finish->reason, FinishReason::Error) << o.finish->error;
    outputs.push_back(o.token_ids);
    prompt_tokens += o.finish->prompt_tokens;
    decode_tokens += int64_t(o.token_ids.size()) - 1;  // every sampled token but the last is fed back
  }
  const EngineMetrics m = engine->metrics();
  engine.reset();
  const RoutingProfile p = rec.snapshot();
  EXPECT_EQ(m.computed_tokens, prompt_tokens + decode_tokens);

  // Direct tallies: each sequence alone, in one forward (routing is batch-invariant on the CPU).
  auto model = Model::load(dir);
  Tally prefill(spec), whole(spec);
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (bool with_output : {false, true}) {
      std::vector<int32_t> seq = prompts[i];
      if (with_output) seq.insert(seq.end(), outputs[i].begin(), outputs[i].end() - 1);
      const int32_t bs = 16, blocks = int32_t((seq.size() + bs - 1) / bs);
      auto runner = make_cpu_runner(*model, {.block_size = bs, .n_blocks = blocks}, 2);
      std::vector<int32_t> table(static_cast<size_t>(blocks));
      std::iota(table.begin(), table.end(), 0);
      ForwardBatch batch;
      batch.tokens = seq;
      batch.seqs.push_back({.first_token = 0, .n_tokens = int32_t(seq.size()), .start_pos = 0, .block_table = table,
                            .want_logits = true});
      std::vector<float> logits;
      runner->forward(batch, logits, with_output ? &whole : &prefill);
    }
  }
  for (int64_t l = 0; l < spec.n_layers; ++l) {
    const LayerRouting& lr = p.layers[size_t(l)];
    ASSERT_TRUE(lr.moe);
    EXPECT_EQ(lr.prefill_tokens, prompt_tokens);
    EXPECT_EQ(lr.decode_tokens, decode_tokens);
    EXPECT_EQ(std::accumulate(lr.prefill.begin(), lr.prefill.end(), int64_t(0)), prompt_tokens * spec.n_experts_per_token);
    EXPECT_EQ(std::accumulate(lr.decode.begin(), lr.decode.end(), int64_t(0)), decode_tokens * spec.n_experts_per_token);
    EXPECT_EQ(lr.prefill, prefill.counts[size_t(l)]) << "layer " << l;
    std::vector<int64_t> both(lr.prefill);
    for (size_t e = 0; e < both.size(); ++e) both[e] += lr.decode[e];
    EXPECT_EQ(both, whole.counts[size_t(l)]) << "layer " << l;
  }
}

}  // namespace
}  // namespace spill::placement

namespace spill::placement {
namespace {

TEST(PlacementProfile, FileWriterWritesAtOnceWhenChangedAndAtTheEnd) {
  const ModelSpec spec = small_spec();
  const std::string path = (fs::temp_directory_path() / ("spill_profile_writer_" + std::to_string(::getpid()) + ".json")).string();
  RoutingRecorder rec(spec);
  {
    ProfileFileWriter writer(rec, path, 3600);  // the periodic write never comes within the test
    ASSERT_TRUE(fs::exists(path));
    EXPECT_EQ(load_profile(path).steps, 0);
    const int32_t ids[] = {0, 1};
    const float w[2] = {};
    rec.on_router(0, 1, 2, ids, w);
    rec.on_router(2, 1, 2, ids, w);
    const StepChunkKind one[] = {{1, true}};
    rec.end_step(one);
  }
  EXPECT_EQ(load_profile(path).steps, 1);  // written when the writer ends
  fs::remove(path);
  EXPECT_THROW(ProfileFileWriter(rec, "/nonexistent-dir/p.json", 1), Error);
}

}  // namespace
}  // namespace spill::placement
