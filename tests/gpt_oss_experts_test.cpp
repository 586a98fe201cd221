// gpt-oss expert unpacking (model/gpt_oss_experts.cpp) against the checkpoint layout decoded by
// hand: bf16 gate_up_proj [E, H, 2I] with gate in the even and up in the odd columns, down_proj
// [E, I, H]; MXFP4 gate_up_proj_blocks [E, 2I, H/32, 16] with weight 2j of a block in byte j's low
// nibble and 2j+1 in its high nibble, times 2^(scale - 127), the FP4 (e2m1) values of the OCP MX
// format. The files are written here as safetensors, as transformers writes them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <random>
#include <unistd.h>

#include "core/dtype.h"
#include "model/gpt_oss_experts.h"
#include "quant/quant.h"

namespace spill {
namespace {

namespace fs = std::filesystem;

struct RawTensor {
  std::string dtype;  // "BF16", "U8"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

void write_safetensors(const fs::path& path, const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  const std::string h = header.dump();
  const uint64_t n = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (const auto& [name, t] : tensors) out.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
}

RawTensor bf16_tensor(const std::vector<float>& values, std::vector<int64_t> shape) {
  RawTensor t{"BF16", std::move(shape), std::vector<uint8_t>(values.size() * 2)};
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t b = f32_to_bf16(values[i]);
    std::memcpy(t.bytes.data() + 2 * i, &b, 2);
  }
  return t;
}

float bf16_value(float v) { return bf16_to_f32(f32_to_bf16(v)); }

constexpr float kFp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};

// Weight c (0..cols) of row r of a checkpoint MXFP4 matrix.
float checkpoint_mxfp4(const RawTensor& blocks, const RawTensor& scales, int64_t row, int64_t c, int64_t cols) {
  const int64_t g = c / 32, j = (c % 32) / 2;
  const uint8_t byte = blocks.bytes[size_t((row * (cols / 32) + g) * 16 + j)];
  const int code = c % 2 == 0 ? byte & 0x0F : byte >> 4;
  return std::ldexp(kFp4[code], int(scales.bytes[size_t(row * (cols / 32) + g)]) - 127);
}

class GptOssExperts : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("spill_gpt_oss_experts_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  static constexpr int64_t E = 3, H = 64, I = 32;
  std::vector<std::unique_ptr<uint8_t[]>> owned_;
  std::function<uint8_t*(size_t)> alloc = [this](size_t n) {
    owned_.emplace_back(std::make_unique<uint8_t[]>(n));
    return owned_.back().get();
  };
};

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> row_of(const TensorView& t, int64_t e, int64_t r) {
  const TensorView m = t.slice0(e);
  std::vector<float> out(size_t(m.cols()));
  quant::dequantize_row(m.dtype, m.row_data(r), out.data(), m.cols());
  return out;
}

TEST_F(GptOssExperts, Bf16IsTransposedAndDeinterleaved) {
  std::mt19937 rng(1);
  const auto gu = random_values(size_t(E * H * 2 * I), rng), dn = random_values(size_t(E * I * H), rng);
  const auto gub = random_values(size_t(E * 2 * I), rng), dnb = random_values(size_t(E * H), rng);
  const std::string p = "model.layers.0.mlp.experts.";
  write_safetensors(dir_ / "model.safetensors", {{p + "gate_up_proj", bf16_tensor(gu, {E, H, 2 * I})},
                                                 {p + "gate_up_proj_bias", bf16_tensor(gub, {E, 2 * I})},
                                                 {p + "down_proj", bf16_tensor(dn, {E, I, H})},
                                                 {p + "down_proj_bias", bf16_tensor(dnb, {E, H})}});
  const WeightStore store = WeightStore::open_folder(dir_.string());
  const GptOssExpertTensors t = unpack_gpt_oss_experts(store, p, {E, H, I}, alloc);
  ASSERT_EQ(t.gate.dtype, DType::BF16);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < I; ++i) {
      const auto g = row_of(t.gate, e, i), u = row_of(t.up, e, i);
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_EQ(g[size_t(h)], bf16_value(gu[size_t((e * H + h) * 2 * I + 2 * i)]));
        ASSERT_EQ(u[size_t(h)], bf16_value(gu[size_t((e * H + h) * 2 * I + 2 * i + 1)]));
      }
      ASSERT_EQ(row_of(t.gate_bias, e, 0)[size_t(i)], bf16_value(gub[size_t(e * 2 * I + 2 * i)]));
      ASSERT_EQ(row_of(t.up_bias, e, 0)[size_t(i)], bf16_value(gub[size_t(e * 2 * I + 2 * i + 1)]));
    }
    for (int64_t h = 0; h < H; ++h) {
      const auto d = row_of(t.down, e, h);
      for (int64_t i = 0; i < I; ++i) ASSERT_EQ(d[size_t(i)], bf16_value(dn[size_t((e * I + i) * H + h)]));
    }
  }
}

