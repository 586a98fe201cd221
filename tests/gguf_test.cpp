// The GGUF reader and writer: round trips of every value type and tensor layout, shards, and
// hostile files (every one must give a spill::Error that names the problem, never a crash).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "gguf_helpers.h"
#include "test_models.h"

namespace spill {
namespace {

using gguf::Value;
using gguf::ValueType;
using testing::RawGguf;

std::string error_of(const std::vector<uint8_t>& bytes) {
  try {
    gguf::parse(bytes.data(), bytes.size(), "test.gguf");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_GGUF_ERROR(bytes, ...)                                                  \
  do {                                                                                 \
    const std::string msg_ = error_of(bytes);                                          \
    ASSERT_FALSE(msg_.empty()) << "no error";                                          \
    EXPECT_NE(msg_.find("test.gguf"), std::string::npos) << msg_;                      \
    for (const char* part_ : {__VA_ARGS__}) EXPECT_NE(msg_.find(part_), std::string::npos) << msg_; \
  } while (0)

// A small valid file: metadata of every type and three tensors of different layouts.
struct Sample {
  std::vector<float> f32 = std::vector<float>(6);
  std::vector<uint16_t> bf16 = std::vector<uint16_t>(2 * 3 * 32);
  std::vector<uint8_t> q8 = std::vector<uint8_t>(2 * 34);
  gguf::Writer writer;

  explicit Sample(uint32_t alignment = 32) : writer(alignment) {
    for (size_t i = 0; i < f32.size(); ++i) f32[i] = float(i) * 0.5f - 1;
    for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = f32_to_bf16(float(i));
    for (size_t i = 0; i < q8.size(); ++i) q8[i] = uint8_t(i * 7);
    writer.set("general.architecture", Value::string("qwen3"));
    writer.set("u8", Value::uint(ValueType::U8, 200));
    writer.set("i8", Value::sint(ValueType::I8, -100));
    writer.set("u16", Value::uint(ValueType::U16, 60000));
    writer.set("i16", Value::sint(ValueType::I16, -30000));
    writer.set("u32", Value::u32(4000000000u));
    writer.set("i32", Value::i32(-2000000000));
    writer.set("u64", Value::u64(uint64_t(1) << 60));
    writer.set("i64", Value::sint(ValueType::I64, -(int64_t(1) << 60)));
    writer.set("f32", Value::f32(1e-6f));
    writer.set("f64", Value::f64(0.1));
    writer.set("bool", Value::boolean(true));
    writer.set("string", Value::string("héllo\nwörld"));
    writer.set("strings", Value::strings({"a", "", "Ġthe"}));
    writer.set("ints", Value::i32s({1, -2, 3}));
    writer.set("nested", Value::array(ValueType::Array, {Value::strings({"x", "y"}), Value::strings({})}));
    writer.add_tensor("vec", DType::F32, {6}, f32.data());
    writer.add_tensor("mat", DType::BF16, {2, 3, 32}, bf16.data());
    writer.add_tensor("q8", DType::Q8_0, {2, 32}, q8.data());
  }
};

TEST(Gguf, RoundTripsEveryValueTypeAndLayout) {
  for (uint32_t alignment : {32u, 64u, 1u}) {
    Sample s(alignment);
    const std::vector<uint8_t> bytes = s.writer.bytes();
    const gguf::Header h = gguf::parse(bytes.data(), bytes.size(), "sample.gguf");
    const gguf::Metadata& m = h.metadata;
    EXPECT_EQ(h.version, 3u);
    EXPECT_EQ(h.alignment, alignment);
    EXPECT_EQ(m.integer("u8"), 200);
    EXPECT_EQ(m.integer("i8"), -100);
    EXPECT_EQ(m.integer("u16"), 60000);
    EXPECT_EQ(m.integer("i16"), -30000);
    EXPECT_EQ(m.integer("u32"), 4000000000ll);
    EXPECT_EQ(m.integer("i32"), -2000000000);
    EXPECT_EQ(m.integer("u64"), int64_t(1) << 60);
    EXPECT_EQ(m.integer("i64"), -(int64_t(1) << 60));
    EXPECT_EQ(float(m.number("f32")), 1e-6f);
    EXPECT_EQ(m.number("f64"), 0.1);
    EXPECT_TRUE(m.boolean("bool", false));
    EXPECT_EQ(m.string("string"), "héllo\nwörld");
    const auto* strs = m.string_array("strings");
    ASSERT_NE(strs, nullptr);
    ASSERT_EQ(strs->size(), 3u);
    EXPECT_EQ((*strs)[2].s, "Ġthe");
    EXPECT_EQ(m.integer_array("ints"), (std::vector<int64_t>{1, -2, 3}));
    const Value* nested = m.find("nested");
    ASSERT_NE(nested, nullptr);
    ASSERT_EQ(nested->items.size(), 2u);
    EXPECT_EQ(nested->items[0].items[1].s, "y");
    EXPECT_TRUE(nested->items[1].items.empty());

    ASSERT_EQ(h.tensors.size(), 3u);
    EXPECT_EQ(h.data_offset % alignment, 0u);
    const auto& vec = h.tensors[0];
    EXPECT_EQ(vec.view.ndim, 1);
    EXPECT_EQ(vec.view.shape[0], 6);
    EXPECT_EQ(std::memcmp(vec.view.data, s.f32.data(), 24), 0);
    const auto& mat = h.tensors[1];
    // ggml dims are reversed: ne = [32, 3, 2] -> shape [2, 3, 32]
    EXPECT_EQ(mat.ne[0], 32);
    EXPECT_EQ(mat.ne[2], 2);
    EXPECT_EQ(shape_str(mat.view), shape_str(TensorView{.dtype = DType::BF16, .ndim = 3, .shape = {2, 3, 32, 0}}));
    EXPECT_EQ(std::memcmp(mat.view.data, s.bf16.data(), s.bf16.size() * 2), 0);
    // expert 1 of [2, 3, 32] is the second contiguous half
    EXPECT_EQ(mat.view.slice0(1).data, static_cast<const uint8_t*>(mat.view.data) + 3 * 32 * 2);
    const auto& q8 = h.tensors[2];
    EXPECT_EQ(q8.view.dtype, DType::Q8_0);
    EXPECT_EQ(q8.nbytes, 68u);
    EXPECT_EQ(std::memcmp(q8.view.data, s.q8.data(), 68), 0);
    for (const auto& t : h.tensors)
      EXPECT_EQ((static_cast<const uint8_t*>(t.view.data) - bytes.data() - h.data_offset) % alignment, 0);
  }
}

TEST(Gguf, MetadataGettersNameKeyAndType) {
  Sample s;
  const std::vector<uint8_t> bytes = s.writer.bytes();
  const gguf::Header h = gguf::parse(bytes.data(), bytes.size(), "sample.gguf");
  try {
    h.metadata.integer("string");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'string' is a string"), std::string::npos) << e.what();
  }
  try {
    h.metadata.integer("absent.key");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing metadata key 'absent.key'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(h.metadata.integer("absent.key", 7), 7);
}

TEST(Gguf, EveryTruncationIsAnError) {
  Sample s;
  const std::vector<uint8_t> bytes = s.writer.bytes();
  const gguf::Header h = gguf::parse(bytes.data(), bytes.size(), "sample.gguf");
  // The padding after the last tensor is not data: a file cut there is still whole.
  const size_t data_end = size_t(h.data_offset + h.tensors.back().offset + h.tensors.back().nbytes);
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + std::ptrdiff_t(n));
    const std::string msg = error_of(cut);
    if (n < data_end) {
      EXPECT_FALSE(msg.empty()) << "cut at " << n << " of " << bytes.size();
    } else {
      EXPECT_EQ(msg, "") << "cut at " << n;
    }
  }
}

TEST(Gguf, BadMagicAndVersions) {
  EXPECT_GGUF_ERROR((std::vector<uint8_t>{'G', 'G', 'U', 'X', 3, 0, 0, 0}), "not a GGUF file");
  EXPECT_GGUF_ERROR((std::vector<uint8_t>{'G', 'G'}), "not a GGUF file");
  EXPECT_GGUF_ERROR(RawGguf().header(0, 0, 1).b, "version 1");
  EXPECT_GGUF_ERROR(RawGguf().header(0, 0, 4).b, "version 4");
  EXPECT_GGUF_ERROR(RawGguf().header(0, 0, 0x03000000u).b, "big-endian");
  EXPECT_EQ(error_of(RawGguf().header(0, 0, 2).b), "");  // v2 has the same layout
}

TEST(Gguf, AbsurdCounts) {
  EXPECT_GGUF_ERROR(RawGguf().header(0, uint64_t(1) << 60).b, "metadata entries");
  EXPECT_GGUF_ERROR(RawGguf().header(uint64_t(1) << 60, 0).b, "tensors");
  EXPECT_GGUF_ERROR(RawGguf().header(0, 1).put<uint64_t>(uint64_t(1) << 62).zeros(64).b, "byte limit");
  EXPECT_GGUF_ERROR(RawGguf().header(0, 1).put<uint64_t>(1000).zeros(64).b, "truncated");
  // array of 2^61 u32 / strings / arrays
  for (uint32_t elem : {4u, 8u, 9u})
    EXPECT_GGUF_ERROR(RawGguf().header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(elem).put<uint64_t>(uint64_t(1) << 61)
                          .zeros(64).b,
                      "key 'k'", "cannot fit");
  // a string inside an array longer than the file
  EXPECT_GGUF_ERROR(RawGguf().header(0, 1).str("toks").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(2).str("a")
                        .put<uint64_t>(uint64_t(1) << 40).zeros(16).b,
                    "toks");
}

TEST(Gguf, BadValueTypes) {
  EXPECT_GGUF_ERROR(RawGguf().header(0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0).b, "key 'k'", "value type 13");
  EXPECT_GGUF_ERROR(RawGguf().header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(0).b,
                    "element type 77");
  EXPECT_GGUF_ERROR(RawGguf().header(0, 1).str("k").put<uint32_t>(7).put<uint8_t>(2).b, "boolean");
  // arrays nested deeper than the limit
  RawGguf deep;
  deep.header(0, 1).str("deep").put<uint32_t>(9);
  for (int i = 0; i < 10; ++i) deep.put<uint32_t>(9).put<uint64_t>(1);
  deep.put<uint32_t>(4).put<uint64_t>(0);
  EXPECT_GGUF_ERROR(deep.b, "nested");
  EXPECT_GGUF_ERROR(RawGguf().header(0, 2).kv_u32("k", 1).kv_u32("k", 2).b, "'k' appears twice");
}

TEST(Gguf, Alignment) {
  EXPECT_GGUF_ERROR(RawGguf().header(0, 1).kv_u32("general.alignment", 48).b, "power of two");
  EXPECT_GGUF_ERROR(RawGguf().header(0, 1).kv_u32("general.alignment", 0).b, "power of two");
  EXPECT_GGUF_ERROR(RawGguf().header(0, 1).str("general.alignment").put<uint32_t>(10).put<uint64_t>(32).b, "u32");
  // a tensor offset that is not a multiple of the alignment
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {8}, 0, 4).align().zeros(64).b, "'w'", "alignment");
}

TEST(Gguf, BadTensorInfos) {
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {}, 0, 0).align().zeros(32).b, "'w'", "0 dimensions");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {1, 1, 1, 1, 1}, 0, 0).align().zeros(32).b, "5 dimensions");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {-4}, 0, 0).align().zeros(32).b, "negative");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {int64_t(1) << 40, int64_t(1) << 40}, 0, 0).align().zeros(32).b,
                    "'w'", "overflow");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {4, INT64_MAX}, 0, 0).align().zeros(32).b, "more than");
  // A huge row beside a zero dimension holds no bytes, but its row alone overflows (found by fuzz_gguf).
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {int64_t(1) << 62, 0}, 0, 0).align().zeros(32).b, "'w'",
                    "dimension 0", "more than");
  // An empty tensor (a zero dimension) whose other dimensions' product overflows.
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {0, int64_t(1) << 40, int64_t(1) << 40}, 0, 0).align().zeros(32).b,
                    "'w'", "overflow");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {256}, 16, 0).align().zeros(96).b, "'w'", "IQ2_XXS",
                    "does not load");
  // Q5_0 (ggml type 6) loads, in whole blocks of 32 only
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {48}, 6, 0).align().zeros(64).b, "Q5_0", "whole blocks");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {32}, 1234, 0).align().zeros(64).b, "1234", "unknown");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {33}, 8, 0).align().zeros(64).b, "whole blocks");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {16}, 0, 0).align().zeros(32).b, "'w'", "past its end");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {8}, 0, uint64_t(1) << 63).align().zeros(32).b, "past its end");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {8}, 0, UINT64_MAX - 31).align().zeros(32).b, "past its end");
  EXPECT_GGUF_ERROR(RawGguf().header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).align().zeros(64).b,
                    "'w' appears twice");
  EXPECT_GGUF_ERROR(RawGguf().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).align().zeros(96).b,
                    "'a' and 'b' overlap");
  EXPECT_GGUF_ERROR(RawGguf().header(1, 0).tensor("w", {8}, 0, 0).b, "truncated");
}

