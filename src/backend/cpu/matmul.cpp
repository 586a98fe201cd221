#include <algorithm>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "quant/quant.h"

namespace spill::cpu {

void load_row(const TensorView& w, int64_t row, float* out) {
  quant::dequantize_row(w.dtype, w.row_data(row), out, w.cols());
}

float dot_row(const float* x, const TensorView& w, int64_t row) {
  return quant::dot(w.dtype, w.row_data(row), x, w.cols());
}

void matmul(ThreadPool& pool, const float* x, int64_t n, const TensorView& w, float* y, const TensorView* bias) {
  const int64_t M = w.rows(), K = w.cols();
  if (!row_fits(w.dtype, K))
    fail("cannot multiply by a {} matrix of {} columns: rows must be whole blocks of {}", dtype_name(w.dtype), K,
         dtype_block_elems(w.dtype));
  // Batch invariance: with several tokens a half-precision row is widened once and reused, which
  // gives the same bits as the fused dot (quant::dot reads F16/BF16 in exactly F32's order). A
  // block-format row takes the fused dot for every n (dot_tokens gives each token the bits
  // quant::dot gives it alone): its factored arithmetic (scales applied to sub-block sums) has no
  // widened twin.
  const bool widen = n > 1 && (w.dtype == DType::F16 || w.dtype == DType::BF16);
  pool.parallel_for(M, [&](int64_t m0, int64_t m1) {
    std::vector<float> row;
    if (widen) row.resize(static_cast<size_t>(K));
    for (int64_t m = m0; m < m1; ++m) {
      if (widen) {
        load_row(w, m, row.data());
        for (int64_t t = 0; t < n; ++t) y[t * M + m] = quant::dot(DType::F32, row.data(), x + t * K, K);
      } else {
        quant::dot_tokens(w.dtype, w.row_data(m), x, K, n, K, y + m, M);  // == quant::dot per token
      }
    }
  });
  if (bias && !bias->empty()) {
    std::vector<float> b(static_cast<size_t>(M));
    TensorView bv = *bias;
    bv.ndim = 2;
    bv.shape = {1, M, 0, 0};
    load_row(bv, 0, b.data());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t m = 0; m < M; ++m) y[t * M + m] += b[size_t(m)];
  }
}

}  // namespace spill::cpu
