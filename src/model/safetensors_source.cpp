// The WeightSource of a Hugging Face folder: roles to the Hub's tensor names.
#include <fmt/format.h>

#include "formats/safetensors.h"
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
    case WeightRole::MlpNorm: return "MLP norm";
    case WeightRole::DenseGate: return "MLP gate";
    case WeightRole::DenseUp: return "MLP up";
    case WeightRole::DenseDown: return "MLP down";
    case WeightRole::Router: return "router";
    case WeightRole::RouterBias: return "router bias";
    case WeightRole::ExpertGate: return "expert gate";
    case WeightRole::ExpertUp: return "expert up";
    case WeightRole::ExpertDown: return "expert down";
    case WeightRole::ExpertsGate: return "fused expert gates";
    case WeightRole::ExpertsUp: return "fused expert ups";
    case WeightRole::ExpertsDown: return "fused expert downs";
    case WeightRole::ExpertsGateUp: return "fused expert gate+up";
  }
  return "?";
}

namespace {

class SafetensorsSource final : public WeightSource {
 public:
  explicit SafetensorsSource(const std::string& dir) : store_(WeightStore::open_folder(dir)) {}

  const std::string& where() const override { return store_.dir(); }
  const TensorView* find(const WeightKey& key) const override {
    const std::string name = name_of(key);
    if (name.empty()) return nullptr;
    if (const TensorView* t = store_.find(name)) return t;
    // transformers 5 saves fused experts with or without the ".weight" suffix.
    if (is_fused(key.role)) return store_.find(name + ".weight");
    return nullptr;
  }
  std::string describe(const WeightKey& key) const override {
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
      case WeightRole::DenseGate: return p + "mlp.gate_proj.weight";
      case WeightRole::DenseUp: return p + "mlp.up_proj.weight";
      case WeightRole::DenseDown: return p + "mlp.down_proj.weight";
      case WeightRole::Router: return moe_prefix(p, mixtral) + "gate.weight";
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
};

}  // namespace

std::unique_ptr<WeightSource> open_safetensors_source(const std::string& dir, const ModelSpec& spec) {
  return std::make_unique<SafetensorsSource>(dir);
}

}  // namespace spill
