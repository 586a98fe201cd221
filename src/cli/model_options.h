// The flags every command that opens a model shares (--model, --quant, --imatrix), and the one
// place that opens it, so a model is opened the same way by generate, logits, eval, info, ...
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/open_engine.h"
#include "model/quantize_on_load.h"
#include "model/synthetic_source.h"

namespace spill::cli {

struct ModelFlags {
  std::string model;    // "": the bundled spill-tiny
  std::string quant;    // "": weights as stored
  std::string imatrix;  // "": none
  std::string synthetic;     // a config.json: random weights of that shape in the --quant types
  std::string routing_skew;  // "zipf:S" for a synthetic model; "": uniform routing
  // The folder to open: --model, else the bundled model.
  std::string dir() const;
};

// Adds --model, --quant, --imatrix, --synthetic and --routing-skew to cmd, writing into flags
// (which must outlive cmd).
void add_model_flags(CLI::App* cmd, ModelFlags& flags);

// Quantizes a loaded model as the flags ask, on `threads` CPU threads; says so on stderr (what,
// how long, how big) unless quiet.
void quantize_as_flagged(Model& model, const ModelFlags& flags, int threads, bool quiet = false);
// Model::load of the flags' path (folder or GGUF), then quantize_as_flagged: for commands that
// need no tokenizer (logits, info, a reference model); the others open a ModelBundle. With
// --synthetic, the synthetic model instead; `fill` false leaves its weights unwritten (sizes only).
std::unique_ptr<Model> open_model(const ModelFlags& flags, int threads, bool quiet = false, bool fill = true);
// A synthetic model of --synthetic's shape, each tensor in the type --quant gives it (planned by
// the same quantization plan a real checkpoint gets), routing skewed as --routing-skew says.
std::unique_ptr<Model> open_synthetic_model(const ModelFlags& flags, int threads, bool quiet, SyntheticFill fill);

// --device cpu|cuda|cuda:N|auto into device (which must outlive cmd); a bad value is a
// spill::Error at parse time. Every command that runs a model has it (engine/open_engine.h).
CLI::Option* add_device_option(CLI::App* cmd, DeviceChoice& device);

// --kv-format f32|bf16|fp8 into format (which must outlive cmd); a bad value is a spill::Error at parse
// time. Every command that runs a model has it (RunnerOptions::kv_format).
CLI::Option* add_kv_format_option(CLI::App* cmd, std::optional<KvFormat>& format);

// --plan FILE into path (which must outlive cmd): the placement plan a GPU runner executes.
CLI::Option* add_plan_option(CLI::App* cmd, std::string& path);
// --gpu-mem, --host-experts, --host-mem: the planner's flags at start-up (offload::plan_at_startup).
void add_placement_options(CLI::App* cmd, offload::StartupPlacement& placement);
// "1,2,3" -> ids; a clear error naming `flag` for anything else.
std::vector<int32_t> parse_token_ids(const std::string& text, const char* flag);

}  // namespace spill::cli
