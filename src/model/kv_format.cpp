#include "model/kv_format.h"

#include <cctype>
#include <string>

#include "core/error.h"

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
  std::string t(text);
  for (char& c : t) c = char(std::tolower(static_cast<unsigned char>(c)));
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

}  // namespace spill
