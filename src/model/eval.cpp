#include "model/eval.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace spill {

namespace {

// log sum exp of a logit row, in double, and its argmax (first of equals, as llama-perplexity).
std::pair<double, int64_t> log_sum_exp(const float* logits, int64_t vocab) {
  int64_t imax = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[imax]) imax = i;
  const double m = logits[imax];
  double s = 0;
  for (int64_t i = 0; i < vocab; ++i) s += std::exp(double(logits[i]) - m);
  return {m + std::log(s), imax};
}

// The first scored position of every window (see EvalOptions::stride).
int32_t first_scored(const EvalOptions& o) {
  const int32_t stride = o.stride > 0 ? o.stride : o.ctx;
  return std::max(o.ctx / 2, o.ctx - 1 - stride);
}

// Mean and its standard error, as llama-perplexity's mean_and_uncertainty.
std::pair<double, double> mean_unc(double sum, double sum2, int64_t n) {
  if (n < 1) return {0, 0};
  const double f = sum / double(n);
  const double var = sum2 / double(n) - f * f;
  return {f, var > 0 && n > 10 ? std::sqrt(var / double(n - 1)) : 0.0};
}

}  // namespace

TokenScore score_token(const float* logits, const float* ref_logits, int64_t vocab, int32_t target) {
  TokenScore s;
  const auto [lse, top] = log_sum_exp(logits, vocab);
  s.nll = lse - double(logits[target]);
  if (!ref_logits) return s;
  const auto [ref_lse, ref_top] = log_sum_exp(ref_logits, vocab);
  s.ref_nll = ref_lse - double(ref_logits[target]);
  double kld = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double log_p_ref = double(ref_logits[i]) - ref_lse;
    const double log_p = double(logits[i]) - lse;
    kld += std::exp(log_p_ref) * (log_p_ref - log_p);
  }
  s.kld = kld;
  s.same_top = top == ref_top;
  return s;
}

std::vector<int64_t> eval_window_starts(int64_t n_tokens, const EvalOptions& o) {
  if (o.ctx < 4) fail("--ctx must be at least 4 tokens, got {}", o.ctx);
  if (o.stride < 0 || o.stride > o.ctx)
    fail("--stride must be between 1 and --ctx ({}), got {}", o.ctx, o.stride);
  const int64_t stride = o.stride > 0 ? o.stride : o.ctx;
  std::vector<int64_t> starts;
  for (int64_t s = 0; s + o.ctx <= n_tokens; s += stride) starts.push_back(s);
  return starts;
}

double sorted_percentile(const std::vector<double>& v, double fraction) {
  if (v.empty()) return 0;
  if (fraction <= 0) return v.front();
  if (fraction >= 1) return v.back();
  const double p = fraction * double(v.size() - 1);
  const size_t ip = size_t(p);
  const double frac = p - double(ip);
  return (1 - frac) * v[ip] + frac * v[std::min(ip + 1, v.size() - 1)];
}

EvalResult summarize_scores(const std::vector<TokenScore>& scores, bool has_reference) {
  EvalResult r;
  r.has_reference = has_reference;
  r.n_scored = int64_t(scores.size());
  double nll = 0, nll2 = 0, ref = 0, ref2 = 0, kld = 0, kld2 = 0;
  int64_t same = 0;
  std::vector<double> klds;
  for (const TokenScore& s : scores) {
    nll += s.nll, nll2 += s.nll * s.nll;
    ref += s.ref_nll, ref2 += s.ref_nll * s.ref_nll;
    kld += s.kld, kld2 += s.kld * s.kld;
    same += s.same_top;
    klds.push_back(s.kld);
  }
  const int64_t n = r.n_scored;
  auto [log_ppl, log_ppl_unc] = mean_unc(nll, nll2, n);
  r.ppl = std::exp(log_ppl);
  r.ppl_unc = r.ppl * log_ppl_unc;
  if (!has_reference) return r;
  auto [log_ref, log_ref_unc] = mean_unc(ref, ref2, n);
  r.ref_ppl = std::exp(log_ref);
  r.ref_ppl_unc = r.ref_ppl * log_ref_unc;
  std::tie(r.kld_mean, r.kld_unc) = mean_unc(kld, kld2, n);
  std::sort(klds.begin(), klds.end());
  if (!klds.empty()) {
    const size_t m = klds.size();
    r.kld_median = m % 2 == 0 ? 0.5 * (klds[m / 2] + klds[m / 2 - 1]) : klds[m / 2];
    r.kld_max = klds.back();
  }
  r.kld_p99 = sorted_percentile(klds, 0.99);
  r.top1 = n ? double(same) / double(n) : 0;
  r.top1_unc = n > 1 ? std::sqrt(r.top1 * (1 - r.top1) / double(n - 1)) : 0;
  return r;
}

EvalResult evaluate(ModelRunner& model, ModelRunner* reference, std::span<const int32_t> tokens,
                    const EvalOptions& options) {
  const int64_t vocab = model.spec().vocab_size;
  if (reference && reference->spec().vocab_size != vocab)
    fail("--reference has a vocabulary of {} tokens, the model {}: they cannot be compared token by token",
         reference->spec().vocab_size, vocab);
  if (options.ctx > model.spec().max_position_embeddings)
    fail("--ctx {} is longer than the model's context of {} tokens", options.ctx, model.spec().max_position_embeddings);
  const std::vector<int64_t> starts = eval_window_starts(int64_t(tokens.size()), options);
  if (starts.empty())
    fail("the text is {} tokens, shorter than one window of --ctx {}; give more text or a smaller --ctx",
         tokens.size(), options.ctx);
  const int32_t first = first_scored(options);
  for (ModelRunner* r : {&model, reference}) {
    if (!r) continue;
    const KvCacheConfig& kv = r->kv_config();
    const int64_t window_blocks = (options.ctx + kv.block_size - 1) / kv.block_size;
    if (kv.n_blocks < hand_built_pool_blocks(r->spec(), window_blocks))
      fail("internal: the runner's KV cache has {} blocks, a window needs {}", kv.n_blocks,
           hand_built_pool_blocks(r->spec(), window_blocks));
  }
  auto run = [&](ModelRunner& r, std::span<const int32_t> window, std::vector<float>& logits) {
    const HandBuiltTables tables =
        hand_built_tables(r.spec(), (options.ctx + r.kv_config().block_size - 1) / r.kv_config().block_size);
    ForwardBatch batch;
    batch.tokens.assign(window.begin(), window.end());
    batch.seqs.push_back({.first_token = 0, .n_tokens = int32_t(window.size()), .start_pos = 0,
                          .block_table = tables.tables[0], .want_logits = true});
    tables.attach(batch.seqs.back());
    batch.all_logits = true;
    r.forward(batch, logits);
  };
  std::vector<TokenScore> scores;
  std::vector<float> logits, ref_logits;
  std::vector<int32_t> window(size_t(options.ctx));
  for (int64_t s : starts) {
    std::copy_n(tokens.begin() + s, options.ctx, window.begin());
    if (options.bos_token >= 0) window[0] = options.bos_token;
    run(model, window, logits);
    if (reference) run(*reference, window, ref_logits);
    for (int32_t p = first; p < options.ctx - 1; ++p)
      scores.push_back(score_token(logits.data() + size_t(p) * size_t(vocab),
                                   reference ? ref_logits.data() + size_t(p) * size_t(vocab) : nullptr, vocab,
                                   tokens[size_t(s + p + 1)]));
  }
  EvalResult r = summarize_scores(scores, reference != nullptr);
  r.n_windows = int64_t(starts.size());
  return r;
}

}  // namespace spill
