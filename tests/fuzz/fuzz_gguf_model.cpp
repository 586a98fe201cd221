// A whole GGUF model load: the reader, then the `<arch>.*` metadata into a ModelSpec (every family,
// MLA's key/value lengths and lora ranks, routers, sliding patterns, NextN counts), then the role
// resolver's shape checks and the MLA kv_b join. Any bytes must load or give a spill::Error. The
// input is the whole file; GgufFile maps it from disk, so it is written to a per-process temporary
// file first. Seeds in tests/fuzz/corpus/gguf_model (small deepseek2 and glm4moe files).
#include <unistd.h>

#include <fstream>
#include <string>

#include "core/error.h"
#include "model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/spill_fuzz_gguf_model_" + std::to_string(getpid()) + ".gguf";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  }
  try {
    auto model = spill::Model::load(path);
    // Touch the joined MLA kv_b of every layer: it must be whole.
    for (const spill::LayerWeights& w : model->layers) {
      const auto* b = static_cast<const volatile uint8_t*>(w.mla.kv_b.data);
      if (b && w.mla.kv_b.nbytes() > 0) (void)(b[0] + b[w.mla.kv_b.nbytes() - 1]);
    }
  } catch (const spill::Error&) {
  }
  return 0;
}
