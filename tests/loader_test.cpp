// Bad files give one clear error naming the file, tensor or field: never a crash, a hang or a
// silently wrong model. One test per failure class.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/model_spec.h"
#include "formats/safetensors.h"
#include "model/model.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using spill::Error;

namespace {

struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes a safetensors file; header_override replaces the generated header when given.
void write_safetensors(const fs::path& path, const std::vector<RawTensor>& tensors, const std::string& header_override = "",
                       int64_t truncate_to = -1) {
  json header = json::object();
  std::vector<uint8_t> data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  }
  std::string h = header_override.empty() ? header.dump() : header_override;
  uint64_t len = h.size();
  std::string file(reinterpret_cast<const char*>(&len), 8);
  file += h;
  file.append(data.begin(), data.end());
  if (truncate_to >= 0) file.resize(size_t(truncate_to));
  std::ofstream(path, std::ios::binary).write(file.data(), std::streamsize(file.size()));
}

RawTensor f32(const std::string& name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  RawTensor t{name, "F32", shape, std::vector<uint8_t>(size_t(n) * 4)};
  for (int64_t i = 0; i < n; ++i) {
    float v = 0.01f * float(i % 17) - 0.05f;
    std::memcpy(t.bytes.data() + i * 4, &v, 4);
  }
  return t;
}

// The header write_safetensors would generate, for tests that then corrupt one entry.
json header_of(const std::vector<RawTensor>& tensors) {
  json header = json::object();
  size_t off = 0;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  return header;
}

size_t data_size(const std::vector<RawTensor>& tensors) {
  size_t n = 0;
  for (const RawTensor& t : tensors) n += t.bytes.size();
  return n;
}

json tiny_llama_config() {
  return {{"model_type", "llama"},     {"vocab_size", 10},        {"hidden_size", 8},
          {"num_hidden_layers", 1},    {"num_attention_heads", 2}, {"num_key_value_heads", 1},
          {"intermediate_size", 12},   {"rms_norm_eps", 1e-5},    {"tie_word_embeddings", true},
          {"max_position_embeddings", 64}};
}

std::vector<RawTensor> tiny_llama_tensors() {
  return {f32("model.embed_tokens.weight", {10, 8}),
          f32("model.norm.weight", {8}),
          f32("model.layers.0.input_layernorm.weight", {8}),
          f32("model.layers.0.post_attention_layernorm.weight", {8}),
          f32("model.layers.0.self_attn.q_proj.weight", {8, 8}),
          f32("model.layers.0.self_attn.k_proj.weight", {4, 8}),
          f32("model.layers.0.self_attn.v_proj.weight", {4, 8}),
          f32("model.layers.0.self_attn.o_proj.weight", {8, 8}),
          f32("model.layers.0.mlp.gate_proj.weight", {12, 8}),
          f32("model.layers.0.mlp.up_proj.weight", {12, 8}),
          f32("model.layers.0.mlp.down_proj.weight", {8, 12})};
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("spill_loader_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_config(tiny_llama_config());
  }
  void TearDown() override { fs::remove_all(dir); }
  void write_config(const json& config) { std::ofstream(dir / "config.json") << config.dump(); }
  std::string model_file() const { return (dir / "model.safetensors").string(); }

  // Expects Model::load to throw a spill::Error whose message contains every fragment.
  void expect_error(std::initializer_list<std::string> fragments) {
    try {
      spill::Model::load(dir.string());
      FAIL() << "expected an error";
    } catch (const Error& e) {
      for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << "message: " << e.what() << "\nmissing: " << f;
    }
  }
  fs::path dir;
};

TEST_F(LoaderTest, ValidFileLoads) {
  write_safetensors(model_file(), tiny_llama_tensors());
  auto model = spill::Model::load(dir.string());
  EXPECT_EQ(model->spec().n_layers, 1);
  EXPECT_EQ(model->lm_head.data, model->embed.data);  // tied
}

TEST_F(LoaderTest, TruncatedFile) {
  write_safetensors(model_file(), tiny_llama_tensors(), "", 200);
  expect_error({"model.safetensors", "header length"});
}

TEST_F(LoaderTest, TruncatedData) {
  auto tensors = tiny_llama_tensors();
  write_safetensors(model_file(), tensors);
  const auto full = fs::file_size(model_file());
  write_safetensors(model_file(), tensors, "", int64_t(full) - 4);
  expect_error({"model.safetensors", "out of range"});
}

TEST_F(LoaderTest, TooShortForHeader) {
  write_safetensors(model_file(), {}, "", 5);
  expect_error({"model.safetensors", "too short"});
}

