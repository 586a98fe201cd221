// A loaded model: its resolved spec and views of every weight, by role, in the mapped files.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/model_spec.h"
#include "model/weight_source.h"

namespace spill {

// One routed (or shared) expert: SwiGLU, down(silu(gate(x)) * up(x)).
struct ExpertWeights {
  TensorView gate;  // [moe_intermediate, hidden]
  TensorView up;    // [moe_intermediate, hidden]
  TensorView down;  // [hidden, moe_intermediate]
};

struct LayerWeights {
  TensorView attn_norm;                 // [hidden]
  TensorView q, k, v, o;                // [q_dim, hidden], [kv_dim, hidden] x2, [hidden, q_dim]
  TensorView q_bias, k_bias, v_bias, o_bias;  // empty unless attention_bias
  TensorView q_norm, k_norm;            // [head_dim] (per head) or [q_dim]/[kv_dim] (whole projection); empty if none
  TensorView mlp_norm;                  // [hidden]
  ExpertWeights dense;                  // dense MLP (intermediate_size) when !spec.layer_is_moe[layer]
  TensorView router;                    // [n_experts, hidden]
  TensorView router_bias;               // [n_experts] or empty
  std::vector<ExpertWeights> experts;   // n_experts views when spec.layer_is_moe[layer]
};

class Model {
 public:
  // Loads a Hugging Face folder (<dir>/config.json and its safetensors weights), or a GGUF file
  // (a path ending in .gguf; the first shard of a split one), and checks every shape against the
  // configuration. Throws spill::Error naming the file, tensor or field on any problem.
  static std::unique_ptr<Model> load(const std::string& path);
  // Resolves every weight role of `spec` from any source (GGUF file, synthetic generator, ...).
  static std::unique_ptr<Model> from_source(ModelSpec spec, std::unique_ptr<WeightSource> source);

  const ModelSpec& spec() const { return spec_; }
  const WeightSource& source() const { return *source_; }
  // The folder or file the weights came from.
  const std::string& where() const { return source_->where(); }
  // Bytes owned by the model for weights made at load (a transposed copy, a quantized copy); they
  // live as long as the model.
  uint8_t* own_bytes(size_t n);

  TensorView embed;       // [vocab, hidden]
  TensorView final_norm;  // [hidden]
  TensorView lm_head;     // [vocab, hidden] (the embedding when tied)
  std::vector<LayerWeights> layers;

 private:
  ModelSpec spec_;
  std::unique_ptr<WeightSource> source_;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;
  friend class WeightResolver;
};

}  // namespace spill
