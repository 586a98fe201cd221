// spill's quantizers against ggml's on the same data: quantize -> dequantize error per type, for
// Gaussian and heavy-tailed (Student-t, 3 degrees of freedom) weights, without and with an
// importance row. Without importance the error is the plain RMSE and ggml runs its
// quantize_row_*_ref path; with importance both minimise the importance-weighted error and ggml
// runs its imatrix path (quantize_q*_K(..., quant_weights) through ggml_quantize_chunk), and the
// weighted RMSE sqrt(sum imp (x - x')^2 / sum imp) is reported. Also checks, on every block
// either quantizer wrote, that spill's dequantizer gives ggml's bits.
//
// Links ggml from a llama.cpp build; tools/bench/build_quant_rmse.sh builds it.
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "ggml.h"
#include "quant/quant.h"

namespace {

using spill::DType;

struct Case {
  DType type;
  ggml_type gtype;
};
const Case kCases[] = {
    {DType::Q8_0, GGML_TYPE_Q8_0}, {DType::Q6_K, GGML_TYPE_Q6_K},     {DType::Q5_K, GGML_TYPE_Q5_K},
    {DType::Q4_K, GGML_TYPE_Q4_K}, {DType::Q3_K, GGML_TYPE_Q3_K},     {DType::Q2_K, GGML_TYPE_Q2_K},
    {DType::IQ4_XS, GGML_TYPE_IQ4_XS}, {DType::MXFP4, GGML_TYPE_MXFP4},
    {DType::Q4_0, GGML_TYPE_Q4_0},     {DType::Q4_1, GGML_TYPE_Q4_1},     {DType::Q5_0, GGML_TYPE_Q5_0},
    {DType::Q5_1, GGML_TYPE_Q5_1},     {DType::IQ4_NL, GGML_TYPE_IQ4_NL},
};

// Whether `name` is one of the comma-separated names of `list` (every name when list is empty).
bool selected(std::string_view list, std::string_view name) {
  if (list.empty()) return true;
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    if (list.substr(at, end - at) == name) return true;
    at = end + 1;
  }
  return false;
}

double weighted_rmse(const std::vector<float>& x, const std::vector<float>& y, const float* imp, int64_t cols) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = imp ? imp[i % size_t(cols)] : 1.0;
    const double d = double(x[i]) - double(y[i]);
    num += w * d * d;
    den += w;
  }
  return std::sqrt(num / den);
}

// CPU time of this thread: the machines these run on are shared, and wall time counts the others.
double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 64, cols = 4096;
  // argv[2], optional: the types to run, comma-separated as spill names them ("Q4_0,IQ4_NL").
  const std::string only = argc > 2 ? argv[2] : "";
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::student_t_distribution<float> heavy(3.0f);
  std::vector<float> gaussian(size_t(rows * cols)), tailed(size_t(rows * cols)), imp(static_cast<size_t>(cols));
  for (float& v : gaussian) v = 0.02f * normal(rng);
  for (float& v : tailed) v = 0.02f * heavy(rng);
  // Importance as an imatrix holds it (mean squared activation per input column): log-normal,
  // a few columns hundreds of times hotter than the median.
  for (float& v : imp) v = std::exp(1.5f * normal(rng));

  std::printf("| type | weights | importance | spill RMSE | ggml RMSE | spill / ggml | spill us/256 weights | ggml us/256 weights | dequant bit-exact |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  bool all_exact = true, all_no_worse = true;
  for (const Case& c : kCases) {
    if (!selected(only, spill::dtype_name(c.type))) continue;
    const size_t row_bytes = size_t(spill::row_bytes(c.type, cols));
    for (int data = 0; data < 2; ++data) {
      const std::vector<float>& x = data ? tailed : gaussian;
      for (int with_imp = 0; with_imp < 2; ++with_imp) {
        const float* im = with_imp ? imp.data() : nullptr;
        std::vector<uint8_t> qs(row_bytes * size_t(rows)), qg(row_bytes * size_t(rows));
        const double t0 = cpu_seconds();
        for (int64_t r = 0; r < rows; ++r)
          spill::quant::quantize_row(c.type, x.data() + r * cols, qs.data() + size_t(r) * row_bytes, cols, im);
        const double t1 = cpu_seconds();
        ggml_quantize_chunk(c.gtype, x.data(), qg.data(), 0, rows, cols, im);
        const double t2 = cpu_seconds();
        std::vector<float> ys(x.size()), yg(x.size()), ys_g(x.size()), yg_g(x.size());
        const ggml_type_traits* tr = ggml_get_type_traits(c.gtype);
        for (int64_t r = 0; r < rows; ++r) {
          spill::quant::dequantize_row(c.type, qs.data() + size_t(r) * row_bytes, ys.data() + r * cols, cols);
          spill::quant::dequantize_row(c.type, qg.data() + size_t(r) * row_bytes, yg.data() + r * cols, cols);
          tr->to_float(qs.data() + size_t(r) * row_bytes, ys_g.data() + r * cols, cols);
          tr->to_float(qg.data() + size_t(r) * row_bytes, yg_g.data() + r * cols, cols);
        }
        const bool exact = same_bits(ys, ys_g) && same_bits(yg, yg_g);
        all_exact &= exact;
        const double es = weighted_rmse(x, ys, im, cols), eg = weighted_rmse(x, yg, im, cols);
        all_no_worse &= es <= eg;
        const double blocks_rows = double(rows) * double(cols) / 256.0;
        std::printf("| %s | %s | %s | %.5e | %.5e | %.4f | %.1f | %.1f | %s |\n",
                    std::string(spill::dtype_name(c.type)).c_str(), data ? "student-t(3)" : "gaussian",
                    with_imp ? "log-normal" : "none", es, eg, es / eg,
                    1e6 * (t1 - t0) / blocks_rows, 1e6 * (t2 - t1) / blocks_rows, exact ? "yes" : "NO");
      }
    }
  }
  std::printf("\n%d x %lld weights per case (scale 0.02); quantize times: CPU microseconds per 256 weights, one thread.\n", int(rows),
              (long long)cols);
  std::printf("spill no worse than ggml everywhere: %s; dequantizers bit-exact with ggml's: %s\n",
              all_no_worse ? "yes" : "NO", all_exact ? "yes" : "NO");
  return all_exact && all_no_worse ? 0 : 1;
}
