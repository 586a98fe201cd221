// Memory accounting: how many bytes a model takes by tensor class for a quantization mix, one
// routed expert (block scales included), KV per token for each KV format, and the activation
// workspace of a step of --max-batch-tokens tokens. One module that the planner and the runners
// both use, so that the estimate and the real allocation cannot drift apart.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/model_spec.h"
#include "model/kv_format.h"
#include "placement/tensor_types.h"

namespace spill::placement {

// Always-on experts of DeepSeek / Qwen2-MoE style models. ModelSpec has no field for them yet;
// parse_model_shape reads n_shared_experts (width shared_expert_intermediate_size, else
// moe_intermediate_size) from config.json until it does.
struct SharedExperts {
  int64_t count = 0;
  int64_t intermediate_size = 0;  // width of each
};

// What accounting needs of a model: its spec plus the fields ModelSpec does not carry yet.
struct ModelShape {
  ModelSpec spec{};
  SharedExperts shared{};
  std::string source{};  // the config it came from, for reports
};

// config.json text -> shape; throws spill::Error naming `where` and the field.
ModelShape parse_model_shape(const std::string& config_json_text, const std::string& where);
// A model folder (its config.json) or a config.json file (as --synthetic takes).
ModelShape load_model_shape(const std::string& path);

// Bytes per tensor class.
struct ClassBytes {
  std::array<int64_t, kNumTensorClasses> bytes{};
  int64_t& operator[](TensorClass c) { return bytes[static_cast<size_t>(c)]; }
  int64_t operator[](TensorClass c) const { return bytes[static_cast<size_t>(c)]; }
  int64_t total() const;
  ClassBytes& operator+=(const ClassBytes& o);
};

// Bytes of a [rows, cols] matrix (rows of cols weights) stored in `type`, falling back as
// storage_type says when a row is not whole blocks.
int64_t matrix_bytes(DType type, int64_t rows, int64_t cols);

// One decoder layer's bytes.
struct LayerBytes {
  ClassBytes weights;         // attention, norms, router, dense MLP or shared experts (routed experts not included)
  int64_t n_routed_experts = 0;  // 0 for a dense layer
  int64_t routed_expert_bytes = 0;  // one routed expert (gate + up + down); 0 for a dense layer
  int64_t routed_bytes() const { return n_routed_experts * routed_expert_bytes; }
};

struct ModelBytes {
  ClassBytes total;               // the whole model, routed experts included
  std::vector<LayerBytes> layers;  // per decoder layer
  int64_t embedding = 0;          // the embedding table (0 when tied to the head)
  int64_t embedding_row = 0;      // one token's row: what a lookup reads
  int64_t lm_head = 0;            // output projection plus the final norm
  bool tied_embedding = false;    // the head's matrix is the embedding table: one copy, with the head
  // One routed expert: gate and up ([width, hidden]) and down ([hidden, width]), with scales.
  int64_t routed_expert_bytes = 0;
  int64_t routed_expert_weights = 0;  // weights in one routed expert
  // Types that could not be used as asked (rows not whole blocks), said plainly for the report.
  std::vector<std::string> notes;
};

// Weight bytes of every tensor of the shape in the given mix. Throws spill::Error when the
// shape is not a decoder spill knows (zero sizes, experts without a width).
ModelBytes account_weights(const ModelShape& shape, const TensorClassTypes& types);

// KV cache formats and their sizes live with the runners that keep them (model/kv_format.h).
using ::spill::KvFormat;
using ::spill::kv_bytes_per_token;
using ::spill::kv_bytes_per_token_per_layer;
using ::spill::kv_format_name;
using ::spill::parse_kv_format;

struct WorkspaceParams {
  int64_t max_batch_tokens = 2048;  // tokens in one step
  int64_t max_logit_rows = 64;      // rows of logits a step returns (sequences in a step)
};
// Activation memory of one step: what a runner allocates besides weights and KV, in f32 as the
// CPU runner keeps it (hidden, norm output, q, k, v, attention output, MLP output, router logits
// and choices, the experts' gate/up for every routed token, final rows and logits).
int64_t workspace_bytes(const ModelShape& shape, const WorkspaceParams& params);

// "95.6G", "80GiB", "512M", "1073741824": binary units (G = 2^30), as GPU memory is quoted. Throws
// spill::Error naming `flag` for anything else (no unit it knows, negative, not finite, past 2^62).
int64_t parse_byte_size(const std::string& text, const char* flag);
// "95.6G,95.6G": one budget per GPU, each as parse_byte_size reads it.
std::vector<int64_t> parse_byte_sizes(const std::string& text, const char* flag);
// "30%" or "0.3": a share in [0, 1]; spill::Error naming `flag` otherwise.
double parse_share(const std::string& text, const char* flag);

// "1.23 GiB", "512.0 MiB", "17 B": for reports.
std::string format_bytes(int64_t bytes);
// bytes / 2^30
double gib(int64_t bytes);

}  // namespace spill::placement
