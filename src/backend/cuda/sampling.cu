// The CUDA sampler: see sampling.h. Every floating-point step that decides a token is written so
// that it rounds exactly as the CPU sampler's (explicit __f*_rn / fma, sampling_math.h).
#include "backend/cuda/sampling_kernel.h"

#include <cuda_runtime.h>

#include "sampling/sampling_math.h"

namespace spill::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr uint64_t kBelowMinP = uint64_t(1) << 63;  // flag in a mass word: min_p drops this token
constexpr float kNegInf = -__builtin_huge_valf();

// What a radix search counts per token.
enum class Weigh {
  kFiniteCount,  // 1 per candidate (score > -inf): top-k
  kRankedCount,  // 1 per non-NaN score: top logprobs
  kMass,         // the token's mass: top-p's cut
  kMassMinP,     // the mass, 0 when min_p drops it: the draw
};

struct BlockShared {
  unsigned long long hist[256];
  unsigned long long u64[kWarps];
  float f32[kWarps];
  int i32[kWarps];
  uint64_t result_key;
  int result_found;
  int top_count;
  uint64_t top_keys[kSampledRowTopMax];
};

__device__ unsigned long long block_sum_u64(unsigned long long v, BlockShared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.u64[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned long long total = 0;
  for (int w = 0; w < kWarps; ++w) total += sh.u64[w];
  return total;
}

__device__ double block_sum_f64(double v, BlockShared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  double* slot = reinterpret_cast<double*>(sh.u64);
  if ((threadIdx.x & 31) == 0) slot[threadIdx.x >> 5] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kWarps; ++w) total += slot[w];
  return total;
}

__device__ float block_max_f32(float v, BlockShared& sh) {  // NaN never wins
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.f32[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = kNegInf;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, sh.f32[w]);
  return m;
}

// The least likely token (largest-key-last) among those with weight > 0 and key >= key_floor whose
// weight before it, in key order, is <= threshold; the same function as select_by_mass in
// sampler.cpp. Returns its key; *found = 0 when no token has weight.
__device__ uint64_t block_select(const float* scores, const uint64_t* mass, int64_t vocab, Weigh weigh,
                                 uint64_t key_floor, uint64_t threshold, BlockShared& sh, int* found) {
  uint64_t prefix = 0, prefix_mask = 0, before = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) sh.hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float s = scores[i];
      uint64_t w;
      switch (weigh) {
        case Weigh::kFiniteCount: w = s > kNegInf ? 1 : 0; break;
        case Weigh::kRankedCount: w = s == s ? 1 : 0; break;
        case Weigh::kMass: w = mass[i] & ~kBelowMinP; break;
        default: w = (mass[i] & kBelowMinP) ? 0 : mass[i]; break;
      }
      if (w == 0) continue;
      const uint64_t key = sampling_key(s, int32_t(i));
      if (key < key_floor || (key & prefix_mask) != prefix) continue;
      atomicAdd(&sh.hist[(key >> shift) & 255], (unsigned long long)w);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l holds bins 255 - 8l .. 248 - 8l (most likely first); an exclusive scan over lanes
      // gives each bin's mass before it.
      const int lane = threadIdx.x;
      unsigned long long lane_sum = 0;
      for (int j = 0; j < 8; ++j) lane_sum += sh.hist[255 - 8 * lane - j];
      unsigned long long scan = lane_sum;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long up = __shfl_up_sync(0xffffffffu, scan, o);
        if (lane >= o) scan += up;
      }
      unsigned long long running = before + (scan - lane_sum);
      int best = -1;  // index in most-likely-first order, 0..255
      unsigned long long best_before = 0;
      for (int j = 0; j < 8; ++j) {
        const unsigned long long h = sh.hist[255 - 8 * lane - j];
        if (h == 0) continue;
        if (running <= threshold) {
          best = 8 * lane + j;
          best_before = running;
        }
        running += h;
      }
      const int winner = __reduce_max_sync(0xffffffffu, best);
      const unsigned long long winner_before = __shfl_sync(0xffffffffu, best_before, winner < 0 ? 0 : winner / 8);
      if (lane == 0) {
        if (winner < 0) {
          sh.result_found = 0;
        } else {
          sh.result_found = 1;
          sh.u64[0] = winner_before;
          sh.result_key = uint64_t(255 - winner);
        }
      }
    }
    __syncthreads();
    if (!sh.result_found) {
      *found = 0;
      __syncthreads();
      return 0;
    }
    before = sh.u64[0];
    prefix |= sh.result_key << shift;
    prefix_mask |= uint64_t(255) << shift;
    __syncthreads();
  }
  *found = 1;
  return prefix;
}

