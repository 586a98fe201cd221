// spill serve: the OpenAI- and Anthropic-compatible HTTP server.
#include <cctype>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "server/http_server.h"

namespace spill::cli {

namespace {

// "8589934592", "8G", "512MiB", "1.5GB" -> bytes (binary units: K = 1024).
int64_t parse_bytes(const std::string& text, const char* flag) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    fail("{} must be a size in bytes such as 8589934592, 8G or 512M, got \"{}\"", flag, text);
  }
  std::string unit = text.substr(end);
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (unit.ends_with("IB")) unit.erase(unit.size() - 2);
  else if (unit.ends_with("B")) unit.pop_back();
  double scale = 1;
  if (unit == "K") scale = 1024.0;
  else if (unit == "M") scale = 1024.0 * 1024;
  else if (unit == "G") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty()) fail("{}: unknown unit \"{}\" in \"{}\"; use K, M, G or T", flag, unit, text);
  if (!(value > 0)) fail("{} must be positive, got \"{}\"", flag, text);
  return int64_t(value * scale);
}

struct ServeArgs {
  server::ServerOptions options;
  std::string kv_mem;
};

}  // namespace

void add_serve_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI- and Anthropic-compatible HTTP server (see docs/API.md)");
  auto a = std::make_shared<ServeArgs>();
  server::ServerOptions& o = a->options;
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
  cmd->add_option("--kv-mem", a->kv_mem, "KV cache size in bytes, e.g. 8G (default: 4 full contexts, at most 2 GiB)");
  cmd->add_option("--threads", o.threads, "CPU threads for the model (default: all)");
  cmd->add_option("--max-body-bytes", o.max_body_bytes, "largest request body accepted; larger ones get 413")
      ->capture_default_str();
  cmd->add_option("--ping-interval", o.ping_interval_s,
                  "seconds of silence after which a stream gets a keep-alive ping (also how soon a vanished client "
                  "is noticed)")
      ->capture_default_str();
  cmd->callback([a] {
    server::ServerOptions options = a->options;
    if (options.model_dir.empty()) options.model_dir = default_model_dir();
    if (!a->kv_mem.empty()) options.kv_mem_bytes = parse_bytes(a->kv_mem, "--kv-mem");
    if (options.max_seqs < 0) fail("--max-seqs must be positive, got {}", options.max_seqs);
    if (options.max_model_len < 0) fail("--max-model-len must be positive, got {}", options.max_model_len);
    const int code = server::serve(options);
    // CLI11 turns a RuntimeError into this exit code without printing anything more: serve()
    // has already said what went wrong.
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace spill::cli
