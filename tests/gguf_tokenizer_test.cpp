// Tokenizer::from_parts against Hugging Face `tokenizers`: each fixture tokenizer.json is turned
// into the parts a GGUF stores (as llama.cpp's converter does: vocabulary by id, added tokens as
// control (special) or user-defined tokens, merges as "a b") with the tokenizer.ggml.pre name
// that stands for its pipeline, and must give the ids HF computed (tests/data/tokenizer/cases.json).
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer.h"

namespace spill {
namespace {

using json = nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TokenizerParts parts_of(const std::string& tokenizer_json, const std::string& pre) {
  const json j = read_json(tokenizer_json);
  TokenizerParts p;
  p.origin = tokenizer_json + " as GGUF parts";
  p.pre = pre;
  const json& vocab = j["model"]["vocab"];
  size_t n = 0;
  for (const auto& [tok, id] : vocab.items()) n = std::max(n, id.get<size_t>() + 1);
  for (const json& a : j["added_tokens"]) n = std::max(n, a["id"].get<size_t>() + 1);
  p.tokens.assign(n, "");
  p.token_types.assign(n, 5);  // unused until filled
  for (const auto& [tok, id] : vocab.items()) {
    p.tokens[id.get<size_t>()] = tok;
    p.token_types[id.get<size_t>()] = 1;
  }
  for (const json& a : j["added_tokens"]) {
    p.tokens[a["id"].get<size_t>()] = a["content"].get<std::string>();
    p.token_types[a["id"].get<size_t>()] = a["special"].get<bool>() ? 3 : 4;
  }
  for (const json& m : j["model"]["merges"])
    p.merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  return p;
}

bool is_nfc(const std::string& s) {
  utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
  if (!out) return false;
  const bool same = s == reinterpret_cast<const char*>(out);
  std::free(out);
  return same;
}

struct Fixture {
  const char* name;  // in cases.json
  const char* path;  // under tests/data
  const char* pre;   // tokenizer.ggml.pre
  bool nfc_only;     // the fixture normalises with NFC but the pre name's pipeline does not
};

class FromParts : public ::testing::TestWithParam<Fixture> {};

TEST_P(FromParts, EncodesAsHuggingFaceDoes) {
  const Fixture f = GetParam();
  const std::string data = SPILL_TEST_DATA;
  const Tokenizer tok = Tokenizer::from_parts(parts_of(data + "/" + f.path, f.pre));
  const json cases = read_json(data + "/tokenizer/cases.json");
  size_t checked = 0;
  for (const json& c : cases["cases"]) {
    if (!c.contains("text") || !c["results"].contains(f.name)) continue;
    const std::string text = c["text"].get<std::string>();
    const json& r = c["results"][f.name];
    if (!r.contains("ids")) continue;
    if (f.nfc_only && !is_nfc(text)) continue;
    EXPECT_EQ(tok.encode(text), r["ids"].get<std::vector<int32_t>>()) << f.name << ": " << text;
    EXPECT_EQ(tok.decode(r["ids"].get<std::vector<int32_t>>()), r["decoded"].get<std::string>()) << text;
    ++checked;
  }
  EXPECT_GT(checked, 50u);
}

INSTANTIATE_TEST_SUITE_P(
    Pipelines, FromParts,
    ::testing::Values(Fixture{"trained", "tokenizer/trained/tokenizer.json", "qwen2", false},
                      Fixture{"llama3_style", "tokenizer/llama3_style/tokenizer.json", "llama-bpe", false},
                      Fixture{"deepseek_style", "tokenizer/deepseek_style/tokenizer.json", "deepseek-v3", true},
                      Fixture{"gpt2", "gpt2/tokenizer.json", "gpt-2", false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(FromParts, RefusesWhatItCannotRepresent) {
  TokenizerParts p;
  p.origin = "x.gguf";
  p.tokens = {"a", "b", "ab"};
  p.merges = {"a b"};
  p.pre = "qwen2";
  EXPECT_EQ(Tokenizer::from_parts(p).encode("ab"), std::vector<int32_t>{2});
  auto message = [](const TokenizerParts& q) {
    try {
      Tokenizer::from_parts(q);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  TokenizerParts bad = p;
  bad.pre = "chameleon";
  EXPECT_NE(message(bad).find("tokenizer.ggml.pre 'chameleon'"), std::string::npos);
  bad = p;
  bad.token_types = {1, 1};
  EXPECT_NE(message(bad).find("token_type has 2 entries"), std::string::npos);
  bad = p;
  bad.tokens = {"a", "a", "ab"};
  EXPECT_NE(message(bad).find("appears twice"), std::string::npos);
  bad = p;
  bad.token_types = {1, 1, 9};
  EXPECT_NE(message(bad).find("type 9"), std::string::npos);
  bad = p;
  bad.add_bos = true;
  bad.bos_id = 7;
  EXPECT_NE(message(bad).find("bos id (7)"), std::string::npos);
  bad = p;
  bad.tokens[2] = "\xff\xfe";
  EXPECT_NE(message(bad).find("x.gguf"), std::string::npos);
  bad = p;
  bad.add_bos = true;
  bad.bos_id = 0;
  EXPECT_EQ(Tokenizer::from_parts(bad).encode("ab", true), (std::vector<int32_t>{0, 2}));
}

// Odd parts a hostile file can hold give a spill::Error or a working tokenizer, never a crash.
TEST(FromParts, HostilePartsAreErrorsOrHarmless) {
  const std::vector<std::vector<std::string>> merge_lists = {{"ab"}, {"a b c"}, {" "}, {""}, {"a zz"}, {"a b", "a b"}};
  const std::vector<std::vector<std::string>> token_lists = {{"a", "b", "ab"}, {"", "b", "ab"}, {"a", "a", "a"}};
  const std::vector<std::vector<int32_t>> type_lists = {{1, 1, 1}, {3, 1, 1}, {4, 4, 4}, {2, 2, 1}, {5, 5, 5}, {6, 1, 1}};
  size_t built = 0, refused = 0;
  for (const auto& merges : merge_lists)
    for (const auto& tokens : token_lists)
      for (const auto& types : type_lists) {
        TokenizerParts p;
        p.origin = "hostile.gguf";
        p.tokens = tokens;
        p.token_types = types;
        p.merges = merges;
        p.pre = "qwen2";
        try {
          const Tokenizer t = Tokenizer::from_parts(p);
          (void)t.encode("ab ab\n<|x|>");
          (void)t.decode(std::vector<int32_t>{0, 1, 2, 3, -1});
          ++built;
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("hostile.gguf"), std::string::npos) << e.what();
          ++refused;
        }
      }
  EXPECT_GT(built, 0u);
  EXPECT_GT(refused, 0u);
}

}  // namespace
}  // namespace spill
