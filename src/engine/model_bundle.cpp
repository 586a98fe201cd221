#include "engine/model_bundle.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/generation_config.h"
#include "formats/gguf.h"

namespace spill {

namespace fs = std::filesystem;

bool is_gguf_model_path(const std::string& path) { return gguf::is_gguf_path(path); }

namespace {

std::vector<std::string> strings_of(const gguf::Metadata& md, const char* key) {
  std::vector<std::string> out;
  if (const std::vector<gguf::Value>* items = md.string_array(key)) {
    out.reserve(items->size());
    for (const gguf::Value& v : *items) out.push_back(v.s);
  }
  return out;
}

int32_t token_id_key(const gguf::Metadata& md, const char* key, size_t n_tokens) {
  if (!md.has(key)) return -1;
  const int64_t id = md.integer(key);
  if (id < 0 || uint64_t(id) >= n_tokens)
    fail("{}: {} = {} is not a token id (the vocabulary has {} tokens)", md.where(), key, id, n_tokens);
  return int32_t(id);
}

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

// Kimi-K2's folder has no tokenizer.json: its tokenizer is tiktoken.model with the regex of
// tokenization_kimi.py (named by tokenizer_config.json's auto_map), spill's "kimi-k2" pipeline.
Tokenizer tiktoken_folder_tokenizer(const std::string& dir) {
  const fs::path model = fs::path(dir) / "tiktoken.model", config = fs::path(dir) / "tokenizer_config.json";
  if (!fs::exists(config))
    fail("{}: tiktoken.model needs the tokenizer_config.json next to it (its special tokens)", dir);
  const std::string config_text = read_text_file(config);
  if (config_text.find("tokenization_kimi") == std::string::npos)
    fail("{}: a tiktoken.model without tokenizer.json; spill knows the pre-tokenizer of Kimi-K2's "
         "(tokenization_kimi.py) only, and tokenizer_config.json does not name it. Give the folder a tokenizer.json",
         dir);
  const std::string model_text = read_text_file(model);
  return Tokenizer::from_tiktoken(
      {.model_text = model_text, .config_text = config_text, .pre = "kimi-k2", .origin = model.string()});
}

Tokenizer gguf_tokenizer(const gguf::GgufFile& file) {
  const gguf::Metadata& md = file.metadata();
  const std::string model = md.string("tokenizer.ggml.model", "");
  if (model.empty()) fail("{}: the file has no tokenizer (tokenizer.ggml.model is missing)", file.path());
  if (model != "gpt2")
    fail("{}: tokenizer.ggml.model is '{}'; spill reads byte-level BPE tokenizers ('gpt2') only{}", file.path(), model,
         model == "llama" ? " (this is a SentencePiece vocabulary, as Llama-2 and Mistral use)" : "");
  TokenizerParts parts;
  parts.origin = file.path();
  parts.tokens = strings_of(md, "tokenizer.ggml.tokens");
  if (parts.tokens.empty()) fail("{}: tokenizer.ggml.tokens is missing or empty", file.path());
  for (int64_t t : md.integer_array("tokenizer.ggml.token_type")) {
    if (t < INT32_MIN || t > INT32_MAX) fail("{}: tokenizer.ggml.token_type holds {}", file.path(), t);
    parts.token_types.push_back(int32_t(t));
  }
  parts.merges = strings_of(md, "tokenizer.ggml.merges");
  parts.pre = md.string("tokenizer.ggml.pre", "default");
  parts.bos_id = token_id_key(md, "tokenizer.ggml.bos_token_id", parts.tokens.size());
  parts.eos_id = token_id_key(md, "tokenizer.ggml.eos_token_id", parts.tokens.size());
  parts.add_bos = md.boolean("tokenizer.ggml.add_bos_token", false);
  parts.add_eos = md.boolean("tokenizer.ggml.add_eos_token", false);
  return Tokenizer::from_parts(parts);
}

ChatTemplate gguf_chat_template(const gguf::GgufFile& file) {
  const gguf::Metadata& md = file.metadata();
  std::map<std::string, std::string> templates;
  const std::string prefix = "tokenizer.chat_template";
  for (const auto& [key, value] : md.entries()) {
    if (key == prefix) templates["default"] = md.string(key);
    else if (key.rfind(prefix + ".", 0) == 0) templates[key.substr(prefix.size() + 1)] = md.string(key);
  }
  // The named tokens a template sees, as tokenizer_config.json would name them.
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  const std::vector<std::string> tokens = strings_of(md, "tokenizer.ggml.tokens");
  for (auto [name, key] : {std::pair{"bos_token", "tokenizer.ggml.bos_token_id"},
                           {"eos_token", "tokenizer.ggml.eos_token_id"},
                           {"unk_token", "tokenizer.ggml.unknown_token_id"},
                           {"pad_token", "tokenizer.ggml.padding_token_id"}}) {
    const int32_t id = token_id_key(md, key, tokens.size());
    if (id >= 0) special[name] = tokens[size_t(id)];
  }
  return ChatTemplate::from_templates(templates, special, file.path());
}

ModelBundle open_model_bundle(const std::string& path, bool require_tokenizer) {
  ModelBundle b;
  if (is_gguf_model_path(path)) {
    std::shared_ptr<const gguf::GgufFile> file = gguf::GgufFile::open(path);
    ModelSpec spec = gguf_model_spec(*file);
    // A file without a tokenizer (tokenizer.ggml.model absent or "none", as random benchmark files
    // are) serves token ids only; any other tokenizer is checked up front, before the weights.
    const std::string tokenizer_model = file->metadata().string("tokenizer.ggml.model", "");
    if (require_tokenizer || !(tokenizer_model.empty() || tokenizer_model == "none")) {
      b.tokenizer = gguf_tokenizer(*file);
      if (b.tokenizer->vocab_size() > spec.vocab_size)
        fail("{}: the tokenizer has {} tokens but token_embd.weight only {} rows", path, b.tokenizer->vocab_size(),
             spec.vocab_size);
    }
    b.sampling = sampling_defaults_from_gguf(file->metadata());
    auto source = open_gguf_source(file, spec);
    b.model = Model::from_source(std::move(spec), std::move(source));
    return b;
  }
  b.model = Model::load(path);
  const std::string tok_path = (fs::path(path) / "tokenizer.json").string();
  if (fs::exists(tok_path)) {
    b.tokenizer = Tokenizer::from_file(tok_path);
  } else if (fs::exists(fs::path(path) / "tiktoken.model")) {
    b.tokenizer = tiktoken_folder_tokenizer(path);
  } else if (require_tokenizer) {
    fail("{}: no tokenizer.json; it is needed to turn text into tokens (give token ids instead of text)", path);
  }
  b.sampling = load_sampling_defaults(path);
  return b;
}

ChatTemplate open_chat_template(const std::string& path) {
  if (is_gguf_model_path(path)) return gguf_chat_template(*gguf::GgufFile::open(path));
  return ChatTemplate::from_model_dir(path);
}

std::string chat_template_sources(const std::string& path) {
  std::string all;
  if (!is_gguf_model_path(path)) return all;
  auto file = gguf::GgufFile::open(path);
  for (const auto& [key, value] : file->metadata().entries())
    if (key.rfind("tokenizer.chat_template", 0) == 0 && value.type == gguf::ValueType::String) all += value.s;
  return all;
}

}  // namespace spill
