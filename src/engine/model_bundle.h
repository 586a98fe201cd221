// Opens what `--model PATH` names, in one place for every command: a Hugging Face folder
// (config.json, safetensors, tokenizer.json, chat template files) or a GGUF file (a path ending
// in .gguf, or the first shard of a split model), which carries weights, tokenizer and chat
// template in one file.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "sampling/sampler.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace spill {

namespace gguf {
class GgufFile;
class Metadata;
}  // namespace gguf

struct ModelBundle {
  std::unique_ptr<Model> model;
  std::optional<Tokenizer> tokenizer;  // absent only for a folder without tokenizer.json (or tiktoken.model)
  SamplingParams sampling;  // the model's own defaults (engine/generation_config)
};

// Loads model and tokenizer; with `require_tokenizer`, a folder without tokenizer.json is an
// error that says so. Throws spill::Error naming the file and what is wrong.
ModelBundle open_model_bundle(const std::string& path, bool require_tokenizer);

// Whether `path` names a GGUF model rather than a folder.
bool is_gguf_model_path(const std::string& path);

// The model's chat template(s) and the special tokens they see: from the folder's files, or from
// a GGUF's tokenizer.chat_template (and tokenizer.chat_template.<name>) with bos/eos/pad/unk tokens
// named by their ids. has_template() is false when the model brings none.
ChatTemplate open_chat_template(const std::string& path);
// The template sources, for callers that look at what the template teaches (<think>, tool calls).
std::string chat_template_sources(const std::string& path);

// The tokenizer a GGUF file describes (tokenizer.ggml.*). Refuses tokenizer models other than
// byte-level BPE ("gpt2"), naming the one found.
Tokenizer gguf_tokenizer(const gguf::GgufFile& file);
// A folder's tiktoken.model (Kimi-K2's, recognised by its tokenizer_config.json) as a Tokenizer.
Tokenizer tiktoken_folder_tokenizer(const std::string& dir);
ChatTemplate gguf_chat_template(const gguf::GgufFile& file);

}  // namespace spill
