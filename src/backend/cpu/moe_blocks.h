// CPU twin of the CUDA MoE expert path (backend/cuda/moe.h) over ggml block-format experts: the
// reference the CUDA kernels are tested against, with the same stages:
//   group (token, slot) pairs by expert; gate and up rows dotted with the token, silu(gate) * up;
//   down rows dotted with that, times the routing weight, per pair; each token's pairs added in
//   slot order.
// Weights are the reference dequantizer's values (quant::dequantize_row); dots accumulate in
// float64 and every stage's output is rounded to f32, as the GPU stores it.
#pragma once
#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace spill::cpu {

struct BlockExpert {  // host addresses of one expert's matrices (rows of blocks)
  const void* gate = nullptr;  // [width, hidden]
  const void* up = nullptr;    // [width, hidden]
  const void* down = nullptr;  // [hidden, width]
};

struct BlockMoeShape {
  int64_t hidden = 0, width = 0;
  int64_t top_k = 0;
  DType gate_up_type = DType::Q4_K, down_type = DType::Q4_K;
};

// out[t] = sum over j < top_k (in order) of weights[t, j] * E_ids[t, j](x[t]); an id outside
// [0, experts.size()) contributes 0. x: [n, hidden], ids/weights: [n, top_k], out: [n, hidden].
void moe_experts_blocks(const BlockMoeShape& shape, std::span<const BlockExpert> experts, const float* x, int64_t n,
                        const int32_t* ids, const float* weights, float* out);

}  // namespace spill::cpu
