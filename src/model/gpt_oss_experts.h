// gpt-oss checkpoints store a layer's experts fused and interleaved: gate_up_proj [E, H, 2I] with
// gate in the even and up in the odd columns (bf16 copies), or, as OpenAI publishes them, MXFP4:
// gate_up_proj_blocks [E, 2I, H/32, 16] (byte j of a block: weight 2j in the low nibble, 2j+1 in
// the high) with gate_up_proj_scales [E, 2I, H/32] (e8m0), down_proj_blocks / _scales likewise
// over [E, H, I]. spill's experts are separate [E, I, H] gate and up and [E, H, I] down, rows of
// weights (MXFP4 rows as ggml's blocks: exponent, then weights 0..15 in the low nibbles, 16..31 in
// the high). This unpacks a layer once at load into buffers the caller owns.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "core/tensor.h"
#include "formats/safetensors.h"

namespace spill {

struct GptOssExpertTensors {
  TensorView gate, up, down;                 // [E, I, H], [E, I, H], [E, H, I]
  TensorView gate_bias, up_bias, down_bias;  // [E, I], [E, I], [E, H]
};

struct GptOssExpertShape {
  int64_t n_experts = 0, hidden = 0, width = 0;  // E, H, I
};

// prefix: "model.layers.L.mlp.experts." ; alloc(n) returns n bytes that live as long as the views.
// Throws spill::Error naming the tensor when one is missing or has the wrong shape or dtype.
GptOssExpertTensors unpack_gpt_oss_experts(const WeightStore& store, const std::string& prefix,
                                           const GptOssExpertShape& shape,
                                           const std::function<uint8_t*(size_t)>& alloc);

// One MXFP4 block of the checkpoint (16 bytes of codes, pairs in order) as ggml lays it out.
void repack_mxfp4_block(const uint8_t codes[16], uint8_t exponent, uint8_t out[17]);

}  // namespace spill
