// Quantize on load: replaces a loaded model's weight views with quantized copies in the types a
// `--quant` mix chooses, owned by the model (Model::own_bytes). The forward reads them through
// the same views, so nothing downstream knows the weights were quantized here and not in a file.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "model/model.h"
#include "quant/quant_mix.h"

namespace spill {

// Per-column importance (mean squared activation of each input column, as llama.cpp's imatrix
// stores it) by weight, which the quantizers' scale search weighs the error with.
class ImportanceMatrix {
 public:
  void set(const WeightKey& key, std::vector<float> values);
  // The values for a weight with `cols` columns, or nullptr when there are none (or a different
  // count, which is an error the caller reports: set() is checked by load_importance_matrix).
  const float* find(const WeightKey& key) const;
  size_t size() const { return values_.size(); }

 private:
  std::map<std::tuple<int, int, int>, std::vector<float>> values_;
};

// One weight tensor of the model and the type the mix gives it.
struct QuantPlanEntry {
  WeightKey key;
  std::string name;          // the source's description of it (file: tensor 'name')
  quant::TensorClass cls;
  DType from;                // the type it has now
  int64_t rows = 0, cols = 0;
  quant::TypeChoice choice;  // choice.quantize false: it stays as it is
};

// Every quantizable weight (norms and biases left out), in model order. The tied head appears
// once, as the embedding in class head.
std::vector<QuantPlanEntry> plan_quantization(const Model& model, const quant::QuantMix& mix);

struct QuantizeOptions {
  const ImportanceMatrix* importance = nullptr;
  int n_threads = 0;  // <= 0: one per hardware thread
};

struct QuantizeReport {
  int64_t n_tensors = 0;     // tensors quantized
  int64_t bytes_before = 0;  // of those tensors
  int64_t bytes_after = 0;
  int64_t n_fallbacks = 0;
  double seconds = 0;
};

QuantizeReport quantize_model(Model& model, const quant::QuantMix& mix, const QuantizeOptions& options = {});

// Reads an importance matrix in llama.cpp's legacy imatrix.dat format (llama-imatrix
// --output-format dat): entries named by GGUF tensor names (blk.N.attn_q.weight,
// blk.N.ffn_down_exps.weight with one row of columns per expert), mapped to the model's roles.
// Throws spill::Error on a malformed file, an unknown name or a column count that disagrees.
ImportanceMatrix load_importance_matrix(const std::string& path, const Model& model);

// What --quant / --imatrix ask for, as every command takes them.
struct QuantRequest {
  std::string quant;    // a --quant spec; empty: the weights as stored
  std::string imatrix;  // a legacy imatrix.dat for the quantizers; empty: none
  int n_threads = 0;
};
// Quantizes a loaded model as asked (nothing when quant is empty). Every command that opens a
// model calls this right after loading it (engine/model_bundle or Model::load).
QuantizeReport quantize_as_asked(Model& model, const QuantRequest& request);

}  // namespace spill
