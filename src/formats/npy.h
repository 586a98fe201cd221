// NumPy .npy files (format version 1.0), the exchange format for logits and other arrays that
// Python tools compare against.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace spill {

// Writes a little-endian float32 C-order array. Throws spill::Error if the file cannot be written.
void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Reads a float32 ('<f4'), C-order .npy file.
NpyArray read_npy_f32(const std::string& path);

}  // namespace spill
