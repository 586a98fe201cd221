// A non-owning view of a weight tensor: where its bytes are, their type and shape. Shapes count
// weights; bytes follow from the type's row size, so block formats (Q4_K, ...) slice by rows too.
// Where the bytes live (VRAM, pinned host, a mapped file) is not the view's business.
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace spill {

struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  std::array<int64_t, 4> shape{};  // row-major; shape[ndim-1] is contiguous

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  bool empty() const { return data == nullptr; }
  int64_t rows() const {
    int64_t n = 1;
    for (int i = 0; i + 1 < ndim; ++i) n *= shape[i];
    return n;
  }
  int64_t cols() const { return ndim >= 1 ? shape[ndim - 1] : 1; }
  // Bytes of one row (the contiguous last dimension), scales included.
  int64_t row_bytes() const { return spill::row_bytes(dtype, cols()); }
  size_t nbytes() const { return size_t(rows()) * size_t(row_bytes()); }
  // Row r's first byte.
  const uint8_t* row_data(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes(); }
  // A [rows, cols] matrix at data (rows of row_bytes each).
  static TensorView matrix(const void* data, DType type, int64_t rows, int64_t cols) {
    TensorView v;
    v.data = data;
    v.dtype = type;
    v.ndim = 2;
    v.shape = {rows, cols, 0, 0};
    return v;
  }
  // Slice along the first dimension (expert e of a fused [E, ...] tensor).
  TensorView slice0(int64_t i) const {
    TensorView v = *this;
    v.ndim = ndim - 1;
    for (int d = 0; d + 1 < ndim; ++d) v.shape[d] = shape[d + 1];
    v.shape[ndim - 1] = 0;
    v.data = static_cast<const char*>(data) + size_t(i) * v.nbytes();
    return v;
  }
};

std::string shape_str(const TensorView& t);

}  // namespace spill
