// The WeightSource of a Hugging Face folder: roles to the Hub's tensor names.
#include <fmt/format.h>

#include <deque>
#include <memory>

#include "formats/safetensors.h"
#include "model/gpt_oss_experts.h"
#include "model/weight_source.h"

namespace spill {

const char* weight_role_name(WeightRole role) {
  switch (role) {
    case WeightRole::Embed: return "embedding";
    case WeightRole::FinalNorm: return "final norm";
    case WeightRole::LmHead: return "LM head";
    case WeightRole::AttnNorm: return "attention norm";
    case WeightRole::Q: return "q projection";
    case WeightRole::K: return "k projection";
    case WeightRole::V: return "v projection";
    case WeightRole::O: return "output projection";
    case WeightRole::QBias: return "q bias";
    case WeightRole::KBias: return "k bias";
    case WeightRole::VBias: return "v bias";
    case WeightRole::OBias: return "output bias";
    case WeightRole::QNorm: return "q norm";
    case WeightRole::KNorm: return "k norm";
    case WeightRole::Sinks: return "attention sinks";
    case WeightRole::QA: return "q down-projection (q_a)";
    case WeightRole::QANorm: return "q latent norm";
    case WeightRole::QB: return "q up-projection (q_b)";
    case WeightRole::KVA: return "kv down-projection (kv_a)";
    case WeightRole::KVANorm: return "kv latent norm";
    case WeightRole::KVB: return "kv up-projection (kv_b)";
    case WeightRole::MlpNorm: return "MLP norm";
    case WeightRole::DenseGate: return "MLP gate";
    case WeightRole::DenseUp: return "MLP up";
    case WeightRole::DenseDown: return "MLP down";
    case WeightRole::Router: return "router";
    case WeightRole::RouterBias: return "router bias";
    case WeightRole::RouterCorrectionBias: return "router correction bias";
    case WeightRole::SharedGate: return "shared experts gate";
    case WeightRole::SharedUp: return "shared experts up";
    case WeightRole::SharedDown: return "shared experts down";
    case WeightRole::ExpertGate: return "expert gate";
    case WeightRole::ExpertUp: return "expert up";
    case WeightRole::ExpertDown: return "expert down";
    case WeightRole::ExpertsGate: return "fused expert gates";
    case WeightRole::ExpertsUp: return "fused expert ups";
    case WeightRole::ExpertsDown: return "fused expert downs";
    case WeightRole::ExpertsGateUp: return "fused expert gate+up";
    case WeightRole::ExpertsGateBias: return "expert gate biases";
    case WeightRole::ExpertsUpBias: return "expert up biases";
    case WeightRole::ExpertsDownBias: return "expert down biases";
  }
  return "?";
}

namespace {

class SafetensorsSource final : public WeightSource {
 public:
  SafetensorsSource(const std::string& dir, const ModelSpec& spec)
      : store_(WeightStore::open_folder(dir)), gpt_oss_(spec.arch == Arch::GptOss) {
    if (gpt_oss_) unpack_gpt_oss(spec);
  }

  const std::string& where() const override { return store_.dir(); }
  const TensorView* find(const WeightKey& key) const override {
    if (gpt_oss_ && is_gpt_oss_expert_role(key.role)) {
      auto it = gpt_oss_experts_.find(key.layer);
      if (it == gpt_oss_experts_.end()) return nullptr;
      switch (key.role) {
        case WeightRole::ExpertsGate: return &it->second.gate;
        case WeightRole::ExpertsUp: return &it->second.up;
        case WeightRole::ExpertsDown: return &it->second.down;
        case WeightRole::ExpertsGateBias: return &it->second.gate_bias;
        case WeightRole::ExpertsUpBias: return &it->second.up_bias;
        case WeightRole::ExpertsDownBias: return &it->second.down_bias;
        default: return nullptr;  // gpt-oss's fused gate_up is only read through the unpacked roles
      }
    }
    const std::string name = name_of(key);
    if (name.empty()) return nullptr;
    if (const TensorView* t = store_.find(name)) return t;
    // transformers 5 saves fused experts with or without the ".weight" suffix.
    if (is_fused(key.role)) return store_.find(name + ".weight");
    return nullptr;
  }
  std::string describe(const WeightKey& key) const override {
    if (gpt_oss_ && is_gpt_oss_expert_role(key.role))
      return fmt::format("{}: layer {}'s experts (model.layers.{}.mlp.experts.*, unpacked at load)", where(), key.layer,
                         key.layer);
    const std::string name = name_of(key);
    if (name.empty()) return fmt::format("{}: {} (no such tensor in a Hugging Face checkpoint)", where(),
                                         weight_role_name(key.role));
    const std::string stored = store_.find(name) || !is_fused(key.role) ? name : name + ".weight";
    if (store_.find(stored)) return fmt::format("{}: tensor '{}'", store_.file_of(stored), stored);
    return fmt::format("{}: tensor '{}'", where(), name);
  }
  const std::map<std::string, TensorView>& tensors() const override { return store_.all(); }

 private:
  static bool is_fused(WeightRole r) { return r == WeightRole::ExpertsGateUp || r == WeightRole::ExpertsDown; }
  static bool is_gpt_oss_expert_role(WeightRole r) {
    switch (r) {
      case WeightRole::ExpertsGate: case WeightRole::ExpertsUp: case WeightRole::ExpertsDown:
      case WeightRole::ExpertsGateUp: case WeightRole::ExpertsGateBias: case WeightRole::ExpertsUpBias:
      case WeightRole::ExpertsDownBias: return true;
      default: return false;
    }
  }

