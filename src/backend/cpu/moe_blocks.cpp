#include "backend/cpu/moe_blocks.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "quant/quant.h"

namespace spill::cpu {

namespace {

// y[r] = dot(row r of w, x) for rows of `cols` weights, float64 accumulation, rounded to f32.
void dot_rows(DType t, const void* w, int64_t rows, int64_t cols, const float* x, float* y) {
  std::vector<float> row(static_cast<size_t>(cols));
  const int64_t rb = row_bytes(t, cols);
  for (int64_t r = 0; r < rows; ++r) {
    quant::dequantize_row(t, static_cast<const uint8_t*>(w) + r * rb, row.data(), cols);
    double s = 0;
    for (int64_t i = 0; i < cols; ++i) s += double(row[size_t(i)]) * double(x[i]);
    y[r] = float(s);
  }
}

}  // namespace

void moe_experts_blocks(const BlockMoeShape& s, std::span<const BlockExpert> experts, const float* x, int64_t n,
                        const int32_t* ids, const float* weights, float* out) {
  if (!row_fits(s.gate_up_type, s.hidden) || !row_fits(s.down_type, s.width))
    fail("MoE expert shape hidden {} / width {} does not fit {} / {} blocks", s.hidden, s.width,
         dtype_name(s.gate_up_type), dtype_name(s.down_type));
  const int64_t pairs = n * s.top_k;
  std::vector<float> partial(static_cast<size_t>(pairs * s.hidden), 0.0f);
  std::vector<float> gate(static_cast<size_t>(s.width)), up(static_cast<size_t>(s.width)), act(gate.size());
  std::vector<float> y(static_cast<size_t>(s.hidden));
  // Stage 1: group pairs by expert (each expert's weights are visited once per step).
  std::vector<std::vector<int64_t>> routed(experts.size());
  for (int64_t p = 0; p < pairs; ++p)
    if (ids[p] >= 0 && size_t(ids[p]) < experts.size()) routed[size_t(ids[p])].push_back(p);
  for (size_t e = 0; e < experts.size(); ++e) {
    for (int64_t p : routed[e]) {
      const float* xt = x + (p / s.top_k) * s.hidden;
      // Stage 2: gate and up, silu(gate) * up.
      dot_rows(s.gate_up_type, experts[e].gate, s.width, s.hidden, xt, gate.data());
      dot_rows(s.gate_up_type, experts[e].up, s.width, s.hidden, xt, up.data());
      for (int64_t i = 0; i < s.width; ++i) {
        const double g = gate[size_t(i)];
        act[size_t(i)] = float(g / (1.0 + std::exp(-g)) * double(up[size_t(i)]));
      }
      // Stage 3: down, times the routing weight, into the pair's partial row.
      dot_rows(s.down_type, experts[e].down, s.hidden, s.width, act.data(), y.data());
      for (int64_t r = 0; r < s.hidden; ++r)
        partial[size_t(p * s.hidden + r)] = float(double(weights[p]) * double(y[size_t(r)]));
    }
  }
  // Stage 4: each token's partial rows in slot order.
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < s.hidden; ++r) {
      float acc = partial[size_t(t * s.top_k * s.hidden + r)];
      for (int64_t j = 1; j < s.top_k; ++j) acc += partial[size_t((t * s.top_k + j) * s.hidden + r)];
      out[t * s.hidden + r] = acc;
    }
}

}  // namespace spill::cpu
