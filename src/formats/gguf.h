// GGUF files (llama.cpp's model format), version 2 and 3, little-endian: a header of typed
// metadata (key -> value), tensor infos (name, ggml dims, ggml type, offset) and an aligned data
// section that spill maps and uses in place, with no copy. Models published as several files
// (`name-00001-of-00003.gguf`, as gguf-split writes them) open from the first shard.
//
// Everything the header says is validated at open, with overflow-safe arithmetic, before any of
// it is used: counts and string lengths against the bytes left, types against the known ones,
// dims against overflow, every tensor's byte range against its shard, alignment, duplicates and
// overlaps. Each failure is a spill::Error naming the file and the key or tensor.
//
// Shapes: ggml lists dims fastest-first (ne[0] is the contiguous one); spill's TensorView is
// row-major, so a GGUF tensor with ne = [cols, rows, experts] becomes shape [experts, rows, cols].
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"

namespace spill {

class MappedFile;

namespace gguf {

// The value types of GGUF metadata, with the ids the file stores.
enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9,
  U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Integers keep their stored type; the getters below convert with range checks.
struct Value {
  ValueType type = ValueType::U32;
  uint64_t u = 0;  // U8, U16, U32, U64, Bool
  int64_t i = 0;   // I8, I16, I32, I64
  double f = 0;    // F32, F64
  std::string s;   // String
  ValueType elem_type = ValueType::U32;  // Array: the type of every element
  std::vector<Value> items;              // Array

  static Value uint(ValueType t, uint64_t v);
  static Value sint(ValueType t, int64_t v);
  static Value u32(uint32_t v) { return uint(ValueType::U32, v); }
  static Value u64(uint64_t v) { return uint(ValueType::U64, v); }
  static Value i32(int32_t v) { return sint(ValueType::I32, v); }
  static Value f32(float v);
  static Value f64(double v);
  static Value boolean(bool v);
  static Value string(std::string v);
  static Value array(ValueType elem_type, std::vector<Value> items);
  static Value strings(const std::vector<std::string>& v);
  static Value i32s(const std::vector<int32_t>& v);

  bool is_integer() const;
  bool is_float() const { return type == ValueType::F32 || type == ValueType::F64; }
};

// The metadata of a file, in file order, looked up by key. Getters throw a spill::Error naming
// the file and the key when it is missing or of the wrong type.
class Metadata {
 public:
  explicit Metadata(std::string where = {}) : where_(std::move(where)) {}
  // false when the key is already there (duplicate keys are an error in a file).
  bool add(std::string key, Value value);
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  const std::string& where() const { return where_; }

  int64_t integer(std::string_view key) const;
  int64_t integer(std::string_view key, int64_t fallback) const;
  double number(std::string_view key) const;  // any integer or float type
  double number(std::string_view key, double fallback) const;
  bool boolean(std::string_view key, bool fallback) const;
  const std::string& string(std::string_view key) const;
  std::string string(std::string_view key, const std::string& fallback) const;
  // An array of strings; nullptr when absent.
  const std::vector<Value>* string_array(std::string_view key) const;
  // An array of integers (any integer element type) converted to int64; empty when absent.
  std::vector<int64_t> integer_array(std::string_view key) const;

 private:
  [[noreturn]] void wrong_type(std::string_view key, const Value& v, const char* wanted) const;
  std::string where_;
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;
};

struct TensorInfo {
  std::string name;
  int64_t ggml_type = 0;
  int n_dims = 0;
  std::array<int64_t, 4> ne{};  // ggml's order: ne[0] is contiguous
  uint64_t offset = 0;          // from the start of its shard's data section
  uint64_t nbytes = 0;
  size_t shard = 0;             // index into GgufFile::shard_paths()
  TensorView view;              // row-major, pointing into the mapped shard
};

// Limits of what the parser accepts, far above any real model, so a hostile header cannot make
// it allocate or loop without bound.
struct ParseLimits {
  uint64_t max_string_bytes = uint64_t(1) << 30;  // one string (a chat template is ~10 KB)
  int max_array_depth = 4;                        // arrays of arrays of ...
  // Array elements in the whole header: each costs ~100 bytes in memory, so this bounds what a
  // small hostile file can make spill allocate (a real tokenizer has ~1M: tokens, types, merges).
  uint64_t max_array_elements = uint64_t(1) << 23;
};

// The parsed header of one file (one shard): metadata, tensor infos and where the data starts.
// Views point into `data`, which the caller keeps alive.
struct Header {
  uint32_t version = 0;
  uint64_t alignment = 32;
  uint64_t data_offset = 0;  // first byte of the data section
  Metadata metadata;
  std::vector<TensorInfo> tensors;
};

// Parses and validates a whole file held in memory (the mapped file, or a fuzzer's bytes).
// `where` names it in errors. Throws spill::Error.
Header parse(const uint8_t* data, size_t size, const std::string& where, const ParseLimits& limits = {});

// The name ggml gives a type id ("Q4_0", "IQ2_XXS"), or "unknown" for ids ggml does not define.
const char* ggml_type_name(int64_t ggml_type);

// A model in one GGUF file or several shards, mapped. Views stay valid while it lives.
class GgufFile {
 public:
  // Opens `path` (the first shard of a split model finds the rest). Throws spill::Error.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  ~GgufFile();

  const std::string& path() const { return path_; }
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }
  const Metadata& metadata() const { return metadata_; }  // the first shard's
  uint32_t version() const { return version_; }
  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The shard file that holds a tensor, for messages.
  const std::string& file_of(const TensorInfo& t) const { return shard_paths_[t.shard]; }

 private:
  GgufFile() = default;
  std::string path_;
  uint32_t version_ = 0;
  std::vector<std::string> shard_paths_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// Whether a path names a GGUF file ("*.gguf"), so callers can pick the loader.
bool is_gguf_path(const std::string& path);

// Splits "dir/name-00001-of-00003.gguf" into its parts; false when the name has no such suffix.
bool parse_shard_name(const std::string& path, std::string& prefix, int& index, int& count);
std::string shard_name(const std::string& prefix, int index, int count);

}  // namespace gguf
}  // namespace spill
