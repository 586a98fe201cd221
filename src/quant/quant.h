// The block formats on the CPU: the reference dequantizer of every DType (bit-exact to ggml's),
// quantizers that search scales to minimise (optionally importance-weighted) error, and the dot
// product the CPU matmul uses. The CUDA kernels read the same bytes and are tested against these.
//
// Bytes are ggml's block layouts exactly (see blocks.h), so rows of a GGUF tensor are passed as
// they are. A row of n weights takes row_bytes(t, n) bytes; n must be a whole number of blocks
// (row_fits), else every function here throws spill::Error. Functions are thread-safe (no state
// but the kernel choice, made once).
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace spill::quant {

// n weights (a whole number of blocks of t, see row_fits) from src (row_bytes(t, n) bytes) into dst.
// Each value is computed exactly as ggml's dequantize_row_* computes it (products rounded one at a
// time, never fused), checked bit for bit against gguf-py and ggml's C code.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantizes n floats (a whole number of blocks) into dst (row_bytes(t, n) bytes). importance, when
// given, holds n non-negative weights (a row of an importance matrix: mean squared activation per
// input column) that the scale search minimises the weighted squared error under; without it the
// error is weighted by default_error_weights. F32/F16/BF16 round to nearest (even). Throws spill::Error for
// non-finite weights, negative or non-finite importance, or a block whose scale overflows f16.
// Cost: roughly ggml's own quantizer (tens of microseconds per 256 weights for the k-quants).
void quantize_row(DType t, const float* src, void* dst, int64_t n, const float* importance = nullptr);

// The error weights quantize_row uses without an importance row: x^2 for Q6_K and Q8_0 (larger
// weights count more, as in ggml's Q6_K reference quantizer), 1 (the plain squared error) for every
// other format. Chosen by KL divergence on spill-tiny (docs/perf/quant-quality-2026-12-01.md and
// -2026-12-02.md): at Q6_K and Q8_0 the plain fit, though of lower RMSE, gave more KL divergence
// than the x^2 weighting; magnitude weights for the other k-quants and IQ4 (|x|, sub-block RMS +
// |x|) gave more KL divergence than the plain fit at Q4_K_M and Q3_K_M.
void default_error_weights(DType t, const float* x, int64_t n, float* w);

// sum_i dequantize(row)[i] * x[i] over n weights, with f32 activations, accumulated in an order that
// depends on n alone (never on the batch or the thread), so a token's result is batch-invariant.
// For block formats the scales are applied to per-sub-block sums (the order is written out in
// dot_kernels.h), so the result equals a float64 dot of the dequantized row to within fp32
// rounding, not bit for bit; dot(F32, widened F16/BF16 row) == dot(F16/BF16 row) exactly.
float dot(DType t, const void* row, const float* x, int64_t n);

// dot() of one row with each of n_tokens activation rows: out[i * out_stride] = dot(t, row,
// x + i * x_stride, n), bit for bit, with the row's blocks unpacked once for every few tokens
// (prefill and batched decode read each weight row once per group of tokens).
void dot_tokens(DType t, const void* row, const float* x, int64_t x_stride, int64_t n_tokens, int64_t n, float* out,
                int64_t out_stride);

// The vector path dot() takes on this CPU: "avx512", "avx2" or "scalar" (the widest this CPU
// runs, unless the environment variable SPILL_CPU_KERNELS names one).
const char* cpu_kernel_path();

// The builds of dot(), for tests and benchmarks that compare them. Every path gives the same bits
// for the same input; dot() takes the widest one cpu_supports.
enum class KernelPath : uint8_t { Scalar, Avx2, Avx512 };
bool cpu_supports(KernelPath p);
const char* kernel_path_name(KernelPath p);
// dot() on a given path; throws spill::Error if this CPU cannot run it.
float dot_on(KernelPath p, DType t, const void* row, const float* x, int64_t n);

// ---- the int8-activation path (what llama.cpp's CPU backend computes) ----------------
//
// A second, explicitly named dot product for decode speed: each token's activations are rounded
// once per matmul to 8 bits per block of 256 (the last block of a row whose length is not a
// multiple of 256 is shorter: n % 256, a multiple of 32), and the weights' integer quants are
// multiplied with them in integer arithmetic (AVX2 maddubs/madd), with the float scales applied
// once per (sub-)block. This is the arithmetic llama.cpp's CPU path uses for the k-quants (its
// Q8_K activations), so spill's CPU decode reads weights at memory speed instead of converting
// every quant to float.
//
// Accuracy contract. quantize_activations_q8 stores, per block b of x, d_b = max_i |x_i| / 127
// and q_i = round(x_i / d_b) in [-127, 127], so x'_i = d_b q_i differs from x_i by at most
// d_b / 2 (plus the f32 rounding of 127 / max and of x_i * that, a few ulp of x_i). dot_q8 then
// computes sum_i w_i x'_i with every integer product and per-lane sum exact (so the scalar and
// AVX2 kernels give the same bits by construction; the AVX-512 choice runs the AVX2 kernels),
// and the float scales combined in one order shared by every path (dot_q8_paths.h: eight lanes,
// each a chain of fused multiply-adds over the row's blocks, summed at the end). Against the exact
// sum_i w_i x_i of the dequantized row w and the original x, the error is at most
//   sum_i |w_i| |x_i - x'_i|  (<= sum_i |w_i| d_b(i) / 2)          the activation rounding,
//   + (nb + 12) u sum_i (|d_j q_i| + |m_j|) |x'_i|                 the float combination,
// with u = 2^-24, nb the number of 256-blocks and d_j q_i, m_j the scale and min parts of w_i
// (tests/quant_test.cpp checks exactly this). It is not quant::dot's result: anything compared
// against a reference (the CUDA op tests, the parity tests) uses the f32 path.
//
// Batch invariance: each token is quantized alone, so its result never depends on the batch.

// One token's activations rounded to int8 per block of 256.
struct ActivationsQ8 {
  int64_t n = 0;
  std::vector<float> d;        // per block of 256 (ceil(n / 256) of them): x' = d * q
  std::vector<int8_t> q;       // n values in [-127, 127]
  std::vector<int16_t> sum16;  // sum of q over each 16 consecutive values (n / 16), for min terms
};

// Rounds n activations (n a multiple of 32, the smallest block any format has) into out, reusing
// its storage. Throws spill::Error for a non-finite activation or n not a multiple of 32.
void quantize_activations_q8(const float* x, int64_t n, ActivationsQ8& out);

// The formats dot_q8 has an integer kernel for (Q8_0, Q4_K, Q6_K, Q5_K, and the legacy Q4_0,
// Q4_1, Q5_0, Q5_1, IQ4_NL). The others keep dot().
bool has_dot_q8(DType t);
// The formats the CPU matmul takes dot_q8 for by default: those whose kernels apply the float
// scales in registers, lane by lane (Q8_0, Q4_K, Q5_K, Q6_K, Q4_0, Q5_0, IQ4_NL: 1.6-4x their
// f32 kernels per CPU second, docs/perf/cpu-decode-2026-12-01.md). Q4_1 / Q5_1 keep f32: their
// q8 kernels sum per block and measured no faster (docs/perf/quant-speed-legacy-2026-12-01.md).
bool prefer_dot_q8(DType t);

// sum_i dequantize(row)[i] * x'_i over a.n weights (see the accuracy contract above). Throws
// spill::Error for a format without a q8 kernel or a row that is not whole blocks.
float dot_q8(DType t, const void* row, const ActivationsQ8& a);
// dot_q8 for many rows of one matrix: fn(row, a) == dot_q8(t, row, a) bit for bit, for any a with
// a.n == n, with the format, the row length and the kernel build resolved once. Throws
// spill::Error as dot_q8 does (format without a q8 kernel, n not whole blocks).
using DotQ8Row = float (*)(const void* row, const ActivationsQ8& a);
DotQ8Row dot_q8_row(DType t, int64_t n);
// One row against many tokens: fn(row, acts, count, out, stride) sets out[i * stride] =
// dot_q8(t, row, acts[i]) bit for bit for i < count (every acts[i].n == n). Groups of four tokens
// share the row's loads and unpacking where the kernel build has it (Q8_0, Q4_K, Q5_K on AVX2):
// a prompt's rows are dotted with hundreds of tokens. Throws spill::Error as dot_q8_row does.
using DotQ8Tokens = void (*)(const void* row, const ActivationsQ8* acts, int64_t count, float* out, int64_t stride);
DotQ8Tokens dot_q8_tokens_fn(DType t, int64_t n);
// dot_q8 on a given path (Scalar, or Avx2 / Avx512, which share the AVX2 integer kernels); for the
// tests and benchmarks. Throws spill::Error if this CPU cannot run it.
float dot_q8_on(KernelPath p, DType t, const void* row, const ActivationsQ8& a);

}  // namespace spill::quant
