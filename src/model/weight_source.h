// Where a model's tensors come from. The one role resolver (model.cpp) asks a source for each
// weight by its role; only the source knows its format's tensor names and files, so the forward
// and the runners never know whether a tensor came from a safetensors folder, a GGUF file or a
// synthetic generator.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "formats/model_spec.h"

namespace spill {

namespace gguf {
class GgufFile;
}

enum class WeightRole : uint8_t {
  Embed,      // [vocab, hidden]
  FinalNorm,  // [hidden]
  LmHead,     // [vocab, hidden]; absent when tied to the embedding
  AttnNorm, Q, K, V, O, QBias, KBias, VBias, OBias, QNorm, KNorm,
  Sinks,  // [n_heads] attention sink logits (gpt-oss)
  // Multi-head latent attention (DeepSeek): q_a [q_lora, H] -> QANorm -> q_b [heads * qk_head, q_lora]
  // (or Q [heads * qk_head, H] without q_lora_rank); kv_a [kv_lora + rope, H] -> KVANorm on the
  // latent; kv_b [heads * (nope + v), kv_lora]; O [H, heads * v].
  QA, QANorm, QB, KVA, KVANorm, KVB,
  MlpNorm,
  DenseGate, DenseUp, DenseDown,  // dense SwiGLU MLP
  Router,                         // [n_experts, hidden]
  RouterBias,                     // [n_experts], added to the router logits (gpt-oss; synthetic skew)
  RouterCorrectionBias,           // [n_experts], added to the scores for the choice only (noaux_tc)
  SharedGate, SharedUp, SharedDown,  // always-on experts, one SwiGLU of width n_shared * moe_intermediate
  // One routed expert's matrices (WeightKey::expert set): gate/up [I, H], down [H, I].
  ExpertGate, ExpertUp, ExpertDown,
  // All routed experts of a layer in one 3-D tensor [E, rows, cols]; a source offers these when it
  // stores experts fused. ExpertsGateUp is [E, 2I, H] with each expert's gate rows before its up rows.
  // A source may hand a fused tensor transposed ([E, H, I] for gate/up); the resolver tells from the shapes.
  ExpertsGate, ExpertsUp, ExpertsDown, ExpertsGateUp,
  // Routed experts' biases over all experts: gate/up [E, I], down [E, H] (gpt-oss).
  ExpertsGateBias, ExpertsUpBias, ExpertsDownBias,
};

const char* weight_role_name(WeightRole role);

struct WeightKey {
  WeightRole role;
  int32_t layer = -1;   // -1 for model-level roles
  int32_t expert = -1;  // only for ExpertGate/ExpertUp/ExpertDown
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The folder or file the tensors come from, for messages.
  virtual const std::string& where() const = 0;
  // The view of a role, or nullptr when this source has no such tensor.
  virtual const TensorView* find(const WeightKey& key) const = 0;
  // The file and name a role would have in this source ("model-00002-of-00003.safetensors: tensor
  // 'model.layers.3.mlp.gate.weight'"), for messages about it, present or not.
  virtual std::string describe(const WeightKey& key) const = 0;
  // Every tensor by this source's own names (spill info, spill dequant).
  virtual const std::map<std::string, TensorView>& tensors() const = 0;

  // Residency of the bytes, for sources that make them on demand (a synthetic model larger than
  // host RAM): prepare() fills [p, p + bytes) of a tensor before it is read; drop() gives the
  // whole pages inside such a range back once its bytes were copied to where they live (VRAM, a
  // pinned arena), and a later read must prepare() it again; prepare_all() fills every tensor, for
  // readers that read weights where they lie (the CPU runner). Addresses outside this source's
  // tensors are ignored. No-ops for files and buffers that already hold their bytes.
  virtual void prepare(const void* /*p*/, size_t /*bytes*/) const {}
  virtual void drop(const void* /*p*/, size_t /*bytes*/) const {}
  virtual void prepare_all() const {}
};

// A Hugging Face folder: config.json's architecture decides the tensor names (Mixtral's
// block_sparse_moe.w1/w2/w3, everyone else's mlp.experts.N.gate_proj/...).
std::unique_ptr<WeightSource> open_safetensors_source(const std::string& dir, const ModelSpec& spec);

// A GGUF file (model/gguf_source.cpp): llama.cpp's tensor names, 3-D expert tensors as they are
// in the file (expert e of each projection is one contiguous slice of its pages); q/k rows of
// `llama`-arch files are put back in Hugging Face order, in copies the source owns.
std::unique_ptr<WeightSource> open_gguf_source(std::shared_ptr<const gguf::GgufFile> file, const ModelSpec& spec);
// The ModelSpec from a GGUF file's general.architecture and `<arch>.*` metadata. Throws
// spill::Error naming the file and key for an unsupported architecture or a missing/bad key.
ModelSpec gguf_model_spec(const gguf::GgufFile& file);

}  // namespace spill
