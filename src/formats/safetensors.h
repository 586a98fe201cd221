// Safetensors files, memory-mapped: a header of tensor names, dtypes, shapes and byte ranges,
// validated completely at open so the rest of spill can trust every view it hands out.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace spill {

// One read-only mapping of a file; unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws spill::Error
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A tensor of raw bytes (safetensors dtype U8): what a checkpoint stores packed, e.g. gpt-oss's
// MXFP4 expert codes and exponents, which the loader repacks; never a weight by itself.
struct ByteTensor {
  const uint8_t* data = nullptr;
  int ndim = 0;
  std::array<int64_t, 4> shape{};
  size_t nbytes = 0;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and validates; throws spill::Error
  const std::string& path() const { return file_->path(); }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, ByteTensor>& byte_tensors() const { return byte_tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, ByteTensor> byte_tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model folder: model.safetensors, or the shards that
// model.safetensors.index.json names. Owns the mappings; views stay valid while it lives.
class WeightStore {
 public:
  static WeightStore open_folder(const std::string& dir);  // throws spill::Error

  // nullptr when absent.
  const TensorView* find(const std::string& name) const;
  const ByteTensor* find_bytes(const std::string& name) const;
  // Throws a spill::Error naming the tensor and the folder when absent.
  const TensorView& get(const std::string& name) const;
  // Which file holds a tensor (for error messages).
  std::string file_of(const std::string& name) const;
  const std::map<std::string, TensorView>& all() const { return tensors_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, ByteTensor> byte_tensors_;
  std::map<std::string, size_t> file_index_;
};

}  // namespace spill
