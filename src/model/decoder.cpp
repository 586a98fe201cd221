// The forward pass of the decoder family spill runs (Llama, Qwen3, Qwen3-MoE, Mixtral, OLMoE,
// gpt-oss, GLM-4.x MoE, DeepSeek-V3), top to bottom, on the CPU backend. The families differ only
// in switches resolved into ModelSpec at load (q/k norm kind, partial rotary, sliding layers and
// attention sinks, the router's kind, shared experts, the expert activation); DeepSeek's latent
// attention is its own block (mla_attention.cpp) behind the same residual stream.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/mla_attention.h"
#include "model/model.h"
#include "model/runner.h"

namespace spill {

namespace {

// A small per-layer vector (sinks, correction bias) as floats.
std::vector<float> to_floats(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.empty()) return {};
  TensorView row = t;
  row.ndim = 2;
  row.shape = {1, t.numel(), 0, 0};
  cpu::load_row(row, 0, out.data());
  return out;
}

class CpuRunner final : public ModelRunner {
 public:
  CpuRunner(const Model& model, KvCacheConfig kv, const RunnerLimits& limits, int n_threads)
      : model_(model), spec_(model.spec()), kv_config_(kv), groups_(kv_groups(spec_)), pool_(n_threads),
        rope_(cpu::make_rope_table(spec_.rope, spec_.rope_dims(), spec_.rope_interleaved)) {
    if (kv.block_size <= 0) fail("KV block size must be positive, got {}", kv.block_size);
    if (kv.n_blocks <= 0) fail("the KV cache needs at least one block, got {}", kv.n_blocks);
    model.prepare_all();  // the forward reads every weight where it lies
    kv_config_.format = KvFormat::F32;
    kv_config_.bytes_per_block = cpu_kv_bytes_per_block(spec_, kv.block_size);
    kv_config_.group_windows = groups_.windows();
    limits_ = resolve_runner_limits(spec_, limits, kv_config_);
    slot_taken_.assign(size_t(limits_.max_seqs), 0);
    // One allocation per pool plane: [n_blocks][block_size][entry] with the entry the layers' shape
    // (GQA: a K plane and a V plane of kv_dim each; MLA: the latent and the rope key). Layer l
    // keeps its KV in plane groups_.plane[l], at the blocks of its group's table; with one group
    // that is one plane per layer.
    kv_slots_ = size_t(kv.n_blocks) * size_t(kv.block_size);
    kv_.resize(static_cast<size_t>(groups_.layers_per_block()));
    for (auto& plane : kv_) plane.reset(new float[kv_slots_ * size_t(spec_.kv_values_per_token())]);
    for (const LayerWeights& lw : model.layers) {
      std::vector<cpu::ExpertView> views;
      for (const ExpertWeights& e : lw.experts) views.push_back(expert_view(e));
      experts_.push_back(std::move(views));
      sinks_.push_back(to_floats(lw.sinks));
      correction_bias_.push_back(to_floats(lw.router_correction_bias));
    }
    activation_ = {.kind = spec_.expert_activation, .alpha = float(spec_.swiglu_alpha), .limit = float(spec_.swiglu_limit)};
    has_routed_experts_ = spec_.n_moe_layers() > 0;
  }

  const ModelSpec& spec() const override { return spec_; }
  const KvCacheConfig& kv_config() const override { return kv_config_; }
  const RunnerLimits& limits() const override { return limits_; }
  std::string describe() const override {
    return fmt::format("cpu ({} threads; KV {} x {} tokens, {})", pool_.size(), kv_config_.n_blocks,
                       kv_config_.block_size, kv_format_name(kv_config_.format));
  }

  void forward(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer) override;

  // Every routed expert is read where the model's weights are (host RAM): routings only, no
  // host-read, cache or placement figures.
  ExpertTraffic expert_traffic() const override { return traffic_; }

 private:
  void forward_pass(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer);
  void check_batch(const ForwardBatch& batch);
  static cpu::ExpertView expert_view(const ExpertWeights& e) {
    return {&e.gate, &e.up, &e.down, e.gate_bias.empty() ? nullptr : &e.gate_bias,
            e.up_bias.empty() ? nullptr : &e.up_bias, e.down_bias.empty() ? nullptr : &e.down_bias};
  }
  void gqa_attention(const LayerWeights& w, int64_t l, std::span<const cpu::AttentionChunk> chunks,
                     const int32_t* positions, const float* h, int64_t n, float* out);
  void mlp_block(const LayerWeights& w, int64_t l, const float* h, int64_t n, float* out, ForwardObserver* observer);

