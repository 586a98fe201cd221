// The CUDA runner's ops (backend/cuda/ops.h) against their CPU twins (backend/cpu/ops.h) over
// awkward shapes: batches of 1, 3, 17, 64; widths that are not powers of two; GQA; positions that
// cross KV blocks through shuffled block tables; contexts longer than one attention partition;
// top-k equal to the expert count; experts that get no tokens. And batch invariance: a row's result
// is bit-identical alone or in a batch.
//
// Bounds, from the arithmetic (u = 2^-24, gamma_m = m u / (1 - m u), Higham):
//  * a dot of K f32 products summed in any order is within gamma_K * sum |x w| of the exact value,
//    so two such sums (the kernel's and the twin's) differ by at most 2 gamma_K sum |x w|;
//  * RMSNorm: both sum the squares in double, so the f32 scale agrees to within 1 ulp; the output
//    to within 2^-21 |out| (the scale's ulp plus two roundings on each side);
//  * expf (CUDA, <= 2 ulp) and std::exp (<= 1 ulp) differ by <= 3 ulp; sinf/cosf likewise;
//  * embedding rows, argmax and the KV slots' contents (F32 cache) are exact.
#include <gtest/gtest.h>

#if SPILL_HAVE_CUDA
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"
#include "quant/fp8.h"
#include "quant/quant.h"
#include "test_values.h"

namespace spill {
namespace {

using test::DeviceBuffer;
using test::f32_gamma;
using test::kF32Unit;

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = d(rng);
  return v;
}

template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

TensorView view(const void* data, DType t, int64_t rows, int64_t cols) { return TensorView::matrix(data, t, rows, cols); }

// Weights of type t (F32, BF16, F16) from floats; `stored` holds the bytes.
std::vector<uint8_t> encode(const std::vector<float>& f, DType t) {
  std::vector<uint8_t> out(f.size() * (t == DType::F32 ? 4 : 2));
  for (size_t i = 0; i < f.size(); ++i) {
    if (t == DType::F32) std::memcpy(out.data() + 4 * i, &f[i], 4);
    else {
      const uint16_t h = t == DType::BF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}
std::vector<float> decode(const std::vector<uint8_t>& b, DType t, int64_t rows, int64_t cols) {
  std::vector<float> f(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) cpu::load_row(view(b.data(), t, rows, cols), r, f.data() + r * cols);
  return f;
}

cudaStream_t s0 = nullptr;

// ---- embedding -------------------------------------------------------------------------------

TEST(CudaOps, EmbeddingRowsAreExactForEveryDeviceFormat) {
  SPILL_SKIP_WITHOUT_GPU();
  const int64_t vocab = 37, hidden = 96;
  const std::vector<int32_t> ids = {0, 36, 5, 5, 17, 2, 30};
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::Q8_0}) {
    const std::vector<float> f = randn(size_t(vocab * hidden), 11);
    std::vector<uint8_t> bytes;
    if (t == DType::Q8_0) {
      bytes.resize(size_t(vocab * row_bytes(t, hidden)));
      for (int64_t r = 0; r < vocab; ++r)
        quant::quantize_row(t, f.data() + r * hidden, bytes.data() + r * row_bytes(t, hidden), hidden);
    } else {
      bytes = encode(f, t);
    }
    DeviceBuffer table = to_device(bytes), id_d = to_device(ids), out(ids.size() * hidden * 4);
    out.poison();
    cuda::embed_rows(table.ptr, t, vocab, hidden, id_d.as<int32_t>(), int64_t(ids.size()), out.as<float>(), s0);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = test::download<float>(out.ptr, ids.size() * hidden);
    std::vector<float> want(static_cast<size_t>(hidden));
    for (size_t i = 0; i < ids.size(); ++i) {
      cpu::load_row(view(bytes.data(), t, vocab, hidden), ids[i], want.data());
      for (int64_t j = 0; j < hidden; ++j) ASSERT_EQ(got[i * hidden + j], want[size_t(j)]) << dtype_name(t) << " row " << i;
    }
  }
}

// ---- RMSNorm ---------------------------------------------------------------------------------

// CUDA's sticky errors (the context is lost: every later call fails too) and a vanished device are a
// DeviceFatalError, which ends the engine; any other failure is an ordinary Error that fails one step.
// Host code only: runs without a GPU.
TEST(CudaCheck, StickyErrorsAreDeviceFatalAndOthersAreNot) {
  for (cudaError_t e : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorIllegalInstruction,
                        cudaErrorMisalignedAddress, cudaErrorECCUncorrectable, cudaErrorNoDevice}) {
    EXPECT_TRUE(cuda::device_error_is_fatal(e)) << cudaGetErrorName(e);
    try {
      cuda::check(e, "a step");
      ADD_FAILURE() << "no throw for " << cudaGetErrorName(e);
    } catch (const DeviceFatalError& x) {
      EXPECT_NE(std::string(x.what()).find(cudaGetErrorName(e)), std::string::npos) << x.what();
      EXPECT_NE(std::string(x.what()).find("restart spill"), std::string::npos) << x.what();
    }
  }
  for (cudaError_t e : {cudaErrorInvalidValue, cudaErrorMemoryAllocation, cudaErrorInvalidConfiguration}) {
    EXPECT_FALSE(cuda::device_error_is_fatal(e)) << cudaGetErrorName(e);
    try {
      cuda::check(e, "a step");
      ADD_FAILURE() << "no throw for " << cudaGetErrorName(e);
    } catch (const DeviceFatalError& x) {
      ADD_FAILURE() << cudaGetErrorName(e) << " should fail one step only: " << x.what();
    } catch (const Error& x) {
      EXPECT_NE(std::string(x.what()).find("a step: "), std::string::npos) << x.what();
    }
  }
  EXPECT_NO_THROW(cuda::check(cudaSuccess, "nothing"));
}

TEST(CudaOps, RmsNormWithResidualAndRowGatherMatchesTheTwin) {
  SPILL_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 3, 17, 64}) {
    for (int64_t dim : {64, 200, 2048}) {
      auto x = randn(size_t(n * dim), 1 + n, 3.0f), r = randn(size_t(n * dim), 2 + dim);
      const auto w = randn(size_t(dim), 3, 0.2f);
      std::vector<float> wt(w);
      for (float& v : wt) v += 1.0f;
      DeviceBuffer xd = to_device(x), rd = to_device(r), wd = to_device(wt), out(size_t(n * dim) * 4);
      // Gather the rows in reverse.
      std::vector<int32_t> rows(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = int32_t(n - 1 - i);
      DeviceBuffer rows_d = to_device(rows);
      cuda::rmsnorm({.x = xd.as<float>(), .residual = rd.as<float>(), .rows = rows_d.as<int32_t>(),
                     .weight = wd.as<float>(), .out = out.as<float>(), .n = n, .dim = dim, .eps = 1e-6},
                    s0);
      CUDA_OK(cudaDeviceSynchronize());
      for (size_t i = 0; i < x.size(); ++i) x[i] += r[i];
      const auto x_got = test::download<float>(xd.ptr, x.size());
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x_got[i], x[i]) << "residual add is exact";
      std::vector<float> want(x.size());
      cpu::rmsnorm(x.data(), n, dim, view(wt.data(), DType::F32, 1, dim), 1e-6, want.data());
      const auto got = test::download<float>(out.ptr, x.size());
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < dim; ++j) {
          const float ref = want[size_t((n - 1 - i) * dim + j)];
          ASSERT_NEAR(got[size_t(i * dim + j)], ref, std::ldexp(std::fabs(ref), -21)) << n << "x" << dim;
        }
    }
  }
}

