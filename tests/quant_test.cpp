// The block-format dequantizers against llama.cpp's: fixtures made by gguf-py's numpy port of
// ggml-quants.c (tools/fixtures/make_quant_fixtures.py) on random blocks, compared bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/npy.h"
#include "quant/quant.h"

namespace {

using spill::DType;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

class DequantizeFixture : public ::testing::TestWithParam<DType> {};

TEST_P(DequantizeFixture, BitExactAgainstGgufPy) {
  const DType t = GetParam();
  const std::string base = std::string(SPILL_TEST_DATA) + "/quant/" + lower(spill::dtype_name(t));
  const std::vector<uint8_t> blocks = read_bytes(base + ".bin");
  const spill::NpyArray expected = spill::read_npy_f32(base + ".npy");
  const int64_t n = int64_t(expected.data.size());
  ASSERT_EQ(int64_t(blocks.size()), spill::row_bytes(t, n)) << "fixture sizes disagree";
  std::vector<float> got(size_t(n), -1.0f);
  spill::quant::dequantize_row(t, blocks.data(), got.data(), n);
  int mismatches = 0;
  for (int64_t i = 0; i < n && mismatches < 5; ++i) {
    if (bits_of(got[size_t(i)]) != bits_of(expected.data[size_t(i)])) {
      ADD_FAILURE() << spill::dtype_name(t) << " weight " << i << " (block " << i / spill::dtype_block_elems(t)
                    << "): spill " << got[size_t(i)] << ", gguf-py " << expected.data[size_t(i)];
      ++mismatches;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantizeFixture,
                         ::testing::Values(DType::F16, DType::BF16, DType::Q8_0, DType::Q6_K, DType::Q5_K,
                                           DType::Q4_K, DType::Q3_K, DType::Q2_K, DType::IQ4_XS, DType::MXFP4),
                         [](const auto& info) { return std::string(spill::dtype_name(info.param)); });

TEST(Dequantize, RejectsPartialBlocks) {
  std::vector<uint8_t> bytes(1024);
  std::vector<float> out(300);
  EXPECT_THROW(spill::quant::dequantize_row(DType::Q4_K, bytes.data(), out.data(), 300), spill::Error);
  EXPECT_THROW(spill::quant::dequantize_row(DType::Q8_0, bytes.data(), out.data(), 33), spill::Error);
}

}  // namespace
