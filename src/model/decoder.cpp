// The forward pass of the decoder family spill runs (Llama, Qwen3, Qwen3-MoE, Mixtral, OLMoE),
// top to bottom, on the CPU backend. The families differ only in switches resolved into
// ModelSpec at load (q/k norm kind, routed or dense MLP per layer, top-k renormalisation).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/runner.h"

namespace spill {

namespace {

class CpuRunner final : public ModelRunner {
 public:
  CpuRunner(const Model& model, KvCacheConfig kv, const RunnerLimits& limits, int n_threads)
      : model_(model), spec_(model.spec()), kv_config_(kv), pool_(n_threads),
        rope_(cpu::make_rope_table(spec_.rope, spec_.head_dim)) {
    if (kv.block_size <= 0) fail("KV block size must be positive, got {}", kv.block_size);
    if (kv.n_blocks <= 0) fail("the KV cache needs at least one block, got {}", kv.n_blocks);
    kv_config_.format = KvFormat::F32;
    kv_config_.bytes_per_block = cpu_kv_bytes_per_block(spec_, kv.block_size);
    limits_ = resolve_runner_limits(spec_, limits, kv_config_);
    slot_taken_.assign(size_t(limits_.max_seqs), 0);
    const size_t per_layer = size_t(kv.n_blocks) * size_t(kv.block_size) * size_t(spec_.kv_dim());
    kv_k_.resize(static_cast<size_t>(spec_.n_layers));
    kv_v_.resize(static_cast<size_t>(spec_.n_layers));
    for (int64_t l = 0; l < spec_.n_layers; ++l) {
      kv_k_[size_t(l)].reset(new float[per_layer]);
      kv_v_[size_t(l)].reset(new float[per_layer]);
    }
    for (const LayerWeights& lw : model.layers) {
      std::vector<cpu::ExpertView> views;
      for (const ExpertWeights& e : lw.experts) views.push_back({&e.gate, &e.up, &e.down});
      experts_.push_back(std::move(views));
    }
  }

  const ModelSpec& spec() const override { return spec_; }
  const KvCacheConfig& kv_config() const override { return kv_config_; }
  const RunnerLimits& limits() const override { return limits_; }
  std::string describe() const override {
    return fmt::format("cpu ({} threads; KV {} x {} tokens, {})", pool_.size(), kv_config_.n_blocks,
                       kv_config_.block_size, kv_format_name(kv_config_.format));
  }

  void forward(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer) override;

 private:
  void check_batch(const ForwardBatch& batch);

