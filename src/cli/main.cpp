// spill: serve Mixture-of-Experts models larger than the GPU.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"spill: inference for Mixture-of-Experts models bigger than the GPU"};
  app.set_version_flag("--version", std::string("spill ") + SPILL_VERSION);
  app.require_subcommand(1);
  spill::cli::add_info_command(app);

  spill::cli::add_logits_command(app);
  spill::cli::add_generate_command(app);
  spill::cli::add_run_batch_command(app);
  spill::cli::add_serve_command(app);
  spill::cli::add_eval_command(app);
  spill::cli::add_dequant_command(app);
  spill::cli::add_quantize_command(app);
  spill::cli::add_plan_command(app);
  spill::cli::add_profile_command(app);
  spill::cli::add_topo_command(app);
  spill::cli::add_bench_command(app);
  spill::cli::add_seats_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const spill::Error& e) {
    std::fprintf(stderr, "spill: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spill: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
