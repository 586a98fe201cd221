// What a KV cache stores K and V in, and what that costs per token. The runners own their KV
// pools and report their format (ModelRunner::kv_config()); the placement planner sizes pools with
// the same arithmetic, so the two cannot drift.
#pragma once
#include <cstdint>
#include <string_view>

#include "formats/model_spec.h"

namespace spill {

// F32 is what the CPU runner keeps; BF16 and FP8 (e4m3 values with one f32 scale per token, KV
// head and K or V) are for GPU runners.
enum class KvFormat : uint8_t { F32, BF16, Fp8E4m3 };
std::string_view kv_format_name(KvFormat f);  // "f32", "bf16", "fp8"
// "f32", "bf16", "fp8" / "fp8_e4m3" (case-insensitive); throws spill::Error naming flag.
KvFormat parse_kv_format(std::string_view text, std::string_view flag = "--kv-format");

// K and V of one token in one layer.
int64_t kv_bytes_per_token_per_layer(const ModelSpec& spec, KvFormat format);
// All layers.
int64_t kv_bytes_per_token(const ModelSpec& spec, KvFormat format);

}  // namespace spill
