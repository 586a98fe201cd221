// libFuzzer target for the GGUF reader: any bytes must parse or give a spill::Error, and every
// view a parsed header hands out must lie inside the input (ASan checks the reads below).
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Isrc tests/fuzz/fuzz_gguf.cpp \
//       src/formats/gguf.cpp src/formats/safetensors.cpp src/core/dtype.cpp src/core/tensor.cpp -lfmt
//   ./a.out -max_len=4096 tests/data/gguf/fuzz_seeds
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes, so a read past the end is a heap overflow ASan reports.
  std::vector<uint8_t> buf(data, data + size);
  try {
    const spill::gguf::Header h = spill::gguf::parse(buf.data(), buf.size(), "fuzz.gguf");
    uint8_t sink = 0;
    for (const spill::gguf::TensorInfo& t : h.tensors) {
      const size_t n = t.view.nbytes();
      if (n != t.nbytes) __builtin_trap();  // the view and the info must agree
      if (n == 0) continue;
      const auto* p = static_cast<const uint8_t*>(t.view.data);
      sink ^= p[0];
      sink ^= p[n - 1];
    }
    for (const auto& [key, value] : h.metadata.entries()) sink ^= uint8_t(key.size() + value.items.size());
    __asm__ volatile("" : : "r"(sink));  // keep the reads
  } catch (const spill::Error&) {
  }
  return 0;
}
