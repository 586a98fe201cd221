// A non-owning view of a weight tensor: where its bytes are, their type and shape.
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
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }
  int64_t rows() const { return ndim >= 2 ? numel() / shape[ndim - 1] : 1; }
  int64_t cols() const { return ndim >= 1 ? shape[ndim - 1] : 1; }
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
