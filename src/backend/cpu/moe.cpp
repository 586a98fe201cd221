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

void route_topk_softmax(const float* router_logits, int64_t n, int64_t n_experts, int64_t k, int32_t* ids,
                        float* weights) {
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  for (int64_t t = 0; t < n; ++t) {
    const float* logits = router_logits + t * n_experts;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    const float max_logit = logits[order[0]];
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += weights[t * k + j] = std::exp(logits[order[size_t(j)]] - max_logit);
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[size_t(j)];
      weights[t * k + j] /= sum;
    }
  }
}

void route_sigmoid_grouped(const SigmoidRouterParams& p, const float* router_logits, int64_t n, int64_t n_experts,
                           int64_t k, int32_t* ids, float* weights) {
  const int64_t G = p.n_group, per_group = n_experts / G;
  std::vector<float> score(static_cast<size_t>(n_experts)), choice(static_cast<size_t>(n_experts));
  std::vector<float> group_score(static_cast<size_t>(G));
  std::vector<int32_t> groups(static_cast<size_t>(G)), order(static_cast<size_t>(n_experts));
  std::vector<bool> allowed(static_cast<size_t>(n_experts));
  auto before = [](const std::vector<float>& v) {
    return [&v](int32_t a, int32_t b) { return v[size_t(a)] > v[size_t(b)] || (v[size_t(a)] == v[size_t(b)] && a < b); };
  };
  for (int64_t t = 0; t < n; ++t) {
    const float* logits = router_logits + t * n_experts;
    for (int64_t e = 0; e < n_experts; ++e) {
      score[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[e]));
      choice[size_t(e)] = score[size_t(e)] + (p.correction_bias ? p.correction_bias[e] : 0.0f);
    }
    // Groups: each scored by the sum of its two best choice values; the topk_group best compete.
    std::fill(allowed.begin(), allowed.end(), G == 1);
    if (G > 1) {
      for (int64_t g = 0; g < G; ++g) {
        float best = -INFINITY, second = -INFINITY;
        for (int64_t e = g * per_group; e < (g + 1) * per_group; ++e) {
          const float c = choice[size_t(e)];
          if (c > best) {
            second = best;
            best = c;
          } else if (c > second) {
            second = c;
          }
        }
        group_score[size_t(g)] = best + second;
      }
      std::iota(groups.begin(), groups.end(), 0);
      std::partial_sort(groups.begin(), groups.begin() + p.topk_group, groups.end(), before(group_score));
      for (int64_t j = 0; j < p.topk_group; ++j)
        for (int64_t e = groups[size_t(j)] * per_group; e < (groups[size_t(j)] + 1) * per_group; ++e)
          allowed[size_t(e)] = true;
    }
    // Experts outside the chosen groups cannot be picked (DeepSeek's reference masks them with
    // -inf; transformers' 0.0 agrees unless a chosen-group expert's score + bias is negative).
    int64_t n_allowed = 0;
    for (int64_t e = 0; e < n_experts; ++e)
      if (allowed[size_t(e)]) order[size_t(n_allowed++)] = int32_t(e);
    std::partial_sort(order.begin(), order.begin() + k, order.begin() + n_allowed, before(choice));
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += score[size_t(order[size_t(j)])];
    const float norm = p.renormalise ? sum + 1e-20f : 1.0f;
    // Output by descending weight (the observer's contract), ties to the lower id.
    std::sort(order.begin(), order.begin() + k, before(score));
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[size_t(j)];
      weights[t * k + j] = score[size_t(order[size_t(j)])] / norm * p.routed_scaling_factor;
    }
  }
}

static inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

namespace {

// gate[i] = act(gate[i], up[i]) in place, the expert activation of swiglu_mlp and moe_experts.
void activate(const ActivationParams& act, float* gate, const float* up, size_t count) {
  if (act.kind == MlpActivation::ClampedSwiGLU) {
    for (size_t i = 0; i < count; ++i) {
      const float g = std::min(gate[i], act.limit), u = std::clamp(up[i], -act.limit, act.limit);
      gate[i] = (u + 1.0f) * (g / (1.0f + std::exp(-act.alpha * g)));
    }
  } else {
    for (size_t i = 0; i < count; ++i) gate[i] = silu(gate[i]) * up[i];
  }
}

}  // namespace

