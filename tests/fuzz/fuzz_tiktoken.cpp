// tiktoken.model + tokenizer_config.json (Kimi-K2's folder): Tokenizer::from_tiktoken parsing the
// rank lines and the special tokens, deriving merges, then encoding and decoding with what loaded.
// The input is the model text, a NUL byte, then the config text.
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = spill::fuzz::as_text(data, size);
  const size_t nul = input.find('\0');
  const std::string_view model = input.substr(0, nul);
  const std::string_view config = nul == std::string_view::npos ? std::string_view("{}") : input.substr(nul + 1);
  try {
    const spill::Tokenizer t = spill::Tokenizer::from_tiktoken(
        {.model_text = model, .config_text = config, .pre = "kimi-k2", .origin = "tiktoken.model"});
    const std::vector<int32_t> ids = t.encode("Hello, 世界! <|im_end|> getElementById 12345\n\n  x", true);
    t.decode(ids);
    t.decode(ids, /*skip_special=*/true);
  } catch (const spill::Error&) {
  }
  return 0;
}
