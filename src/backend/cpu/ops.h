// CPU kernels, fp32 arithmetic over weights stored as F32, BF16, F16 or a ggml block format (src/quant).
// the CUDA kernels are tested against, so each computes every output element in an order that
// does not depend on the batch: a token's result is the same alone or in any batch.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "formats/model_spec.h"

namespace spill::cpu {

// ---- matmul.cpp --------------------------------------------------------------
// y[n, M] = x[n, K] * w[M, K]^T (+ bias[M]). Parallel over the rows of w.
void matmul(ThreadPool& pool, const float* x, int64_t n, const TensorView& w, float* y,
            const TensorView* bias = nullptr);
// Block-format weights with a faster int8 kernel (quant::prefer_dot_q8: Q8_0, Q4_K, Q5_K, Q6_K,
// Q4_0, Q5_0, IQ4_NL) take the int8-activation path by default: each token's x is rounded to 8 bits per block of 256 once per call and the
// rows are dotted with it in integer arithmetic (quant.h states the bound; it is what llama.cpp's
// CPU path computes). ActivationMode::F32 forces quant::dot with f32 activations for every
// format, the exact reference that the CUDA op tests and parity checks compare against. Either
// way a token's result does not depend on the batch. The default comes from the environment
// variable SPILL_CPU_ACTIVATIONS=f32|q8 (read once; anything else is an error at first use).
enum class ActivationMode : uint8_t { F32, Q8 };
ActivationMode activation_mode();
void set_activation_mode(ActivationMode mode);
// "f32" / "q8", and back (throws spill::Error naming the accepted values).
const char* activation_mode_name(ActivationMode mode);
ActivationMode parse_activation_mode(std::string_view name);
// Several matrices in one parallel loop (fewer hand-overs of the thread pool per decode step),
// each output exactly what matmul(pool, x, n, *w, y, bias) gives it: y[t, M] for the tokens that
// x[t] points at (their rows may be anywhere). Activations shared by several products (q/k/v of
// one hidden state; the gate and up of an expert) are rounded once when consecutive jobs point at
// the same tokens.
struct MatmulJob {
  const TensorView* w = nullptr;
  const float* const* x = nullptr;  // n pointers, one per token, each to w.cols() floats
  int64_t n = 0;
  float* y = nullptr;  // [n, w.rows()]
  const TensorView* bias = nullptr;
};
void matmul_jobs(ThreadPool& pool, std::span<const MatmulJob> jobs);
// Dot product of x[K] with row `row` of w, in the canonical accumulation order (f32 activations).
float dot_row(const float* x, const TensorView& w, int64_t row);
// Row `row` of w as floats.
void load_row(const TensorView& w, int64_t row, float* out);

// ---- norm.cpp ----------------------------------------------------------------
// out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight, for n rows of width dim.
// out may alias x.
void rmsnorm(const float* x, int64_t n, int64_t dim, const TensorView& weight, double eps, float* out);

// ---- rope.cpp ----------------------------------------------------------------
// Rotary position embedding as transformers applies it: rotate-half (NeoX) pairs (i, i + dims/2),
// or adjacent pairs (2i, 2i + 1) when interleaved (DeepSeek's rope_interleave; transformers
// de-interleaves first, which permutes the rotated dims but leaves every q.k the same).
struct RopeTable {
  std::vector<float> inv_freq;   // [rotary_dims / 2]
  float attention_factor = 1.0f; // scales cos and sin (YaRN)
  bool interleaved = false;
  int64_t dims() const { return 2 * int64_t(inv_freq.size()); }
};
// rotary_dims: the rotated dims per head (head_dim, or less with a partial rotary factor).
RopeTable make_rope_table(const RopeSpec& rope, int64_t rotary_dims, bool interleaved = false);
// x: [n_tokens, n_heads, head_stride]; rotates dims [offset, offset + table.dims()) of each head
// (the rest pass through). positions: [n_tokens].
void apply_rope(const RopeTable& table, float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride,
                const int32_t* positions, int64_t offset = 0);

// ---- attention.cpp -----------------------------------------------------------
// Paged KV: for each layer, K and V are [n_blocks][block_size][n_kv_heads][head_dim] floats.
struct PagedKv {
  float* k = nullptr;
  float* v = nullptr;
  int32_t block_size = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  float* k_at(int32_t block, int32_t slot) const { return k + (int64_t(block) * block_size + slot) * n_kv_heads * head_dim; }
  float* v_at(int32_t block, int32_t slot) const { return v + (int64_t(block) * block_size + slot) * n_kv_heads * head_dim; }
};

struct AttentionChunk {  // one sequence's tokens in this step (see model/batch.h SeqChunk)
  int32_t first_token, n_tokens, start_pos;
  std::span<const int32_t> block_table;
};

struct AttentionParams {
  float scale = 0.0f;            // softmax scale of q.k; 0: 1/sqrt(head_dim)
  int32_t window = 0;            // > 0: a query at position p sees positions (p - window, p] only
  const float* sinks = nullptr;  // [n_heads] or null: a logit per head that joins the softmax's
                                 // denominator and contributes no value (gpt-oss)
};

// Writes k, v ([n_tokens, kv_dim]) into their slots, then causal grouped-query attention of
// q ([n_tokens, n_heads, head_dim]) over each chunk's cached and new positions. out: [n_tokens, q_dim].
void paged_attention(ThreadPool& pool, const PagedKv& kv, std::span<const AttentionChunk> chunks, const float* q,
                     const float* k, const float* v, int64_t n_heads, float* out, const AttentionParams& params = {});

// ---- mla.cpp -----------------------------------------------------------------
// A paged cache of MLA latents: per layer [n_blocks][block_size][entry] floats, entry =
// kv_lora_rank (the normalised latent) + qk_rope_head_dim (the rotated rope key shared by all heads).
struct PagedLatentKv {
  float* data = nullptr;
  int32_t block_size = 0;
  int64_t entry = 0;
  float* at(int32_t block, int32_t slot) const { return data + (int64_t(block) * block_size + slot) * entry; }
};

struct MlaAttentionParams {
  int64_t n_heads = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  float scale = 0.0f;  // softmax scale (qk_head_dim^-0.5, times YaRN's mscale^2)
};

// Writes each token's latent ([n_tokens, kv_lora_rank + qk_rope_head_dim]) into its slot, then
// causal attention of q ([n_tokens, n_heads, nope + rope], rope part rotated) over each chunk's
// cached and new latents, with kv_b ([n_heads * (nope + v_head_dim), kv_lora_rank], each head's
// key rows then value rows) absorbed: scores against latents, one value up-projection per head.
// out: [n_tokens, n_heads * v_head_dim].
void mla_attention(ThreadPool& pool, const MlaAttentionParams& params, const PagedLatentKv& kv,
                   std::span<const AttentionChunk> chunks, const float* q, const float* latent, const TensorView& kv_b,
                   float* out);

// ---- moe.cpp -----------------------------------------------------------------
struct ExpertView {
  const TensorView* gate;  // [I, H]
  const TensorView* up;    // [I, H]
  const TensorView* down;  // [H, I]
  const TensorView* gate_bias = nullptr;  // [I] or null (gpt-oss)
  const TensorView* up_bias = nullptr;    // [I] or null
  const TensorView* down_bias = nullptr;  // [H] or null
};

struct ActivationParams {
  MlpActivation kind = MlpActivation::SwiGLU;
  float alpha = 1.702f, limit = 7.0f;  // ClampedSwiGLU
};

// Softmax over router logits [n, E], top-k per row (descending weight; ties to the lower id),
// optionally renormalised. ids/weights: [n, k].
void route_topk(const float* router_logits, int64_t n, int64_t n_experts, int64_t k, bool renormalise,
                int32_t* ids, float* weights);

// gpt-oss: the k largest logits per row (ties to the lower id), weights the softmax over those k.
void route_topk_softmax(const float* router_logits, int64_t n, int64_t n_experts, int64_t k, int32_t* ids,
                        float* weights);

struct SigmoidRouterParams {
  int64_t n_group = 1, topk_group = 1;
  bool renormalise = false;
  float routed_scaling_factor = 1.0f;
  const float* correction_bias = nullptr;  // [E] or null
};
// DeepSeek-V3 / GLM-4.x (noaux_tc): s = sigmoid(logit); the choice ranks s + correction_bias: the
// topk_group groups with the best sum of their two best, then the k best experts inside them (ties
// to the lower index). The weights are s of the chosen (the bias selects, it does not weight),
// renormalised (+1e-20) if asked, times routed_scaling_factor. Rows ordered by descending weight.
void route_sigmoid_grouped(const SigmoidRouterParams& params, const float* router_logits, int64_t n,
                           int64_t n_experts, int64_t k, int32_t* ids, float* weights);

// Each routed expert's output per (token, slot) pair, before its weight: for every pair q of the n
// tokens whose id is in [0, experts.size()) and, where `take` is given, has take[id] set,
// emit(q, y) with y = expert(x[q / k]) (H floats, valid during the call), experts in ascending
// order and an expert's pairs in pair order. Each expert runs once over the tokens routed to it
// (every active expert's gate and up in one loop of the pool, every down in one more), and each
// product is the matmul it would be alone, so a pair's y is the same in any batch.
void moe_expert_outputs(ThreadPool& pool, const float* x, int64_t n, int64_t hidden, int64_t k, const int32_t* ids,
                        std::span<const ExpertView> experts, const uint8_t* take,
                        const std::function<void(int64_t pair, const float* y)>& emit, const ActivationParams& act = {});

// out[t] = sum over the token's k experts of weight * expert(x[t]); experts run once each over
// the tokens routed to them. out: [n, H], overwritten.
void moe_experts(ThreadPool& pool, const float* x, int64_t n, int64_t hidden, int64_t k, const int32_t* ids,
                 const float* weights, std::span<const ExpertView> experts, float* out,
                 const ActivationParams& act = {});

// Gated MLP for all n rows: out = down(act(gate(x), up(x))) with the view's biases; act is
// silu(g) * u, or gpt-oss's clamped form (see MlpActivation).
void swiglu_mlp(ThreadPool& pool, const float* x, int64_t n, const ExpertView& mlp, float* out,
                const ActivationParams& act = {});

}  // namespace spill::cpu
