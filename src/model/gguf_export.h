// Writes a loaded (and usually quantized) model as a GGUF file that llama.cpp loads: its tensor
// names (token_embd, blk.N.attn_q, blk.N.ffn_gate_exps, ...), its metadata keys for the
// architecture (`<arch>.block_count`, ...), the tokenizer as tokenizer.ggml.* and the chat
// template, as llama.cpp's convert_hf_to_gguf.py lays them out for the same Hugging Face folder.
// Used by `spill quantize`.
#pragma once
#include <string>

#include "model/model.h"

namespace spill {

struct GgufExportOptions {
  std::string hf_dir;  // the folder the model came from: tokenizer.json, tokenizer_config.json
  std::string name;    // general.name; "" -> the folder's name
  std::string quant;   // the --quant spec, recorded in general.quantized_by-style key spill.quant
};

// Throws spill::Error for an architecture or tokenizer llama.cpp's format cannot carry here.
void write_gguf(const Model& model, const std::string& path, const GgufExportOptions& options);

// The GGUF architecture name of a model ("qwen3moe", "llama", ...).
std::string gguf_arch_name(const ModelSpec& spec);

}  // namespace spill