TEST(Gguf, FileOpensMappedAndRefusesMissingFiles) {
  testing::TempDir dir;
  Sample s;
  s.writer.write(dir.sub("m.gguf"));
  auto f = gguf::GgufFile::open(dir.sub("m.gguf"));
  ASSERT_NE(f->find("mat"), nullptr);
  EXPECT_EQ(std::memcmp(f->find("mat")->view.data, s.bf16.data(), s.bf16.size() * 2), 0);
  EXPECT_EQ(f->find("nope"), nullptr);
  EXPECT_THROW(gguf::GgufFile::open(dir.sub("absent.gguf")), Error);
}

TEST(Gguf, ShardedModelOpensFromTheFirstShard) {
  testing::TempDir dir;
  std::vector<float> a(8, 1.0f), b(16, 2.0f), c(4, 3.0f);
  auto shard = [&](int no, std::vector<std::pair<std::string, std::vector<float>*>> tensors, int count = 3,
                   int total = 3) {
    gguf::Writer w;
    if (no == 0) w.set("general.architecture", Value::string("qwen3"));
    w.set("split.no", Value::uint(ValueType::U16, uint64_t(no)));
    w.set("split.count", Value::uint(ValueType::U16, uint64_t(count)));
    w.set("split.tensors.count", Value::sint(ValueType::I32, total));
    for (auto& [name, data] : tensors) w.add_tensor(name, DType::F32, {int64_t(data->size())}, data->data());
    w.write(gguf::shard_name(dir.sub("m"), no + 1, count));
  };
  shard(0, {{"a", &a}});
  shard(1, {{"b", &b}});
  shard(2, {{"c", &c}});
  auto f = gguf::GgufFile::open(dir.sub("m-00001-of-00003.gguf"));
  ASSERT_EQ(f->tensors().size(), 3u);
  ASSERT_EQ(f->shard_paths().size(), 3u);
  EXPECT_EQ(f->find("c")->view.shape[0], 4);
  EXPECT_EQ(static_cast<const float*>(f->find("b")->view.data)[15], 2.0f);
  EXPECT_EQ(f->file_of(*f->find("b")), dir.sub("m-00002-of-00003.gguf"));
  EXPECT_EQ(f->metadata().string("general.architecture"), "qwen3");

  auto message = [&](const std::string& path) {
    try {
      gguf::GgufFile::open(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(dir.sub("m-00002-of-00003.gguf")).find("open the first shard"), std::string::npos);
  std::filesystem::remove(dir.sub("m-00003-of-00003.gguf"));
  EXPECT_NE(message(dir.sub("m-00001-of-00003.gguf")).find("shard 3 of 3 is missing"), std::string::npos);
  shard(2, {{"c", &c}}, 3, 4);  // split.tensors.count disagrees
  shard(0, {{"a", &a}}, 3, 4);
  EXPECT_NE(message(dir.sub("m-00001-of-00003.gguf")).find("split.tensors.count says 4"), std::string::npos);
  shard(0, {{"a", &a}});
  shard(2, {{"b", &c}});  // the same name in two shards
  EXPECT_NE(message(dir.sub("m-00001-of-00003.gguf")).find("'b' appears in two shards"), std::string::npos);
  std::filesystem::rename(dir.sub("m-00001-of-00003.gguf"), dir.sub("renamed.gguf"));
  EXPECT_NE(message(dir.sub("renamed.gguf")).find("other shards cannot be found"), std::string::npos);
}

TEST(Gguf, ShardNames) {
  std::string prefix;
  int index = 0, count = 0;
  ASSERT_TRUE(gguf::parse_shard_name("/d/Qwen3-235B-Q4_K_M-00002-of-00005.gguf", prefix, index, count));
  EXPECT_EQ(prefix, "/d/Qwen3-235B-Q4_K_M");
  EXPECT_EQ(index, 2);
  EXPECT_EQ(count, 5);
  EXPECT_EQ(gguf::shard_name(prefix, 2, 5), "/d/Qwen3-235B-Q4_K_M-00002-of-00005.gguf");
  EXPECT_FALSE(gguf::parse_shard_name("model.gguf", prefix, index, count));
  EXPECT_FALSE(gguf::parse_shard_name("model-0001-of-00003.gguf", prefix, index, count));
}

}  // namespace
}  // namespace spill
