// A model runner executes planned forward steps on one backend and owns that backend's KV
// memory. The engine talks to this interface only, so a CUDA runner plugs in unchanged.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "formats/model_spec.h"
#include "model/batch.h"

namespace spill {

class Model;

struct KvCacheConfig {
  int32_t block_size = 16;  // tokens per KV block
  int64_t n_blocks = 0;     // blocks in the pool (all layers of a block together)
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelSpec& spec() const = 0;
  virtual const KvCacheConfig& kv_config() const = 0;
  // Runs one step. logits is resized to [batch.n_logit_rows(), vocab_size], row-major.
  // Reads and writes KV blocks named by the chunks' block tables; blocks not named are untouched.
  virtual void forward(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer = nullptr) = 0;
};

// Bytes one KV block takes on the CPU backend (fp32 K and V, all layers).
int64_t cpu_kv_bytes_per_block(const ModelSpec& spec, int32_t block_size);

// n_threads <= 0: one per hardware thread.
std::unique_ptr<ModelRunner> make_cpu_runner(const Model& model, KvCacheConfig kv, int n_threads = 0);

}  // namespace spill
