// Quantization quality over a text: perplexity, and against a reference model (the BF16
// original) the KL divergence of each next-token distribution and how often the top token is the
// same, the way llama.cpp's llama-perplexity --kl-divergence reports them:
//   * the tokens are cut into windows of ctx tokens (by default back to back, as its chunks are);
//     with a BOS, each window's first token is replaced by it;
//   * in each window only the predictions of the second half are scored: the logits at positions
//     ctx/2 .. ctx-2, each predicting the token after it (ctx - 1 - ctx/2 per window), so every
//     scored token has at least ctx/2 tokens of context;
//   * PPL = exp(mean NLL); KLD(ref || model) = sum_v p_ref(v) (log p_ref(v) - log p_model(v));
//     the 99th percentile interpolates linearly between sorted values, as its percentile() does;
//     top-1 agreement: the argmax of both logit rows is the same token.
// Differences from llama-perplexity, all of them in its approximations: it stores the
// reference's log-probabilities in 16 bits and leaves out tokens with p_ref < e^-16 from the KLD
// sum; spill keeps every term in double precision.
//
// Both models run through ModelRunner::forward with all_logits, the path serving uses.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "model/runner.h"

namespace spill {

struct EvalOptions {
  int32_t ctx = 512;      // tokens per window
  // Window starts every stride tokens; 0: ctx (back to back). With stride < ctx-1-ctx/2 windows
  // overlap and each scores only its last `stride` predictions (positions ctx-1-stride .. ctx-2),
  // so no token is scored twice and every one has ctx-1-stride tokens of context or more.
  int32_t stride = 0;
  int32_t bos_token = -1;  // >= 0: each window starts with it (the model's tokenizer adds a BOS)
};

struct EvalResult {
  int64_t n_windows = 0, n_scored = 0;
  double ppl = 0, ppl_unc = 0;  // exp(mean NLL) and its uncertainty (as llama-perplexity computes it)
  bool has_reference = false;
  double ref_ppl = 0, ref_ppl_unc = 0;
  double kld_mean = 0, kld_unc = 0, kld_median = 0, kld_p99 = 0, kld_max = 0;
  double top1 = 0, top1_unc = 0;  // fraction of scored tokens whose top token agrees
};

// One scored prediction: logits of the model (and of the reference, or nullptr) at a position,
// and the token that follows.
struct TokenScore {
  double nll = 0;   // -log p_model(target)
  double ref_nll = 0;
  double kld = 0;   // KL(ref || model); 0 without a reference
  bool same_top = false;
};
TokenScore score_token(const float* logits, const float* ref_logits, int64_t vocab, int32_t target);

// The window starts of a text of n_tokens (only whole windows, as llama-perplexity's chunks).
std::vector<int64_t> eval_window_starts(int64_t n_tokens, const EvalOptions& options);

// Runs model (and reference, when given: same vocabulary) over every window and scores them.
// Each runner needs KV room for one window (ceil(ctx / block_size) blocks).
EvalResult evaluate(ModelRunner& model, ModelRunner* reference, std::span<const int32_t> tokens,
                    const EvalOptions& options);

// Summary statistics from per-token scores (exposed for tests).
EvalResult summarize_scores(const std::vector<TokenScore>& scores, bool has_reference);

// Linear interpolation between sorted values at fraction (0..1), as llama-perplexity's percentile.
double sorted_percentile(const std::vector<double>& sorted, double fraction);

}  // namespace spill
