#include "formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_limits.h"

namespace spill {

namespace fs = std::filesystem;
using json = nlohmann::json;

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(e));
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail("{}: cannot map {} bytes: {}", path, size_, std::strerror(e));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

static DType parse_dtype(const std::string& s, const std::string& path, const std::string& name) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  fail("{}: tensor '{}' has dtype '{}', which spill does not load (supported: F32, BF16, F16, and U8 for packed "
       "MXFP4 experts)", path, name, s);
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(std::make_unique<MappedFile>(path)) {
  const size_t size = file_->size();
  const uint8_t* base = file_->data();
  if (size < 8) fail("{}: file is {} bytes, too short for a safetensors header (is it truncated?)", path, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian u64, as every platform spill runs on
  if (header_len > size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes): the file is truncated or not safetensors",
         path, header_len, size);
  if (header_len > (100u << 20)) fail("{}: header length {} is larger than the 100 MB limit", path, header_len);
  const json header = parse_json<json>(
      std::string_view(reinterpret_cast<const char*>(base + 8), size_t(header_len)), path + ": header");
  if (!header.is_object()) fail("{}: header is not a JSON object", path);
  const size_t data_begin = 8 + size_t(header_len);
  const size_t data_size = size - data_begin;

  struct Range {
    size_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (info.is_object())
        for (auto& [k, v] : info.items())
          if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
      fail("{}: tensor '{}': header entry needs 'dtype', 'shape' and 'data_offsets'", path, name);
    const json& jd = info["dtype"];
    const json& js = info["shape"];
    const json& jo = info["data_offsets"];
    if (!jd.is_string()) fail("{}: tensor '{}': 'dtype' must be a string", path, name);
    if (!js.is_array() || js.size() > 4)
      fail("{}: tensor '{}': 'shape' must be an array of at most 4 dimensions", path, name);
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
      fail("{}: tensor '{}': 'data_offsets' must be two non-negative integers", path, name);
    TensorView t;
    const bool bytes = jd.get<std::string>() == "U8";
    t.dtype = bytes ? DType::F32 : parse_dtype(jd.get<std::string>(), path, name);  // U8: sized below
    t.ndim = int(js.size());
    uint64_t numel = 1;
    for (int d = 0; d < t.ndim; ++d) {
      if (!js[d].is_number_unsigned()) fail("{}: tensor '{}': shape entries must be non-negative integers", path, name);
      uint64_t n = js[d].get<uint64_t>();
      if (n > (uint64_t(1) << 40) || (n && numel > (uint64_t(1) << 62) / n))
        fail("{}: tensor '{}': shape is implausibly large", path, name);
      t.shape[d] = int64_t(n);
      numel *= n;
    }
    uint64_t begin = jo[0].get<uint64_t>(), end = jo[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail("{}: tensor '{}': data_offsets [{}, {}] are out of range (data section is {} bytes)", path, name, begin, end,
           data_size);
    // Checked: a huge element count times the element size must not wrap to a size that matches.
    uint64_t need = 0;
    if (__builtin_mul_overflow(numel, bytes ? uint64_t(1) : uint64_t(dtype_traits(t.dtype).block_bytes), &need))
      fail("{}: tensor '{}': dtype {} and shape {} need more than 2^64 bytes; the header is corrupt", path, name,
           dtype_name(t.dtype), shape_str(t));
    if (end - begin != need)
      fail("{}: tensor '{}': data_offsets cover {} bytes but dtype {} and shape {} need {}", path, name, end - begin,
           bytes ? std::string_view("U8") : dtype_name(t.dtype), shape_str(t), need);
    t.data = base + data_begin + begin;
    ranges.push_back({size_t(begin), size_t(end), name});
    if (bytes)
      byte_tensors_.emplace(name, ByteTensor{static_cast<const uint8_t*>(t.data), t.ndim, t.shape, size_t(need)});
    else
      tensors_.emplace(name, t);
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      fail("{}: tensors '{}' and '{}' overlap in the file (bytes {}..{} and {}..{})", path, ranges[i - 1].name,
           ranges[i].name, ranges[i - 1].begin, ranges[i - 1].end, ranges[i].begin, ranges[i].end);
}

WeightStore WeightStore::open_folder(const std::string& dir) {
  WeightStore store;
  store.dir_ = dir;
  if (!fs::is_directory(dir)) fail("{}: not a directory (expected a Hugging Face model folder)", dir);
  std::vector<std::string> files;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  json index;
  if (fs::exists(index_path)) {
    std::ifstream in(index_path, std::ios::binary);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    index = parse_json<json>(text, index_path.string());
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail("{}: needs a 'weight_map' object mapping tensor names to files", index_path.string());
    for (auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string()) fail("{}: weight_map['{}'] must be a file name", index_path.string(), name);
      std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos)
        fail("{}: weight_map['{}'] = '{}' must be a file in the same folder", index_path.string(), name, f);
      if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
    }
  } else if (fs::exists(single_path)) {
    files.push_back("model.safetensors");
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json found", dir);
  }
  for (const std::string& f : files) {
    auto file = std::make_unique<SafetensorsFile>((fs::path(dir) / f).string());
    for (auto& [name, view] : file->tensors()) {
      if (store.file_index_.count(name))
        fail("{}: tensor '{}' appears in both {} and {}", dir, name, store.file_of(name), file->path());
      store.tensors_.emplace(name, view);
      store.file_index_.emplace(name, store.files_.size());
    }
    for (auto& [name, bytes] : file->byte_tensors()) {
      if (store.file_index_.count(name))
        fail("{}: tensor '{}' appears in both {} and {}", dir, name, store.file_of(name), file->path());
      store.byte_tensors_.emplace(name, bytes);
      store.file_index_.emplace(name, store.files_.size());
    }
    store.files_.push_back(std::move(file));
  }
  if (!index.is_null()) {
    for (auto& [name, file] : index["weight_map"].items()) {
      auto it = store.file_index_.find(name);
      if (it == store.file_index_.end())
        fail("{}: index names tensor '{}' in {}, but that file does not contain it", dir, name,
             file.get<std::string>());
    }
  }
  return store;
}

const TensorView* WeightStore::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const ByteTensor* WeightStore::find_bytes(const std::string& name) const {
  auto it = byte_tensors_.find(name);
  return it == byte_tensors_.end() ? nullptr : &it->second;
}

const TensorView& WeightStore::get(const std::string& name) const {
  if (const TensorView* t = find(name)) return *t;
  fail("{}: missing tensor '{}' (the checkpoint is incomplete or not of the architecture config.json names)", dir_,
       name);
}

std::string WeightStore::file_of(const std::string& name) const {
  auto it = file_index_.find(name);
  return it == file_index_.end() ? dir_ : files_[it->second]->path();
}

}  // namespace spill
