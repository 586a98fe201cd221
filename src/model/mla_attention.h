// DeepSeek-V3's attention block (multi-head latent attention) on the CPU backend, called by the
// decoder forward (model/decoder.cpp) for layers of spec.attention == Mla.
#pragma once
#include <cstdint>
#include <span>

#include "backend/cpu/ops.h"
#include "model/batch.h"
#include "model/model.h"

namespace spill {

struct MlaBlockArgs {
  const ModelSpec& spec;
  const MlaWeights& weights;
  const cpu::RopeTable& rope;        // over qk_rope_head_dim
  const cpu::PagedLatentKv& kv;      // this layer's latent cache
  std::span<const cpu::AttentionChunk> chunks;
  const int32_t* positions;          // [n]
  ForwardObserver* observer;         // may be null
  int layer;
};

// h: the attention norm's output [n, hidden]; out: the block's output after o_proj [n, hidden].
void mla_attention_block(ThreadPool& pool, const MlaBlockArgs& args, const float* h, int64_t n, float* out);

}  // namespace spill
