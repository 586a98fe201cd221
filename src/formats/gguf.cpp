#include "formats/gguf.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "formats/safetensors.h"

namespace spill::gguf {

namespace {

constexpr uint32_t kMaxValueType = 12;
// No tensor dimension comes near this (vocabularies are ~2^18, context-length tables ~2^24).
constexpr int64_t kMaxDimension = int64_t(1) << 48;

bool valid_value_type(uint32_t t) { return t <= kMaxValueType; }

// Fewest bytes one element of a type can take in the file: the bound that turns "n elements"
// into "at least n x this many bytes must be left", before anything is allocated.
uint64_t min_value_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::Bool: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::String: return 8;   // the length
    case ValueType::Array: return 12;   // element type + count
  }
  return 1;
}

// Reads little-endian fields with every length checked against the bytes left.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& where, const ParseLimits& limits)
      : data_(data), size_(size), where_(where), limits_(limits) {}

  // Counts array elements against the header-wide limit.
  void take_elements(uint64_t n, std::string_view key) {
    if (n > limits_.max_array_elements - elements_)
      fail("{}: key '{}': arrays in the header hold more than {} elements in all (the header is corrupt)", where_,
           key, limits_.max_array_elements);
    elements_ += n;
  }

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  void need(uint64_t n, std::string_view what) const {
    if (n > left())
      fail("{}: truncated: {} needs {} bytes at offset {} but the file has {} left (is the download incomplete?)",
           where_, what, n, pos_, left());
  }
  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // GGUF is little-endian, as every host spill runs on
    pos_ += sizeof(T);
    return v;
  }
  std::string string(std::string_view what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > limits_.max_string_bytes)
      fail("{}: {}: a string of {} bytes is larger than the {} byte limit (the header is corrupt)", where_, what, n,
           limits_.max_string_bytes);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  uint64_t elements_ = 0;
  const std::string& where_;
  const ParseLimits& limits_;
};

Value read_value(Cursor& c, ValueType type, const std::string& key, const std::string& where,
                 const ParseLimits& limits, int depth) {
  Value v;
  v.type = type;
  switch (type) {
    case ValueType::U8: v.u = c.read<uint8_t>(key); break;
    case ValueType::I8: v.i = c.read<int8_t>(key); break;
    case ValueType::U16: v.u = c.read<uint16_t>(key); break;
    case ValueType::I16: v.i = c.read<int16_t>(key); break;
    case ValueType::U32: v.u = c.read<uint32_t>(key); break;
    case ValueType::I32: v.i = c.read<int32_t>(key); break;
    case ValueType::U64: v.u = c.read<uint64_t>(key); break;
    case ValueType::I64: v.i = c.read<int64_t>(key); break;
    case ValueType::F32: v.f = c.read<float>(key); break;
    case ValueType::F64: v.f = c.read<double>(key); break;
    case ValueType::Bool: {
      const uint8_t b = c.read<uint8_t>(key);
      if (b > 1) fail("{}: key '{}': boolean byte is {}, not 0 or 1", where, key, b);
      v.u = b;
      break;
    }
    case ValueType::String: v.s = c.string(key); break;
    case ValueType::Array: {
      const uint32_t elem = c.read<uint32_t>(key);
      if (!valid_value_type(elem))
        fail("{}: key '{}': array element type {} is not a GGUF value type (0..{})", where, key, elem, kMaxValueType);
      v.elem_type = ValueType(elem);
      if (v.elem_type == ValueType::Array && depth + 1 >= limits.max_array_depth)
        fail("{}: key '{}': arrays nested more than {} deep", where, key, limits.max_array_depth);
      const uint64_t n = c.read<uint64_t>(key);
      const uint64_t min_bytes = min_value_bytes(v.elem_type);
      if (n > c.left() / min_bytes)
        fail("{}: key '{}': an array of {} {} values cannot fit in the {} bytes left in the file", where, key, n,
             value_type_name(v.elem_type), c.left());
      c.take_elements(n, key);
      v.items.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.items.push_back(read_value(c, v.elem_type, key, where, limits, depth + 1));
      break;
    }
  }
  return v;
}