// The norm's output rounded to int8 in its own kernel (RmsNormArgs::rounded, what the tensor-core
// GEMMs read next) has round_rows's bits: every int8 value and every block scale, over widths with
// a partial last block of 256 (2880, 4128), one chunk per thread and eight (1024, 8192), past the
// registers' reach (8224: the plain kernel, then round_rows), rows gathered, a residual added, and
// a row holding an infinity and a NaN (their blocks' scales NaN, as round_rows gives).
TEST(CudaOps, RmsNormRoundsItsOutputAsRoundRowsDoes) {
  SPILL_SKIP_WITHOUT_GPU();
  for (int64_t dim : {32, 1024, 2048, 2880, 4128, 8192, 8224}) {
    const int64_t n = 5;
    auto x = randn(size_t(n * dim), 11 + dim, 3.0f);
    const auto r = randn(size_t(n * dim), 12 + dim), w = randn(size_t(dim), 13, 0.5f);
    x[size_t(2 * dim + dim / 3)] = INFINITY;
    x[size_t(3 * dim + dim - 1)] = NAN;
    std::vector<int32_t> rows = {4, 0, 3, 1, 2};
    DeviceBuffer xd = to_device(x), rd = to_device(r), wd = to_device(w), rows_d = to_device(rows);
    DeviceBuffer out(size_t(n * dim) * 4), fused(size_t(cuda::rounded_rows_bytes(n, dim))),
        apart(size_t(cuda::rounded_rows_bytes(n, dim)));
    cuda::rmsnorm({.x = xd.as<float>(), .residual = rd.as<float>(), .rows = rows_d.as<int32_t>(), .weight = wd.as<float>(),
                   .out = out.as<float>(), .n = n, .dim = dim, .eps = 1e-6, .rounded = fused.ptr},
                  s0);
    cuda::round_rows(out.ptr, false, n, dim, apart.ptr, s0);
    CUDA_OK(cudaDeviceSynchronize());
    const size_t bytes = size_t(cuda::rounded_rows_bytes(n, dim));
    const auto got = test::download<uint8_t>(fused.ptr, bytes), want = test::download<uint8_t>(apart.ptr, bytes);
    const cuda::RoundedRows layout = cuda::rounded_rows_at(fused.ptr, n, dim);
    const size_t q_bytes = size_t(n * dim),
                 d_at = size_t(reinterpret_cast<const uint8_t*>(layout.d) - static_cast<const uint8_t*>(fused.ptr));
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), q_bytes)) << "int8 values, dim " << dim;
    ASSERT_EQ(0, std::memcmp(got.data() + d_at, want.data() + d_at, size_t(n * layout.d_stride) * 4))
        << "block scales, dim " << dim;
    // Output row 2 reads input row 3 (the NaN: every output of the row is NaN), output row 4 input
    // row 2 (the infinity: a zero norm scale, so NaN only where inf * 0 lands); row 0 is finite.
    std::vector<float> d(size_t(n * layout.d_stride));
    std::memcpy(d.data(), got.data() + d_at, d.size() * 4);
    EXPECT_TRUE(std::isnan(d[size_t(2 * layout.d_stride + (dim - 1) / 256)])) << dim;
    EXPECT_TRUE(std::isnan(d[size_t(4 * layout.d_stride + (dim / 3) / 256)])) << dim;
    for (int64_t b = 0; b < layout.d_stride; ++b) EXPECT_FALSE(std::isnan(d[size_t(b)])) << dim;
  }
}

// The q/k norm fused into the RoPE kernel, isolated by a zero frequency table (cos 1, sin 0: the
// rotation is exact), so q and the stored k are the normed values.
TEST(CudaOps, QkNormPerHeadAndWholeProjectionMatchTheTwin) {
  SPILL_SKIP_WITHOUT_GPU();
  const int64_t n = 17, nh = 6, nkv = 2, D = 48, ld_q = nh * D + 2 * nkv * D;
  for (bool per_head : {true, false}) {
    auto qkv = randn(size_t(n * ld_q), 5, 2.0f);
    const int64_t qw_len = per_head ? D : nh * D, kw_len = per_head ? D : nkv * D;
    auto qw = randn(size_t(qw_len), 6, 0.1f), kw = randn(size_t(kw_len), 7, 0.1f);
    for (float& v : qw) v += 1;
    for (float& v : kw) v += 1;
    std::vector<int32_t> positions(static_cast<size_t>(n));
    std::vector<int64_t> slots(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) positions[size_t(t)] = int32_t(t * 3), slots[size_t(t)] = n - 1 - t;
    DeviceBuffer d = to_device(qkv), qwd = to_device(qw), kwd = to_device(kw), pd = to_device(positions),
                 sd = to_device(slots), inv = to_device(std::vector<float>(size_t(D / 2), 0.0f)),
                 kc(size_t(n * nkv * D) * 4), vc(size_t(n * nkv * D) * 4);
    float* q = d.as<float>();
    cuda::rope_kv_write({.q = q, .k = q + nh * D, .v = q + (nh + nkv) * D, .ld_q = ld_q, .ld_k = ld_q, .ld_v = ld_q,
                         .positions = pd.as<int32_t>(), .slots = sd.as<int64_t>(), .inv_freq = inv.as<float>(),
                         .q_norm = qwd.as<float>(), .k_norm = kwd.as<float>(), .norm_per_head = per_head,
                         .norm_eps = 1e-6, .k_cache = kc.ptr, .v_cache = vc.ptr, .kv_type = KvFormat::F32, .n = n,
                         .n_heads = nh, .n_kv_heads = nkv, .head_dim = D},
                        s0);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = test::download<float>(d.ptr, qkv.size());
    const auto k_stored = test::download<float>(kc.ptr, size_t(n * nkv * D));
    const auto v_stored = test::download<float>(vc.ptr, size_t(n * nkv * D));
    std::vector<float> qr(size_t(n * nh * D)), kr(size_t(n * nkv * D));
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(qkv.begin() + t * ld_q, nh * D, qr.begin() + t * nh * D);
      std::copy_n(qkv.begin() + t * ld_q + nh * D, nkv * D, kr.begin() + t * nkv * D);
    }
    if (per_head) {
      cpu::rmsnorm(qr.data(), n * nh, D, view(qw.data(), DType::F32, 1, D), 1e-6, qr.data());
      cpu::rmsnorm(kr.data(), n * nkv, D, view(kw.data(), DType::F32, 1, D), 1e-6, kr.data());
    } else {
      cpu::rmsnorm(qr.data(), n, nh * D, view(qw.data(), DType::F32, 1, nh * D), 1e-6, qr.data());
      cpu::rmsnorm(kr.data(), n, nkv * D, view(kw.data(), DType::F32, 1, nkv * D), 1e-6, kr.data());
    }
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < nh * D; ++j) {
        const float ref = qr[size_t(t * nh * D + j)];
        ASSERT_NEAR(got[size_t(t * ld_q + j)], ref, std::ldexp(std::fabs(ref), -21)) << "q " << t << " " << j;
      }
      const int64_t slot = n - 1 - t;
      for (int64_t j = 0; j < nkv * D; ++j) {
        const float ref = kr[size_t(t * nkv * D + j)];
        ASSERT_NEAR(k_stored[size_t(slot * nkv * D + j)], ref, std::ldexp(std::fabs(ref), -21)) << "k " << t << " " << j;
        ASSERT_EQ(v_stored[size_t(slot * nkv * D + j)], qkv[size_t(t * ld_q + (nh + nkv) * D + j)]) << "v is stored as is";
      }
    }
  }
}

// ---- RoPE + KV write and attention -------------------------------------------------------------

struct AttnCase {
  int64_t n_heads, n_kv_heads, head_dim;
  int32_t block_size;
  std::vector<std::pair<int32_t, int32_t>> chunks;  // (start_pos, n_tokens) per sequence
  KvFormat kv_type;
};

