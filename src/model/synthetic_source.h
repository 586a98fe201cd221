// Models of any config.json shape with random weights made in memory, in the chosen formats, for
// shapes no file exists for (benchmarks and plans of 235B- and 763B-parameter models).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "core/thread_pool.h"
#include "model/weight_source.h"

namespace spill {

enum class SyntheticFill : uint8_t {
  Now,       // every tensor written at construction
  // Norms, biases and routers now; the big matrices (embedding, projections, experts) when a
  // reader prepare()s them, and drop() gives their pages back: a model larger than host RAM can be
  // uploaded to a GPU a tensor at a time (the CUDA runner and the expert store prepare and drop).
  OnDemand,
  Never,     // address space only, never touched (spill info reports sizes in seconds)
};

struct SyntheticOptions {
  // The stored type of each tensor (rows x cols); F32 when unset. Rows that the chosen block type
  // cannot hold must be given a type that can (the caller's quantization mix decides fallbacks).
  std::function<DType(const WeightKey& key, int64_t rows, int64_t cols)> type_for;
  uint64_t seed = 0;
  // Expert popularity: 0 = every expert equally likely; s > 0 adds a router bias of -s * ln(rank) to
  // the experts of each layer, ranked in a random order per layer, so the rank-r expert's logits sit
  // s * ln(r) router-logit standard deviations lower (a Zipf-like fall-off with exponent ~s; the
  // measured popularity is what `spill profile` reports).
  double routing_skew = 0.0;
  SyntheticFill fill = SyntheticFill::Now;
  ThreadPool* pool = nullptr;  // for a fill at construction; one thread when null (not kept)
};

// Weights are uniform with unit-variance outputs for unit-variance inputs (norm weights 1 +- 0.1),
// so activations stay finite through any depth. Large matrices are tiled from a small pool of rows
// quantized once by the real quantizer (quant::quantize_row), so every format's blocks hold what a
// quantized checkpoint holds, and a 100 GB model fills at memory speed. Routers, norms and biases are
// drawn row by row, so no two experts tie. A tensor's bytes are the same whichever fill makes them,
// and whichever ranges are prepared in which order.
std::unique_ptr<WeightSource> make_synthetic_source(const ModelSpec& spec, const SyntheticOptions& options);

}  // namespace spill
