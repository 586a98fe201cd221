#include "cli/model_options.h"

#include <fmt/format.h>

#include "cli/commands.h"
#include "core/error.h"

namespace spill::cli {

std::vector<int32_t> parse_token_ids(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    std::string part = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || part.find_first_not_of(" 0123456789-") != std::string::npos || v < 0 || v > INT32_MAX)
      fail("{}: '{}' is not a token id (expected comma-separated non-negative integers, e.g. 1,2,3)", flag, part);
    ids.push_back(int32_t(v));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return ids;
}

std::string ModelFlags::dir() const { return model.empty() ? default_model_dir() : model; }

void add_model_flags(CLI::App* cmd, ModelFlags& flags) {
  cmd->add_option("--model", flags.model, "Hugging Face model folder or GGUF file (default: the bundled spill-tiny)");
  cmd->add_option("--quant", flags.quant,
                  "quantize the weights at load: a preset (q8_0, q6_k, q5_k_m, q4_k_m, q3_k_m, q2_k, iq4_xs, "
                  "mxfp4_moe, ...), class=type pairs (experts=q3_k,attention=q8_0,embed=q8_0,head=q6_k), or both "
                  "(q4_k_m,experts=q3_k); see docs/QUANT.md");
  cmd->add_option("--imatrix", flags.imatrix,
                  "importance matrix for --quant (llama.cpp's legacy imatrix.dat format)");
}

std::unique_ptr<Model> open_model(const ModelFlags& flags, int threads, bool quiet) {
  std::unique_ptr<Model> model = Model::load(flags.dir());
  quantize_as_flagged(*model, flags, threads, quiet);
  return model;
}

void quantize_as_flagged(Model& model, const ModelFlags& flags, int threads, bool quiet) {
  const QuantizeReport r =
      quantize_as_asked(model, {.quant = flags.quant, .imatrix = flags.imatrix, .n_threads = threads});
  if (!quiet && r.n_tensors)
    fmt::print(stderr, "[spill] quantized {} tensors ({}) in {:.2f} s: {:.2f} MiB -> {:.2f} MiB{}\n", r.n_tensors,
               quant::parse_quant_mix(flags.quant).str(), r.seconds, r.bytes_before / 1048576.0,
               r.bytes_after / 1048576.0,
               r.n_fallbacks ? fmt::format(", {} row-width fallbacks (spill info --quant lists them)", r.n_fallbacks)
                             : "");
}

}  // namespace spill::cli
