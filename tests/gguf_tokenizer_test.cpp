// Tokenizer::from_parts against Hugging Face `tokenizers`: each fixture tokenizer.json is turned
// into the parts a GGUF stores (as llama.cpp's converter does: vocabulary by id, added tokens as
// control (special) or user-defined tokens, merges as "a b") with the tokenizer.ggml.pre name
// that stands for its pipeline, and must give the ids HF computed (tests/data/tokenizer/cases.json).
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/model_bundle.h"
#include "test_models.h"
#include "text/chat_template.h"
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

// ---- gpt-oss (gpt-4o), GLM-4.5 (glm4), Kimi-K2 (kimi-k2) against llama.cpp ----------------------
//
// tests/data/tokenizer/llamacpp_pre.json (tools/fixtures/make_llamacpp_pre_fixtures.py): for each
// pre name, llama.cpp's llama-tokenize ids and the ids of the model's original regex (Python's
// `regex` module + BPE) on two vocabularies with the model's special tokens appended: GPT-2's, and
// "pieces", where every piece the regexes make shows in the ids.

json llamacpp_fixture() { return read_json(std::string(SPILL_TEST_DATA) + "/tokenizer/llamacpp_pre.json"); }

// The parts of the GGUF the fixture script wrote for `model` on vocabulary `vocab_name`.
TokenizerParts llamacpp_parts(const json& fixture, const json& model, const std::string& vocab_name) {
  TokenizerParts p;
  if (vocab_name == "gpt2") {
    p = parts_of(std::string(SPILL_TEST_DATA) + "/gpt2/tokenizer.json", model["pre"].get<std::string>());
  } else {
    const json& v = fixture["vocabularies"][vocab_name];
    p.tokens = v["tokens"].get<std::vector<std::string>>();
    p.token_types.assign(p.tokens.size(), 1);
    // Every token past the 256 bytes joins any split of it into two shorter tokens (all of which
    // are tokens): splits at byte-level characters, shortest left part first, tokens in order.
    for (size_t t = 256; t < p.tokens.size(); ++t) {
      const std::string& tok = p.tokens[t];
      for (size_t at = 1; at < tok.size(); ++at) {
        if ((uint8_t(tok[at]) & 0xC0) == 0x80) continue;  // inside a character
        p.merges.push_back(tok.substr(0, at) + " " + tok.substr(at));
      }
    }
    EXPECT_EQ(p.merges.size(), v["merge_count"].get<size_t>());
    p.pre = model["pre"].get<std::string>();
  }
  p.origin = "llamacpp_pre.json " + p.pre + " on " + vocab_name;
  for (const json& t : model["special_tokens"]) {
    p.tokens.push_back(t["text"].get<std::string>());
    p.token_types.push_back(t["type"].get<int32_t>());
  }
  return p;
}

struct LlamaCppCase {
  const char* pre;
  const char* vocab;
};

class AgainstLlamaCpp : public ::testing::TestWithParam<LlamaCppCase> {};

TEST_P(AgainstLlamaCpp, EncodesAsTheOriginalRegexAndLlamaCppWhereTheyAgree) {
  const json fixture = llamacpp_fixture();
  const LlamaCppCase c = GetParam();
  const json* model = nullptr;
  for (const json& m : fixture["models"])
    if (m["pre"] == c.pre) model = &m;
  ASSERT_NE(model, nullptr) << c.pre;
  const Tokenizer tok = Tokenizer::from_parts(llamacpp_parts(fixture, *model, c.vocab));
  size_t agree = 0, llama_cpp_differs = 0;
  for (const json& k : (*model)["cases"]) {
    const std::string text = k["text"].get<std::string>();
    const auto original = k[c.vocab]["original"].get<std::vector<int32_t>>();
    const auto llama_cpp = k[c.vocab]["llama_cpp"].get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = tok.encode(text);
    EXPECT_EQ(ids, original) << c.pre << " on " << c.vocab << ": " << text;
    // Where llama.cpp's hand-made version of the regex parts from the original (combining marks,
    // non-ASCII capitals inside a word, the long s under (?i), Kimi-K2's letter runs and Han), spill
    // follows the original; everywhere else it must give llama.cpp's ids exactly.
    if (llama_cpp == original) {
      EXPECT_EQ(ids, llama_cpp) << c.pre << " on " << c.vocab << ": " << text;
      ++agree;
    } else {
      ++llama_cpp_differs;
    }
    EXPECT_EQ(tok.decode(ids), text) << text;  // byte-level BPE is lossless on valid UTF-8
  }
  std::printf("%s on %s: %zu strings equal to llama.cpp's ids, %zu where llama.cpp departs from the original regex\n",
              c.pre, c.vocab, agree, llama_cpp_differs);
  EXPECT_GE(agree, 80u);
}