bool mul_ok(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::Bool: return "bool";
    case ValueType::String: return "string";
    case ValueType::Array: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "?";
}

const char* ggml_type_name(int64_t t) {
  static const char* const names[] = {
      "F32",  "F16",  "Q4_0", "Q4_1", nullptr, nullptr, "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K",
      "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",
      "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8",
      "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4", "NVFP4", "Q1_0", "Q2_0"};
  if (t < 0 || t >= int64_t(std::size(names)) || !names[t]) return "unknown";
  return names[t];
}

// ---- Value / Metadata ----------------------------------------------------------------------

Value Value::uint(ValueType t, uint64_t v) {
  Value x;
  x.type = t;
  x.u = v;
  return x;
}
Value Value::sint(ValueType t, int64_t v) {
  Value x;
  x.type = t;
  x.i = v;
  return x;
}
Value Value::f32(float v) {
  Value x;
  x.type = ValueType::F32;
  x.f = v;
  return x;
}
Value Value::f64(double v) {
  Value x;
  x.type = ValueType::F64;
  x.f = v;
  return x;
}
Value Value::boolean(bool v) { return uint(ValueType::Bool, v ? 1 : 0); }
Value Value::string(std::string v) {
  Value x;
  x.type = ValueType::String;
  x.s = std::move(v);
  return x;
}
Value Value::array(ValueType elem_type, std::vector<Value> items) {
  Value x;
  x.type = ValueType::Array;
  x.elem_type = elem_type;
  x.items = std::move(items);
  return x;
}
Value Value::strings(const std::vector<std::string>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (const std::string& s : v) items.push_back(string(s));
  return array(ValueType::String, std::move(items));
}
Value Value::i32s(const std::vector<int32_t>& v) {
  std::vector<Value> items;
  items.reserve(v.size());
  for (int32_t x : v) items.push_back(i32(x));
  return array(ValueType::I32, std::move(items));
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16: case ValueType::U32:
    case ValueType::I32: case ValueType::U64: case ValueType::I64: return true;
    default: return false;
  }
}

namespace {
bool is_unsigned(ValueType t) {
  return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}
}  // namespace

bool Metadata::add(std::string key, Value value) {
  if (index_.count(key)) return false;
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
  return true;
}

const Value* Metadata::find(std::string_view key) const {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void Metadata::wrong_type(std::string_view key, const Value& v, const char* wanted) const {
  fail("{}: metadata key '{}' is a {}, but spill needs {}", where_, key, value_type_name(v.type), wanted);
}

int64_t Metadata::integer(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail("{}: missing metadata key '{}' (the file was not written for this architecture, or is incomplete)",
               where_, key);
  if (!v->is_integer()) wrong_type(key, *v, "an integer");
  if (is_unsigned(v->type)) {
    if (v->u > uint64_t(INT64_MAX)) fail("{}: metadata key '{}' = {} is out of range", where_, key, v->u);
    return int64_t(v->u);
  }
  return v->i;
}
int64_t Metadata::integer(std::string_view key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }

double Metadata::number(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail("{}: missing metadata key '{}'", where_, key);
  if (v->is_float()) return v->f;
  if (v->is_integer()) return double(integer(key));
  wrong_type(key, *v, "a number");
}
double Metadata::number(std::string_view key, double fallback) const { return has(key) ? number(key) : fallback; }

bool Metadata::boolean(std::string_view key, bool fallback) const {
  const Value* v = find(key);
  if (!v) return fallback;
  if (v->type != ValueType::Bool) wrong_type(key, *v, "a bool");
  return v->u != 0;
}

const std::string& Metadata::string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) fail("{}: missing metadata key '{}'", where_, key);
  if (v->type != ValueType::String) wrong_type(key, *v, "a string");
  return v->s;
}
std::string Metadata::string(std::string_view key, const std::string& fallback) const {
  return has(key) ? string(key) : fallback;
}

