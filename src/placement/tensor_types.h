// Which element type each class of tensors is stored in: the quantization mix that memory
// accounting and the planner price. One struct, one small parser of the `--quant` syntax
// (`experts=q3_k,attention=q8_0,embed=q8_0,head=q6_k,shared=q6_k`, or a preset such as q4_k_m,
// optionally followed by overrides), kept in this one place so that a shared parser can replace it.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace spill::placement {

// The classes the fit report counts bytes by.
enum class TensorClass : uint8_t {
  Embedding,      // token embedding table (vocab x hidden)
  Attention,      // q, k, v, o projections (and their biases)
  DenseMlp,       // gate/up/down of layers without experts
  Router,         // expert-choice matrix of each MoE layer
  SharedExperts,  // always-on experts (DeepSeek / Qwen2-MoE style)
  RoutedExperts,  // the routed experts: what placement moves
  Norms,          // RMSNorm weights (layer, q/k, final)
  LmHead,         // output projection (vocab x hidden); holds the embedding too when tied
};
constexpr int kNumTensorClasses = 8;

// "embed", "attention", "dense", "router", "shared", "experts", "norms", "head": the keys of --quant.
std::string_view tensor_class_key(TensorClass c);

struct TensorClassTypes {
  // Unquantized by default: bf16 as checkpoints ship, f32 norms and router (the router's
  // logits decide routing; runners keep it precise).
  std::array<DType, kNumTensorClasses> types{DType::BF16, DType::BF16, DType::BF16, DType::F32,
                                             DType::BF16, DType::BF16, DType::F32,  DType::BF16};

  DType& operator[](TensorClass c) { return types[static_cast<size_t>(c)]; }
  DType operator[](TensorClass c) const { return types[static_cast<size_t>(c)]; }
  bool operator==(const TensorClassTypes&) const = default;
};

// Parses a --quant value: comma-separated items, each a preset name (bf16, f16, q8_0, q6_k,
// q4_k_m, q3_k_m, q2_k) or CLASS=TYPE with CLASS a tensor_class_key and TYPE a DType name
// (case-insensitive). Items apply left to right, so "q4_k_m,experts=q3_k" is the preset with its
// experts overridden. Empty: the defaults. Throws spill::Error naming the flag and the bad item.
TensorClassTypes parse_tensor_class_types(std::string_view text, std::string_view flag = "--quant");

// "embed=Q8_0,attention=Q8_0,...", every class, in enum order: what a plan records.
std::string format_tensor_class_types(const TensorClassTypes& types);

// The type a matrix with rows of `cols` weights is actually stored in: `wanted` when the row is a
// whole number of its blocks, else llama.cpp's 32-weight fallback type, else F16
// (quant::fallback_type: the one rule quantize-on-load and `spill quantize` use too).
DType storage_type(DType wanted, int64_t cols);

}  // namespace spill::placement
