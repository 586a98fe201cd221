#include "formats/gguf_writer.h"

#include <cstring>
#include <fstream>

#include "core/error.h"

namespace spill::gguf {

namespace {

class Bytes {
 public:
  explicit Bytes(std::vector<uint8_t>& out) : out_(out) {}
  template <class T>
  void put(T v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void value(const Value& v) {
    switch (v.type) {
      case ValueType::U8: put<uint8_t>(uint8_t(v.u)); break;
      case ValueType::I8: put<int8_t>(int8_t(v.i)); break;
      case ValueType::U16: put<uint16_t>(uint16_t(v.u)); break;
      case ValueType::I16: put<int16_t>(int16_t(v.i)); break;
      case ValueType::U32: put<uint32_t>(uint32_t(v.u)); break;
      case ValueType::I32: put<int32_t>(int32_t(v.i)); break;
      case ValueType::U64: put<uint64_t>(v.u); break;
      case ValueType::I64: put<int64_t>(v.i); break;
      case ValueType::F32: put<float>(float(v.f)); break;
      case ValueType::F64: put<double>(v.f); break;
      case ValueType::Bool: put<uint8_t>(v.u ? 1 : 0); break;
      case ValueType::String: str(v.s); break;
      case ValueType::Array:
        put<uint32_t>(uint32_t(v.elem_type));
        put<uint64_t>(v.items.size());
        for (const Value& e : v.items) {
          if (e.type != v.elem_type)
            fail("GGUF writer: an array of {} holds a {} element", value_type_name(v.elem_type),
                 value_type_name(e.type));
          value(e);
        }
        break;
    }
  }

 private:
  std::vector<uint8_t>& out_;
};

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) fail("GGUF writer: alignment {} is not a power of two", alignment);
}

void Writer::set(const std::string& key, Value value) {
  if (key == "general.alignment") fail("GGUF writer: general.alignment is set by the writer's alignment");
  if (metadata_.add(key, value)) return;
  Metadata replaced;
  for (const auto& [k, v] : metadata_.entries()) replaced.add(k, k == key ? value : v);
  metadata_ = std::move(replaced);
}

void Writer::add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data) {
  if (shape.empty() || shape.size() > 4) fail("GGUF writer: tensor '{}' needs 1 to 4 dimensions", name);
  if (!row_fits(dtype, shape.back()))
    fail("GGUF writer: tensor '{}': rows of {} weights are not whole {} blocks", name, shape.back(), dtype_name(dtype));
  uint64_t rows = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) rows *= uint64_t(shape[d]);
  std::vector<int64_t> ne(shape.rbegin(), shape.rend());
  add_raw_tensor(name, uint32_t(dtype_traits(dtype).ggml_type), ne, data, rows * uint64_t(row_bytes(dtype, shape.back())));
}

void Writer::add_raw_tensor(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& ne, const void* data,
                            uint64_t nbytes) {
  for (const Tensor& t : tensors_)
    if (t.name == name) fail("GGUF writer: tensor '{}' added twice", name);
  tensors_.push_back({name, ggml_type, ne, data, nbytes});
}

std::vector<uint8_t> Writer::header_bytes(std::vector<uint64_t>& offsets) const {
  std::vector<uint8_t> out;
  Bytes b(out);
  b.put<uint32_t>(0x46554747u);  // "GGUF" read as a little-endian u32
  b.put<uint32_t>(3);
  b.put<uint64_t>(tensors_.size());
  const bool write_alignment = alignment_ != 32;
  b.put<uint64_t>(metadata_.entries().size() + (write_alignment ? 1 : 0));
  for (const auto& [key, value] : metadata_.entries()) {
    b.str(key);
    b.put<uint32_t>(uint32_t(value.type));
    b.value(value);
  }
  if (write_alignment) {
    b.str("general.alignment");
    b.put<uint32_t>(uint32_t(ValueType::U32));
    b.put<uint32_t>(alignment_);
  }
  uint64_t offset = 0;
  offsets.clear();
  for (const Tensor& t : tensors_) {
    b.str(t.name);
    b.put<uint32_t>(uint32_t(t.ne.size()));
    for (int64_t n : t.ne) b.put<int64_t>(n);
    b.put<uint32_t>(t.ggml_type);
    b.put<uint64_t>(offset);
    offsets.push_back(offset);
    offset = align_up(offset + t.nbytes, alignment_);
  }
  out.resize(align_up(out.size(), alignment_), 0);
  return out;
}

std::vector<uint8_t> Writer::bytes() const {
  std::vector<uint64_t> offsets;
  std::vector<uint8_t> out = header_bytes(offsets);
  const size_t data_start = out.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(data_start + offsets[i], 0);
    const auto* p = static_cast<const uint8_t*>(tensors_[i].data);
    out.insert(out.end(), p, p + tensors_[i].nbytes);
  }
  out.resize(align_up(out.size(), alignment_), 0);
  return out;
}

void Writer::write(const std::string& path) const {
  std::vector<uint64_t> offsets;
  const std::vector<uint8_t> header = header_bytes(offsets);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot write", path);
  out.write(reinterpret_cast<const char*>(header.data()), std::streamsize(header.size()));
  uint64_t written = 0;  // bytes of the data section so far
  static const char zeros[64] = {};
  auto pad_to = [&](uint64_t at) {
    while (written < at) {
      const uint64_t n = std::min<uint64_t>(sizeof(zeros), at - written);
      out.write(zeros, std::streamsize(n));
      written += n;
    }
  };
  for (size_t i = 0; i < tensors_.size(); ++i) {
    pad_to(offsets[i]);
    out.write(static_cast<const char*>(tensors_[i].data), std::streamsize(tensors_[i].nbytes));
    written += tensors_[i].nbytes;
  }
  pad_to(align_up(written, alignment_));
  out.flush();
  if (!out) fail("{}: write failed (disk full?)", path);
}

}  // namespace spill::gguf
