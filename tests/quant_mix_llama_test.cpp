// spill's presets against llama-quantize itself: for every tensor of four models and every preset,
// the type spill's mix gives equals the type llama-quantize wrote into the file (tests/data/quant/llama_mixes.json: spill-tiny and the
// mixtral, olmoe and llama GGUF test models of /work/gguf, made by
// tools/fixtures/make_quant_mix_fixture.py), the 32-block fallback types of rows that are not a
// multiple of 256 (Q4_0, Q5_0, Q5_1, IQ4_NL, Q8_0) included.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "quant/quant_mix.h"

namespace spill::quant {

namespace {

// A GGUF tensor name -> what spill's mix needs to know of it.
bool slot_of(const std::string& name, int64_t ne0, TensorSlot& s) {
  s = {.kind = TensorKind::Norm, .layer = -1, .cols = ne0};
  if (name == "token_embd.weight") return s.kind = TensorKind::TokenEmbd, true;
  if (name == "output.weight") return s.kind = TensorKind::Output, true;
  if (name == "output_norm.weight") return true;
  int layer = -1, used = 0;
  if (std::sscanf(name.c_str(), "blk.%d.%n", &layer, &used) != 1 || used == 0) return false;
  s.layer = layer;
  const std::string rest = name.substr(size_t(used));
  if (rest.ends_with(".bias")) return s.kind = TensorKind::Bias, true;
  if (rest.ends_with("_norm.weight")) return true;
  const std::pair<const char*, TensorKind> plain[] = {{"attn_q.weight", TensorKind::AttnQ},
                                                      {"attn_k.weight", TensorKind::AttnK},
                                                      {"attn_v.weight", TensorKind::AttnV},
                                                      {"attn_output.weight", TensorKind::AttnOutput},
                                                      {"ffn_gate_inp.weight", TensorKind::Router}};
  for (auto& [n, k] : plain)
    if (rest == n) return s.kind = k, true;
  for (auto [proj, kind] : {std::pair{"gate", TensorKind::FfnGate}, {"up", TensorKind::FfnUp}, {"down", TensorKind::FfnDown}})
    for (auto [suffix, owner] : {std::pair{".weight", FfnOwner::Dense}, {"_exps.weight", FfnOwner::Routed},
                                 {"_shexp.weight", FfnOwner::Shared}})
      if (rest == std::string("ffn_") + proj + suffix) return s.kind = kind, s.ffn = owner, true;
  return false;
}

}  // namespace

TEST(QuantMixVsLlamaQuantize, EveryTensorOfEveryPresetGetsLlamaCppsType) {
  const std::string path = std::string(SPILL_TEST_DATA) + "/quant/llama_mixes.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " is missing: run tools/fixtures/make_quant_mix_fixture.py";
  const nlohmann::json fixture = nlohmann::json::parse(in);
  int64_t compared = 0, legacy = 0;
  for (auto& [model, m] : fixture["models"].items()) {
    const auto& sh = m["shape"];
    const MixModelShape shape{.n_layers = sh["n_layers"].get<int32_t>(),
                              .n_heads = sh["n_heads"].get<int32_t>(),
                              .n_kv_heads = sh["n_kv_heads"].get<int32_t>(),
                              .n_experts = sh["n_experts"].get<int32_t>(),
                              .tied_embeddings = sh["tied"].get<bool>()};
    for (auto& [preset, types] : m["mixes"].items()) {
      const QuantMix mix = parse_quant_mix(preset);
      for (auto& [name, llama_type] : types.items()) {
        TensorSlot slot;
        ASSERT_TRUE(slot_of(name, m["tensors"][name]["ne"][0].get<int64_t>(), slot)) << model << ": " << name;
        const TypeChoice c = resolve_tensor_type(mix, shape, slot);
        const std::string want = llama_type.get<std::string>();
        if (!c.quantize) {
          // Kept as stored: llama-quantize keeps it too (F32 norms and routers in these files).
          EXPECT_EQ(llama_type.get<std::string>(), m["tensors"][name]["type"].get<std::string>())
              << model << " " << preset << " " << name;
          EXPECT_TRUE(slot.kind == TensorKind::Norm || slot.kind == TensorKind::Bias || slot.kind == TensorKind::Router)
              << model << " " << preset << " " << name << " is not quantized by spill, llama.cpp made it "
              << llama_type;
        } else {
          EXPECT_EQ(std::string(dtype_name(c.type)), want) << model << " " << preset << " " << name;
          legacy += want == "Q4_0" || want == "Q4_1" || want == "Q5_0" || want == "Q5_1" || want == "IQ4_NL";
        }
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 1500);  // 144 tensors x 14 presets in the fixture
  EXPECT_GT(legacy, 0) << "the fixture's narrow rows should exercise the legacy fallback types";
  std::printf("compared %lld tensor types, %lld of them a legacy 32-block fallback type\n", (long long)compared,
              (long long)legacy);
}

}  // namespace spill::quant
