// Valid random blocks of any DType for tests and benchmarks: random quantized values with sane
// scales, so every dequantized weight is finite and of order 0.01 to 0.1 (like trained weights),
// and products with O(1) activations stay far from overflow. Deterministic in (type, n_blocks,
// seed) whatever the thread count: the bytes come in fixed chunks, each from its own stream.
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace spill::quant {

// Fills n_blocks blocks of t (block_bytes(t) each; for plain floats, n_blocks values) at dst.
// Uses up to `threads` threads (0: one per hardware thread); a 100 GB fill runs at memory speed.
void fill_random_blocks(DType t, void* dst, int64_t n_blocks, uint64_t seed, int threads = 0);

}  // namespace spill::quant
