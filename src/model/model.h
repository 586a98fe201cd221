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
  TensorView gate_bias, up_bias, down_bias;  // [I], [I], [H]; empty unless spec.expert_bias
};

// Multi-head latent attention's projections (spec.attention == Mla).
struct MlaWeights {
  TensorView q_a, q_a_norm, q_b;  // q_lora_rank > 0: [q_lora, H], [q_lora], [heads * qk_head, q_lora]
  TensorView q;                   // q_lora_rank == 0: [heads * qk_head, H]
  TensorView kv_a;                // [kv_lora + rope, H]: the latent, then the shared rope key
  TensorView kv_a_norm;           // [kv_lora]
  TensorView kv_b;                // [heads * (nope + v), kv_lora]: per head, key rows then value rows
  TensorView o;                   // [H, heads * v]
};

struct LayerWeights {
  TensorView attn_norm;                 // [hidden]
  TensorView q, k, v, o;                // [q_dim, hidden], [kv_dim, hidden] x2, [hidden, q_dim]
  TensorView q_bias, k_bias, v_bias, o_bias;  // empty unless attention_bias
  TensorView q_norm, k_norm;            // [head_dim] (per head) or [q_dim]/[kv_dim] (whole projection); empty if none
  TensorView sinks;                     // [n_heads] when spec.attention_sinks
  MlaWeights mla;                       // when spec.attention == Mla (q, k, v, o above are empty)
  TensorView mlp_norm;                  // [hidden]
  ExpertWeights dense;                  // dense MLP (intermediate_size) when !spec.layer_is_moe[layer]
  TensorView router;                    // [n_experts, hidden]
  TensorView router_bias;               // [n_experts] or empty
  TensorView router_correction_bias;    // [n_experts] when spec.router.correction_bias
  std::vector<ExpertWeights> experts;   // n_experts views when spec.layer_is_moe[layer]
  ExpertWeights shared;                 // shared experts of an MoE layer when spec.n_shared_experts > 0
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
  // WeightSource::prepare / drop / prepare_all of the source: readers that copy weights elsewhere
  // (the CUDA runner, the expert store) prepare each range before reading it and drop it after;
  // readers that read weights in place (the CPU runner) prepare everything once.
  void prepare(const void* p, size_t bytes) const { source_->prepare(p, bytes); }
  void drop(const void* p, size_t bytes) const { source_->drop(p, bytes); }
  void prepare_all() const { source_->prepare_all(); }
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