const std::vector<Value>* Metadata::string_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return nullptr;
  if (v->type != ValueType::Array || v->elem_type != ValueType::String) wrong_type(key, *v, "an array of strings");
  return &v->items;
}

std::vector<int64_t> Metadata::integer_array(std::string_view key) const {
  std::vector<int64_t> out;
  const Value* v = find(key);
  if (!v) return out;
  if (v->type != ValueType::Array) wrong_type(key, *v, "an array of integers");
  Value probe;
  probe.type = v->elem_type;
  if (!probe.is_integer()) fail("{}: metadata key '{}' is an array of {}, but spill needs integers", where_, key,
                                value_type_name(v->elem_type));
  out.reserve(v->items.size());
  for (const Value& e : v->items) {
    if (is_unsigned(e.type) && e.u > uint64_t(INT64_MAX)) fail("{}: metadata key '{}': {} is out of range", where_, key, e.u);
    out.push_back(is_unsigned(e.type) ? int64_t(e.u) : e.i);
  }
  return out;
}

// ---- parsing -------------------------------------------------------------------------------

Header parse(const uint8_t* data, size_t size, const std::string& where, const ParseLimits& limits) {
  Header h;
  h.metadata = Metadata(where);
  Cursor c(data, size, where, limits);
  if (size < 4 || std::memcmp(data, "GGUF", 4) != 0)
    fail("{}: not a GGUF file (it does not start with the bytes 'GGUF')", where);
  c.read<uint32_t>("the magic");
  h.version = c.read<uint32_t>("the version");
  if (h.version == 0x02000000u || h.version == 0x03000000u)
    fail("{}: a big-endian GGUF file; spill reads little-endian GGUF only", where);
  if (h.version == 1) fail("{}: GGUF version 1 (2023) is not supported; convert the model again with a current llama.cpp", where);
  if (h.version != 2 && h.version != 3) fail("{}: GGUF version {} is not supported (spill reads versions 2 and 3)", where, h.version);
  const uint64_t n_tensors = c.read<uint64_t>("the tensor count");
  const uint64_t n_kv = c.read<uint64_t>("the metadata count");
  // A key/value takes at least 13 bytes (key length, type, one byte of value); a tensor info 28.
  if (n_kv > c.left() / 13)
    fail("{}: the header claims {} metadata entries, more than the {} bytes left could hold (the header is corrupt)",
         where, n_kv, c.left());
  if (n_tensors > c.left() / 28)
    fail("{}: the header claims {} tensors, more than the {} bytes left could hold (the header is corrupt)", where,
         n_tensors, c.left());

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.string(fmt::format("the key of metadata entry {}", k));
    const uint32_t type = c.read<uint32_t>(key);
    if (!valid_value_type(type))
      fail("{}: key '{}': value type {} is not a GGUF value type (0..{})", where, key, type, kMaxValueType);
    Value v = read_value(c, ValueType(type), key, where, limits, 0);
    if (!h.metadata.add(key, std::move(v))) fail("{}: metadata key '{}' appears twice", where, key);
  }
  if (const Value* a = h.metadata.find("general.alignment")) {
    if (a->type != ValueType::U32) fail("{}: general.alignment must be a u32, not a {}", where, value_type_name(a->type));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      fail("{}: general.alignment = {} is not a power of two", where, a->u);
    h.alignment = a->u;
  }

  h.tensors.reserve(size_t(n_tensors));
  std::unordered_map<std::string, size_t> seen;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    TensorInfo info;
    info.name = c.string(fmt::format("the name of tensor {}", t));
    const std::string& name = info.name;
    const uint32_t n_dims = c.read<uint32_t>(name);
    if (n_dims < 1 || n_dims > 4)
      fail("{}: tensor '{}' has {} dimensions; GGUF tensors have 1 to 4", where, name, n_dims);
    info.n_dims = int(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      const int64_t ne = c.read<int64_t>(name);
      if (ne < 0) fail("{}: tensor '{}': dimension {} is negative ({})", where, name, d, ne);
      // Also with another dimension 0 (no bytes at all), so that no product of one dimension and
      // a type's bytes per element further on can overflow.
      if (ne > kMaxDimension)
        fail("{}: tensor '{}': dimension {} is {}, more than {} (the header is corrupt)", where, name, d, ne,
             kMaxDimension);
      info.ne[d] = ne;
    }
    info.ggml_type = c.read<uint32_t>(name);
    info.offset = c.read<uint64_t>(name);
    if (!seen.emplace(name, h.tensors.size()).second) fail("{}: tensor '{}' appears twice", where, name);
    h.tensors.push_back(std::move(info));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t end_of_infos = c.pos();
  const uint64_t pad = (h.alignment - end_of_infos % h.alignment) % h.alignment;
  h.data_offset = end_of_infos + pad;
  if (h.data_offset > size && !h.tensors.empty())
    fail("{}: truncated: the data section would start at byte {} but the file has {} bytes", where, h.data_offset, size);
  const uint64_t data_size = h.data_offset <= size ? size - h.data_offset : 0;

  for (TensorInfo& info : h.tensors) {
    const std::string& name = info.name;
    DType dtype;
    if (!dtype_from_ggml_type(info.ggml_type, dtype)) {
      std::string supported;
      for (int i = 0; i < kNumDTypes; ++i) supported += (i ? ", " : "") + std::string(kDTypeTraits[i].name);
      fail("{}: tensor '{}' is of ggml type {} ({}), which spill does not load (supported: {}); requantize the "
           "model to one of those",
           where, name, info.ggml_type, ggml_type_name(info.ggml_type), supported);
    }
    const DTypeTraits& tr = dtype_traits(dtype);
    if (info.ne[0] % tr.block_elems != 0)
      fail("{}: tensor '{}' ({}): rows of {} weights are not whole blocks of {}", where, name, tr.name, info.ne[0],
           tr.block_elems);
    uint64_t nbytes = 0;
    if (!mul_ok(uint64_t(info.ne[0] / tr.block_elems), uint64_t(tr.block_bytes), nbytes))
      fail("{}: tensor '{}': dims overflow (the header is corrupt)", where, name);
    // The product of the dimensions with zeros counted as 1 bounds every partial product a view
    // takes of them (rows, nbytes) in any order, so none can overflow even where the tensor is empty.
    uint64_t extent = uint64_t(std::max<int64_t>(info.ne[0], 1));
    for (int d = 1; d < info.n_dims; ++d)
      if (!mul_ok(nbytes, uint64_t(info.ne[d]), nbytes) ||
          !mul_ok(extent, uint64_t(std::max<int64_t>(info.ne[d], 1)), extent) || extent > (uint64_t(1) << 60))
        fail("{}: tensor '{}': dims overflow (the header is corrupt)", where, name);
    info.nbytes = nbytes;
    if (info.offset % h.alignment != 0)
      fail("{}: tensor '{}': data offset {} is not a multiple of the alignment {}", where, name, info.offset,
           h.alignment);
    if (info.offset > data_size || nbytes > data_size - info.offset)
      fail("{}: tensor '{}': bytes {}..{} of the data section run past its end ({} bytes; is the file truncated?)",
           where, name, info.offset, info.offset + nbytes, data_size);
    TensorView& v = info.view;
    v.dtype = dtype;
    v.ndim = info.n_dims;
    for (int d = 0; d < info.n_dims; ++d) v.shape[size_t(d)] = info.ne[size_t(info.n_dims - 1 - d)];
    v.data = data + h.data_offset + info.offset;
  }

  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : h.tensors)
    if (t.nbytes) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->nbytes)
      fail("{}: tensors '{}' and '{}' overlap in the data section", where, by_offset[i - 1]->name, by_offset[i]->name);
  return h;
}

