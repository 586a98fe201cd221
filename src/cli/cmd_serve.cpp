// spill serve: the OpenAI- and Anthropic-compatible HTTP server.
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "engine/open_engine.h"
#include "server/http_server.h"

namespace spill::cli {

void add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI- and Anthropic-compatible HTTP server (see docs/API.md)");
  auto a = std::make_shared<server::ServerOptions>();
  server::ServerOptions& o = *a;
  cmd->add_option("--model", o.model_dir, "Hugging Face model folder or GGUF file (default: the bundled spill-tiny)");
  cmd->add_option("--quant", o.quant, "quantize the weights at load (see spill info --help, docs/QUANT.md)");
  cmd->add_option("--imatrix", o.imatrix, "importance matrix for --quant (llama.cpp legacy imatrix.dat)");
  cmd->add_option("--host", o.host, "address to listen on (loopback by default; 0.0.0.0 for every interface)")
      ->capture_default_str();
  cmd->add_option("--port", o.port, "TCP port; 0 picks a free one (printed on the listening line)")->capture_default_str();
  cmd->add_option("--api-key", o.api_key,
                  "require this key as 'Authorization: Bearer KEY' or 'x-api-key: KEY' on /v1 endpoints")
      ->envname("SPILL_API_KEY");
  cmd->add_option("--served-model-name", o.served_model_name, "model id in /v1/models (default: the folder's name)");
  cmd->add_option("--max-seqs", o.max_seqs, "sequences generated at once (default: the engine's, 64)");
  cmd->add_option("--max-waiting", o.max_waiting, "requests queued before new ones get 503 (default: the engine's)");
  cmd->add_option("--max-model-len", o.max_model_len,
                  "longest prompt + output in tokens (default: the model's context, capped by the KV cache)");
  add_size_option(cmd, "--kv-mem", o.kv_mem_bytes, "KV cache size (default: 4 full contexts, at most 2 GiB)");
  add_kv_format_option(cmd, o.kv_format);
  cmd->add_option("--threads", o.threads, "CPU threads for the model (default: all)");
  cmd->add_option("--device", o.device,
                  "where the model runs: cpu, cuda (cuda:N for the N-th GPU; cuda:N,M,... for the GPUs of an "
                  "expert-parallel --plan, in its order) or auto (cuda when this build has a CUDA runner and a usable "
                  "GPU is present, else cpu)")
      ->capture_default_str();
  add_plan_option(cmd, o.expert_plan);
  add_placement_options(cmd, o.placement);
  cmd->add_option("--max-body-bytes", o.max_body_bytes, "largest request body accepted; larger ones get 413")
      ->capture_default_str();
  cmd->add_option("--ping-interval", o.ping_interval_s,
                  "seconds of silence after which a stream gets a keep-alive ping (also how soon a vanished client "
                  "is noticed)")
      ->capture_default_str();
  cmd->add_option("--record-profile", o.record_profile,
                  "count expert routings of live traffic and rewrite this profile file periodically (spill plan "
                  "--profile FILE reads it)");
  cmd->add_option("--record-profile-interval", o.record_profile_interval_s, "seconds between rewrites of the profile")
      ->capture_default_str();
  cmd->add_flag("--strict-max-tokens", o.strict_max_tokens,
                "refuse (400) a max_tokens larger than the room the prompt leaves, instead of clamping it to that room");
  cmd->add_option("--max-tokens", o.max_tokens_cap,
                  "most tokens one reply may generate, whatever the request asks (0: up to the end of the context)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--responses-store", o.responses_store,
                  "how many /v1/responses to keep for previous_response_id and GET /v1/responses/ID (0: none)")
      ->capture_default_str();
  cmd->callback([a] {
    // Before the device check below starts the CUDA driver's threads: they must inherit the mask.
    server::block_shutdown_signals();
    server::ServerOptions options = *a;
    if (options.model_dir.empty()) options.model_dir = default_model_dir();
    if (options.max_seqs < 0) fail("--max-seqs must be positive, got {}", options.max_seqs);
    if (options.max_model_len < 0) fail("--max-model-len must be positive, got {}", options.max_model_len);
    (void)resolve_device(parse_device(options.device));  // an impossible --device fails before anything starts
    const int code = server::serve(options);
    // CLI11 turns a RuntimeError into this exit code without printing anything more: serve()
    // has already said what went wrong.
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace spill::cli