// Runs cpu::apply_rope + cpu::paged_attention and the CUDA rope_kv_write + paged_attention on the
// same inputs (positions before start_pos are written by an earlier call of both), and compares.
void run_attention_case(const AttnCase& c, uint64_t seed) {
  const int64_t nh = c.n_heads, nkv = c.n_kv_heads, D = c.head_dim, Q = nh * D, KV = nkv * D;
  const int32_t bs = c.block_size;
  int32_t max_len = 0;
  for (auto [s, n] : c.chunks) max_len = std::max(max_len, s + n);
  const int32_t blocks_per_seq = (max_len + bs - 1) / bs;
  const int32_t n_blocks = blocks_per_seq * int32_t(c.chunks.size()) + 3;
  // Shuffled block tables: block ids far apart and out of order.
  std::vector<int32_t> pool(static_cast<size_t>(n_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(uint32_t(seed)));
  std::vector<std::vector<int32_t>> tables;
  for (size_t s = 0; s < c.chunks.size(); ++s)
    tables.emplace_back(pool.begin() + s * blocks_per_seq, pool.begin() + (s + 1) * blocks_per_seq);

  RopeSpec rope;
  rope.theta = 10000.0;
  const cpu::RopeTable table = cpu::make_rope_table(rope, D);
  ThreadPool tp(2);
  std::vector<float> kc(size_t(n_blocks) * bs * KV, 0.0f), vc(kc.size(), 0.0f);
  const cpu::PagedKv cpu_kv{kc.data(), vc.data(), bs, nkv, D};
  const size_t elem = c.kv_type == KvFormat::F32 ? 4 : 2;
  DeviceBuffer kd(kc.size() * elem), vd(kc.size() * elem), inv = to_device(table.inv_freq);
  CUDA_OK(cudaMemset(kd.ptr, 0, kd.bytes));
  CUDA_OK(cudaMemset(vd.ptr, 0, vd.bytes));

  // Two phases: the cached prefix (positions < start_pos), then the step itself.
  std::vector<float> step_q_rot, step_out_cpu;
  std::vector<float> gpu_out;
  std::vector<int32_t> step_pos;
  bool tensor_cores = false;  // the step ran the tensor-core kernel (bf16 q and weights)
  std::vector<float> step_k, step_v;
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<cpu::AttentionChunk> chunks;
    std::vector<int32_t> positions, table_off, flat;
    std::vector<int64_t> slots;
    int32_t first = 0;
    for (size_t s = 0; s < c.chunks.size(); ++s) {
      const auto [start, count] = c.chunks[s];
      const int32_t p0 = phase == 0 ? 0 : start, cnt = phase == 0 ? start : count;
      if (cnt == 0) continue;
      chunks.push_back({first, cnt, p0, tables[s]});
      const int32_t off = int32_t(flat.size());
      flat.insert(flat.end(), tables[s].begin(), tables[s].end());
      for (int32_t i = 0; i < cnt; ++i) {
        const int32_t p = p0 + i;
        positions.push_back(p);
        table_off.push_back(off);
        slots.push_back(int64_t(tables[s][size_t(p / bs)]) * bs + p % bs);
      }
      first += cnt;
    }
    const int64_t n = first;
    if (n == 0) continue;
    auto q = randn(size_t(n * Q), seed * 7 + phase, 1.5f), k = randn(size_t(n * KV), seed * 7 + 3 + phase, 1.5f),
         v = randn(size_t(n * KV), seed * 7 + 5 + phase);
    // GPU
    DeviceBuffer qd = to_device(q), kk = to_device(k), vv = to_device(v), pd = to_device(positions),
                 sd = to_device(slots), od = to_device(table_off), fd = to_device(flat), out(size_t(n * Q) * 4);
    out.poison();
    cuda::rope_kv_write({.q = qd.as<float>(), .k = kk.as<float>(), .v = vv.as<float>(), .ld_q = Q, .ld_k = KV,
                         .ld_v = KV, .positions = pd.as<int32_t>(), .slots = sd.as<int64_t>(),
                         .inv_freq = inv.as<float>(), .attention_factor = table.attention_factor, .clip = 0.0f,
                         .k_cache = kd.ptr, .v_cache = vd.ptr, .kv_type = c.kv_type, .n = n, .n_heads = nh,
                         .n_kv_heads = nkv, .head_dim = D},
                        s0);
    const int32_t max_pos = *std::max_element(positions.begin(), positions.end()) + 1;
    DeviceBuffer ws(size_t(std::max<int64_t>(cuda::attention_workspace_floats(n, nh, D, max_pos), 1)) * 4);
    const cuda::AttentionArgs attention_args{
        .q = qd.as<float>(), .ld_q = Q, .k_cache = kd.ptr, .v_cache = vd.ptr, .kv_type = c.kv_type,
        .positions = pd.as<int32_t>(), .table_offset = od.as<int32_t>(), .block_tables = fd.as<int32_t>(),
        .block_size = bs, .out = out.as<float>(), .n = n, .n_heads = nh, .n_kv_heads = nkv, .head_dim = D,
        .max_positions = max_pos, .workspace = ws.as<float>()};
    cuda::paged_attention(attention_args, s0);
    tensor_cores = cuda::attention_mma_heads(attention_args) > 0;
    CUDA_OK(cudaDeviceSynchronize());
    const auto q_gpu = test::download<float>(qd.ptr, q.size());
    const std::vector<float> q_in(q), k_in(k);
    cpu::apply_rope(table, q.data(), n, nh, D, positions.data());
    cpu::apply_rope(table, k.data(), n, nkv, D, positions.data());
    // The rotation's bound: cos and sin 3 ulp apart (<= 3 * 2^-23 each), then a product each and
    // one subtraction per side: |d| <= (|x0| + |x1|) (3 * 2^-23 + 3 * 2^-23) < 2^-19 (|x0| + |x1|).
    auto rope_bound = [&](const std::vector<float>& in, size_t i) {
      const int64_t d = int64_t(i) % D, half = D / 2;
      const size_t pair = d < half ? i + size_t(half) : i - size_t(half);
      return std::ldexp(std::fabs(in[i]) + std::fabs(in[pair]), -19) + 1e-37;
    };
    for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(q_gpu[i], q[i], rope_bound(q_in, i)) << "q element " << i;
    std::vector<float> cpu_out(size_t(n * Q));
    if (c.kv_type == KvFormat::BF16) {
      // The twin attends over what the GPU cache holds: bf16 of the GPU's rotated k (and of v).
      const size_t total = kc.size();
      std::vector<uint16_t> kb(total), vb(total);
      CUDA_OK(cudaMemcpy(kb.data(), kd.ptr, total * 2, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(vb.data(), vd.ptr, total * 2, cudaMemcpyDeviceToHost));
      // Check the step's stored values against the twin's rotation, rounded to bf16.
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < KV; ++j) {
          const float kg = bf16_to_f32(kb[size_t(slots[size_t(t)] * KV + j)]);
          const float vg = bf16_to_f32(vb[size_t(slots[size_t(t)] * KV + j)]);
          // The f32 rotation's bound, then bf16 rounding (half an ulp of 8 significant bits: 2^-8 relative).
          ASSERT_NEAR(kg, k[size_t(t * KV + j)],
                      rope_bound(k_in, size_t(t * KV + j)) * 1.01 + std::ldexp(std::fabs(kg), -8));
          ASSERT_EQ(vg, bf16_to_f32(f32_to_bf16(v[size_t(t * KV + j)])));
        }
      for (size_t i = 0; i < total; ++i) {
        kc[i] = bf16_to_f32(kb[i]);
        vc[i] = bf16_to_f32(vb[i]);
      }
      // The twin writes its own k and v again: give it the GPU's stored values for this step.
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < KV; ++j) {
          k[size_t(t * KV + j)] = kc[size_t(slots[size_t(t)] * KV + j)];
          v[size_t(t * KV + j)] = vc[size_t(slots[size_t(t)] * KV + j)];
        }
    } else {
      std::vector<float> kg(kc.size());
      CUDA_OK(cudaMemcpy(kg.data(), kd.ptr, kg.size() * 4, cudaMemcpyDeviceToHost));
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < KV; ++j) {
          const float ref = k[size_t(t * KV + j)];
          const size_t at = size_t(slots[size_t(t)] * KV + j);
          ASSERT_NEAR(kg[at], ref, rope_bound(k_in, size_t(t * KV + j))) << "stored k";
          // Attend over the GPU's values so the comparison isolates the attention kernel.
          k[size_t(t * KV + j)] = kg[at];
        }
    }
    // The twin's q: the GPU's rotated q (isolating attention from rope).
    cpu::paged_attention(tp, cpu_kv, chunks, q_gpu.data(), k.data(), v.data(), nh, cpu_out.data());
    if (phase == 1) {
      const auto got = test::download<float>(out.ptr, size_t(n * Q));
      // Bound per (token, head): scores differ by ds <= 2 gamma_D sum_d |q k| / sqrt(D); the
      // weights relatively by 2 ds + the exp/sum roundings; the output by that times max |v|.
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t kvh = h / (nh / nkv);
          const cpu::AttentionChunk* ch = nullptr;
          for (const auto& cc : chunks)
            if (t >= cc.first_token && t < cc.first_token + cc.n_tokens) ch = &cc;
          const int32_t n_pos = positions[size_t(t)] + 1;
          double max_qk = 0, max_v = 0;
          for (int32_t p = 0; p < n_pos; ++p) {
            const float* kp = cpu_kv.k_at(ch->block_table[size_t(p / bs)], p % bs) + kvh * D;
            const float* vp = cpu_kv.v_at(ch->block_table[size_t(p / bs)], p % bs) + kvh * D;
            double s = 0;
            for (int64_t d = 0; d < D; ++d) {
              s += std::fabs(double(q_gpu[size_t((t * nh + h) * D + d)]) * kp[d]);
              max_v = std::max(max_v, std::fabs(double(vp[d])));
            }
            max_qk = std::max(max_qk, s / std::sqrt(double(D)));
          }
          double ds = 2 * f32_gamma(D + 2) * max_qk;
          double rel = 4 * ds + 2 * f32_gamma(2 * n_pos + 16) + 16 * kF32Unit;
          if (tensor_cores) {
            // q rounded to bf16 (each element within 2^-9 relative) moves a score by at most
            // 2^-9 sum |q k| / sqrt(D); the tensor cores' f32 sums are taken as one ulp per add
            // (2u, not u); the softmax weights rounded to bf16 move the output by 2^-9 max |v|.
            ds = (std::ldexp(1.0, -9) + 2 * f32_gamma(2 * (D + 2))) * max_qk;
            rel = 4 * ds + std::ldexp(1.0, -9) + 2 * f32_gamma(2 * (2 * n_pos + 16)) + 16 * kF32Unit;
          }
          for (int64_t d = 0; d < D; ++d) {
            const size_t i = size_t((t * nh + h) * D + d);
            ASSERT_NEAR(got[i], cpu_out[i], rel * max_v + 1e-30)
                << "token " << t << " head " << h << " d " << d << " n_pos " << n_pos;
          }
        }
      gpu_out = got;
    }
  }
}