  const Model& model_;
  const ModelSpec& spec_;
  KvCacheConfig kv_config_;
  KvGroups groups_;
  RunnerLimits limits_;
  ThreadPool pool_;
  cpu::RopeTable rope_;
  size_t kv_slots_ = 0;
  std::vector<std::unique_ptr<float[]>> kv_;  // per plane [n_blocks][block_size][kv_values_per_token]
  std::vector<std::vector<cpu::ExpertView>> experts_;  // per layer
  std::vector<uint8_t> slot_taken_;                    // check_batch's scratch, all 0 between calls
  std::vector<uint8_t> block_written_;                 // check_batch's scratch (multi-group models)
  std::vector<std::vector<float>> sinks_, correction_bias_;  // per layer, empty where the model has none
  cpu::ActivationParams activation_;
  bool has_routed_experts_ = false;  // some layer is MoE
  // Counted per step into step_routings_ (by mlp_block) and added to traffic_ when the forward
  // completes, so a published count is always of whole steps.
  int64_t step_routings_ = 0;
  ExpertTraffic traffic_;
};

// The CPU runner needs none of the limits to compute, but holds every batch to them, so that
// tests on the CPU catch a plan a device runner (which sized its buffers by them) would refuse.
void CpuRunner::check_batch(const ForwardBatch& batch) {
  if (int64_t(batch.seqs.size()) > limits_.max_seqs)
    fail("forward: {} sequences in one step, more than the runner's limit of {} (--max-seqs)", batch.seqs.size(),
         limits_.max_seqs);
  if (batch.n_tokens() > limits_.max_batch_tokens)
    fail("forward: {} tokens in one step, more than the runner's limit of {} (--max-batch-tokens)", batch.n_tokens(),
         limits_.max_batch_tokens);
  int64_t expected_first = 0;
  for (const SeqChunk& c : batch.seqs) {
    if (c.first_token != expected_first || c.n_tokens <= 0 || c.start_pos < 0)
      fail("forward: chunks must cover the batch's tokens in order, each with at least one token");
    expected_first += c.n_tokens;
    if (int64_t(c.start_pos) + c.n_tokens > limits_.max_model_len)
      fail("forward: a chunk reaches position {}, beyond the runner's limit of {} (--max-model-len)",
           int64_t(c.start_pos) + c.n_tokens, limits_.max_model_len);
    const int64_t bs = kv_config_.block_size;
    const int64_t needed_blocks = (int64_t(c.start_pos) + c.n_tokens + bs - 1) / bs;
    for (int32_t g = 0; g < groups_.size(); ++g) {
      const std::span<const int32_t> table = c.table(g);
      const std::span<const int32_t> fresh = g == 0 ? c.new_blocks : c.group_new_blocks[size_t(g - 1)];
      if (table.empty() && g > 0)
        fail("forward: this model keeps KV in {} groups (full and sliding-window layers) and a chunk names no block "
             "table for group {} (SeqChunk::group_tables; hand_built_tables makes them)",
             groups_.size(), g);
      if (int64_t(table.size()) < needed_blocks)
        fail("forward: a block table of {} blocks cannot hold {} positions", table.size(), c.start_pos + c.n_tokens);
      if (fresh.size() > table.size())
        fail("forward: {} new blocks for a block table of {}", fresh.size(), table.size());
      // A sliding group's blocks wholly before the window of the chunk's first position are never
      // read and may have gone back to the pool (kNoBlock).
      const int32_t window = groups_.groups[size_t(g)].window;
      const int64_t first_read = window > 0 ? std::max<int64_t>(0, int64_t(c.start_pos) - window + 1) / bs : 0;
      for (int64_t b = 0; b < needed_blocks; ++b) {
        const int32_t id = table[size_t(b)];
        if (b < first_read && id == kNoBlock) continue;
        if (id < 0 || id >= kv_config_.n_blocks)
          fail("forward: block id {} is outside the KV pool of {} blocks", id, kv_config_.n_blocks);
      }
    }
  }
  // With several KV groups, one block id serves one group's layers on the pool's shared planes: two
  // groups (or two sequences) writing one block would overwrite each other. The scheduler never
  // plans it; a hand-built batch could.
  if (groups_.size() > 1) {
    block_written_.resize(size_t(kv_config_.n_blocks), 0);
    const int64_t bs = kv_config_.block_size;
    std::vector<int32_t> marked;
    bool clash = false;
    int32_t clash_block = 0;
    for (const SeqChunk& c : batch.seqs)
      for (int32_t g = 0; g < groups_.size(); ++g)
        for (int64_t b = c.start_pos / bs; b <= (int64_t(c.start_pos) + c.n_tokens - 1) / bs; ++b) {
          const int32_t id = c.table(g)[size_t(b)];
          if (block_written_[size_t(id)] && !clash) clash = true, clash_block = id;
          block_written_[size_t(id)] = 1;
          marked.push_back(id);
        }
    for (int32_t id : marked) block_written_[size_t(id)] = 0;
    if (clash)
      fail("forward: block {} is written by two KV groups or two sequences in one step (the groups' tables of a "
           "sequence must name different blocks)",
           clash_block);
  }
  if (expected_first != batch.n_tokens()) fail("forward: chunks cover {} tokens of {}", expected_first, batch.n_tokens());
  for (int32_t t : batch.tokens)
    if (t < 0 || t >= spec_.vocab_size) fail("forward: token id {} is outside the vocabulary (size {})", t, spec_.vocab_size);
  // Slots: in range and one sequence each (hand-built single-sequence batches use slot 0).
  for (const SeqChunk& c : batch.seqs)
    if (c.slot < 0 || c.slot >= limits_.max_seqs)
      fail("forward: sequence slot {} is outside [0, {}) (--max-seqs)", c.slot, limits_.max_seqs);
  bool clash = false;
  for (const SeqChunk& c : batch.seqs) {
    clash |= slot_taken_[size_t(c.slot)] != 0;
    slot_taken_[size_t(c.slot)] = 1;
  }
  for (const SeqChunk& c : batch.seqs) slot_taken_[size_t(c.slot)] = 0;
  if (clash) fail("forward: two sequences of one step share a slot (internal error)");
}

// Grouped-query attention: q/k/v projections, q/k norm, rotary positions on the first rope_dims of
// each head, paged attention (windowed on sliding layers, with sinks when the model has them), output.
void CpuRunner::gqa_attention(const LayerWeights& w, int64_t l, std::span<const cpu::AttentionChunk> chunks,
                              const int32_t* positions, const float* h, int64_t n, float* out) {
  const int64_t D = spec_.head_dim, n_heads = spec_.n_heads, n_kv = spec_.n_kv_heads;
  const int64_t Q = spec_.q_dim(), KV = spec_.kv_dim();
  std::vector<float> q(static_cast<size_t>(n * Q)), k(static_cast<size_t>(n * KV)), v(static_cast<size_t>(n * KV)),
      attn(static_cast<size_t>(n * Q));
  // q, k and v in one loop of the thread pool, over one rounding of h (cpu::matmul_jobs).
  std::vector<const float*> rows(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) rows[size_t(t)] = h + t * spec_.hidden_size;
  const cpu::MatmulJob qkv[3] = {{&w.q, rows.data(), n, q.data(), &w.q_bias},
                                 {&w.k, rows.data(), n, k.data(), &w.k_bias},
                                 {&w.v, rows.data(), n, v.data(), &w.v_bias}};
  cpu::matmul_jobs(pool_, qkv);
  if (spec_.qk_norm == QkNorm::PerHead) {
    cpu::rmsnorm(q.data(), n * n_heads, D, w.q_norm, spec_.rms_norm_eps, q.data());
    cpu::rmsnorm(k.data(), n * n_kv, D, w.k_norm, spec_.rms_norm_eps, k.data());
  } else if (spec_.qk_norm == QkNorm::WholeProjection) {
    cpu::rmsnorm(q.data(), n, Q, w.q_norm, spec_.rms_norm_eps, q.data());
    cpu::rmsnorm(k.data(), n, KV, w.k_norm, spec_.rms_norm_eps, k.data());
  }
  if (spec_.clip_qkv > 0) {
    const float c = float(spec_.clip_qkv);
    for (auto* buf : {&q, &k, &v})
      for (float& f : *buf) f = std::clamp(f, -c, c);
  }
  cpu::apply_rope(rope_, q.data(), n, n_heads, D, positions);
  cpu::apply_rope(rope_, k.data(), n, n_kv, D, positions);
  float* base = kv_[size_t(groups_.plane[size_t(l)])].get();
  const cpu::PagedKv kv{base, base + kv_slots_ * size_t(KV), kv_config_.block_size, n_kv, D};
  const cpu::AttentionParams params{.scale = float(spec_.softmax_scale()),
                                    .window = spec_.sliding(l) ? int32_t(spec_.sliding_window) : 0,
                                    .sinks = sinks_[size_t(l)].empty() ? nullptr : sinks_[size_t(l)].data()};
  cpu::paged_attention(pool_, kv, chunks, q.data(), k.data(), v.data(), n_heads, attn.data(), params);
  cpu::matmul(pool_, attn.data(), n, w.o, out, &w.o_bias);
}

// Routed experts (router, then the chosen experts) plus the shared experts, or the dense MLP.
void CpuRunner::mlp_block(const LayerWeights& w, int64_t l, const float* h, int64_t n, float* out,
                          ForwardObserver* observer) {
  const int layer = int(l);
  if (!spec_.layer_is_moe[size_t(l)]) {
    cpu::swiglu_mlp(pool_, h, n, {&w.dense.gate, &w.dense.up, &w.dense.down}, out);
    return;
  }
  const int64_t E = spec_.n_experts, top_k = spec_.n_experts_per_token, H = spec_.hidden_size;
  std::vector<float> router_logits(static_cast<size_t>(n * E)), expert_weights(static_cast<size_t>(n * top_k));
  std::vector<int32_t> expert_ids(static_cast<size_t>(n * top_k));
  cpu::matmul(pool_, h, n, w.router, router_logits.data(), &w.router_bias);
  switch (spec_.router.kind) {
    case RouterKind::SoftmaxTopK:
      cpu::route_topk(router_logits.data(), n, E, top_k, spec_.norm_topk_prob, expert_ids.data(), expert_weights.data());
      break;
    case RouterKind::TopKSoftmax:
      cpu::route_topk_softmax(router_logits.data(), n, E, top_k, expert_ids.data(), expert_weights.data());
      break;
    case RouterKind::SigmoidGrouped: {
      const std::vector<float>& bias = correction_bias_[size_t(l)];
      const cpu::SigmoidRouterParams params{.n_group = spec_.router.n_group,
                                            .topk_group = spec_.router.topk_group,
                                            .renormalise = spec_.norm_topk_prob,
                                            .routed_scaling_factor = float(spec_.router.routed_scaling_factor),
                                            .correction_bias = bias.empty() ? nullptr : bias.data()};
      cpu::route_sigmoid_grouped(params, router_logits.data(), n, E, top_k, expert_ids.data(), expert_weights.data());
      break;
    }
  }
  if (observer) observer->on_router(layer, n, top_k, expert_ids.data(), expert_weights.data());
  step_routings_ += n * top_k;
  cpu::moe_experts(pool_, h, n, H, top_k, expert_ids.data(), expert_weights.data(), experts_[size_t(l)], out,
                   activation_);
  if (spec_.n_shared_experts > 0) {
    std::vector<float> shared(static_cast<size_t>(n * H));
    cpu::swiglu_mlp(pool_, h, n, {&w.shared.gate, &w.shared.up, &w.shared.down}, shared.data());
    for (int64_t i = 0; i < n * H; ++i) out[i] += shared[size_t(i)];
  }
}

// One step, and its expert counts: each token once, (token, slot) pairs over the MoE layers, wall time.
void CpuRunner::forward(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer) {
  const auto start = std::chrono::steady_clock::now();
  step_routings_ = 0;
  forward_pass(batch, logits, observer);
  if (!has_routed_experts_) return;
  traffic_.tokens += batch.n_tokens();
  traffic_.routings += step_routings_;
  traffic_.step_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void CpuRunner::forward_pass(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer) {
  check_batch(batch);
  const int64_t n = batch.n_tokens(), H = spec_.hidden_size;

  std::vector<int32_t> positions(static_cast<size_t>(n));
  // The chunks as each KV group's layers see them: the same tokens, that group's block tables.
  std::array<std::vector<cpu::AttentionChunk>, kMaxKvGroups> group_chunks;
  for (const SeqChunk& c : batch.seqs) {
    for (int32_t i = 0; i < c.n_tokens; ++i) positions[size_t(c.first_token + i)] = c.start_pos + i;
    for (int32_t g = 0; g < groups_.size(); ++g)
      group_chunks[size_t(g)].push_back({c.first_token, c.n_tokens, c.start_pos, c.table(g)});
  }
  std::vector<float> x(static_cast<size_t>(n * H)), h(static_cast<size_t>(n * H)), block_out(static_cast<size_t>(n * H));

  // Embedding
  for (int64_t t = 0; t < n; ++t) cpu::load_row(model_.embed, batch.tokens[size_t(t)], x.data() + t * H);

  for (int64_t l = 0; l < spec_.n_layers; ++l) {
    const LayerWeights& w = model_.layers[size_t(l)];
    const int layer = int(l);
    const std::span<const cpu::AttentionChunk> chunks = group_chunks[size_t(groups_.group_of[size_t(l)])];

    // Attention block: norm, then grouped-query or latent attention, residual.
    cpu::rmsnorm(x.data(), n, H, w.attn_norm, spec_.rms_norm_eps, h.data());
    if (spec_.attention == AttentionKind::Mla) {
      const cpu::PagedLatentKv kv{kv_[size_t(groups_.plane[size_t(l)])].get(), kv_config_.block_size,
                                  spec_.mla.cache_values()};
      mla_attention_block(pool_,
                          {.spec = spec_, .weights = w.mla, .rope = rope_, .kv = kv, .chunks = chunks,
                           .positions = positions.data(), .observer = observer, .layer = layer},
                          h.data(), n, block_out.data());
    } else {
      gqa_attention(w, l, chunks, positions.data(), h.data(), n, block_out.data());
    }
    for (int64_t i = 0; i < n * H; ++i) x[size_t(i)] += block_out[size_t(i)];
    if (observer) observer->on_tensor("attn_residual", layer, x.data(), n, H);

    // MLP block: norm, then routed (+ shared) experts or the dense MLP, residual.
    cpu::rmsnorm(x.data(), n, H, w.mlp_norm, spec_.rms_norm_eps, h.data());
    mlp_block(w, l, h.data(), n, block_out.data(), observer);
    for (int64_t i = 0; i < n * H; ++i) x[size_t(i)] += block_out[size_t(i)];
    if (observer) observer->on_tensor("layer_out", layer, x.data(), n, H);
  }

  // Final norm and LM head, only for the rows whose logits are wanted.
  std::vector<int64_t> rows;
  for (const SeqChunk& c : batch.seqs) {
    if (batch.all_logits) {
      for (int32_t i = 0; i < c.n_tokens; ++i) rows.push_back(c.first_token + i);
    } else if (c.want_logits) {
      rows.push_back(c.first_token + c.n_tokens - 1);
    }
  }
  std::vector<float> final_rows(rows.size() * size_t(H));
  for (size_t r = 0; r < rows.size(); ++r) std::copy_n(x.data() + rows[r] * H, H, final_rows.data() + r * size_t(H));
  cpu::rmsnorm(final_rows.data(), int64_t(rows.size()), H, model_.final_norm, spec_.rms_norm_eps, final_rows.data());
  logits.resize(rows.size() * size_t(spec_.vocab_size));
  cpu::matmul(pool_, final_rows.data(), int64_t(rows.size()), model_.lm_head, logits.data());
}

}  // namespace

int64_t cpu_kv_bytes_per_block(const ModelSpec& spec, int32_t block_size) {
  return kv_groups(spec).layers_per_block() * kv_bytes_per_token_per_layer(spec, KvFormat::F32) * int64_t(block_size);
}

std::unique_ptr<ModelRunner> make_cpu_runner(const Model& model, const CpuRunnerConfig& config) {
  const int64_t n_blocks =
      resolve_kv_blocks(model.spec(), config.kv, cpu_kv_bytes_per_block(model.spec(), config.kv.block_size));
  return std::make_unique<CpuRunner>(model, KvCacheConfig{.block_size = config.kv.block_size, .n_blocks = n_blocks},
                                     config.limits, config.n_threads);
}

std::unique_ptr<ModelRunner> make_cpu_runner(const Model& model, KvCacheConfig kv, int n_threads) {
  return std::make_unique<CpuRunner>(model, kv, RunnerLimits{}, n_threads);
}

}  // namespace spill
