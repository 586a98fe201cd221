#include "core/dtype.h"

#include <cctype>

namespace spill {

bool parse_dtype_name(std::string_view s, DType& out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const std::string_view name = kDTypeTraits[i].name;
    if (name.size() != s.size()) continue;
    bool same = true;
    for (size_t c = 0; c < s.size() && same; ++c)
      same = std::toupper(static_cast<unsigned char>(s[c])) == std::toupper(static_cast<unsigned char>(name[c]));
    if (same) {
      out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

bool dtype_from_ggml_type(int64_t ggml_type, DType& out) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kDTypeTraits[i].ggml_type == ggml_type) {
      out = static_cast<DType>(i);
      return true;
    }
  }
  return false;
}

}  // namespace spill
