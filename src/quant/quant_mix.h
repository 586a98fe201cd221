// Which block format each weight gets: the `--quant` spec. A spec is a preset that mirrors one of
// llama.cpp's mixes (q4_k_m, q3_k_m, ...), per-class types (experts=q3_k,attention=q8_0), or a
// preset with classes on top ("q4_k_m,experts=q3_k"). resolve_tensor_type() turns it into one
// type per tensor, layer by layer as llama.cpp's mixes do, then applies the row-width fallback
// (a row must be a whole number of blocks). The table itself is in quant_mix.cpp; docs/QUANT.md
// says where it differs from llama.cpp's.
//
// Knows nothing of model files: the caller (model/quantize_on_load) says what a tensor is.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace spill::quant {

// The classes `--quant` names. Norms, biases and the router (unless named) are never quantized.
enum class TensorClass : uint8_t { Experts, Shared, Dense, Attention, Embed, Head, Router };
constexpr int kNumTensorClasses = 7;
std::string_view tensor_class_name(TensorClass c);  // "experts", "attention", ...

// What a tensor is, in llama.cpp's categories (the rules of a mix are stated in these).
enum class TensorKind : uint8_t {
  TokenEmbd, Output, AttnQ, AttnK, AttnV, AttnOutput, FfnGate, FfnUp, FfnDown, Router,
  Norm, Bias,  // never quantized
};
// Whose FFN an FFN tensor (FfnGate/Up/Down) is.
enum class FfnOwner : uint8_t { None, Routed, Shared, Dense };

enum class Preset : uint8_t {
  None,  // classes only
  F16, BF16, Q8_0, Q6_K, Q5_K_M, Q5_K_S, Q4_K_M, Q4_K_S, Q3_K_L, Q3_K_M, Q3_K_S, Q2_K, IQ4_XS, MXFP4_MOE,
};
std::string_view preset_name(Preset p);  // "q4_k_m"
// llama.cpp's llama_ftype of the preset (GGUF general.file_type), -1 for None.
int32_t preset_llama_ftype(Preset p);
// Every preset, for messages and tests.
const std::vector<Preset>& all_presets();

struct QuantMix {
  Preset preset = Preset::None;
  // Per-class type that replaces the preset's choice for every tensor of the class; unset: the
  // preset's choice (or, with no preset, the source's own type).
  std::optional<DType> class_type[kNumTensorClasses];
  bool empty() const;
  std::string str() const;  // canonical spelling, for `spill info` and docs
};

// Parses "q4_k_m", "experts=q3_k,attention=q8_0", "q4_k_m,experts=q3_k,head=q8_0". Types by
// dtype name (q8_0, q6_k, ..., f16, bf16, f32). Throws spill::Error naming the bad part.
QuantMix parse_quant_mix(std::string_view spec);

// The model-wide facts the mixes depend on.
struct MixModelShape {
  int32_t n_layers = 0;
  int32_t n_heads = 0, n_kv_heads = 0;
  int32_t n_experts = 0;       // routed experts per MoE layer (0: dense model)
  bool tied_embeddings = false;  // the embedding is also the output head
};

struct TensorSlot {
  TensorKind kind;
  FfnOwner ffn = FfnOwner::None;
  int32_t layer = -1;  // -1 for the embedding, head and final norm
  int64_t cols = 0;    // row width (ggml's ne[0]): what must be a whole number of blocks
};

struct TypeChoice {
  bool quantize = false;  // false: the tensor keeps its source type (norms, biases, unnamed classes)
  DType type = DType::F32;     // when quantize: the type stored
  DType wanted = DType::F32;   // what the mix asked for, before the row-width fallback
  bool fell_back() const { return quantize && type != wanted; }
  std::string fallback_reason;  // why, when fell_back()
};

// The class a tensor belongs to, or nullopt for norms and biases.
std::optional<TensorClass> tensor_class(const TensorSlot& slot, const MixModelShape& shape);

TypeChoice resolve_tensor_type(const QuantMix& mix, const MixModelShape& shape, const TensorSlot& slot);

// The row-width fallback alone: `wanted` if cols is a whole number of its blocks, else the
// 32-weight type llama-quantize stores instead (Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1,
// Q6_K -> Q8_0, IQ4_XS -> IQ4_NL), and F16 when that does not fit either (cols not a multiple of
// 32) or `wanted` is already a 32-weight or float type.
DType fallback_type(DType wanted, int64_t cols);

}  // namespace spill::quant
