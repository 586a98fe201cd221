#include "formats/npy.h"

#include <cstring>
#include <fstream>

#include "core/error.h"

namespace spill {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t count = 1;
  for (int64_t d : shape) {
    dims += std::to_string(d) + ", ";
    count *= d;
  }
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64, ending in \n.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot open for writing", path);
  const uint16_t len = uint16_t(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(header.data(), std::streamsize(header.size()));
  out.write(reinterpret_cast<const char*>(data), std::streamsize(count * 4));
  if (!out) fail("{}: write failed", path);
}

NpyArray read_npy_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  char magic[10];
  in.read(magic, 10);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0 || magic[6] != 1) fail("{}: not a version 1 .npy file", path);
  uint16_t len;
  std::memcpy(&len, magic + 8, 2);
  std::string header(len, '\0');
  in.read(header.data(), len);
  if (header.find("'<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
    fail("{}: expected a little-endian float32 C-order array, header is {}", path, header);
  const size_t open = header.find("'shape': (");
  const size_t close = open == std::string::npos ? open : header.find(')', open);
  if (close == std::string::npos) fail("{}: no shape in header", path);
  NpyArray a;
  int64_t count = 1;
  const std::string dims = header.substr(open + 10, close - open - 10);
  for (size_t pos = 0; pos < dims.size();) {
    size_t end = dims.find(',', pos);
    std::string part = dims.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (part.find_first_not_of(' ') != std::string::npos) {
      if (part.find_first_not_of(" 0123456789") != std::string::npos) fail("{}: bad shape in header: {}", path, header);
      a.shape.push_back(std::stoll(part));
      count *= a.shape.back();
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  a.data.resize(static_cast<size_t>(count));
  in.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(count * 4));
  if (!in) fail("{}: file is shorter than its shape says", path);
  return a;
}

}  // namespace spill
