// spill quantize: a Hugging Face folder -> a GGUF file in the types a --quant mix chooses, with
// llama.cpp's tensor names and metadata, so llama.cpp and spill can be measured on one file.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "engine/model_bundle.h"
#include "model/gguf_export.h"
#include "model/model.h"

namespace spill::cli {

void add_quantize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("quantize", "Write a Hugging Face model as a GGUF file (llama.cpp's layout), quantized "
                                             "with --quant");
  struct Args {
    ModelFlags model;
    std::string out, name;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  add_model_flags(cmd, a->model);
  cmd->add_option("--out", a->out, "output .gguf file")->required();
  cmd->add_option("--name", a->name, "general.name in the file (default: the folder's name)");
  cmd->add_option("--threads", a->threads, "CPU threads (default: all)");
  cmd->callback([a] {
    const std::string dir = a->model.dir();
    if (is_gguf_model_path(dir))
      fail("--model {}: spill quantize reads a Hugging Face folder (safetensors); this is a GGUF file", dir);
    if (a->model.quant.empty())
      fail("give --quant (a preset such as q4_k_m, or bf16 to write the weights as they are)");
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Model> model = open_model(a->model, a->threads);
    write_gguf(*model, a->out, {.hf_dir = dir, .name = a->name, .quant = a->model.quant});
    fmt::print(stderr, "wrote {} ({:.2f} MiB) in {:.2f} s\n", a->out,
               double(std::filesystem::file_size(a->out)) / 1048576.0,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });
}

}  // namespace spill::cli
