#include "placement/tensor_types.h"

#include <fmt/format.h>

#include <cctype>
#include <vector>

#include "core/error.h"
#include "core/strings.h"
#include "quant/quant_mix.h"

namespace spill::placement {

namespace {

constexpr std::string_view kClassKeys[kNumTensorClasses] = {"embed",  "attention", "dense", "router",
                                                            "shared", "experts",   "norms", "head"};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Class-level versions of llama.cpp's mixes: its per-tensor refinements (attn_v and ffn_down one
// step larger in some layers) are not modelled; the k-quant type of the bulk and the Q6_K output
// are. Norms and router stay F32, as in llama.cpp's files.
bool apply_preset(std::string_view name, TensorClassTypes& t) {
  auto all = [&](DType d) {
    for (int c = 0; c < kNumTensorClasses; ++c) t.types[size_t(c)] = d;
    t[TensorClass::Norms] = DType::F32;
    t[TensorClass::Router] = DType::F32;
  };
  if (name == "bf16") all(DType::BF16);
  else if (name == "f16") all(DType::F16);
  else if (name == "f32") all(DType::F32);
  else if (name == "q8_0") all(DType::Q8_0);
  else if (name == "q6_k") all(DType::Q6_K);
  else if (name == "q4_k_m") {
    all(DType::Q4_K);
    t[TensorClass::LmHead] = DType::Q6_K;
  } else if (name == "q3_k_m") {
    all(DType::Q3_K);
    t[TensorClass::Attention] = DType::Q4_K;
    t[TensorClass::LmHead] = DType::Q6_K;
  } else if (name == "q2_k") {
    all(DType::Q2_K);
    t[TensorClass::Attention] = DType::Q3_K;
    t[TensorClass::LmHead] = DType::Q6_K;
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::string_view tensor_class_key(TensorClass c) { return kClassKeys[static_cast<size_t>(c)]; }

TensorClassTypes parse_tensor_class_types(std::string_view text, std::string_view flag) {
  TensorClassTypes t;
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      if (!apply_preset(ascii_lower(item), t))
        fail("{}: unknown preset \"{}\"; use bf16, f16, q8_0, q6_k, q4_k_m, q3_k_m or q2_k, or CLASS=TYPE items "
             "such as experts=q3_k,attention=q8_0",
             flag, item);
      continue;
    }
    const std::string key = ascii_lower(trim(item.substr(0, eq)));
    const std::string_view type_name = trim(item.substr(eq + 1));
    int cls = -1;
    for (int c = 0; c < kNumTensorClasses; ++c)
      if (kClassKeys[c] == key) cls = c;
    if (cls < 0)
      fail("{}: unknown tensor class \"{}\" in \"{}\"; classes are embed, attention, dense, router, shared, experts, "
           "norms, head",
           flag, key, item);
    DType d;
    if (!parse_dtype_name(type_name, d))
      fail("{}: unknown type \"{}\" in \"{}\"; types are F32, F16, BF16, Q8_0, Q6_K, Q5_K, Q4_K, Q3_K, Q2_K, IQ4_XS, "
           "MXFP4, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL",
           flag, type_name, item);
    t.types[size_t(cls)] = d;
  }
  return t;
}

std::string format_tensor_class_types(const TensorClassTypes& types) {
  std::string out;
  for (int c = 0; c < kNumTensorClasses; ++c) {
    if (c) out += ',';
    out += fmt::format("{}={}", kClassKeys[c], dtype_name(types.types[size_t(c)]));
  }
  return out;
}

DType storage_type(DType wanted, int64_t cols) { return quant::fallback_type(wanted, cols); }

}  // namespace spill::placement