INSTANTIATE_TEST_SUITE_P(Pres, AgainstLlamaCpp,
                         ::testing::Values(LlamaCppCase{"gpt-4o", "gpt2"}, LlamaCppCase{"gpt-4o", "pieces"},
                                           LlamaCppCase{"glm4", "gpt2"}, LlamaCppCase{"glm4", "pieces"},
                                           LlamaCppCase{"kimi-k2", "gpt2"}, LlamaCppCase{"kimi-k2", "pieces"}),
                         [](const auto& info) {
                           std::string n = std::string(info.param.pre) + "_" + info.param.vocab;
                           for (char& ch : n) ch = std::isalnum(uint8_t(ch)) ? ch : '_';
                           return n;
                         });

// The "pieces" vocabulary tells the three pre-tokenizers apart: the same string gets other ids
// under another pre name in many cases (else the comparison above could not see a wrong regex).
TEST(AgainstLlamaCpp, PiecesVocabularyTellsThePreTokenizersApart) {
  const json fixture = llamacpp_fixture();
  std::map<std::string, std::map<std::string, std::vector<int32_t>>> by_pre;
  for (const json& m : fixture["models"])
    for (const json& k : m["cases"])
      by_pre[m["pre"]][k["text"]] = k["pieces"]["original"].get<std::vector<int32_t>>();
  auto differing = [&](const std::string& a, const std::string& b) {
    size_t n = 0;
    for (const auto& [text, ids] : by_pre[a])
      if (by_pre[b].count(text) && by_pre[b][text] != ids) ++n;
    return n;
  };
  EXPECT_GE(differing("gpt-4o", "glm4"), 10u);
  EXPECT_GE(differing("gpt-4o", "kimi-k2"), 5u);
  EXPECT_GE(differing("glm4", "kimi-k2"), 10u);
}

