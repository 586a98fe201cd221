// The routed-expert path of a MoE layer for a decode step, on the GPU:
//   out[t] = sum over slots j < top_k, in slot order, of weight[t, j] * E_ids[t, j](x[t]),
//   E(x) = down(silu(gate x) * (up x)),
// with gate/up/down in ggml block formats, reached through a per-expert pointer table that lives
// in device memory. Two launches (more for calls of more than 8 tokens, whose pairs a small
// kernel first groups by expert so no block scans them all), no host synchronisation:
//   1. gate_up: one block of 8 warps per (16 rows of the expert width, (token, slot) pair); the
//      block of the first pair routed to an expert gathers that expert's tokens from the ids (on
//      the device) and does the work, the others return at once. So an expert's bytes are read
//      once per step however many tokens route to it, and experts with no tokens cost nothing. The
//      block stages its gate and up rows in shared memory (16-byte cp.async), rounds its tokens'
//      x to int8 (block_dot.cuh: the CPU's quantize_activations_q8 rounding), dots gate and up rows
//      together with __dp4a and writes SiLU(gate) * up per (token, slot) pair in f32.
//   2. down: the same grouping over 64-row tiles of the hidden size (each warp stages two quads of
//      rows before decoding either); each block rounds its pairs
//      SiLU(gate) * up rows to int8 the same way; each pair's row times its routing weight goes to
//      a per-pair partial row; the last block to finish a tile adds the partial rows of each token
//      in slot order.
// A call of one token runs a one-token build of both kernels (few registers, more warps per SM).
// Optionally (plan_moe's tile_from, SPILL_MOE_MMA_FROM; off by default until measured), calls of 2
// to 8 tokens run, per projection whose format has an MmqFormat, a
// tensor-core decode tile instead (mmq.cuh: the expert's pairs gathered in place as above, one token
// tile of 8; x rounded once by the RMSNorm or round_rows, SiLU(gate) * up rounded between the
// two, the slots added by a small combine kernel); the other projections keep the one-token build.
// Larger calls run an 8-token build that decodes each weight unit once for 8 tokens, or, where the
// experts get a few tokens each on average and the format has one, the tensor-core path (tiles of
// 32 of an expert's pairs grouped first, down's slot sum in the combine kernel). All give a token
// the same bits.
// Every pair's arithmetic is the same whatever else is in the batch (block_dot.cuh), and the slot
// sum has a fixed order, so a token's output is bit-identical alone or in any batch. The table is
// read inside the kernels: it may change between steps, point at VRAM or at device-mapped pinned
// host memory, and no expert address is part of a launch (or of a captured graph).
//
// CPU twin: cpu::moe_experts_blocks (src/backend/cpu/moe_blocks.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gemv.h"
#include "core/dtype.h"

