// The `--quant` presets: spill's own table of which tensor gets which type, written to give the
// same types as llama.cpp's llama-quantize for the tensors spill has (llama_tensor_get_type in
// its src/llama-quant.cpp, read 2026-12-01), except where docs/QUANT.md says otherwise.
#include "quant/quant_mix.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "core/strings.h"

namespace spill::quant {

namespace {

struct PresetInfo {
  Preset preset;
  std::string_view name;
  DType base;  // the type every quantizable tensor gets unless a rule below says otherwise
  int32_t llama_ftype;  // llama.cpp's enum llama_ftype (general.file_type in a GGUF file)
};

constexpr PresetInfo kPresets[] = {
    {Preset::F16, "f16", DType::F16, 1},          {Preset::BF16, "bf16", DType::BF16, 32},
    {Preset::Q8_0, "q8_0", DType::Q8_0, 7},       {Preset::Q6_K, "q6_k", DType::Q6_K, 18},
    {Preset::Q5_K_M, "q5_k_m", DType::Q5_K, 17},  {Preset::Q5_K_S, "q5_k_s", DType::Q5_K, 16},
    {Preset::Q4_K_M, "q4_k_m", DType::Q4_K, 15},  {Preset::Q4_K_S, "q4_k_s", DType::Q4_K, 14},
    {Preset::Q3_K_L, "q3_k_l", DType::Q3_K, 13},  {Preset::Q3_K_M, "q3_k_m", DType::Q3_K, 12},
    {Preset::Q3_K_S, "q3_k_s", DType::Q3_K, 11},  {Preset::Q2_K, "q2_k", DType::Q2_K, 10},
    {Preset::IQ4_XS, "iq4_xs", DType::IQ4_XS, 30}, {Preset::MXFP4_MOE, "mxfp4_moe", DType::MXFP4, 38},
};

const PresetInfo& info(Preset p) {
  for (const PresetInfo& i : kPresets)
    if (i.preset == p) return i;
  fail("internal: preset {} has no table entry", int(p));
}

constexpr std::string_view kClassNames[kNumTensorClasses] = {"experts", "shared", "dense", "attention",
                                                             "embed",   "head",   "router"};

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

std::string preset_list() {
  std::string s;
  for (const PresetInfo& i : kPresets) s += (s.empty() ? "" : ", ") + std::string(i.name);
  return s;
}

// llama.cpp's "use more bits" layers: the first and last eighth, and every third layer between.
bool use_more_bits(int32_t layer, int32_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

// The preset's type for one quantizable tensor, before the row-width fallback.
DType preset_type(Preset p, const MixModelShape& m, const TensorSlot& t) {
  const DType base = info(p).base;
  if (p == Preset::F16 || p == Preset::BF16) return base;  // no rules: every matrix in the float type
  const int32_t L = t.layer, n = m.n_layers;
  const bool mixtral_like = m.n_experts == 8;  // llama.cpp's 8-expert rules (Mixtral)
  const int32_t gqa = m.n_kv_heads > 0 ? m.n_heads / m.n_kv_heads : 1;
  const bool is_head = t.kind == TensorKind::Output || (t.kind == TensorKind::TokenEmbd && m.tied_embeddings);

  // The output head (and a tied embedding): Q6_K in every k-quant and IQ mix, Q8_0 in q8_0 and
  // mxfp4_moe, and Q8_0 when its width does not fit the base type's blocks.
  if (is_head) {
    if (p == Preset::MXFP4_MOE || !row_fits(base, t.cols) || base == DType::Q8_0) return DType::Q8_0;
    return DType::Q6_K;
  }
  // mxfp4_moe: MXFP4 for routed experts, Q8_0 for everything else.
  if (p == Preset::MXFP4_MOE) return t.ffn == FfnOwner::Routed ? DType::MXFP4 : DType::Q8_0;

  switch (t.kind) {
    case TensorKind::AttnV:
      if (mixtral_like) return DType::Q8_0;
      switch (p) {
        case Preset::Q2_K: return gqa >= 4 ? DType::Q4_K : DType::Q3_K;
        case Preset::Q3_K_M: return L < 2 ? DType::Q5_K : DType::Q4_K;
        case Preset::Q3_K_L: return DType::Q5_K;
        case Preset::IQ4_XS: return gqa >= 4 ? DType::Q5_K : base;
        case Preset::Q4_K_M:
        case Preset::Q5_K_M: return use_more_bits(L, n) ? DType::Q6_K : base;
        case Preset::Q4_K_S: return L < 4 ? DType::Q5_K : base;
        default: return base;
      }
    case TensorKind::AttnK: return mixtral_like ? DType::Q8_0 : base;
    case TensorKind::AttnOutput:
      if (mixtral_like) {
        switch (p) {
          case Preset::Q2_K: case Preset::Q3_K_S: case Preset::Q3_K_M: case Preset::Q4_K_S:
          case Preset::Q4_K_M: case Preset::IQ4_XS: return DType::Q5_K;
          default: return base;
        }
      }
      switch (p) {
        case Preset::Q2_K: return DType::Q3_K;
        case Preset::Q3_K_M: return DType::Q4_K;
        case Preset::Q3_K_L: return DType::Q5_K;
        default: return base;
      }
    case TensorKind::FfnDown:  // dense, routed and shared alike, by layer
      switch (p) {
        case Preset::Q2_K: return DType::Q3_K;
        case Preset::Q3_K_M: return L < n / 16 ? DType::Q5_K : DType::Q4_K;
        case Preset::Q3_K_L: return DType::Q5_K;
        case Preset::Q4_K_M:
        case Preset::Q5_K_M: return use_more_bits(L, n) ? DType::Q6_K : base;
        case Preset::IQ4_XS: return L < n / 8 ? DType::Q5_K : base;  // llama.cpp: only without an imatrix
        case Preset::Q4_K_S: return L < n / 8 ? DType::Q5_K : base;
        default: return base;
      }
    default: return base;
  }
}

}  // namespace

std::string_view tensor_class_name(TensorClass c) { return kClassNames[int(c)]; }

int32_t preset_llama_ftype(Preset p) { return p == Preset::None ? -1 : info(p).llama_ftype; }

std::string_view preset_name(Preset p) { return p == Preset::None ? "none" : info(p).name; }

const std::vector<Preset>& all_presets() {
  static const std::vector<Preset> all = [] {
    std::vector<Preset> v;
    for (const PresetInfo& i : kPresets) v.push_back(i.preset);
    return v;
  }();
  return all;
}

bool QuantMix::empty() const {
  return preset == Preset::None && std::none_of(std::begin(class_type), std::end(class_type),
                                                [](const std::optional<DType>& t) { return t.has_value(); });
}

std::string QuantMix::str() const {
  std::string s = preset == Preset::None ? "" : std::string(preset_name(preset));
  for (int c = 0; c < kNumTensorClasses; ++c)
    if (class_type[c])
      s += fmt::format("{}{}={}", s.empty() ? "" : ",", kClassNames[c], ascii_lower(dtype_name(*class_type[c])));
  return s.empty() ? "none" : s;
}

QuantMix parse_quant_mix(std::string_view spec) {
  QuantMix mix;
  if (trim(spec).empty()) fail("--quant: empty; give a preset ({}) or class=type pairs", preset_list());
  size_t pos = 0;
  bool first = true;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string_view::npos) end = spec.size();
    const std::string part = trim(spec.substr(pos, end - pos));
    pos = end + 1;
    if (part.empty()) fail("--quant '{}': an empty item between commas", spec);
    const size_t eq = part.find('=');
    if (eq == std::string::npos) {
      const std::string name = ascii_lower(part);
      auto it = std::find_if(std::begin(kPresets), std::end(kPresets),
                             [&](const PresetInfo& i) { return i.name == name; });
      if (it == std::end(kPresets))
        fail("--quant '{}': '{}' is not a preset (presets: {}; or give class=type, e.g. experts=q3_k)", spec, part,
             preset_list());
      if (!first) fail("--quant '{}': the preset '{}' must come first, before any class=type", spec, part);
      mix.preset = it->preset;
    } else {
      const std::string cls = ascii_lower(trim(part.substr(0, eq))), type = trim(part.substr(eq + 1));
      if (cls == "norms" || cls == "norm")
        fail("--quant '{}': norms are never quantized (they stay F32); leave '{}' out", spec, part);
      auto it = std::find(std::begin(kClassNames), std::end(kClassNames), cls);
      if (it == std::end(kClassNames))
        fail("--quant '{}': '{}' is not a tensor class (classes: experts, shared, dense, attention, embed, head, "
             "router)",
             spec, cls);
      DType t;
      if (!parse_dtype_name(type, t))
        fail("--quant '{}': '{}' is not a type (types: f32, f16, bf16, q8_0, q6_k, q5_k, q4_k, q3_k, q2_k, iq4_xs, "
             "mxfp4, q4_0, q4_1, q5_0, q5_1, iq4_nl)",
             spec, type);
      auto& slot = mix.class_type[it - std::begin(kClassNames)];
      if (slot) fail("--quant '{}': the class '{}' is given twice", spec, cls);
      slot = t;
    }
    first = false;
    if (end == spec.size()) break;
  }
  return mix;
}

