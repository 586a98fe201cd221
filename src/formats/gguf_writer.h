// Writes GGUF v3 files: metadata of every value type and tensors in the ggml layouts, each
// tensor's data aligned (general.alignment, 32 by default), as llama.cpp's gguf writer lays them
// out, so llama.cpp loads what spill writes. Used by `spill quantize` and by tests that craft files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/gguf.h"

namespace spill::gguf {

class Writer {
 public:
  explicit Writer(uint32_t alignment = 32);

  // Sets a metadata key (replacing an earlier value of the same key); keys are written in the
  // order they were first set. general.alignment is managed by the writer.
  void set(const std::string& key, Value value);

  // A tensor in spill's row-major shape ([experts, rows, cols]); `data` holds
  // row_bytes(dtype, cols) x rows bytes and must stay valid until write()/bytes().
  void add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data);
  // Any ggml type id and dims in ggml's order (ne[0] contiguous), with `nbytes` of data: for
  // tests that need types or sizes spill itself would refuse.
  void add_raw_tensor(const std::string& name, uint32_t ggml_type, const std::vector<int64_t>& ne, const void* data,
                      uint64_t nbytes);

  // The whole file.
  std::vector<uint8_t> bytes() const;
  // Writes the file; throws spill::Error naming the path when it cannot.
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    uint32_t ggml_type;
    std::vector<int64_t> ne;
    const void* data;
    uint64_t nbytes;
  };
  std::vector<uint8_t> header_bytes(std::vector<uint64_t>& offsets) const;

  uint32_t alignment_;
  Metadata metadata_;
  std::vector<Tensor> tensors_;
};

}  // namespace spill::gguf