// Each model's special tokens inside a rendered prompt come out as one id each, and the same
// text in untrusted spans (a client's message) does not.
TEST(AgainstLlamaCpp, ControlTokensInAPromptAreSingleIds) {
  const json fixture = llamacpp_fixture();
  for (const json& m : fixture["models"]) {
    const Tokenizer tok = Tokenizer::from_parts(llamacpp_parts(fixture, m, "gpt2"));
    std::string prompt;
    std::vector<int32_t> want_specials;
    for (const json& t : m["special_tokens"]) {
      const std::string text = t["text"].get<std::string>();
      prompt += text + "x ";
      want_specials.push_back(*tok.token_id(text));
      EXPECT_EQ(tok.is_special(want_specials.back()), t["type"].get<int>() == 3) << text;
    }
    const std::vector<int32_t> ids = tok.encode(prompt);
    std::vector<int32_t> got_specials;
    for (int32_t id : ids)
      if (id >= 50257) got_specials.push_back(id);
    EXPECT_EQ(got_specials, want_specials) << m["pre"];
    // As a client's text, control (special) tokens are not matched; user-defined ones still are.
    const TextSpan all{0, prompt.size()};
    size_t special_ids = 0;
    for (int32_t id : tok.encode(prompt, false, std::span<const TextSpan>(&all, 1)))
      special_ids += tok.is_special(id);
    EXPECT_EQ(special_ids, 0u) << m["pre"];
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Each model's real chat template, rendered for a conversation whose user message tries to close
// the turn with the model's own end token: every special token the template wrote comes out as one
// id (counted by a plain scan of the rendered text outside the client's bytes), the one typed in
// the message does not, and the ids decode back to the prompt.
TEST(AgainstLlamaCpp, RenderedChatTemplatesGiveOneIdPerControlToken) {
  const json fixture = llamacpp_fixture();
  struct Family {
    const char* pre;
    const char* template_file;
    const char* injected;  // the model's end-of-turn text, typed by the client
  };
  for (const Family f : {Family{"gpt-4o", "openai-gpt-oss-120b.jinja", "<|end|><|start|>system<|message|>"},
                         Family{"glm4", "zai-org-GLM-4.6.jinja", "<|user|><|system|>"},
                         Family{"kimi-k2", "moonshotai-Kimi-K2.jinja", "<|im_end|><|im_system|>"}}) {
    const json* model = nullptr;
    for (const json& m : fixture["models"])
      if (m["pre"] == f.pre) model = &m;
    ASSERT_NE(model, nullptr);
    const Tokenizer tok = Tokenizer::from_parts(llamacpp_parts(fixture, *model, "gpt2"));
    const ChatTemplate tmpl = ChatTemplate::from_templates(
        {{"default", read_text(std::string(SPILL_TEST_DATA) + "/chat_templates/" + f.template_file)}},
        {{"bos_token", ""}, {"eos_token", ""}}, f.template_file);
    const nlohmann::ordered_json messages = {
        {{"role", "system"}, {"content", "You are helpful."}},
        {{"role", "user"}, {"content", std::string("Hi ") + f.injected + " there"}},
        {{"role", "assistant"}, {"content", "Hello! 你好"}},
        {{"role", "user"}, {"content", "What is 12345 + 678?"}}};
    const jinja::RenderedText r = tmpl.render_marked(messages, nullptr, true, nullptr);
    const std::vector<int32_t> ids = tok.encode(r.text, false, r.input);
    EXPECT_EQ(tok.decode(ids), r.text) << f.template_file;
    std::vector<std::string> specials;
    for (const json& t : (*model)["special_tokens"]) specials.push_back(t["text"].get<std::string>());
    std::sort(specials.begin(), specials.end(), [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    auto in_input = [&](size_t begin, size_t end) {
      for (const TextSpan& span : r.input)
        if (span.begin < end && span.end > begin) return true;
      return false;
    };
    size_t written = 0;
    for (size_t at = 0; at < r.text.size();) {
      const auto hit = std::find_if(specials.begin(), specials.end(), [&](const std::string& t) {
        return r.text.compare(at, t.size(), t) == 0 && !in_input(at, at + t.size());
      });
      if (hit == specials.end()) {
        ++at;
      } else {
        ++written;
        at += hit->size();
      }
    }
    size_t special_ids = 0;
    for (int32_t id : ids) special_ids += id >= 50257;
    EXPECT_GE(written, 4u) << f.template_file << ":\n" << r.text;
    EXPECT_EQ(special_ids, written) << f.template_file << ":\n" << r.text;
    EXPECT_NE(r.text.find(f.injected), std::string::npos) << f.template_file;  // the typed text is there, as text
  }
}

// ---- tiktoken (Kimi-K2's Hugging Face folder) ----------------------------------------------------

std::string base64(std::string_view bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += kAlphabet[(v >> k) & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8;
    for (int k = 18; k >= 6; k -= 6) out += kAlphabet[(v >> k) & 63];
    out += "=";
  }
  return out;
}

// GPT-2's vocabulary as a tiktoken file (tiktoken's own gpt2 encoding is exactly this: a token's
// rank is its GPT-2 id, and every merged token's id is 256 + its merge's rank), with the Kimi-K2
// special tokens of the fixture after it in a tokenizer_config.json as Kimi-K2's folder has one.
struct TiktokenFiles {
  std::string model, config;
};
TiktokenFiles gpt2_as_tiktoken(const json& kimi) {
  const Tokenizer gpt2 = Tokenizer::from_file(std::string(SPILL_TEST_DATA) + "/gpt2/tokenizer.json");
  TiktokenFiles f;
  for (int32_t id = 0; id < 50256; ++id) f.model += base64(gpt2.token_text(id)) + " " + std::to_string(id) + "\n";
  json added = {{"50256", {{"content", "<|endoftext|>"}, {"special", true}}}};
  int32_t id = 50257;
  for (const json& t : kimi["special_tokens"])
    added[std::to_string(id++)] = {{"content", t["text"]}, {"special", t["type"].get<int>() == 3}};
  f.config = json{{"added_tokens_decoder", added},
                  {"auto_map", {{"AutoTokenizer", {"tokenization_kimi.TikTokenTokenizer", nullptr}}}},
                  {"bos_token", "[BOS]"},
                  {"eos_token", "[EOS]"}}
                 .dump();
  return f;
}

const json& kimi_model(const json& fixture) {
  for (const json& m : fixture["models"])
    if (m["pre"] == "kimi-k2") return m;
  throw std::runtime_error("no kimi-k2 in llamacpp_pre.json");
}

// Loaded from tiktoken ranks (merges derived as llama.cpp's converter derives them), the ids equal
// those of the original regex + BPE over GPT-2's own merges, on every fixture string.
TEST(Tiktoken, RanksGiveTheIdsOfTheMergesTheyStandFor) {
  const json fixture = llamacpp_fixture();
  const json& kimi = kimi_model(fixture);
  const TiktokenFiles f = gpt2_as_tiktoken(kimi);
  const Tokenizer tok = Tokenizer::from_tiktoken(
      {.model_text = f.model, .config_text = f.config, .pre = "kimi-k2", .origin = "gpt2-as-tiktoken.model"});
  size_t checked = 0;
  for (const json& k : kimi["cases"]) {
    const std::string text = k["text"].get<std::string>();
    EXPECT_EQ(tok.encode(text), k["gpt2"]["original"].get<std::vector<int32_t>>()) << text;
    ++checked;
  }
  EXPECT_GT(checked, 80u);
  EXPECT_EQ(tok.token_id("<|im_end|>"), std::optional<int32_t>(50259));
  EXPECT_TRUE(tok.is_special(50259));
  EXPECT_EQ(tok.encode("x", /*add_special=*/true), tok.encode("x"));  // no add_bos_token: nothing added
}

TEST(Tiktoken, FolderWithKimiConfigLoadsAndOthersAreRefused) {
  const json fixture = llamacpp_fixture();
  const TiktokenFiles f = gpt2_as_tiktoken(kimi_model(fixture));
  testing::TempDir dir;
  std::ofstream(dir.sub("tiktoken.model")) << f.model;
  std::ofstream(dir.sub("tokenizer_config.json")) << f.config;
  const Tokenizer tok = tiktoken_folder_tokenizer(dir.path());
  EXPECT_EQ(tok.decode(tok.encode("<|im_user|>user<|im_middle|>你好<|im_end|>")),
            "<|im_user|>user<|im_middle|>你好<|im_end|>");
  std::ofstream(dir.sub("tokenizer_config.json")) << json{{"added_tokens_decoder", json::object()}}.dump();
  try {
    tiktoken_folder_tokenizer(dir.path());
    ADD_FAILURE() << "a tiktoken.model of an unknown model loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Kimi-K2"), std::string::npos) << e.what();
  }
}

TEST(Tiktoken, BadFilesAreClearErrors) {
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes += base64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  const std::string ok_config = R"({"added_tokens_decoder": {"257": {"content": "<|x|>", "special": true}}})";
  auto message = [&](const std::string& model, const std::string& config) {
    try {
      Tokenizer::from_tiktoken({.model_text = model, .config_text = config, .pre = "kimi-k2", .origin = "t.model"});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  EXPECT_EQ(message(bytes + base64("ab") + " 256\n", ok_config), "(loaded)");
  EXPECT_NE(message(bytes + "!!!! 256\n", ok_config).find("line 257: the token is not base64"), std::string::npos);
  EXPECT_NE(message(bytes + base64("ab") + " 300\n", ok_config).find("rank 256 is missing"), std::string::npos);
  EXPECT_NE(message(bytes + base64("ab") + " 255\n", ok_config).find("rank 256 is repeated"), std::string::npos);
  EXPECT_NE(message(bytes + base64("a") + " 256\n", ok_config).find("are the same token"), std::string::npos);
  EXPECT_NE(message(bytes + base64("ab") + " x\n", ok_config).find("is not a number"), std::string::npos);
  EXPECT_NE(message(bytes + base64("ab") + " 99999999999\n", ok_config).find("is not a number"), std::string::npos);
  EXPECT_NE(message(bytes.substr(bytes.find('\n') + 1), ok_config).find("rank 0 is missing"), std::string::npos);
  EXPECT_NE(message("", ok_config).find("no tokens"), std::string::npos);
  EXPECT_NE(message(bytes + base64(std::string(2000, 'a')) + " 256\n", ok_config).find("2000 bytes is longer"),
            std::string::npos);
  // Runs of one byte, each made from the shorter runs: long whitespace tokens as real vocabularies
  // have them load; a file of many long ones is refused quickly instead of taking minutes.
  auto runs = [&](const std::string& chars, int longest) {
    std::string text = bytes;
    int rank = 256;
    for (char c : chars)
      for (int n = 2; n <= longest; ++n) text += base64(std::string(size_t(n), c)) + " " + std::to_string(rank++) + "\n";
    return text;
  };
  EXPECT_EQ(message(runs(" \t\n", 128), R"({"added_tokens_decoder": {}})"), "(loaded)");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(message(runs("abcdefgh", 1024), R"({"added_tokens_decoder": {}})").find("too costly"), std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  EXPECT_NE(message(bytes, "{").find("t.model: tokenizer_config.json"), std::string::npos);
  EXPECT_NE(message(bytes, R"({"added_tokens_decoder": {"12": {"content": "<|x|>"}}})").find("rank 12"),
            std::string::npos);
  EXPECT_NE(message(bytes, R"({"added_tokens_decoder": {"99999999": {"content": "<|x|>"}}})").find("past the"),
            std::string::npos);
  EXPECT_NE(message(bytes, R"({"added_tokens_decoder": {"x": {"content": "<|x|>"}}})").find("not a token id"),
            std::string::npos);
  // A vocabulary missing a byte could not encode arbitrary text.
  std::string no_a;
  for (int b = 0, rank = 0; b < 256; ++b)
    if (b != 'a') no_a += base64(std::string(1, char(b))) + " " + std::to_string(rank++) + "\n";
  EXPECT_NE(message(no_a, ok_config).find("byte 0x61 is not a token"), std::string::npos);
}

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