TEST(CudaOps, AttentionDecodeAndPrefillMatchTheTwin) {
  SPILL_SKIP_WITHOUT_GPU();
  // Decode-only batches of 1, 3, 17 sequences (GQA 8 over 2), block boundaries everywhere.
  run_attention_case({8, 2, 64, 16, {{15, 1}}, KvFormat::F32}, 1);
  run_attention_case({8, 2, 64, 16, {{16, 1}, {31, 1}, {3, 1}}, KvFormat::F32}, 2);
  {
    AttnCase c{4, 4, 16, 4, {}, KvFormat::F32};
    for (int i = 0; i < 17; ++i) c.chunks.push_back({i * 5 + 1, 1});
    run_attention_case(c, 3);
  }
  // Prefill chunks (one fresh, one continuing) mixed with decodes; head_dim 80 (not a power of 2).
  run_attention_case({6, 3, 80, 8, {{0, 23}, {9, 1}, {40, 17}, {7, 1}}, KvFormat::F32}, 4);
  // A batch of 64 decodes.
  {
    AttnCase c{4, 2, 32, 16, {}, KvFormat::F32};
    for (int i = 0; i < 64; ++i) c.chunks.push_back({(i * 37) % 300, 1});
    run_attention_case(c, 5);
  }
}

TEST(CudaOps, AttentionOverSeveralPartitionsMatchesTheTwin) {
  SPILL_SKIP_WITHOUT_GPU();
  // Contexts of 1, 2 and many partitions, at the edges of the split, up to the partition cap
  // (longer partitions past kMaxAttentionPartitions * kMinAttentionPartition positions).
  const int32_t P = cuda::kMinAttentionPartition, M = cuda::kMaxAttentionPartitions * P;
  ASSERT_EQ(cuda::attention_split(P).parts, 1);
  ASSERT_EQ(cuda::attention_split(P + 1).parts, 2);
  // Past the cap the partitions lengthen (to a multiple of 32, so their count may fall below the cap);
  // every split covers its positions with no empty partition.
  for (int32_t n_pos : {1, 31, P, P + 1, 3 * P + 7, M - 1, M, M + 1000, 4 * M + 3})
    for (const cuda::AttentionSplit sp : {cuda::attention_split(n_pos)}) {
      ASSERT_LE(sp.parts, cuda::kMaxAttentionPartitions) << n_pos;
      ASSERT_EQ(sp.length % 32, 0) << n_pos;
      ASSERT_LT(int64_t(sp.parts - 1) * sp.length, n_pos) << n_pos;
      ASSERT_GE(int64_t(sp.parts) * sp.length, n_pos) << n_pos;
    }
  // A grid sized for the longest context holds every shorter one's partitions (the count is not
  // monotonic: M positions split into 64 partitions, M + 1 into 52).
  int32_t most = 0;
  for (int32_t n_pos = 1; n_pos <= 4 * M + 3; ++n_pos) {
    most = std::max(most, cuda::attention_split(n_pos).parts);
    ASSERT_GE(cuda::attention_grid_partitions(n_pos), most) << n_pos;
    ASSERT_LE(cuda::attention_grid_partitions(n_pos), cuda::kMaxAttentionPartitions) << n_pos;
  }
  run_attention_case({4, 1, 128, 16, {{P - 1, 1}, {P, 1}, {2 * P + 37, 1}, {P - 5, 9}, {M + 999, 1}}, KvFormat::F32}, 6);
  run_attention_case({4, 2, 64, 16, {{3 * P + 7, 1}, {M - 1, 2}}, KvFormat::BF16}, 9);
  // The tensor-core kernel's shapes: head_dim 128 over a BF16 cache with GQA groups of 8 (S30), 16
  // (S235), 5 (the seed shape: rows past the group are padding) and 32 (two blocks per KV head);
  // positions at the edges of tiles and partitions, and partitions longer than four tiles.
  run_attention_case({8, 1, 128, 16, {{0, 1}, {31, 1}, {P, 1}, {3 * P + 7, 1}, {M + 999, 1}, {40, 1}}, KvFormat::BF16}, 10);
  run_attention_case({32, 2, 128, 16, {{P - 1, 1}, {2 * P + 37, 1}, {5, 13}}, KvFormat::BF16}, 11);
  run_attention_case({10, 2, 128, 16, {{0, 7}, {77, 1}, {P + 1, 1}}, KvFormat::BF16}, 12);
  run_attention_case({64, 2, 64, 16, {{200, 1}, {33, 2}}, KvFormat::BF16}, 13);
}

TEST(CudaOps, AttentionOverABf16CacheMatchesTheTwinOnTheStoredValues) {
  SPILL_SKIP_WITHOUT_GPU();
  run_attention_case({8, 2, 64, 16, {{0, 19}, {33, 1}, {70, 5}}, KvFormat::BF16}, 7);
}

TEST(CudaOps, AttentionIsBatchInvariant) {
  SPILL_SKIP_WITHOUT_GPU();
  // One decode token at position 700 over a cache of random values: alone, then as row 5 of 9.
  const int64_t nh = 8, nkv = 2, D = 64, Q = nh * D, KV = nkv * D;
  const int32_t bs = 16, n_blocks = 64;
  auto kc = randn(size_t(n_blocks * bs * KV), 21), vc = randn(size_t(n_blocks * bs * KV), 22);
  DeviceBuffer kd = to_device(kc), vd = to_device(vc);
  std::vector<int32_t> table(n_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());
  DeviceBuffer td = to_device(table);
  auto run = [&](const std::vector<int32_t>& positions, const std::vector<float>& q) {
    const int64_t n = int64_t(positions.size());
    std::vector<int32_t> offs(size_t(n), 0);
    DeviceBuffer qd = to_device(q), pd = to_device(positions), od = to_device(offs), out(size_t(n * Q) * 4);
    const int32_t mp = *std::max_element(positions.begin(), positions.end()) + 1;
    DeviceBuffer ws(size_t(std::max<int64_t>(cuda::attention_workspace_floats(n, nh, D, mp), 1)) * 4);
    cuda::paged_attention({.q = qd.as<float>(), .ld_q = Q, .k_cache = kd.ptr, .v_cache = vd.ptr, .kv_type = KvFormat::F32,
                           .positions = pd.as<int32_t>(), .table_offset = od.as<int32_t>(), .block_tables = td.as<int32_t>(),
                           .block_size = bs, .out = out.as<float>(), .n = n, .n_heads = nh, .n_kv_heads = nkv,
                           .head_dim = D, .max_positions = mp, .workspace = ws.as<float>()},
                          s0);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return test::download<float>(out.ptr, size_t(n * Q));
  };
  const auto q_all = randn(size_t(9 * Q), 23);
  const std::vector<int32_t> pos_all = {3, 100, 127, 128, 1000, 700, 5, 900, 64};
  const auto batched = run(pos_all, q_all);
  const auto alone = run({700}, std::vector<float>(q_all.begin() + 5 * Q, q_all.begin() + 6 * Q));
  ASSERT_EQ(0, std::memcmp(alone.data(), batched.data() + 5 * Q, size_t(Q) * 4));
  // One query head per block instead of the GQA group's 4: the same bits.
  setenv("SPILL_CUDA_ATTN_HEADS", "1", 1);
  const auto one_head = run(pos_all, q_all);
  unsetenv("SPILL_CUDA_ATTN_HEADS");
  ASSERT_EQ(0, std::memcmp(one_head.data(), batched.data(), batched.size() * 4));
}

