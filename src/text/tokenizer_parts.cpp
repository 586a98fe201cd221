// Tokenizer::from_parts: a GGUF vocabulary rebuilt as the tokenizer.json of the Hugging Face
// tokenizer it was converted from, so one BPE implementation serves both formats.
//
// tokenizer.ggml.pre names the pre-tokenizer; llama.cpp's converter picks it by hashing what the
// Hugging Face tokenizer does to a test text, so each name stands for one tokenizer.json
// pipeline. The pipelines below are those of the tokenizers the names come from (Qwen2/Qwen3,
// Llama 3, DeepSeek-V3, gpt-oss's o200k_harmony, GLM-4.5, Kimi-K2's tiktoken, GPT-2, OLMo's GPT-NeoX
// vocabulary), written as tokenizer.json sections.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "text/tokenizer.h"

namespace spill {

namespace {

using json = nlohmann::json;

json split(const char* regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}
json byte_level(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", use_regex}};
}
json sequence(std::initializer_list<json> steps) { return {{"type", "Sequence"}, {"pretokenizers", json(steps)}}; }

struct Pipeline {
  json normalizer;     // null for none
  json pre_tokenizer;
  bool ignore_merges = false;
};

constexpr const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kDeepseekV3Words =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// gpt-oss's o200k_harmony (tokenizer.json's Split): a word is an optional leading symbol, then
// upper-case letters followed by lower-case ones or the reverse (so "getElementById" splits at each
// capital), with an optional contraction; digits in threes; "/" sticks to a run of punctuation.
constexpr const char* kO200kRegex =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Kimi-K2's tiktoken pattern (tokenization_kimi.py): runs of Han characters first, then o200k-style
// words whose letter classes exclude Han (written "[...&&[^\p{Han}]]" there; PCRE2 10.42 has no class
// intersection, so each letter is the class behind a negative lookahead). \p{sc:Han} is the Script
// property, which is what the Rust regex crate under tiktoken reads \p{Han} as; PCRE2's bare \p{Han}
// is Script_Extensions and would also take CJK punctuation such as "、" and "。". Unlike o200k, no "/"
// after a run of punctuation.
constexpr const char* kKimiK2Regex =
    "\\p{sc:Han}+|"
    "[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])*"
    "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])+"
    "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

Pipeline pipeline_for(const std::string& pre, const std::string& origin) {
  const json nfc = {{"type", "NFC"}};
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return {nfc, sequence({split(kQwen2Regex), byte_level(false)})};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3")
    return {nullptr, sequence({split(kLlama3Regex), byte_level(false)}), true};
  if (pre == "deepseek-v3")
    return {nullptr, sequence({split("\\p{N}{1,3}"), split("[一-龥぀-ゟ゠-ヿ]+"), split(kDeepseekV3Words),
                               byte_level(false)})};
  // GLM-4.5/4.6 (and GLM-4's chatglm-bpe): Llama 3's regex, but merges are always applied.
  if (pre == "glm4" || pre == "chatglm-bpe") return {nullptr, sequence({split(kLlama3Regex), byte_level(false)})};
  if (pre == "gpt-4o") return {nullptr, sequence({split(kO200kRegex), byte_level(false)})};
  if (pre == "kimi-k2") return {nullptr, sequence({split(kKimiK2Regex), byte_level(false)})};
  if (pre == "gpt-2" || pre == "default") return {nullptr, byte_level(true)};
  if (pre == "olmo") return {nfc, byte_level(true)};
  fail("{}: tokenizer.ggml.pre '{}' is not a pre-tokenizer spill knows (supported: qwen2, deepseek-r1-qwen, "
       "llama-bpe, llama3, deepseek-v3, gpt-4o, glm4, chatglm-bpe, kimi-k2, gpt-2, olmo)", origin, pre);
}

}  // namespace

Tokenizer Tokenizer::from_parts(const TokenizerParts& parts) {
  const std::string& origin = parts.origin;
  const Pipeline p = pipeline_for(parts.pre.empty() ? "default" : parts.pre, origin);
  if (!parts.token_types.empty() && parts.token_types.size() != parts.tokens.size())
    fail("{}: tokenizer.ggml.token_type has {} entries but tokenizer.ggml.tokens has {}", origin,
         parts.token_types.size(), parts.tokens.size());
  if (parts.tokens.empty()) fail("{}: tokenizer.ggml.tokens is empty", origin);
  if (parts.tokens.size() > (size_t(1) << 24)) fail("{}: {} tokens is more than spill accepts (2^24)", origin, parts.tokens.size());

  json vocab = json::object();
  json added = json::array();
  std::unordered_map<std::string, size_t> first_id;
  std::string unk;
  for (size_t id = 0; id < parts.tokens.size(); ++id) {
    const std::string& tok = parts.tokens[id];
    const int32_t type = parts.token_types.empty() ? 1 : parts.token_types[id];
    if (type < 1 || type > 6) fail("{}: token {} has type {}, not one of GGUF's token types 1..6", origin, id, type);
    if (type == 3 || type == 4) {
      added.push_back({{"id", id}, {"content", tok}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", type == 3}});
      continue;
    }
    auto [it, fresh] = first_id.emplace(tok, id);
    if (!fresh) {
      if (type == 5) continue;  // converters pad vocabularies with unused entries that may repeat
      fail("{}: token {:?} appears twice in tokenizer.ggml.tokens (ids {} and {})", origin, tok, it->second, id);
    }
    vocab[tok] = id;
    if (type == 2 && unk.empty()) unk = tok;
  }

  json post = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  if (parts.add_bos || parts.add_eos) {
    json single = json::array(), special = json::object();
    auto add_special = [&](int32_t id, const char* what) {
      if (id < 0 || size_t(id) >= parts.tokens.size())
        fail("{}: tokenizer.ggml.add_{}_token is true but the {} id ({}) is not a token", origin, what, what, id);
      const std::string& tok = parts.tokens[size_t(id)];
      single.push_back({{"SpecialToken", {{"id", tok}, {"type_id", 0}}}});
      special[tok] = {{"id", tok}, {"ids", {id}}, {"tokens", {tok}}};
    };
    if (parts.add_bos) add_special(parts.bos_id, "bos");
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (parts.add_eos) add_special(parts.eos_id, "eos");
    post = {{"type", "TemplateProcessing"}, {"single", single}, {"pair", json::array()}, {"special_tokens", special}};
  }

  json root = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", p.normalizer},
      {"pre_tokenizer", p.pre_tokenizer},
      {"post_processor", post},
      {"decoder", byte_level(false)},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", unk.empty() ? json(nullptr) : json(unk)},
        {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", p.ignore_merges || parts.ignore_merges},
        {"vocab", vocab},
        {"merges", parts.merges}}},
  };
  // The JSON text round trip costs a fraction of a second for a 150K vocabulary, once at load, and
  // keeps a single loader (and its validation) for both formats.
  std::string text;
  try {
    text = root.dump();
  } catch (const json::exception&) {
    fail("{}: a token or merge in tokenizer.ggml.* is not valid UTF-8", origin);
  }
  return from_json(text, origin);
}

}  // namespace spill