  // gpt-oss experts are interleaved and transposed (bf16) or MXFP4-packed in the checkpoint; they
  // are unpacked once into spill's layout (gpt_oss_experts.h), in buffers this source owns.
  void unpack_gpt_oss(const ModelSpec& spec) {
    const GptOssExpertShape shape{spec.n_experts, spec.hidden_size, spec.moe_intermediate_size};
    auto alloc = [this](size_t n) {
      owned_.emplace_back(std::make_unique<uint8_t[]>(n));
      return owned_.back().get();
    };
    for (int32_t l = 0; l < int32_t(spec.n_layers); ++l)
      gpt_oss_experts_.emplace(
          l, unpack_gpt_oss_experts(store_, "model.layers." + std::to_string(l) + ".mlp.experts.", shape, alloc));
  }

  // The MoE block's prefix: Mixtral checkpoints say block_sparse_moe with w1 (gate), w3 (up), w2 (down).
  std::string moe_prefix(const std::string& layer, bool& mixtral) const {
    mixtral = store_.find(layer + "block_sparse_moe.gate.weight") != nullptr;
    return layer + (mixtral ? "block_sparse_moe." : "mlp.");
  }

  std::string name_of(const WeightKey& key) const {
    switch (key.role) {
      case WeightRole::Embed: return "model.embed_tokens.weight";
      case WeightRole::FinalNorm: return "model.norm.weight";
      case WeightRole::LmHead: return "lm_head.weight";
      default: break;
    }
    const std::string p = "model.layers." + std::to_string(key.layer) + ".";
    bool mixtral = false;
    switch (key.role) {
      case WeightRole::AttnNorm: return p + "input_layernorm.weight";
      case WeightRole::MlpNorm: return p + "post_attention_layernorm.weight";
      case WeightRole::Q: return p + "self_attn.q_proj.weight";
      case WeightRole::K: return p + "self_attn.k_proj.weight";
      case WeightRole::V: return p + "self_attn.v_proj.weight";
      case WeightRole::O: return p + "self_attn.o_proj.weight";
      case WeightRole::QBias: return p + "self_attn.q_proj.bias";
      case WeightRole::KBias: return p + "self_attn.k_proj.bias";
      case WeightRole::VBias: return p + "self_attn.v_proj.bias";
      case WeightRole::OBias: return p + "self_attn.o_proj.bias";
      case WeightRole::QNorm: return p + "self_attn.q_norm.weight";
      case WeightRole::KNorm: return p + "self_attn.k_norm.weight";
      case WeightRole::Sinks: return p + "self_attn.sinks";
      case WeightRole::QA: return p + "self_attn.q_a_proj.weight";
      case WeightRole::QANorm: return p + "self_attn.q_a_layernorm.weight";
      case WeightRole::QB: return p + "self_attn.q_b_proj.weight";
      case WeightRole::KVA: return p + "self_attn.kv_a_proj_with_mqa.weight";
      case WeightRole::KVANorm: return p + "self_attn.kv_a_layernorm.weight";
      case WeightRole::KVB: return p + "self_attn.kv_b_proj.weight";
      case WeightRole::RouterBias: return gpt_oss_ ? p + "mlp.router.bias" : std::string();
      case WeightRole::RouterCorrectionBias: return p + "mlp.gate.e_score_correction_bias";
      case WeightRole::SharedGate: return p + "mlp.shared_experts.gate_proj.weight";
      case WeightRole::SharedUp: return p + "mlp.shared_experts.up_proj.weight";
      case WeightRole::SharedDown: return p + "mlp.shared_experts.down_proj.weight";
      case WeightRole::DenseGate: return p + "mlp.gate_proj.weight";
      case WeightRole::DenseUp: return p + "mlp.up_proj.weight";
      case WeightRole::DenseDown: return p + "mlp.down_proj.weight";
      case WeightRole::Router: return gpt_oss_ ? p + "mlp.router.weight" : moe_prefix(p, mixtral) + "gate.weight";
      case WeightRole::ExpertGate:
      case WeightRole::ExpertUp:
      case WeightRole::ExpertDown: {
        const std::string moe = moe_prefix(p, mixtral);
        const char* proj = key.role == WeightRole::ExpertGate ? (mixtral ? "w1" : "gate_proj")
                           : key.role == WeightRole::ExpertUp ? (mixtral ? "w3" : "up_proj")
                                                              : (mixtral ? "w2" : "down_proj");
        return moe + "experts." + std::to_string(key.expert) + "." + proj + ".weight";
      }
      case WeightRole::ExpertsGateUp: return moe_prefix(p, mixtral) + "experts.gate_up_proj";
      case WeightRole::ExpertsDown: return moe_prefix(p, mixtral) + "experts.down_proj";
      default: return {};  // roles Hugging Face checkpoints of these families do not have
    }
  }

  WeightStore store_;
  bool gpt_oss_ = false;
  std::map<int32_t, GptOssExpertTensors> gpt_oss_experts_;
  std::deque<std::unique_ptr<uint8_t[]>> owned_;
};

}  // namespace

std::unique_ptr<WeightSource> open_safetensors_source(const std::string& dir, const ModelSpec& spec) {
  return std::make_unique<SafetensorsSource>(dir, spec);
}

}  // namespace spill