void swiglu_mlp(ThreadPool& pool, const float* x, int64_t n, const ExpertView& mlp, float* out,
                const ActivationParams& act) {
  const int64_t I = mlp.gate->rows(), H = mlp.gate->cols();
  std::vector<float> gate(static_cast<size_t>(n * I)), up(static_cast<size_t>(n * I));
  std::vector<const float*> rows(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) rows[size_t(t)] = x + t * H;
  // Gate and up in one loop of the pool, over one rounding of x (matmul_jobs).
  const MatmulJob gate_up[2] = {{mlp.gate, rows.data(), n, gate.data(), mlp.gate_bias},
                                {mlp.up, rows.data(), n, up.data(), mlp.up_bias}};
  matmul_jobs(pool, gate_up);
  activate(act, gate.data(), up.data(), gate.size());
  matmul(pool, gate.data(), n, *mlp.down, out, mlp.down_bias);
}

void moe_expert_outputs(ThreadPool& pool, const float* x, int64_t n, int64_t hidden, int64_t k, const int32_t* ids,
                        std::span<const ExpertView> experts, const uint8_t* take,
                        const std::function<void(int64_t, const float*)>& emit, const ActivationParams& act) {
  // Group (token, slot) pairs by expert so each expert's weights are read once per step.
  const int64_t E = int64_t(experts.size());
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(E));  // entries: token * k + slot
  for (int64_t i = 0; i < n * k; ++i)
    if (ids[i] >= 0 && ids[i] < E && (!take || take[ids[i]])) routed[size_t(ids[i])].push_back(i);
  // Every chosen expert's gate and up in one loop of the pool, then every down in one more: each
  // product is the matmul it would be alone (matmul_jobs), so a token's result is the same in any
  // batch, and a decode step hands the pool two loops instead of three per expert.
  struct Active {
    int64_t expert;
    std::vector<const float*> x, hidden_rows;  // the tokens' inputs; their activated gate rows
    std::vector<float> gate, up, y;
  };
  std::vector<Active> active;
  for (int64_t e = 0; e < E; ++e) {
    const auto& entries = routed[size_t(e)];
    if (entries.empty()) continue;
    const int64_t m = int64_t(entries.size()), I = experts[size_t(e)].gate->rows();
    Active a{.expert = e, .x = {}, .hidden_rows = {}, .gate = std::vector<float>(size_t(m * I)),
             .up = std::vector<float>(size_t(m * I)), .y = std::vector<float>(size_t(m * hidden))};
    for (int64_t r = 0; r < m; ++r) a.x.push_back(x + (entries[size_t(r)] / k) * hidden);
    for (int64_t r = 0; r < m; ++r) a.hidden_rows.push_back(a.gate.data() + r * I);
    active.push_back(std::move(a));
  }
  std::vector<MatmulJob> jobs;
  for (Active& a : active) {
    const ExpertView& ev = experts[size_t(a.expert)];
    const int64_t m = int64_t(a.x.size());
    jobs.push_back({ev.gate, a.x.data(), m, a.gate.data(), ev.gate_bias});
    jobs.push_back({ev.up, a.x.data(), m, a.up.data(), ev.up_bias});
  }
  matmul_jobs(pool, jobs);
  jobs.clear();
  for (Active& a : active) {
    const ExpertView& ev = experts[size_t(a.expert)];
    activate(act, a.gate.data(), a.up.data(), a.gate.size());
    jobs.push_back({ev.down, a.hidden_rows.data(), int64_t(a.x.size()), a.y.data(), ev.down_bias});
  }
  matmul_jobs(pool, jobs);
  for (const Active& a : active) {
    const auto& entries = routed[size_t(a.expert)];
    for (size_t r = 0; r < entries.size(); ++r) emit(entries[r], a.y.data() + r * size_t(hidden));
  }
}

void moe_experts(ThreadPool& pool, const float* x, int64_t n, int64_t hidden, int64_t k, const int32_t* ids,
                 const float* weights, std::span<const ExpertView> experts, float* out, const ActivationParams& act) {
  std::fill(out, out + n * hidden, 0.0f);
  // A token's contributions are added in ascending expert order whatever the batch is.
  moe_expert_outputs(pool, x, n, hidden, k, ids, experts, nullptr,
                     [&](int64_t pair, const float* y) {
                       const float w = weights[pair];
                       float* o = out + (pair / k) * hidden;
                       for (int64_t j = 0; j < hidden; ++j) o[j] += w * y[j];
                     },
                     act);
}

}  // namespace spill::cpu