  const Model& model_;
  const ModelSpec& spec_;
  KvCacheConfig kv_config_;
  RunnerLimits limits_;
  ThreadPool pool_;
  cpu::RopeTable rope_;
  std::vector<std::unique_ptr<float[]>> kv_k_, kv_v_;  // per layer [n_blocks][block_size][kv_dim]
  std::vector<std::vector<cpu::ExpertView>> experts_;  // per layer
  std::vector<uint8_t> slot_taken_;                    // check_batch's scratch, all 0 between calls
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
    const int64_t needed_blocks = (int64_t(c.start_pos) + c.n_tokens + kv_config_.block_size - 1) / kv_config_.block_size;
    if (int64_t(c.block_table.size()) < needed_blocks)
      fail("forward: a block table of {} blocks cannot hold {} positions", c.block_table.size(),
           c.start_pos + c.n_tokens);
    if (c.new_blocks.size() > c.block_table.size())
      fail("forward: {} new blocks for a block table of {}", c.new_blocks.size(), c.block_table.size());
    for (int64_t b = 0; b < needed_blocks; ++b)
      if (c.block_table[size_t(b)] < 0 || c.block_table[size_t(b)] >= kv_config_.n_blocks)
        fail("forward: block id {} is outside the KV pool of {} blocks", c.block_table[size_t(b)], kv_config_.n_blocks);
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

void CpuRunner::forward(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer) {
  check_batch(batch);
  const int64_t n = batch.n_tokens(), H = spec_.hidden_size, D = spec_.head_dim;
  const int64_t n_heads = spec_.n_heads, n_kv = spec_.n_kv_heads, Q = spec_.q_dim(), KV = spec_.kv_dim();

  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::vector<cpu::AttentionChunk> chunks;
  for (const SeqChunk& c : batch.seqs) {
    for (int32_t i = 0; i < c.n_tokens; ++i) positions[size_t(c.first_token + i)] = c.start_pos + i;
    chunks.push_back({c.first_token, c.n_tokens, c.start_pos, c.block_table});
  }

  std::vector<float> x(static_cast<size_t>(n * H)), h(static_cast<size_t>(n * H)), q(static_cast<size_t>(n * Q)), k(static_cast<size_t>(n * KV)), v(static_cast<size_t>(n * KV)),
      attn(static_cast<size_t>(n * Q)), mlp_out(static_cast<size_t>(n * H));
  std::vector<float> router_logits;
  std::vector<int32_t> expert_ids;
  std::vector<float> expert_weights;

  // Embedding
  for (int64_t t = 0; t < n; ++t) cpu::load_row(model_.embed, batch.tokens[size_t(t)], x.data() + t * H);

  for (int64_t l = 0; l < spec_.n_layers; ++l) {
    const LayerWeights& w = model_.layers[size_t(l)];
    const int layer = int(l);

    // Attention block: norm, q/k/v projections, q/k norm, rotary positions, paged GQA, output.
    cpu::rmsnorm(x.data(), n, H, w.attn_norm, spec_.rms_norm_eps, h.data());
    cpu::matmul(pool_, h.data(), n, w.q, q.data(), &w.q_bias);
    cpu::matmul(pool_, h.data(), n, w.k, k.data(), &w.k_bias);
    cpu::matmul(pool_, h.data(), n, w.v, v.data(), &w.v_bias);
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
    cpu::apply_rope(rope_, q.data(), n, n_heads, D, positions.data());
    cpu::apply_rope(rope_, k.data(), n, n_kv, D, positions.data());
    const cpu::PagedKv kv{kv_k_[size_t(l)].get(), kv_v_[size_t(l)].get(), kv_config_.block_size, n_kv, D};
    cpu::paged_attention(pool_, kv, chunks, q.data(), k.data(), v.data(), n_heads, attn.data());
    cpu::matmul(pool_, attn.data(), n, w.o, h.data(), &w.o_bias);
    for (int64_t i = 0; i < n * H; ++i) x[size_t(i)] += h[size_t(i)];
    if (observer) observer->on_tensor("attn_residual", layer, x.data(), n, H);

    // MLP block: norm, then routed experts or the dense SwiGLU MLP.
    cpu::rmsnorm(x.data(), n, H, w.mlp_norm, spec_.rms_norm_eps, h.data());
    if (spec_.layer_is_moe[size_t(l)]) {
      const int64_t E = spec_.n_experts, top_k = spec_.n_experts_per_token;
      router_logits.resize(static_cast<size_t>(n * E));
      expert_ids.resize(static_cast<size_t>(n * top_k));
      expert_weights.resize(static_cast<size_t>(n * top_k));
      cpu::matmul(pool_, h.data(), n, w.router, router_logits.data(), &w.router_bias);
      cpu::route_topk(router_logits.data(), n, E, top_k, spec_.norm_topk_prob, expert_ids.data(),
                      expert_weights.data());
      if (observer) observer->on_router(layer, n, top_k, expert_ids.data(), expert_weights.data());
      cpu::moe_experts(pool_, h.data(), n, H, top_k, expert_ids.data(), expert_weights.data(),
                       experts_[size_t(l)], mlp_out.data());
    } else {
      cpu::swiglu_mlp(pool_, h.data(), n, {&w.dense.gate, &w.dense.up, &w.dense.down}, mlp_out.data());
    }
    for (int64_t i = 0; i < n * H; ++i) x[size_t(i)] += mlp_out[size_t(i)];
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
  return kv_bytes_per_token(spec, KvFormat::F32) * int64_t(block_size);
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
