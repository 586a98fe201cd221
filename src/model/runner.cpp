// What every runner shares: the KV pool rule, limits, and the host half of forward_sample.
#include "model/runner.h"

#include <algorithm>

#include "core/error.h"

namespace spill {

int64_t resolve_kv_blocks(const ModelSpec& spec, const KvCapacity& capacity, int64_t bytes_per_block) {
  if (capacity.block_size <= 0) fail("--block-size must be positive, got {}", capacity.block_size);
  if (bytes_per_block <= 0) fail("KV pool: a block of {} bytes is not a size (internal error)", bytes_per_block);
  if (capacity.blocks < 0 || capacity.bytes < 0) fail("--kv-blocks and --kv-mem must be positive");
  if (capacity.blocks > 0 && capacity.bytes > 0) fail("give the KV cache size once: --kv-blocks or --kv-mem, not both");
  if (capacity.blocks > 0) return capacity.blocks;
  if (capacity.bytes > 0) {
    const int64_t n = capacity.bytes / bytes_per_block;
    if (n < 1)
      fail("--kv-mem {} bytes does not hold one KV block ({} bytes for {} tokens of this model); give at least {}",
           capacity.bytes, bytes_per_block, capacity.block_size, bytes_per_block);
    return n;
  }
  // Default: room for 4 full-context sequences, capped at 2 GiB so a laptop is not swamped.
  const int64_t context = std::max<int64_t>(spec.max_position_embeddings, capacity.block_size);
  const int64_t wanted = 4 * kv_blocks_for_sequence(kv_groups(spec).windows(), context, capacity.block_size);
  const int64_t cap = std::max<int64_t>(1, (int64_t(2) << 30) / bytes_per_block);
  return std::min(wanted, cap);
}

void RunnerLimits::validate() const {
  if (max_seqs < 1) fail("runner: the most sequences per step (--max-seqs) must be at least 1, got {}", max_seqs);
  if (max_batch_tokens < 1)
    fail("runner: the most tokens per step (--max-batch-tokens) must be at least 1, got {}", max_batch_tokens);
  if (max_model_len < 0) fail("runner: --max-model-len must be positive, got {}", max_model_len);
}

RunnerLimits resolve_runner_limits(const ModelSpec& spec, RunnerLimits limits, const KvCacheConfig& kv) {
  limits.validate();
  if (limits.max_model_len == 0) {
    const int64_t pool_tokens = kv.pool_tokens();
    limits.max_model_len =
        spec.max_position_embeddings > 0 ? std::min(pool_tokens, spec.max_position_embeddings) : pool_tokens;
  }
  if (limits.max_model_len < 1) fail("runner: a KV pool of {} blocks holds no sequence", kv.n_blocks);
  return limits;
}

void HandBuiltTables::attach(SeqChunk& chunk, bool first_in_slot) const {
  chunk.block_table = tables.at(0);
  for (size_t g = 1; g < tables.size(); ++g) chunk.group_tables[g - 1] = tables[g];
  if (!first_in_slot) return;
  chunk.first_in_slot = true;
  chunk.new_blocks = tables[0];
  for (size_t g = 1; g < tables.size(); ++g) chunk.group_new_blocks[g - 1] = tables[g];
}

HandBuiltTables hand_built_tables(const ModelSpec& spec, int64_t blocks_per_table, int32_t first) {
  HandBuiltTables t;
  const int32_t n_groups = kv_groups(spec).size();
  for (int32_t g = 0; g < n_groups; ++g) {
    std::vector<int32_t> table(static_cast<size_t>(blocks_per_table));
    for (int64_t b = 0; b < blocks_per_table; ++b) table[size_t(b)] = int32_t(first + g * blocks_per_table + b);
    t.tables.push_back(std::move(table));
  }
  return t;
}

int64_t hand_built_pool_blocks(const ModelSpec& spec, int64_t blocks_per_table, int64_t n_seqs) {
  return n_seqs * kv_groups(spec).size() * blocks_per_table;
}

void ModelRunner::forward_sample(const ForwardBatch& batch, std::span<SequenceSampler* const> samplers,
                                 StepResult& out, ForwardObserver* observer) {
  if (batch.all_logits) fail("forward_sample: a batch that wants every token's logits is for forward() (internal error)");
  if (int64_t(samplers.size()) != batch.n_logit_rows())
    fail("forward_sample: {} samplers for {} logit rows (internal error)", samplers.size(), batch.n_logit_rows());
  forward(batch, host_logits_, observer);
  sample_on_host(host_logits_, samplers, out);
}

void ModelRunner::sample_on_host(std::span<const float> logits, std::span<SequenceSampler* const> samplers,
                                 StepResult& out) {
  const size_t vocab = size_t(spec().vocab_size);
  if (logits.size() != samplers.size() * vocab)
    fail("forward_sample: {} logits for {} rows of {} (internal error)", logits.size(), samplers.size(), vocab);
  out.rows.resize(samplers.size());
  for (size_t r = 0; r < samplers.size(); ++r) {
    SampledRow& row = out.rows[r];
    row.error.clear();
    if (!samplers[r]) fail("forward_sample: logit row {} has no sampler (internal error)", r);
    try {
      row.sampled = samplers[r]->sample(logits.subspan(r * vocab, vocab), sampler_workspace_);
    } catch (const Error& e) {
      // The sampler's own verdict on this row (every logit -inf or NaN): this request only.
      row.sampled = SampledToken{};
      row.error = e.what();
    }
  }
}

}  // namespace spill