TEST(CudaOps, TensorCoreAttentionIsBatchInvariant) {
  SPILL_SKIP_WITHOUT_GPU();
  // The BF16 cache's kernel (GQA 8 over 2 KV heads, head_dim 128): a decode token at position 700
  // alone, then as row 5 of 9 at other positions, and inside a grid sized for longer contexts.
  const int64_t nh = 16, nkv = 2, D = 128, Q = nh * D, KV = nkv * D;
  const int32_t bs = 16, n_blocks = 128;
  const auto kf = randn(size_t(n_blocks * bs * KV), 31), vf = randn(size_t(n_blocks * bs * KV), 32);
  std::vector<uint16_t> kb(kf.size()), vb(vf.size());
  for (size_t i = 0; i < kf.size(); ++i) kb[i] = f32_to_bf16(kf[i]), vb[i] = f32_to_bf16(vf[i]);
  DeviceBuffer kd = to_device(kb), vd = to_device(vb);
  std::vector<int32_t> table(n_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());
  DeviceBuffer td = to_device(table);
  auto run = [&](const std::vector<int32_t>& positions, const std::vector<float>& q, int32_t min_grid_parts) {
    const int64_t n = int64_t(positions.size());
    std::vector<int32_t> offs(size_t(n), 0);
    DeviceBuffer qd = to_device(q), pd = to_device(positions), od = to_device(offs), out(size_t(n * Q) * 4);
    const int32_t mp = *std::max_element(positions.begin(), positions.end()) + 1;
    const int32_t parts = std::max(cuda::attention_grid_parts(mp), min_grid_parts);
    DeviceBuffer ws(size_t(std::max<int64_t>(n * nh * parts * (D + 2), 1)) * 4);
    const cuda::AttentionArgs args{.q = qd.as<float>(), .ld_q = Q, .k_cache = kd.ptr, .v_cache = vd.ptr,
                                   .kv_type = KvFormat::BF16, .positions = pd.as<int32_t>(),
                                   .table_offset = od.as<int32_t>(), .block_tables = td.as<int32_t>(),
                                   .block_size = bs, .out = out.as<float>(), .n = n, .n_heads = nh,
                                   .n_kv_heads = nkv, .head_dim = D, .max_positions = mp,
                                   .min_grid_parts = min_grid_parts, .workspace = ws.as<float>()};
    EXPECT_EQ(cuda::attention_mma_heads(args), 8);
    cuda::paged_attention(args, s0);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return test::download<float>(out.ptr, size_t(n * Q));
  };
  const auto q_all = randn(size_t(9 * Q), 33);
  const std::vector<int32_t> pos_all = {3, 100, 127, 128, 2000, 700, 5, 1900, 64};
  const auto batched = run(pos_all, q_all, 0);
  const std::vector<float> q5(q_all.begin() + 5 * Q, q_all.begin() + 6 * Q);
  const auto alone = run({700}, q5, 0);
  ASSERT_EQ(0, std::memcmp(alone.data(), batched.data() + 5 * Q, size_t(Q) * 4));
  const auto wide_grid = run({700}, q5, 32);  // a graph's grid, sized for longer contexts
  ASSERT_EQ(0, std::memcmp(wide_grid.data(), alone.data(), size_t(Q) * 4));
}

// One step of the tokens at `positions` (sequence i's block table starts at offsets[i]) through every
// prompt build of the tensor-core attention (AttentionArgs::prompt_warps 0, 4, 8), over a random BF16
// cache of n_blocks blocks of 16; each token's output must be the bits it gets alone (the decode build).
static void expect_prompt_tokens_keep_their_decode_bits(int64_t group, int64_t nkv, int32_t n_blocks,
                                                        const std::vector<int32_t>& tables,
                                                        const std::vector<int32_t>& positions,
                                                        const std::vector<int32_t>& offsets, uint64_t seed) {
  const int64_t D = 128;
  const int32_t bs = 16;
  const int64_t nh = group * nkv, Q = nh * D, KV = nkv * D;
  const auto kf = randn(size_t(n_blocks) * bs * size_t(KV), seed), vf = randn(size_t(n_blocks) * bs * size_t(KV), seed + 1);
  std::vector<uint16_t> kb(kf.size()), vb(vf.size());
  for (size_t i = 0; i < kf.size(); ++i) kb[i] = f32_to_bf16(kf[i]), vb[i] = f32_to_bf16(vf[i]);
  DeviceBuffer kd = to_device(kb), vd = to_device(vb), td = to_device(tables);
  auto run = [&](const std::vector<int32_t>& pos, const std::vector<int32_t>& offs, const float* q, int32_t width) {
    const int64_t n = int64_t(pos.size());
    DeviceBuffer qd = to_device(std::vector<float>(q, q + n * Q)), pd = to_device(pos), od = to_device(offs),
                 out(size_t(n * Q) * 4);
    const int32_t mp = *std::max_element(pos.begin(), pos.end()) + 1;
    DeviceBuffer ws(size_t(std::max<int64_t>(cuda::attention_workspace_floats(n, nh, D, mp), 1)) * 4);
    const cuda::AttentionArgs args{.q = qd.as<float>(), .ld_q = Q, .k_cache = kd.ptr, .v_cache = vd.ptr,
                                   .kv_type = KvFormat::BF16, .positions = pd.as<int32_t>(),
                                   .table_offset = od.as<int32_t>(), .block_tables = td.as<int32_t>(),
                                   .block_size = bs, .out = out.as<float>(), .n = n, .n_heads = nh,
                                   .n_kv_heads = nkv, .head_dim = D, .max_positions = mp, .workspace = ws.as<float>(),
                                   .prompt_warps = width};
    EXPECT_EQ(cuda::attention_mma_heads(args), int(group));
    cuda::paged_attention(args, s0);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return test::download<float>(out.ptr, size_t(n * Q));
  };
  const int64_t n = int64_t(positions.size());
  const auto q = randn(size_t(n * Q), seed + 2);
  std::vector<std::vector<float>> alone(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) alone[size_t(t)] = run({positions[size_t(t)]}, {offsets[size_t(t)]}, q.data() + t * Q, 0);
  for (const int32_t width : {0, 4, 8}) {
    const auto step = run(positions, offsets, q.data(), width);
    for (int64_t t = 0; t < n; ++t)
      ASSERT_EQ(0, std::memcmp(alone[size_t(t)].data(), step.data() + t * Q, size_t(Q) * 4))
          << "group " << group << " prompt build " << width << " token " << t << " position " << positions[size_t(t)];
  }
}

