#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/ops.h"

namespace spill::cpu {

void route_topk(const float* router_logits, int64_t n, int64_t n_experts, int64_t k, bool renormalise,
                int32_t* ids, float* weights) {
  std::vector<float> probs(static_cast<size_t>(n_experts));
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n; ++t) {
    const float* logits = router_logits + t * n_experts;
    const float max_logit = *std::max_element(logits, logits + n_experts);
    float sum = 0;
    for (int64_t e = 0; e < n_experts; ++e) sum += probs[size_t(e)] = std::exp(logits[e] - max_logit);
    for (float& p : probs) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return probs[size_t(a)] > probs[size_t(b)] || (probs[size_t(a)] == probs[size_t(b)] && a < b);
    });
    float top_sum = 0;
    for (int64_t j = 0; j < k; ++j) top_sum += probs[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[size_t(j)];
      weights[t * k + j] = renormalise ? probs[size_t(order[size_t(j)])] / top_sum : probs[size_t(order[size_t(j)])];
    }
  }
}

static inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

void swiglu_mlp(ThreadPool& pool, const float* x, int64_t n, const ExpertView& mlp, float* out) {
  const int64_t I = mlp.gate->rows();
  std::vector<float> gate(static_cast<size_t>(n * I)), up(static_cast<size_t>(n * I));
  matmul(pool, x, n, *mlp.gate, gate.data());
  matmul(pool, x, n, *mlp.up, up.data());
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = silu(gate[i]) * up[i];
  matmul(pool, gate.data(), n, *mlp.down, out);
}

void moe_experts(ThreadPool& pool, const float* x, int64_t n, int64_t hidden, int64_t k, const int32_t* ids,
                 const float* weights, std::span<const ExpertView> experts, float* out) {
  // Group (token, slot) pairs by expert so each expert's weights are read once per step.
  const int64_t E = int64_t(experts.size());
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(E));  // entries: token * k + slot
  for (int64_t i = 0; i < n * k; ++i) routed[size_t(ids[i])].push_back(i);
  std::fill(out, out + n * hidden, 0.0f);
  std::vector<float> xe, ye;
  for (int64_t e = 0; e < E; ++e) {
    const auto& entries = routed[size_t(e)];
    if (entries.empty()) continue;
    const int64_t m = int64_t(entries.size());
    xe.resize(static_cast<size_t>(m * hidden));
    ye.resize(static_cast<size_t>(m * hidden));
    for (int64_t r = 0; r < m; ++r)
      std::copy_n(x + (entries[size_t(r)] / k) * hidden, hidden, xe.data() + r * hidden);
    swiglu_mlp(pool, xe.data(), m, experts[size_t(e)], ye.data());
    // A token's contributions are added in ascending expert order whatever the batch is.
    for (int64_t r = 0; r < m; ++r) {
      const int64_t token = entries[size_t(r)] / k;
      const float w = weights[entries[size_t(r)]];
      float* o = out + token * hidden;
      const float* y = ye.data() + r * hidden;
      for (int64_t j = 0; j < hidden; ++j) o[j] += w * y[j];
    }
  }
}

}  // namespace spill::cpu