// ---- files and shards ----------------------------------------------------------------------

bool is_gguf_path(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

bool parse_shard_name(const std::string& path, std::string& prefix, int& index, int& count) {
  // <prefix>-NNNNN-of-MMMMM.gguf
  constexpr size_t kTail = std::string_view("-00001-of-00003.gguf").size();
  if (path.size() <= kTail) return false;
  const std::string tail = path.substr(path.size() - kTail);
  auto digits = [](const std::string& s, size_t at, int& out) {
    out = 0;
    for (size_t k = at; k < at + 5; ++k) {
      if (s[k] < '0' || s[k] > '9') return false;
      out = out * 10 + (s[k] - '0');
    }
    return true;
  };
  if (tail[0] != '-' || tail.compare(6, 4, "-of-") != 0 || tail.compare(15, 5, ".gguf") != 0) return false;
  if (!digits(tail, 1, index) || !digits(tail, 10, count)) return false;
  prefix = path.substr(0, path.size() - kTail);
  return true;
}

std::string shard_name(const std::string& prefix, int index, int count) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, index, count);
}

GgufFile::~GgufFile() = default;

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  auto first = std::make_unique<MappedFile>(path);
  Header h = parse(first->data(), first->size(), path);
  f->version_ = h.version;
  f->metadata_ = std::move(h.metadata);
  f->shard_paths_.push_back(path);
  f->files_.push_back(std::move(first));
  for (TensorInfo& t : h.tensors) f->tensors_.push_back(std::move(t));

  const int64_t n_split = f->metadata_.integer("split.count", 1);
  if (n_split < 1 || n_split > 99999) fail("{}: split.count = {} is out of range (1..99999)", path, n_split);
  if (f->metadata_.integer("split.no", 0) != 0)
    fail("{}: this is shard {} of {} of a split model; open the first shard (…-00001-of-{:05d}.gguf)", path,
         f->metadata_.integer("split.no", 0) + 1, n_split, n_split);
  if (n_split > 1) {
    std::string prefix;
    int index = 0, count = 0;
    if (!parse_shard_name(path, prefix, index, count) || index != 1 || count != n_split)
      fail("{}: split.count says the model is in {} files, but the name is not '<name>-00001-of-{:05d}.gguf', so "
           "the other shards cannot be found",
           path, n_split, n_split);
    for (int s = 2; s <= n_split; ++s) {
      const std::string shard = shard_name(prefix, s, int(n_split));
      if (!std::filesystem::exists(shard)) fail("{}: shard {} of {} is missing: {}", path, s, n_split, shard);
      auto mapped = std::make_unique<MappedFile>(shard);
      Header sh = parse(mapped->data(), mapped->size(), shard);
      if (sh.metadata.integer("split.count", -1) != n_split || sh.metadata.integer("split.no", -1) != s - 1)
        fail("{}: split.count / split.no say this is not shard {} of {} of {}", shard, s, n_split, path);
      for (TensorInfo& t : sh.tensors) {
        t.shard = f->shard_paths_.size();
        f->tensors_.push_back(std::move(t));
      }
      f->shard_paths_.push_back(shard);
      f->files_.push_back(std::move(mapped));
    }
    const int64_t total = f->metadata_.integer("split.tensors.count", int64_t(f->tensors_.size()));
    if (total != int64_t(f->tensors_.size()))
      fail("{}: split.tensors.count says {} tensors, but the {} shards hold {}", path, total, n_split,
           f->tensors_.size());
  }
  for (size_t i = 0; i < f->tensors_.size(); ++i)
    if (!f->index_.emplace(f->tensors_[i].name, i).second)
      fail("{}: tensor '{}' appears in two shards ({} and {})", path, f->tensors_[i].name,
           f->shard_paths_[f->tensors_[f->index_[f->tensors_[i].name]].shard], f->shard_paths_[f->tensors_[i].shard]);
  return f;
}

const TensorInfo* GgufFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace spill::gguf
