// The flags every command that opens a model shares (--model, --quant, --imatrix), and the one
// place that opens it, so a model is opened the same way by generate, logits, eval, info, ...
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "model/quantize_on_load.h"

namespace spill::cli {

struct ModelFlags {
  std::string model;    // "": the bundled spill-tiny
  std::string quant;    // "": weights as stored
  std::string imatrix;  // "": none
  // The folder to open: --model, else the bundled model.
  std::string dir() const;
};

// Adds --model, --quant and --imatrix to cmd, writing into flags (which must outlive cmd).
void add_model_flags(CLI::App* cmd, ModelFlags& flags);

// Quantizes a loaded model as the flags ask, on `threads` CPU threads; says so on stderr (what,
// how long, how big) unless quiet.
void quantize_as_flagged(Model& model, const ModelFlags& flags, int threads, bool quiet = false);
// Model::load of the flags' path (folder or GGUF), then quantize_as_flagged: for commands that
// need no tokenizer (logits, info, a reference model); the others open a ModelBundle.
std::unique_ptr<Model> open_model(const ModelFlags& flags, int threads, bool quiet = false);

// "1,2,3" -> ids; a clear error naming `flag` for anything else.
std::vector<int32_t> parse_token_ids(const std::string& text, const char* flag);

}  // namespace spill::cli
