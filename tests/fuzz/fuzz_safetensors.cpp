// safetensors files: the 8-byte header length, the JSON header (dtypes, shapes, offsets) and the
// data section. The input is the whole file; SafetensorsFile maps it from disk, so it is written
// to a per-process temporary file first.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/error.h"
#include "formats/safetensors.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/spill_fuzz_safetensors_" + std::to_string(getpid()) + ".bin";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    spill::SafetensorsFile file(path);
    // Touch every tensor's bytes: a view that passed validation must lie inside the mapping.
    for (const auto& [name, t] : file.tensors()) {
      const auto* bytes = static_cast<const volatile uint8_t*>(t.data);
      if (t.nbytes() > 0) (void)(bytes[0] + bytes[t.nbytes() - 1]);
    }
  } catch (const spill::Error&) {
  }
  return 0;
}