namespace spill::cuda {

// One expert's three matrices: gate and up [width, hidden], down [hidden, width], each rows of
// ggml blocks; 16-byte aligned device-visible addresses (VRAM, or mapped pinned host memory).
// They may lie in one span (see expert_span_layout) or anywhere.
struct ExpertWeights {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
};

struct MoeShape {
  int64_t hidden = 0;  // H: rows of down, columns of gate and up
  int64_t width = 0;   // I: the expert's intermediate size
  int32_t n_experts = 0;
  int32_t top_k = 0;
  DType gate_up_type = DType::Q4_K;
  DType down_type = DType::Q4_K;
};

// Where gate, up and down sit in one expert's span of bytes, each 16-byte aligned.
struct ExpertSpanLayout {
  int64_t gate_offset = 0, up_offset = 0, down_offset = 0, bytes = 0;
};
ExpertSpanLayout expert_span_layout(const MoeShape& shape);

struct MoePlan {
  MoeShape shape;
  int64_t max_tokens = 0;
  // Calls of tile_from .. 8 tokens run the tensor-core decode tiles (per projection whose format
  // has an MmqFormat); 0: never.
  int64_t tile_from = 0;
  int64_t workspace_bytes = 0;
};

// Checks the shape (block formats the kernels decode, widths whole blocks) and sizes the workspace
// for up to max_tokens tokens per call. tile_from: MoePlan::tile_from; -1: the process default,
// SPILL_MOE_MMA_FROM or 0 (off: the tiles have not been measured against the one-token kernels yet,
// docs/perf/NOTES.md).
MoePlan plan_moe(const MoeShape& shape, int64_t max_tokens, int64_t tile_from = -1);

// Zeroes the workspace's tile counters (once after allocation; the kernels leave them zero).
void init_moe_workspace(const MoePlan& plan, void* workspace, cudaStream_t stream);

// Host experts computed by the CPU (offload/cpu_experts.h) while the GPU runs the rest of the
// layer. A call of up to kMoeCpuMaxTokens tokens with `mask` set hands its rows, ids and weights to
// CPU threads through a channel in mapped pinned memory; the GPU kernels skip the experts whose bit
// is set, and a last kernel waits for the CPU's rows and adds every token's pairs in slot order
// (the CPU's pair rows in place of the GPU's partials). Larger calls (prefill) read those experts
// over PCIe like any host expert: their table entries stay valid mapped addresses.
struct CpuExpertChannel {  // the header, in mapped pinned memory; 64-byte aligned
  volatile uint32_t request;  // the GPU's call number, written after the call's data
  volatile uint32_t done;     // the last call number whose rows the CPU has written
  volatile uint32_t gave_up;  // a call number whose wait timed out (the step's output is void)
  int32_t layer;              // the call's MoE layer (the runner's index among MoE layers)
  int32_t n;                  // the call's tokens
};
constexpr int64_t kMoeCpuMaxTokens = 8;
struct CpuExperts {
  const uint32_t* mask = nullptr;     // device [ceil(n_experts / 32)]: bit e set: the CPU computes expert e
  CpuExpertChannel* channel = nullptr;  // device address of the mapped header
  float* x = nullptr;                 // device address of [kMoeCpuMaxTokens][hidden] in the channel
  int32_t* ids = nullptr;             // device address of [kMoeCpuMaxTokens * top_k]
  float* weights = nullptr;           // device address of [kMoeCpuMaxTokens * top_k]
  const float* rows = nullptr;        // device address of [pairs][hidden]: weight * E(x) of the CPU's pairs
  uint32_t* calls = nullptr;          // device memory [1]: calls published so far
  int32_t layer = 0;                  // written into the header with each call
  uint64_t timeout_ns = 10'000'000'000ull;  // a wait longer than this gives up (gave_up) instead of hanging
};

struct MoeArgs {
  const ExpertWeights* table = nullptr;  // device memory, [n_experts]
  const float* x = nullptr;              // [n, hidden]
  int64_t n = 0;                         // tokens, 1 .. plan.max_tokens
  const int32_t* ids = nullptr;          // [n, top_k] device; an id outside [0, n_experts) contributes 0
  const float* weights = nullptr;        // [n, top_k] device routing weights
  float* out = nullptr;                  // [n, hidden], overwritten
  void* workspace = nullptr;             // plan.workspace_bytes, prepared by init_moe_workspace
  // Optional counters, device memory, [n_experts] each, added to (never reset; unsigned wrap):
  // routings[e] += the (token, slot) pairs routed to e, touches[e] += 1 when e has any, i.e. when
  // the call reads its bytes. Where host-expert traffic and the VRAM expert cache get their counts.
  uint32_t* routings = nullptr;
  uint32_t* touches = nullptr;
  // x already rounded (q set: n rows of hidden; round_rows's bits): the tensor-core gate/up reads
  // these instead of rounding x itself (moe_reads_rounded_x says when it runs).
  RoundedRows x_rounded{};
  // With cpu.mask set and n <= kMoeCpuMaxTokens: the CPU computes the masked experts' pairs.
  CpuExperts cpu{};
};

// Enqueues the two kernels on `stream`.
void moe_experts(const MoePlan& plan, const MoeArgs& args, cudaStream_t stream);

// Kernels moe_experts launches per decode call (for benchmarks' launch counts).
constexpr int kMoeLaunchesPerCall = 2;
// Launches of a call of n tokens: calls of more than 8 tokens group their pairs by expert first;
// a projection on the tensor-core path rounds its activations first, and down adds a combine.
int moe_launches(const MoePlan& plan, int64_t n, bool x_rounded = false, bool cpu_experts = false);
// Whether a call of n tokens reads its activations rounded (the tensor-core gate/up).
bool moe_reads_rounded_x(const MoePlan& plan, int64_t n);

// Tokens one moe_experts() call should be planned for: the tensor-core path wants whole prefill
// chunks (an expert's token tiles fill up); the decode kernels keep a call's pair list in shared
// memory, which bounds theirs.
int64_t moe_tokens_per_call(const MoeShape& shape);

}  // namespace spill::cuda
