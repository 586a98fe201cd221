// The `spill` subcommands. Each lives in its own file under src/cli/ and only parses flags
// and calls the library.
#pragma once
#include <CLI/CLI.hpp>

#include "cli/model_path.h"

namespace spill::cli {

// Each adds a subcommand to app; the subcommand's callback does the work and may throw
// spill::Error, which main() prints.
void add_info_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_logits_command(CLI::App& app);
void add_run_batch_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_dequant_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_profile_command(CLI::App& app);
void add_topo_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_seats_command(CLI::App& app);

// A byte-size flag: a count of bytes, or a whole number with a binary unit (512M, 8G, 8GiB,
// 1T; K = 1024). Zero and negative sizes are refused. One parser for every command.
CLI::Option* add_size_option(CLI::App* cmd, const std::string& name, int64_t& bytes, const std::string& help);
// Accepts a finite number of `what` (e.g. "GB/s") above `min`, or from `min` on with min_allowed;
// anything else is refused as "expected GB/s, more than 0, got X". type_name: the --help placeholder.
CLI::Validator number_validator(double min, bool min_allowed, const std::string& what, const std::string& type_name);

}  // namespace spill::cli
