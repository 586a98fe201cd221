#include "model/kv_format.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/strings.h"

namespace spill {

std::string_view kv_format_name(KvFormat f) {
  switch (f) {
    case KvFormat::F32: return "f32";
    case KvFormat::BF16: return "bf16";
    case KvFormat::Fp8E4m3: return "fp8";
  }
  return "?";
}

KvFormat parse_kv_format(std::string_view text, std::string_view flag) {
  const std::string t = ascii_lower(text);
  if (t == "f32" || t == "fp32" || t == "float32") return KvFormat::F32;
  if (t == "bf16") return KvFormat::BF16;
  if (t == "fp8" || t == "fp8_e4m3" || t == "e4m3") return KvFormat::Fp8E4m3;
  fail("{}: unknown KV format \"{}\"; use f32 (the CPU runner), bf16 or fp8 (e4m3 with per-head scales)", flag, text);
}

int64_t kv_bytes_per_token_per_layer(const ModelSpec& spec, KvFormat format) {
  if (spec.attention == AttentionKind::Mla) {
    // One latent + rope key per token, shared by all heads (kv_lora_rank + qk_rope_head_dim values).
    const int64_t values = spec.mla.cache_values();
    switch (format) {
      case KvFormat::F32: return values * 4;
      case KvFormat::BF16: return values * 2;
      case KvFormat::Fp8E4m3: return values + 4;  // one f32 scale per token
    }
    return 0;
  }
  const int64_t elems = spec.n_kv_heads * spec.head_dim;  // of K, and again of V
  switch (format) {
    case KvFormat::F32: return 2 * elems * 4;
    case KvFormat::BF16: return 2 * elems * 2;
    case KvFormat::Fp8E4m3: return 2 * (elems * 1 + spec.n_kv_heads * 4);  // one f32 scale per head
  }
  return 0;
}

int64_t kv_bytes_per_token(const ModelSpec& spec, KvFormat format) {
  return spec.n_layers * kv_bytes_per_token_per_layer(spec, format);
}

int64_t KvGroups::layers_per_block() const {
  size_t most = 0;
  for (const KvGroup& g : groups) most = std::max(most, g.layers.size());
  return int64_t(most);
}

std::vector<int32_t> KvGroups::windows() const {
  std::vector<int32_t> w;
  for (const KvGroup& g : groups) w.push_back(g.window);
  return w;
}

KvGroups kv_groups(const ModelSpec& spec) {
  KvGroups kg;
  KvGroup full, sliding;
  sliding.window = int32_t(spec.sliding_window);
  for (int64_t l = 0; l < spec.n_layers; ++l) (spec.sliding(l) ? sliding : full).layers.push_back(int32_t(l));
  if (!full.layers.empty()) kg.groups.push_back(std::move(full));
  if (!sliding.layers.empty()) kg.groups.push_back(std::move(sliding));
  if (kg.groups.empty()) kg.groups.push_back({});  // no layers: a degenerate spec, one empty group
  kg.group_of.assign(size_t(spec.n_layers), 0);
  kg.plane.assign(size_t(spec.n_layers), 0);
  for (size_t g = 0; g < kg.groups.size(); ++g)
    for (size_t i = 0; i < kg.groups[g].layers.size(); ++i) {
      kg.group_of[size_t(kg.groups[g].layers[i])] = int32_t(g);
      kg.plane[size_t(kg.groups[g].layers[i])] = int32_t(i);
    }
  return kg;
}

namespace {
int64_t blocks_of_group(int32_t window, int64_t n_tokens, int32_t block_size) {
  const int64_t all = (n_tokens + block_size - 1) / block_size;
  if (window <= 0) return all;
  return std::min(all, (int64_t(window) - 1 + block_size - 1) / block_size + 1);
}
}  // namespace

int64_t kv_blocks_for_sequence(std::span<const int32_t> windows, int64_t n_tokens, int32_t block_size) {
  int64_t n = 0;
  for (int32_t w : windows) n += blocks_of_group(w, n_tokens, block_size);
  return n;
}

int64_t kv_pool_tokens(std::span<const int32_t> windows, int64_t n_blocks, int32_t block_size) {
  if (windows.size() <= 1 && (windows.empty() || windows[0] <= 0)) return n_blocks * int64_t(block_size);
  // Blocks needed grow with the length, so the longest that fits is found by bisection.
  int64_t lo = 0, hi = n_blocks * int64_t(block_size) + 1;  // fits(lo), !fits(hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (kv_blocks_for_sequence(windows, mid, block_size) <= n_blocks ? lo : hi) = mid;
  }
  // A sliding-only model holds any length in a window's blocks; the pool's positions still bound it.
  return lo;
}

int64_t kv_bytes_for_sequence(const ModelSpec& spec, KvFormat format, int64_t n_tokens, int32_t block_size) {
  const KvGroups kg = kv_groups(spec);
  int64_t slots = 0;  // block slots of one layer, summed over layers
  for (const KvGroup& g : kg.groups)
    slots += int64_t(g.layers.size()) * blocks_of_group(g.window, n_tokens, block_size) * block_size;
  return slots * kv_bytes_per_token_per_layer(spec, format);
}

}  // namespace spill