// Greedy: the first (lowest id) maximum; NaN and -inf never win; -1 when nothing is finite.
__device__ int32_t block_argmax(const float* scores, int64_t vocab, BlockShared& sh) {
  float best = kNegInf;
  int32_t best_id = -1;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float s = scores[i];
    if (s > best) {
      best = s;
      best_id = int32_t(i);
    }
  }
  auto better = [](float a, int32_t ia, float b, int32_t ib) {
    if (ib < 0) return true;
    if (ia < 0) return false;
    return a > b || (a == b && ia < ib);
  };
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, best_id, o);
    if (!better(best, best_id, ob, oi)) {
      best = ob;
      best_id = oi;
    }
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    sh.f32[threadIdx.x >> 5] = best;
    sh.i32[threadIdx.x >> 5] = best_id;
  }
  __syncthreads();
  float b = kNegInf;
  int32_t bi = -1;
  for (int w = 0; w < kWarps; ++w)
    if (!better(b, bi, sh.f32[w], sh.i32[w])) {
      b = sh.f32[w];
      bi = sh.i32[w];
    }
  return bi;
}

__device__ float penalised(float s, const SamplingRowParams& p, int32_t count) {
  if (p.repetition_penalty != 1.0f) s = s > 0.0f ? __fdiv_rn(s, p.repetition_penalty) : __fmul_rn(s, p.repetition_penalty);
  if ((p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && count > 0)
    s = __fsub_rn(s, sampling_count_penalty(p.presence_penalty, p.frequency_penalty, count));
  return s;
}


__global__ void __launch_bounds__(kThreads) sample_rows_kernel(SampleRowsArgs a) {
  __shared__ BlockShared sh;
  const int64_t row = blockIdx.x, vocab = a.vocab;
  const SamplingRowParams p = a.params[row];
  const float* logits = a.logits + row * vocab;
  float* scores = a.scores + row * vocab;
  uint64_t* mass = a.mass + row * vocab;
  const SamplingPenaltyEntry* pen = a.penalties + p.penalty_offset;
  const bool greedy = p.temperature == 0.0f;
  const bool penalties = p.penalty_count > 0 &&
                         (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
  int32_t token = -1;

  // Scores: penalised, then scaled by 1 / temperature (sampled rows), in the CPU's order.
  const float inv_t = greedy ? 1.0f : __fdiv_rn(1.0f, p.temperature);
  const float* picked_from = logits;
  if (penalties || !greedy) {
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) scores[i] = greedy ? logits[i] : __fmul_rn(logits[i], inv_t);
    __syncthreads();
    // Each token occurs once in the list, so no two threads write the same score.
    for (int j = threadIdx.x; j < p.penalty_count; j += kThreads) {
      const int32_t t = pen[j].token;
      if (t < 0 || t >= vocab) continue;
      const float s = penalised(logits[t], p, pen[j].output_count);
      scores[t] = greedy ? s : __fmul_rn(s, inv_t);
    }
    __syncthreads();
    picked_from = scores;
  }

  if (greedy) {
    token = block_argmax(picked_from, vocab, sh);
  } else {
    float m = kNegInf;
    unsigned long long n_cand = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float s = scores[i];
      if (s > kNegInf) {
        m = fmaxf(m, s);
        ++n_cand;
      }
    }
    const float max_score = block_max_f32(m, sh);
    n_cand = block_sum_u64(n_cand, sh);
    if (n_cand > 0) {
      const double floor = double(p.min_p);
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        const float s = scores[i];
        uint64_t q = 0;
        if (s > kNegInf) {
          const double w = sampling_weight(s, max_score);
          q = sampling_mass(w);
          if (q > 0 && p.min_p > 0.0f && w < floor) q |= kBelowMinP;
        }
        mass[i] = q;
      }
      __syncthreads();
      int found = 1;
      uint64_t key_floor = 0;
      if (p.top_k > 0 && uint64_t(p.top_k) < n_cand)
        key_floor = block_select(scores, mass, vocab, Weigh::kFiniteCount, 0, uint64_t(p.top_k) - 1, sh, &found);
      if (p.top_p < 1.0f) {
        unsigned long long total = 0;
        for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
          const float s = scores[i];
          if (s > kNegInf && sampling_key(s, int32_t(i)) >= key_floor) total += mass[i] & ~kBelowMinP;
        }
        total = block_sum_u64(total, sh);
        key_floor = block_select(scores, mass, vocab, Weigh::kMass, key_floor, sampling_top_p_limit(p.top_p, total) - 1,
                                 sh, &found);
      }
      unsigned long long total = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        const float s = scores[i];
        const uint64_t q = mass[i];
        if (s > kNegInf && !(q & kBelowMinP) && sampling_key(s, int32_t(i)) >= key_floor) total += q;
      }
      total = block_sum_u64(total, sh);
      const uint64_t key = block_select(scores, mass, vocab, Weigh::kMassMinP, key_floor,
                                        sampling_target(p.seed, p.token_index, total), sh, &found);
      if (found) token = sampling_key_token(key);
    }
  }

  GpuSampledToken* out = a.out + row;
  if (threadIdx.x == 0) {
    out->token = token;
    out->top_count = 0;
  }
  if (!p.logprobs || token < 0) return;
  // Logprobs of the raw logits: log-softmax in double (the CPU's arithmetic up to the order of the sum).
  float m = kNegInf;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, logits[i]);
  const float max_logit = block_max_f32(m, sh);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = logits[i];
    if (v > kNegInf) sum += exp(double(v) - double(max_logit));
  }
  sum = block_sum_f64(sum, sh);
  const double log_z = double(max_logit) + log(sum);
  auto logprob_of = [&](int32_t t) {
    const float v = logits[t];
    return v != v ? kNegInf : float(double(v) - log_z);
  };
  if (threadIdx.x == 0) out->logprob = logprob_of(token);
  const int n = p.top_logprobs;
  if (n <= 0) return;
  int found = 0;
  const uint64_t least = block_select(logits, nullptr, vocab, Weigh::kRankedCount, 0, uint64_t(n) - 1, sh, &found);
  if (threadIdx.x == 0) sh.top_count = 0;
  __syncthreads();
  if (found) {
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const float v = logits[i];
      if (v != v) continue;
      const uint64_t key = sampling_key(v, int32_t(i));
      if (key >= least) {
        const int slot = atomicAdd(&sh.top_count, 1);
        if (slot < kSampledRowTopMax) sh.top_keys[slot] = key;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int count = min(sh.top_count, n);
    for (int i = 1; i < count; ++i)  // insertion sort, most likely first
      for (int j = i; j > 0 && sh.top_keys[j] > sh.top_keys[j - 1]; --j) {
        const uint64_t k = sh.top_keys[j];
        sh.top_keys[j] = sh.top_keys[j - 1];
        sh.top_keys[j - 1] = k;
      }
    for (int i = 0; i < count; ++i) {
      const int32_t t = sampling_key_token(sh.top_keys[i]);
      out->top_tokens[i] = t;
      out->top_logprobs[i] = logprob_of(t);
    }
    out->top_count = count;
  }
}

}  // namespace

void launch_sample_rows(const SampleRowsArgs& args, int32_t rows, cudaStream_t stream) {
  sample_rows_kernel<<<rows, kThreads, 0, stream>>>(args);
}

}  // namespace spill::cuda
