#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"

namespace spill::cpu {

void rmsnorm(const float* x, int64_t n, int64_t dim, const TensorView& weight, double eps, float* out) {
  std::vector<float> w(static_cast<size_t>(dim));
  TensorView row = weight;
  row.ndim = 2;
  row.shape = {1, dim, 0, 0};
  load_row(row, 0, w.data());
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * dim;
    double sum_sq = 0;  // double: the mean of squares is the one reduction where fp32 drifts
    for (int64_t j = 0; j < dim; ++j) sum_sq += double(xi[j]) * xi[j];
    const float scale = float(1.0 / std::sqrt(sum_sq / double(dim) + eps));
    float* oi = out + i * dim;
    for (int64_t j = 0; j < dim; ++j) oi[j] = w[size_t(j)] * (xi[j] * scale);
  }
}

}  // namespace spill::cpu
