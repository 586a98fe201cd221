// The `spill` subcommands. Each lives in its own file under src/cli/ and only parses flags
// and calls the library.
#pragma once
#include <CLI/CLI.hpp>

namespace spill::cli {

// Each adds a subcommand to app; the subcommand's callback does the work and may throw
// spill::Error, which main() prints.
void add_info_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_logits_command(CLI::App& app);
void add_run_batch_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_seats_command(CLI::App& app);

// The model folder used when --model is not given: models/spill-tiny next to the installed
// executable or in the source tree it was built from.
std::string default_model_dir();

}  // namespace spill::cli