TEST_F(LoaderTest, HeaderLengthPastEnd) {
  std::string bogus(8, '\0');
  uint64_t len = 1 << 20;
  std::memcpy(bogus.data(), &len, 8);
  bogus += "{}";
  std::ofstream(model_file(), std::ios::binary) << bogus;
  expect_error({"model.safetensors", "header length 1048576 runs past the end"});
}

TEST_F(LoaderTest, OffsetsOutOfRange) {
  auto tensors = tiny_llama_tensors();
  json header = header_of(tensors);
  const size_t off = data_size(tensors);
  header["model.norm.weight"]["data_offsets"] = {off, off + 32};
  write_safetensors(model_file(), tensors, header.dump());
  expect_error({"model.norm.weight", "out of range"});
}

TEST_F(LoaderTest, OverlappingOffsets) {
  auto tensors = tiny_llama_tensors();
  json header = header_of(tensors);
  header["model.norm.weight"]["data_offsets"] = {0, 32};  // inside the embedding's bytes
  write_safetensors(model_file(), tensors, header.dump());
  expect_error({"overlap", "model.norm.weight"});
}

TEST_F(LoaderTest, OffsetsDisagreeWithShape) {
  auto tensors = tiny_llama_tensors();
  json header = header_of(tensors);
  header["model.norm.weight"]["shape"] = {9};
  write_safetensors(model_file(), tensors, header.dump());
  expect_error({"model.norm.weight", "need"});
}

TEST_F(LoaderTest, UnknownDtype) {
  auto tensors = tiny_llama_tensors();
  tensors[1].dtype = "F8_E4M3";
  tensors[1].bytes.resize(8);
  write_safetensors(model_file(), tensors);
  expect_error({"model.norm.weight", "F8_E4M3", "supported"});
}

TEST_F(LoaderTest, HeaderNotJson) {
  write_safetensors(model_file(), tiny_llama_tensors(), "{\"a\": [1, 2");
  expect_error({"model.safetensors", "not valid JSON"});
}

TEST_F(LoaderTest, MissingTensor) {
  auto tensors = tiny_llama_tensors();
  tensors.erase(tensors.begin() + 4);  // q_proj
  write_safetensors(model_file(), tensors);
  expect_error({"model.layers.0.self_attn.q_proj.weight", "missing"});
}

TEST_F(LoaderTest, ShapeDisagreesWithConfig) {
  auto tensors = tiny_llama_tensors();
  tensors[8] = f32("model.layers.0.mlp.gate_proj.weight", {11, 8});
  write_safetensors(model_file(), tensors);
  expect_error({"model.layers.0.mlp.gate_proj.weight", "[11, 8]", "[12, 8]", "config.json"});
}

TEST_F(LoaderTest, ConfigFieldOfWrongType) {
  json config = tiny_llama_config();
  config["hidden_size"] = "eight";
  write_config(config);
  write_safetensors(model_file(), tiny_llama_tensors());
  expect_error({"config.json", "hidden_size", "integer"});
}

TEST_F(LoaderTest, ConfigMissingField) {
  json config = tiny_llama_config();
  config.erase("num_hidden_layers");
  write_config(config);
  write_safetensors(model_file(), tiny_llama_tensors());
  expect_error({"config.json", "num_hidden_layers", "missing"});
}

TEST_F(LoaderTest, UnsupportedArchitecture) {
  json config = tiny_llama_config();
  config["model_type"] = "mamba";
  write_config(config);
  write_safetensors(model_file(), tiny_llama_tensors());
  expect_error({"config.json", "mamba", "not supported"});
}

TEST_F(LoaderTest, ShardIndexNamesAbsentTensor) {
  auto tensors = tiny_llama_tensors();
  write_safetensors(dir / "model-00001-of-00001.safetensors", tensors);
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (auto& t : tensors) index["weight_map"][t.name] = "model-00001-of-00001.safetensors";
  index["weight_map"]["model.extra.weight"] = "model-00001-of-00001.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  expect_error({"model.extra.weight", "does not contain"});
}

TEST_F(LoaderTest, ShardedLoads) {
  auto tensors = tiny_llama_tensors();
  std::vector<RawTensor> a(tensors.begin(), tensors.begin() + 5), b(tensors.begin() + 5, tensors.end());
  write_safetensors(dir / "model-00001-of-00002.safetensors", a);
  write_safetensors(dir / "model-00002-of-00002.safetensors", b);
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  for (auto& t : a) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (auto& t : b) index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  auto model = spill::Model::load(dir.string());
  EXPECT_EQ(model->layers.size(), 1u);
}

TEST_F(LoaderTest, NoWeights) { expect_error({"no model.safetensors"}); }

}  // namespace