std::optional<TensorClass> tensor_class(const TensorSlot& t, const MixModelShape& m) {
  switch (t.kind) {
    case TensorKind::TokenEmbd: return m.tied_embeddings ? TensorClass::Head : TensorClass::Embed;
    case TensorKind::Output: return TensorClass::Head;
    case TensorKind::AttnQ: case TensorKind::AttnK: case TensorKind::AttnV: case TensorKind::AttnOutput:
      return TensorClass::Attention;
    case TensorKind::FfnGate: case TensorKind::FfnUp: case TensorKind::FfnDown:
      switch (t.ffn) {
        case FfnOwner::Routed: return TensorClass::Experts;
        case FfnOwner::Shared: return TensorClass::Shared;
        default: return TensorClass::Dense;
      }
    case TensorKind::Router: return TensorClass::Router;
    case TensorKind::Norm: case TensorKind::Bias: return std::nullopt;
  }
  return std::nullopt;
}

DType fallback_type(DType wanted, int64_t cols) {
  if (row_fits(wanted, cols)) return wanted;
  // llama.cpp's tensor_type_fallback: the 32-weight format of about the same bits per weight.
  DType small = DType::F16;
  switch (wanted) {
    case DType::Q2_K:
    case DType::Q3_K: small = DType::Q4_0; break;
    case DType::Q4_K: small = DType::Q5_0; break;
    case DType::Q5_K: small = DType::Q5_1; break;
    case DType::Q6_K: small = DType::Q8_0; break;
    case DType::IQ4_XS: small = DType::IQ4_NL; break;
    default: break;  // 32-weight and float types: nothing smaller to fall back to
  }
  return row_fits(small, cols) ? small : DType::F16;
}

TypeChoice resolve_tensor_type(const QuantMix& mix, const MixModelShape& shape, const TensorSlot& slot) {
  TypeChoice c;
  const std::optional<TensorClass> cls = tensor_class(slot, shape);
  if (!cls) return c;  // norms and biases
  if (mix.class_type[int(*cls)]) {
    c.wanted = *mix.class_type[int(*cls)];
  } else if (mix.preset != Preset::None && *cls != TensorClass::Router) {  // llama.cpp never quantizes routers
    c.wanted = preset_type(mix.preset, shape, slot);
  } else {
    return c;
  }
  c.quantize = true;
  c.type = fallback_type(c.wanted, slot.cols);
  if (c.type != c.wanted)
    c.fallback_reason = fmt::format("{} columns are not a whole number of {}-weight {} blocks", slot.cols,
                                    dtype_block_elems(c.wanted), dtype_name(c.wanted));
  return c;
}

}  // namespace spill::quant