TEST(CudaOps, TensorCoreAttentionOfAPromptGivesEachTokenItsDecodeBits) {
  SPILL_SKIP_WITHOUT_GPU();
  // A step of two prompt chunks and decodes, long enough that consecutive tokens share m16 tiles
  // (16 / group of them: 2 for S30's group of 8, 4 for 4, 8 for 2, one for 16, 3 for 5). Each token's
  // output must be the bits it gets alone. The chunks cross partitions of different lengths (128
  // positions up to 128, then 96 at 129..192, 128 at 257..384, ...), the first chunk's length is
  // odd so a tile pair straddles the two sequences, and a decode token sits between them.
  const int64_t nkv = 2;
  const int32_t n_blocks = 96, per_seq = n_blocks / 3;
  std::vector<int32_t> tables(n_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::reverse(tables.begin(), tables.end());  // three sequences' tables of per_seq blocks each
  std::vector<int32_t> positions, offsets;
  for (int32_t p = 60; p < 60 + 151; ++p) positions.push_back(p), offsets.push_back(0);
  positions.push_back(300), offsets.push_back(2 * per_seq);  // a decode of the third sequence
  for (int32_t p = 250; p < 250 + 140; ++p) positions.push_back(p), offsets.push_back(per_seq);
  for (const int64_t group : {8, 4, 2, 16, 5})
    expect_prompt_tokens_keep_their_decode_bits(group, nkv, n_blocks, tables, positions, offsets, uint64_t(41 + group));
}

TEST(CudaOps, TensorCoreAttentionOfALongPromptGivesEachTokenItsDecodeBits) {
  SPILL_SKIP_WITHOUT_GPU();
  // Past 8K positions a partition holds more than 4 tiles, so each of the decode build's four warp
  // states walks several (the prompt build rebuilds them one after another). One sequence of 20,096
  // positions, its block table shuffled; a chunk at 18,400..18,479 crosses the partition length's
  // change from 288 to 320 (at 18,433 positions), one at 20,000..20,095 has partitions of 320 (10
  // tiles: states of 3, 3, 2 and 2 tiles), and a decode token of a second, short sequence sits between.
  const int64_t nkv = 2;
  const int32_t seq_blocks = 20096 / 16, n_blocks = seq_blocks + 4;
  std::vector<int32_t> tables(n_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(tables.begin(), tables.end(), rng);
  std::vector<int32_t> positions, offsets;
  for (int32_t p = 18400; p < 18480; ++p) positions.push_back(p), offsets.push_back(0);
  positions.push_back(40), offsets.push_back(seq_blocks);
  for (int32_t p = 20000; p < 20096; ++p) positions.push_back(p), offsets.push_back(0);
  for (const int64_t group : {8, 16, 5})
    expect_prompt_tokens_keep_their_decode_bits(group, nkv, n_blocks, tables, positions, offsets, uint64_t(71 + group));
}

// ---- FP8 KV cache -------------------------------------------------------------------------------

TEST(CudaOps, E4m3ConversionMatchesTheTwin) {
  SPILL_SKIP_WITHOUT_GPU();
  // Every sign and exponent, every e4m3 rounding midpoint (the 16 high bits with zero low bits hold
  // them all) and its neighbours one ulp away, saturation and the special values.
  std::vector<float> x;
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : {0u, 1u, 0x7FFFu, 0x8000u, 0xFFFFu}) {
      const uint32_t bits = (hi << 16) | lo;
      float f;
      std::memcpy(&f, &bits, 4);
      x.push_back(f);
    }
  for (float f : {0.0f, -0.0f, 448.0f, -448.0f, 464.0f, 479.99f, 480.0f, 1e30f, INFINITY, -INFINITY, NAN, 0.015625f,
                  0.001953125f, 0.0009765625f, 0.00097656f})
    x.push_back(f);
  DeviceBuffer xd = to_device(x), qd(x.size());
  cuda::f32_to_e4m3(xd.as<float>(), int64_t(x.size()), static_cast<uint8_t*>(qd.ptr), s0);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = test::download<uint8_t>(qd.ptr, x.size());
  auto is_nan_code = [](uint8_t q) { return (q & 0x7Fu) == 0x7Fu; };
  for (size_t i = 0; i < x.size(); ++i) {
    const uint8_t want = quant::f32_to_e4m3(x[i]);
    if (std::isnan(x[i])) {
      ASSERT_TRUE(is_nan_code(got[i]) && is_nan_code(want)) << "NaN input " << i;
      continue;
    }
    ASSERT_EQ(int(got[i]), int(want)) << "x = " << x[i] << " (bits " << std::hex << std::bit_cast<uint32_t>(x[i]) << ")";
    // And the twin's decoding is the inverse on the grid.
    if (!is_nan_code(want)) {
      ASSERT_EQ(int(quant::f32_to_e4m3(quant::e4m3_to_f32(want))), int(want));
    }
  }
}

// rope_kv_write into an FP8 cache stores, for each (token, KV head), quant::quantize_kv_fp8 of the
// values an F32 cache gets from the same call, bit for bit; a zero vector and a non-finite one take
// the twin's scales (0 and NaN).
TEST(CudaOps, Fp8KvWriteIsTheTwinsRoundingOfTheF32Write) {
  SPILL_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t nh, nkv, D;
    bool norm, per_head;
    float clip;
  };
  // The per-head kernel (64, 128, 256; per-head norm or none) and the block kernel (a whole-projection
  // norm; head_dim 96, not a power of two).
  for (const Case c : {Case{8, 2, 64, false, true, 0.0f}, Case{16, 4, 128, true, true, 0.0f},
                       Case{4, 2, 256, false, true, 2.5f}, Case{6, 3, 96, true, false, 0.0f},
                       Case{4, 4, 128, true, false, 1.5f}}) {
    const int64_t n = 7, Q = c.nh * c.D, KV = c.nkv * c.D, slots = 40;
    auto q = randn(size_t(n * Q), 71, 1.5f), k = randn(size_t(n * KV), 72, 1.5f), v = randn(size_t(n * KV), 73);
    // Token 2: a KV head of zeros (k and v); token 4: an infinite v value.
    for (int64_t j = 0; j < c.D; ++j) k[size_t(2 * KV + j)] = 0.0f, v[size_t(2 * KV + j)] = 0.0f;
    v[size_t(4 * KV + c.D + 3) % size_t(n * KV)] = INFINITY;
    std::vector<int32_t> positions = {0, 5, 17, 16, 300, 2, 1023};
    std::vector<int64_t> slot_of = {3, 39, 0, 17, 22, 8, 31};
    const auto qn = randn(size_t(c.per_head ? c.D : Q), 74), kn = randn(size_t(c.per_head ? c.D : KV), 75);
    RopeSpec rope;
    rope.theta = 10000.0;
    const cpu::RopeTable table = cpu::make_rope_table(rope, c.D);
    DeviceBuffer inv = to_device(table.inv_freq), pd = to_device(positions), sd = to_device(slot_of),
                 qnd = to_device(qn), knd = to_device(kn);
    auto write = [&](KvFormat f, DeviceBuffer& kc, DeviceBuffer& vc, DeviceBuffer* ks, DeviceBuffer* vs) {
      DeviceBuffer qd = to_device(q), kd = to_device(k), vd = to_device(v);
      cuda::rope_kv_write({.q = qd.as<float>(), .k = kd.as<float>(), .v = vd.as<float>(), .ld_q = Q, .ld_k = KV,
                           .ld_v = KV, .positions = pd.as<int32_t>(), .slots = sd.as<int64_t>(),
                           .inv_freq = inv.as<float>(), .attention_factor = table.attention_factor, .clip = c.clip,
                           .q_norm = c.norm ? qnd.as<float>() : nullptr, .k_norm = c.norm ? knd.as<float>() : nullptr,
                           .norm_per_head = c.per_head, .norm_eps = 1e-6, .k_cache = kc.ptr, .v_cache = vc.ptr,
                           .kv_type = f, .k_scale = ks ? ks->as<float>() : nullptr,
                           .v_scale = vs ? vs->as<float>() : nullptr, .n = n, .n_heads = c.nh, .n_kv_heads = c.nkv,
                           .head_dim = c.D},
                          s0);
      CUDA_OK(cudaDeviceSynchronize());
    };
    DeviceBuffer kf(size_t(slots * KV) * 4), vf(size_t(slots * KV) * 4);
    write(KvFormat::F32, kf, vf, nullptr, nullptr);
    DeviceBuffer k8(size_t(slots * KV)), v8(size_t(slots * KV)), ks(size_t(slots * c.nkv) * 4),
        vs(size_t(slots * c.nkv) * 4);
    write(KvFormat::Fp8E4m3, k8, v8, &ks, &vs);
    const auto kf_h = test::download<float>(kf.ptr, size_t(slots * KV)), vf_h = test::download<float>(vf.ptr, size_t(slots * KV));
    const auto k8_h = test::download<uint8_t>(k8.ptr, size_t(slots * KV)), v8_h = test::download<uint8_t>(v8.ptr, size_t(slots * KV));
    const auto ks_h = test::download<float>(ks.ptr, size_t(slots * c.nkv)), vs_h = test::download<float>(vs.ptr, size_t(slots * c.nkv));
    int zero_scales = 0, nan_scales = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < c.nkv; ++h) {
        const size_t at = size_t(slot_of[size_t(t)] * c.nkv + h);
        for (int side = 0; side < 2; ++side) {
          const std::vector<float>& f = side ? vf_h : kf_h;
          std::vector<uint8_t> want(size_t(c.D));
          const float scale = quant::quantize_kv_fp8(f.data() + at * size_t(c.D), c.D, want.data());
          const float got_scale = (side ? vs_h : ks_h)[at];
          if (std::isnan(scale)) {
            ++nan_scales;
            ASSERT_TRUE(std::isnan(got_scale)) << "token " << t << " head " << h;
          } else {
            zero_scales += scale == 0.0f;
            ASSERT_EQ(std::bit_cast<uint32_t>(got_scale), std::bit_cast<uint32_t>(scale)) << "token " << t << " head " << h;
          }
          ASSERT_EQ(0, std::memcmp((side ? v8_h : k8_h).data() + at * size_t(c.D), want.data(), size_t(c.D)))
              << (side ? "v" : "k") << " of token " << t << " head " << h << " (D " << c.D << ")";
        }
      }
    EXPECT_GE(zero_scales, 1) << "the zero head's scales";
    EXPECT_EQ(nan_scales, c.clip > 0 ? 0 : 1) << "the infinite value's head (clipped when clip > 0)";
  }
}

