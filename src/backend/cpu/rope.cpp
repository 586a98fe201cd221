#include <cmath>
#include <numbers>

#include "backend/cpu/ops.h"

namespace spill::cpu {

// Frequencies as transformers computes them (modeling_rope_utils.py), in float32 where it
// uses float32, so positions far out still agree with the reference.
RopeTable make_rope_table(const RopeSpec& rope, int64_t head_dim, bool interleaved) {
  RopeTable t;
  t.interleaved = interleaved;
  const int64_t half = head_dim / 2;
  t.inv_freq.resize(static_cast<size_t>(half));
  const float base = float(rope.theta);
  for (int64_t i = 0; i < half; ++i)
    t.inv_freq[size_t(i)] = 1.0f / std::pow(base, float(2 * i) / float(head_dim));
  switch (rope.kind) {
    case RopeKind::Default: break;
    case RopeKind::Linear:
      for (float& f : t.inv_freq) f = f / float(rope.factor);
      break;
    case RopeKind::Llama3: {
      const double old_len = double(rope.original_max_position);
      const double low_wavelen = old_len / rope.low_freq_factor, high_wavelen = old_len / rope.high_freq_factor;
      for (float& f : t.inv_freq) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen > low_wavelen) {
          f = float(f / rope.factor);
        } else if (wavelen >= high_wavelen) {  // medium band: interpolate
          const double smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
          f = float((1 - smooth) * f / rope.factor + smooth * f);
        }
      }
      break;
    }
    case RopeKind::Yarn: {
      const double dim = double(head_dim), base_d = rope.theta;
      auto correction_dim = [&](double rotations) {
        return dim * std::log(double(rope.original_max_position) / (rotations * 2 * std::numbers::pi)) /
               (2 * std::log(base_d));
      };
      double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
      if (rope.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1);
      if (low == high) high += 0.001;
      for (int64_t i = 0; i < half; ++i) {
        const float pos_freq = std::pow(base, float(2 * i) / float(head_dim));
        const float extrapolation = 1.0f / pos_freq;
        const float interpolation = 1.0f / (float(rope.factor) * pos_freq);
        float ramp = float((double(i) - low) / (high - low));
        ramp = std::min(1.0f, std::max(0.0f, ramp));
        const float extrapolation_factor = 1.0f - ramp;
        t.inv_freq[size_t(i)] =
            interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
      }
      t.attention_factor = float(rope.attention_factor);
      break;
    }
  }
  return t;
}

void apply_rope(const RopeTable& table, float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride,
                const int32_t* positions, int64_t offset) {
  const int64_t half = int64_t(table.inv_freq.size());
  std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float pos = float(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * table.inv_freq[size_t(i)];
      cos_v[size_t(i)] = std::cos(angle) * table.attention_factor;
      sin_v[size_t(i)] = std::sin(angle) * table.attention_factor;
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_stride + offset;
      // Pair i is (i, i + half), or (2i, 2i + 1) interleaved; both rotate by frequency i.
      const int64_t step = table.interleaved ? 2 : 1, partner = table.interleaved ? 1 : half;
      for (int64_t i = 0; i < half; ++i) {
        float* a = v + i * step;
        float* b = a + partner;
        const float x0 = *a, x1 = *b;
        *a = x0 * cos_v[size_t(i)] - x1 * sin_v[size_t(i)];
        *b = x1 * cos_v[size_t(i)] + x0 * sin_v[size_t(i)];
      }
    }
  }
}

}  // namespace spill::cpu
