// tokenizer.json: loading (normalizers, pre-tokenizer regexes, BPE tables, added tokens, the
// post-processor), then encoding and decoding with whatever loaded. Inputs starting with byte 0
// instead encode their rest with spill-tiny's tokenizer, with untrusted spans taken from it.
#include <string>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "text/tokenizer.h"

namespace {

void exercise(const spill::Tokenizer& t, std::string_view text, const std::vector<spill::TextSpan>& spans) {
  try {
    const std::vector<int32_t> ids = t.encode(text, false, spans);
    t.decode(ids);
    t.decode(ids, /*skip_special=*/true);
    t.encode(text, /*add_special=*/true);
  } catch (const spill::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input = spill::fuzz::as_text(data, size);
  if (!input.empty() && input[0] == 0) {
    static const spill::Tokenizer tiny =
        spill::Tokenizer::from_file(std::string(SPILL_SOURCE_DIR) + "/models/spill-tiny/tokenizer.json");
    input.remove_prefix(1);
    // One untrusted span over the middle third, sorted and inside the text.
    std::vector<spill::TextSpan> spans;
    if (input.size() >= 3) spans.push_back({input.size() / 3, 2 * input.size() / 3});
    exercise(tiny, input, spans);
    return 0;
  }
  try {
    const spill::Tokenizer t = spill::Tokenizer::from_json(input, "tokenizer.json");
    exercise(t, "Hello, world! <|im_end|> 123 \xc3\xa9\n\n  x", {{0, 5}});
    for (int32_t id = 0; id < 64 && id < t.vocab_size(); ++id) t.token_text(id);
  } catch (const spill::Error&) {
  }
  return 0;
}