TEST_F(GptOssExperts, Mxfp4IsRepackedWithoutChangingAWeight) {
  std::mt19937 rng(2);
  auto bytes = [&](size_t n, int lo, int hi) {
    std::uniform_int_distribution<int> d(lo, hi);
    std::vector<uint8_t> v(n);
    for (uint8_t& b : v) b = uint8_t(d(rng));
    return v;
  };
  const RawTensor gu_blocks{"U8", {E, 2 * I, H / 32, 16}, bytes(size_t(E * 2 * I * H / 32 * 16), 0, 255)};
  const RawTensor gu_scales{"U8", {E, 2 * I, H / 32}, bytes(size_t(E * 2 * I * H / 32), 118, 130)};
  const RawTensor dn_blocks{"U8", {E, H, I / 32, 16}, bytes(size_t(E * H * I / 32 * 16), 0, 255)};
  const RawTensor dn_scales{"U8", {E, H, I / 32}, bytes(size_t(E * H * I / 32), 118, 130)};
  const auto gub = random_values(size_t(E * 2 * I), rng), dnb = random_values(size_t(E * H), rng);
  const std::string p = "model.layers.0.mlp.experts.";
  write_safetensors(dir_ / "model.safetensors",
                    {{p + "gate_up_proj_blocks", gu_blocks}, {p + "gate_up_proj_scales", gu_scales},
                     {p + "down_proj_blocks", dn_blocks}, {p + "down_proj_scales", dn_scales},
                     {p + "gate_up_proj_bias", bf16_tensor(gub, {E, 2 * I})},
                     {p + "down_proj_bias", bf16_tensor(dnb, {E, H})}});
  const WeightStore store = WeightStore::open_folder(dir_.string());
  const GptOssExpertTensors t = unpack_gpt_oss_experts(store, p, {E, H, I}, alloc);
  ASSERT_EQ(t.gate.dtype, DType::MXFP4);
  ASSERT_EQ(t.down.dtype, DType::MXFP4);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < I; ++i) {
      const auto g = row_of(t.gate, e, i), u = row_of(t.up, e, i);
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_EQ(g[size_t(h)], checkpoint_mxfp4(gu_blocks, gu_scales, e * 2 * I + 2 * i, h, H)) << e << " " << i << " " << h;
        ASSERT_EQ(u[size_t(h)], checkpoint_mxfp4(gu_blocks, gu_scales, e * 2 * I + 2 * i + 1, h, H));
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      const auto d = row_of(t.down, e, h);
      for (int64_t i = 0; i < I; ++i) ASSERT_EQ(d[size_t(i)], checkpoint_mxfp4(dn_blocks, dn_scales, e * H + h, i, I));
    }
  }
}

TEST_F(GptOssExperts, WrongShapesAndMissingTensorsAreNamed) {
  const std::string p = "model.layers.0.mlp.experts.";
  std::mt19937 rng(3);
  write_safetensors(dir_ / "model.safetensors",
                    {{p + "gate_up_proj", bf16_tensor(random_values(size_t(E * H * I), rng), {E, H, I})},
                     {p + "gate_up_proj_bias", bf16_tensor(random_values(size_t(E * 2 * I), rng), {E, 2 * I})},
                     {p + "down_proj_bias", bf16_tensor(random_values(size_t(E * H), rng), {E, H})}});
  const WeightStore store = WeightStore::open_folder(dir_.string());
  try {
    unpack_gpt_oss_experts(store, p, {E, H, I}, alloc);
    FAIL() << "no error";
  } catch (const std::exception& ex) {
    EXPECT_NE(std::string(ex.what()).find("gate_up_proj"), std::string::npos) << ex.what();
    EXPECT_NE(std::string(ex.what()).find("[3, 64, 64]"), std::string::npos) << ex.what();
  }
}

}  // namespace
}  // namespace spill
