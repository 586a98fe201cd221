// tokenizer.json: loading (normalizers, pre-tokenizer regexes, BPE tables, added tokens, the
// post-processor), then encoding and decoding with whatever loaded. Inputs starting with byte 0
// instead encode their rest with spill-tiny's tokenizer, with untrusted spans taken from it; byte 1
// encodes the rest (after a selector byte) with spill-tiny's vocabulary as GGUF parts under one of
// the pre-tokenizers of Tokenizer::from_parts (the regexes of gpt-oss, GLM, Kimi-K2, ...).
#include <fstream>
#include <nlohmann/json.hpp>
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

// spill-tiny's tokenizer.json as the parts a GGUF holds, under tokenizer.ggml.pre `pre`.
spill::Tokenizer tiny_as_parts(const char* pre) {
  std::ifstream in(std::string(SPILL_SOURCE_DIR) + "/models/spill-tiny/tokenizer.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  spill::TokenizerParts p;
  p.origin = "spill-tiny as GGUF parts";
  p.pre = pre;
  size_t n = 0;
  for (const auto& [tok, id] : j["model"]["vocab"].items()) n = std::max(n, id.get<size_t>() + 1);
  for (const auto& a : j["added_tokens"]) n = std::max(n, a["id"].get<size_t>() + 1);
  p.tokens.assign(n, "");
  p.token_types.assign(n, 5);
  for (const auto& [tok, id] : j["model"]["vocab"].items()) {
    p.tokens[id.get<size_t>()] = tok;
    p.token_types[id.get<size_t>()] = 1;
  }
  for (const auto& a : j["added_tokens"]) {
    p.tokens[a["id"].get<size_t>()] = a["content"].get<std::string>();
    p.token_types[a["id"].get<size_t>()] = a["special"].get<bool>() ? 3 : 4;
  }
  for (const auto& m : j["model"]["merges"])
    p.merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  return spill::Tokenizer::from_parts(p);
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
  if (!input.empty() && input[0] == 1) {
    static const char* const kPres[] = {"gpt-4o", "glm4", "kimi-k2", "qwen2", "llama-bpe", "deepseek-v3", "gpt-2"};
    static const std::vector<spill::Tokenizer> by_pre = [] {
      std::vector<spill::Tokenizer> all;
      for (const char* pre : kPres) all.push_back(tiny_as_parts(pre));
      return all;
    }();
    input.remove_prefix(1);
    const uint8_t which = spill::fuzz::take_byte(input);
    std::vector<spill::TextSpan> spans;
    if (input.size() >= 3) spans.push_back({input.size() / 3, 2 * input.size() / 3});
    exercise(by_pre[which % by_pre.size()], input, spans);
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