// The FP8 cache's attention is, bit for bit, the BF16 cache's over the values quant::kv_fp8_to_bf16
// gives (decode batches, prompts that share m16 tiles, contexts of many partitions, GQA groups of 1 to
// 32, head_dim 64 and 128), with cache rows of zeros and of tiny and large scales.
TEST(CudaOps, Fp8AttentionIsTheBf16AttentionOverTheDequantizedCache) {
  SPILL_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t nh, nkv, D;
    std::vector<int32_t> positions, offsets;
  };
  std::vector<Case> cases;
  cases.push_back({16, 2, 128, {3, 100, 127, 128, 2000, 700, 5, 1900, 64}, {0, 0, 0, 0, 0, 0, 0, 0, 0}});
  cases.push_back({4, 2, 64, {0, 31, 4100, 129}, {0, 0, 0, 0}});
  cases.push_back({32, 1, 128, {77, 1500}, {0, 0}});
  cases.push_back({4, 4, 64, {9000}, {0}});
  {
    // A step of two prompt chunks and a decode (consecutive tokens share m16 tiles: n >= 64).
    Case c{8, 2, 128, {}, {}};
    for (int32_t p = 60; p < 60 + 90; ++p) c.positions.push_back(p), c.offsets.push_back(0);
    c.positions.push_back(300), c.offsets.push_back(200);
    for (int32_t p = 250; p < 250 + 40; ++p) c.positions.push_back(p), c.offsets.push_back(400);
    cases.push_back(c);
  }
  const int32_t bs = 16, n_blocks = 600;
  std::vector<int32_t> table(n_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(5));
  DeviceBuffer td = to_device(table);
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    const int64_t Q = c.nh * c.D, KV = c.nkv * c.D, slots = int64_t(n_blocks) * bs;
    std::mt19937_64 rng(100 + ci);
    std::vector<uint8_t> k8(size_t(slots * KV)), v8(k8.size());
    for (auto* cache : {&k8, &v8})
      for (uint8_t& b : *cache) {
        b = uint8_t(rng());
        if ((b & 0x7F) == 0x7F) b = 0x3C;  // no NaN codes
      }
    std::vector<float> ks(size_t(slots * c.nkv)), vs(ks.size());
    std::uniform_real_distribution<float> log2s(-12.0f, 2.0f);
    for (size_t i = 0; i < ks.size(); ++i) {
      ks[i] = std::exp2(log2s(rng)) / 448.0f, vs[i] = std::exp2(log2s(rng)) / 448.0f;
      if (i % 97 == 5) ks[i] = 0.0f;   // a zero head as the writer stores it
      if (i % 89 == 7) vs[i] = 0.0f;
    }
    std::vector<uint16_t> kb(k8.size()), vb(v8.size());
    for (size_t i = 0; i < k8.size(); ++i) {
      const size_t head = i / size_t(c.D);
      kb[i] = quant::kv_fp8_to_bf16(k8[i], ks[head]);
      vb[i] = quant::kv_fp8_to_bf16(v8[i], vs[head]);
    }
    DeviceBuffer k8d = to_device(k8), v8d = to_device(v8), ksd = to_device(ks), vsd = to_device(vs),
                 kbd = to_device(kb), vbd = to_device(vb);
    const int64_t n = int64_t(c.positions.size());
    const auto q = randn(size_t(n * Q), 200 + ci, 2.0f);
    DeviceBuffer qd = to_device(q), pd = to_device(c.positions), od = to_device(c.offsets);
    const int32_t mp = *std::max_element(c.positions.begin(), c.positions.end()) + 1;
    DeviceBuffer ws(size_t(std::max<int64_t>(cuda::attention_workspace_floats(n, c.nh, c.D, mp), 1)) * 4);
    auto run = [&](KvFormat f) {
      DeviceBuffer out(size_t(n * Q) * 4);
      out.poison();
      const bool fp8 = f == KvFormat::Fp8E4m3;
      const cuda::AttentionArgs args{.q = qd.as<float>(), .ld_q = Q, .k_cache = fp8 ? k8d.ptr : kbd.ptr,
                                     .v_cache = fp8 ? v8d.ptr : vbd.ptr, .kv_type = f,
                                     .k_scale = fp8 ? ksd.as<float>() : nullptr, .v_scale = fp8 ? vsd.as<float>() : nullptr,
                                     .positions = pd.as<int32_t>(), .table_offset = od.as<int32_t>(),
                                     .block_tables = td.as<int32_t>(), .block_size = bs, .out = out.as<float>(), .n = n,
                                     .n_heads = c.nh, .n_kv_heads = c.nkv, .head_dim = c.D, .max_positions = mp,
                                     .workspace = ws.as<float>()};
      EXPECT_GT(cuda::attention_mma_heads(args), 0);
      cuda::paged_attention(args, s0);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      return test::download<float>(out.ptr, size_t(n * Q));
    };
    const auto want = run(KvFormat::BF16), got = run(KvFormat::Fp8E4m3);
    size_t finite = 0;
    for (float f : want) finite += std::isfinite(f);
    ASSERT_EQ(finite, want.size()) << "case " << ci;
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << "case " << ci;
  }
  EXPECT_TRUE(cuda::kv_fp8_supported(32, 4, 128));
  EXPECT_FALSE(cuda::kv_fp8_supported(6, 3, 96));
  EXPECT_FALSE(cuda::kv_fp8_supported(24, 1, 128));  // a group of 24: neither <= 16 nor a multiple of 16
}

// ---- router ----------------------------------------------------------------------------------

TEST(CudaOps, RouterTopKMatchesTheTwin) {
  SPILL_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t n, E, k;
    bool renorm;
  };
  for (const Case& c : {Case{1, 8, 2, true}, Case{3, 128, 8, true}, Case{17, 60, 4, false}, Case{64, 16, 16, true},
                        Case{5, 1, 1, false}, Case{9, 257, 7, true}}) {
    const auto logits = randn(size_t(c.n * c.E), uint64_t(c.n * 131 + c.E), 2.0f);
    DeviceBuffer ld = to_device(logits), ids(size_t(c.n * c.k) * 4), ws(size_t(c.n * c.k) * 4);
    cuda::route_topk(ld.as<float>(), c.n, c.E, c.k, c.renorm, ids.as<int32_t>(), ws.as<float>(), s0);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<int32_t> want_ids(size_t(c.n * c.k));
    std::vector<float> want_w(size_t(c.n * c.k));
    cpu::route_topk(logits.data(), c.n, c.E, c.k, c.renorm, want_ids.data(), want_w.data());
    const auto got_ids = test::download<int32_t>(ids.ptr, want_ids.size());
    const auto got_w = test::download<float>(ws.ptr, want_w.size());
    // Probabilities: exp (3 ulp apart), the sum (gamma_E each side), the division: relative
    // 2 gamma_E + 8u; renormalised: twice that plus the top-k sum's 2 gamma_k.
    const double rel = 2 * (2 * f32_gamma(c.E) + 8 * kF32Unit) + 2 * f32_gamma(c.k);
    for (size_t i = 0; i < want_ids.size(); ++i) {
      ASSERT_EQ(got_ids[i], want_ids[i]) << "n " << c.n << " E " << c.E << " entry " << i;
      ASSERT_NEAR(got_w[i], want_w[i], rel * want_w[i]);
    }
    // A GPU's share (expert parallelism): the same ids and weights, and its own list with the
    // experts it does not hold (here those with id % 3 == 1) as -1.
    std::vector<uint8_t> owned(size_t(c.E));
    for (int64_t e = 0; e < c.E; ++e) owned[size_t(e)] = e % 3 != 1;
    DeviceBuffer owned_d = to_device(owned), share_ids(size_t(c.n * c.k) * 4);
    cuda::route_topk(ld.as<float>(), c.n, c.E, c.k, c.renorm, ids.as<int32_t>(), ws.as<float>(), s0,
                     {.owned = owned_d.as<uint8_t>(), .ids = share_ids.as<int32_t>()});
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(test::download<int32_t>(ids.ptr, want_ids.size()), got_ids);
    EXPECT_EQ(test::download<float>(ws.ptr, want_w.size()), got_w);
    const auto got_share = test::download<int32_t>(share_ids.ptr, want_ids.size());
    for (size_t i = 0; i < want_ids.size(); ++i)
      ASSERT_EQ(got_share[i], want_ids[i] % 3 != 1 ? want_ids[i] : -1) << "n " << c.n << " E " << c.E << " entry " << i;
  }
}

// ---- dense float matmul ---------------------------------------------------------------------

TEST(CudaOps, FloatMatmulMatchesTheTwinAndIsBatchInvariant) {
  SPILL_SKIP_WITHOUT_GPU();
  ThreadPool tp(2);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    // 203: element loads; 200: 16-byte loads, part of one chunk; 4200 and 9000: 16-byte loads over
    // more than one chunk of prefetched vectors (4096 F32 or 8192 BF16/F16 elements)
    for (const auto& [n, cols] : {std::pair<int64_t, int64_t>{1, 203}, {3, 200}, {17, 9000}, {64, 203}, {1, 4200}}) {
      const int64_t rows = 75;
      const std::vector<uint8_t> w = encode(randn(size_t(rows * cols), 31, 0.1f), t);
      const std::vector<float> wf = decode(w, t, rows, cols);
      const auto x = randn(size_t(n * cols), 32 + n), bias = randn(size_t(rows), 33);
      DeviceBuffer wd = to_device(w), xd = to_device(x), bd = to_device(bias), y(size_t(n * rows) * 4);
      cuda::matmul_float(wd.ptr, t, rows, cols, xd.as<float>(), n, bd.as<float>(), y.as<float>(), s0);
      CUDA_OK(cudaDeviceSynchronize());
      const auto got = test::download<float>(y.ptr, size_t(n * rows));
      std::vector<float> want(size_t(n * rows));
      const std::vector<float> bias_copy(bias);
      const TensorView bv = view(bias_copy.data(), DType::F32, 1, rows);
      cpu::matmul(tp, x.data(), n, view(w.data(), t, rows, cols), want.data(), &bv);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t m = 0; m < rows; ++m) {
          double mag = 0;
          for (int64_t k = 0; k < cols; ++k) mag += std::fabs(double(x[size_t(i * cols + k)]) * wf[size_t(m * cols + k)]);
          const double tol = 2 * f32_gamma(cols + 1) * mag + 2 * kF32Unit * std::fabs(bias[size_t(m)]);
          ASSERT_NEAR(got[size_t(i * rows + m)], want[size_t(i * rows + m)], tol) << dtype_name(t) << " n " << n;
        }
      // Row n-1 alone gives the same bits.
      DeviceBuffer x1 = to_device(std::vector<float>(x.end() - cols, x.end())), y1(size_t(rows) * 4);
      cuda::matmul_float(wd.ptr, t, rows, cols, x1.as<float>(), 1, bd.as<float>(), y1.as<float>(), s0);
      CUDA_OK(cudaDeviceSynchronize());
      const auto alone = test::download<float>(y1.ptr, size_t(rows));
      ASSERT_EQ(0, std::memcmp(alone.data(), got.data() + (n - 1) * rows, size_t(rows) * 4));
    }
  }
}

// ---- SiLU * up, argmax -------------------------------------------------------------------------

