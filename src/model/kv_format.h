// What a KV cache stores K and V in, and what that costs per token. The runners own their KV
// pools and report their format (ModelRunner::kv_config()); the placement planner sizes pools with
// the same arithmetic, so the two cannot drift.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "formats/model_spec.h"
#include "model/batch.h"

namespace spill {

// KvFormat itself (F32, BF16, Fp8E4m3) is declared in core/dtype.h, where the CUDA sources (C++17)
// can include it.
std::string_view kv_format_name(KvFormat f);  // "f32", "bf16", "fp8"
// "f32", "bf16", "fp8" / "fp8_e4m3" (case-insensitive); throws spill::Error naming flag.
KvFormat parse_kv_format(std::string_view text, std::string_view flag = "--kv-format");

// K and V of one token in one layer.
int64_t kv_bytes_per_token_per_layer(const ModelSpec& spec, KvFormat format);
// All layers.
int64_t kv_bytes_per_token(const ModelSpec& spec, KvFormat format);

// KV cache groups (as vLLM's hybrid KV manager groups layers by attention kind): the layers of a
// group share one block table per sequence. One group unless the model mixes sliding-window and
// full-attention layers (gpt-oss); then group 0 holds the full layers and group 1 the sliding ones.
//
// One pool serves every group: a block id belongs to one group at a time and holds, for each
// layer of that group, block_size positions of KV. Layer i of every group uses the same plane of
// the pool (KvGroups::plane), so a block is layers_per_block() layers deep. Groups of unequal
// size leave the planes above the smaller group's size unused in its blocks (gpt-oss's published
// models alternate evenly, 18 + 18 and 12 + 12).
struct KvGroup {
  int32_t window = 0;           // > 0: the layers see the last `window` positions only; 0: all
  std::vector<int32_t> layers;  // ascending
};
struct KvGroups {
  std::vector<KvGroup> groups;
  std::vector<int32_t> group_of;  // per layer
  std::vector<int32_t> plane;     // per layer: its index within its group, the pool plane it uses

  int32_t size() const { return int32_t(groups.size()); }
  int64_t layers_per_block() const;
  std::vector<int32_t> windows() const;
};
KvGroups kv_groups(const ModelSpec& spec);

// The most blocks one sequence of n_tokens holds at once when it advances a token at a time: every
// position's block in a full group, the blocks that cover a window in a sliding one (what
// paging needs: a window of w positions starting anywhere spans ceil((w - 1) / bs) + 1 blocks).
// windows: one entry per group (KvGroups::windows, KvCacheConfig::group_windows).
int64_t kv_blocks_for_sequence(std::span<const int32_t> windows, int64_t n_tokens, int32_t block_size);
// The longest sequence a pool of n_blocks holds alone (n_blocks * block_size with one full group).
int64_t kv_pool_tokens(std::span<const int32_t> windows, int64_t n_blocks, int32_t block_size);

// KV bytes one sequence of n_tokens keeps (all layers; a sliding layer keeps only what its window
// and paging need, in whole blocks as the pool holds them). With no sliding layer:
// n_tokens rounded up to whole blocks, times kv_bytes_per_token.
int64_t kv_bytes_for_sequence(const ModelSpec& spec, KvFormat format, int64_t n_tokens, int32_t block_size);

}  // namespace spill