TEST(CudaOps, SiluMulMatchesTheTwin) {
  SPILL_SKIP_WITHOUT_GPU();
  const int64_t n = 17, width = 96;
  const auto gu = randn(size_t(n * 2 * width), 41, 3.0f);
  DeviceBuffer gd = to_device(gu), out(size_t(n * width) * 4);
  cuda::silu_mul(gd.as<float>(), nullptr, n, width, out.as<float>(), s0);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = test::download<float>(out.ptr, size_t(n * width));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < width; ++i) {
      const float g = gu[size_t(t * 2 * width + i)], u = gu[size_t(t * 2 * width + width + i)];
      const float want = g / (1.0f + std::exp(-g)) * u;  // cpu::swiglu_mlp's expression
      // exp 3 ulp (6u relative) apart and the add's rounding on each side: 1 + e within 8u
      // relative; then the division and the product, one rounding each side: 12u.
      ASSERT_NEAR(got[size_t(t * width + i)], want, 12 * kF32Unit * std::fabs(want) + 1e-38);
    }
}

TEST(CudaOps, ArgmaxTakesTheLowestIndexAmongEquals) {
  SPILL_SKIP_WITHOUT_GPU();
  const int64_t rows = 5, cols = 1001;
  auto x = randn(size_t(rows * cols), 51);
  x[size_t(1 * cols + 700)] = 9.0f;
  x[size_t(1 * cols + 300)] = 9.0f;  // tie: 300 wins
  x[size_t(2 * cols + 1000)] = 50.0f;
  for (int64_t j = 0; j < cols; ++j) x[size_t(3 * cols + j)] = -INFINITY;
  DeviceBuffer xd = to_device(x), ids(size_t(rows) * 4);
  cuda::argmax_rows(xd.as<float>(), rows, cols, ids.as<int32_t>(), s0);
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = test::download<int32_t>(ids.ptr, size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int32_t want = 0;
    for (int64_t j = 1; j < cols; ++j)
      if (x[size_t(r * cols + j)] > x[size_t(r * cols + want)]) want = int32_t(j);
    ASSERT_EQ(got[size_t(r)], want) << "row " << r;
  }
}

// ---- float experts ---------------------------------------------------------------------------

TEST(CudaOps, FloatExpertsMatchTheTwin) {
  SPILL_SKIP_WITHOUT_GPU();
  ThreadPool tp(2);
  const int64_t H = 96, I = 40;
  const int32_t E = 6;
  for (DType t : {DType::BF16, DType::F32}) {
    for (int64_t n : {1, 3, 17}) {
      for (int32_t k : {2, E}) {
        std::vector<std::vector<uint8_t>> g, u, d;
        std::vector<TensorView> views;
        views.reserve(size_t(3 * E));
        for (int32_t e = 0; e < E; ++e) {
          g.push_back(encode(randn(size_t(I * H), 100 + e, 0.1f), t));
          u.push_back(encode(randn(size_t(I * H), 200 + e, 0.1f), t));
          d.push_back(encode(randn(size_t(H * I), 300 + e, 0.15f), t));
        }
        std::vector<cpu::ExpertView> ev;
        std::vector<cuda::ExpertWeights> table;
        for (int32_t e = 0; e < E; ++e) {
          views.push_back(view(g[size_t(e)].data(), t, I, H));
          views.push_back(view(u[size_t(e)].data(), t, I, H));
          views.push_back(view(d[size_t(e)].data(), t, H, I));
        }
        for (int32_t e = 0; e < E; ++e) ev.push_back({&views[size_t(3 * e)], &views[size_t(3 * e + 1)], &views[size_t(3 * e + 2)]});
        std::vector<std::unique_ptr<DeviceBuffer>> owned;
        for (int32_t e = 0; e < E; ++e) {
          owned.push_back(std::make_unique<DeviceBuffer>(g[size_t(e)].size()));
          owned.back()->upload(g[size_t(e)].data(), g[size_t(e)].size());
          owned.push_back(std::make_unique<DeviceBuffer>(u[size_t(e)].size()));
          owned.back()->upload(u[size_t(e)].data(), u[size_t(e)].size());
          owned.push_back(std::make_unique<DeviceBuffer>(d[size_t(e)].size()));
          owned.back()->upload(d[size_t(e)].data(), d[size_t(e)].size());
          table.push_back({owned[owned.size() - 3]->ptr, owned[owned.size() - 2]->ptr, owned.back()->ptr});
        }
        // Routing: expert 4 never chosen when k < E (an expert with no tokens).
        const auto x = randn(size_t(n * H), 400 + n);
        std::vector<int32_t> ids(size_t(n * k));
        std::vector<float> w(size_t(n * k));
        std::mt19937 rng(uint32_t(n * 10 + k));
        for (int64_t i = 0; i < n; ++i) {
          std::vector<int32_t> order = {0, 1, 2, 3, 5, 4};
          std::shuffle(order.begin(), order.begin() + (k < E ? 5 : 6), rng);
          for (int32_t j = 0; j < k; ++j) {
            ids[size_t(i * k + j)] = order[size_t(j)];
            w[size_t(i * k + j)] = 1.0f / float(j + 2);
          }
        }
        DeviceBuffer td = to_device(table), xd = to_device(x), idd = to_device(ids), wd = to_device(w),
                     out(size_t(n * H) * 4), ws(size_t(cuda::moe_float_workspace_bytes(n, k, H, I)));
        cuda::moe_experts_float({.table = td.as<cuda::ExpertWeights>(), .type = t, .hidden = H, .width = I,
                                 .n_experts = E, .top_k = k, .x = xd.as<float>(), .n = n, .ids = idd.as<int32_t>(),
                                 .weights = wd.as<float>(), .out = out.as<float>(), .workspace = ws.ptr},
                                s0);
        CUDA_OK(cudaDeviceSynchronize());
        const auto got = test::download<float>(out.ptr, size_t(n * H));
        std::vector<float> want(size_t(n * H));
        cpu::moe_experts(tp, x.data(), n, H, k, ids.data(), w.data(), ev, want.data());
        // Bound per output: every stage's two sums are 2 gamma apart relative to their absolute
        // sums; silu and the product add 14u (SiluMul's bound); computed in double.
        for (int64_t i = 0; i < n; ++i) {
          std::vector<double> mag(size_t(H), 0.0), sum_abs(size_t(H), 0.0);
          for (int32_t j = 0; j < k; ++j) {
            const int32_t e = ids[size_t(i * k + j)];
            const auto gf = decode(g[size_t(e)], t, I, H), uf = decode(u[size_t(e)], t, I, H),
                       df = decode(d[size_t(e)], t, H, I);
            std::vector<double> h_abs(static_cast<size_t>(I)), dh(static_cast<size_t>(I));
            for (int64_t r = 0; r < I; ++r) {
              double gv = 0, uv = 0, ga = 0, ua = 0;
              for (int64_t c = 0; c < H; ++c) {
                const double xv = x[size_t(i * H + c)];
                gv += xv * gf[size_t(r * H + c)];
                uv += xv * uf[size_t(r * H + c)];
                ga += std::fabs(xv * gf[size_t(r * H + c)]);
                ua += std::fabs(xv * uf[size_t(r * H + c)]);
              }
              const double sg = gv / (1 + std::exp(-gv));
              const double dg = 2 * f32_gamma(H) * ga, du = 2 * f32_gamma(H) * ua;
              h_abs[size_t(r)] = std::fabs(sg * uv);
              dh[size_t(r)] = 1.1 * dg * (std::fabs(uv) + du) + (std::fabs(sg) + 1.1 * dg) * du + 14 * kF32Unit * h_abs[size_t(r)];
            }
            for (int64_t c = 0; c < H; ++c) {
              double a = 0, y = 0;
              for (int64_t r = 0; r < I; ++r) {
                a += std::fabs(df[size_t(c * I + r)]) * (dh[size_t(r)] + 2 * f32_gamma(I) * (h_abs[size_t(r)] + dh[size_t(r)]));
                y += std::fabs(df[size_t(c * I + r)]) * h_abs[size_t(r)];
              }
              // The weight's product: one rounding each side.
              mag[size_t(c)] += w[size_t(i * k + j)] * (a + 2 * kF32Unit * y);
              sum_abs[size_t(c)] += w[size_t(i * k + j)] * (y + a);
            }
          }
          for (int64_t c = 0; c < H; ++c) {
            const float ref = want[size_t(i * H + c)];
            // The slot sums (k terms, different orders): 2 gamma_k sum_j w_j |y_j|.
            ASSERT_NEAR(got[size_t(i * H + c)], ref, mag[size_t(c)] + 2 * f32_gamma(k) * sum_abs[size_t(c)] + 1e-30)
                << dtype_name(t) << " n " << n << " k " << k;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace spill

#else
TEST(CudaOps, SkippedWithoutCuda) { GTEST_SKIP() << "spill was built without CUDA"; }
#endif
