#include "cli/model_options.h"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/synthetic_source.h"

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

CLI::Option* add_plan_option(CLI::App* cmd, std::string& path) {
  return cmd
      ->add_option("--plan", path,
                   "placement plan (spill plan --out FILE): the routed experts it lists live in host RAM, read by the "
                   "GPU in place over PCIe; the rest in VRAM (default: every weight on the GPU)")
      ->check(CLI::ExistingFile);
}

void add_placement_options(CLI::App* cmd, offload::StartupPlacement& placement) {
  cmd->add_option("--gpu-mem", placement.gpu_mem,
                  "plan at start-up (instead of --plan): what spill may use of the GPU, e.g. 64G; routed experts that do "
                  "not fit live in host RAM, read in place over PCIe; the fit report is printed first. One per GPU "
                  "(e.g. 95.6G,95.6G) spreads every layer's experts over that many GPUs");
  cmd->add_option("--host-experts", placement.host_experts,
                  "with --gpu-mem: at least this share of the routed experts in host RAM, e.g. 30%");
  cmd->add_option("--host-mem", placement.host_mem, "with --gpu-mem: pinned host RAM the plan may use (default: not limited)");
  cmd->add_option("--host-read-gbps", placement.host_read_gbps,
                  "with --gpu-mem: the rate the GPU reads pinned host memory in place, GB/s, to plan at (default: "
                  "measured at start-up, ~0.4 s; spill topo measures it too)")
      ->check(number_validator(0, false, "GB/s", "GBPS"));
  cmd->add_option("--expert-cache-mem", placement.expert_cache_mem,
                  "with --gpu-mem or --plan: VRAM for a cache of the host experts live traffic reads most (e.g. 4G; "
                  "taken from --gpu-mem); hit rates in /metrics");
  cmd->add_option("--cpu-experts", placement.cpu_experts,
                  "with --gpu-mem or --plan: CPU threads compute this share of each layer's host experts in decode steps "
                  "of up to 8 sequences while the GPU reads the others over PCIe, e.g. 100% or 0.6; auto: all of them "
                  "where the CPU, measured at start-up, beats the link, else none. Pays where the link is slow against "
                  "the CPU; output may differ from all-in-VRAM in the last bits (default: off)")
      ->type_name("SHARE|auto");
  cmd->add_option("--cpu-expert-threads", placement.cpu_expert_threads,
                  "with --cpu-experts: CPU threads computing experts (default: the GPU's NUMA node's cores less two)")
      ->check(CLI::Range(1, 4096));
}

CLI::Option* add_kv_format_option(CLI::App* cmd, std::optional<KvFormat>& format) {
  return cmd
      ->add_option_function<std::string>(
          "--kv-format", [&format](const std::string& value) { format = parse_kv_format(value); },
          "KV cache format: bf16 (the GPU's default), fp8 (e4m3 with a scale per token and KV head: half the bytes, "
          "twice the tokens), f32 (the CPU runner's only format)")
      ->type_name("FORMAT");
}

CLI::Option* add_device_option(CLI::App* cmd, DeviceChoice& device) {
  return cmd
      ->add_option_function<std::string>(
          "--device", [&device](const std::string& value) { device = parse_device(value); },
          "where the model runs: cpu, cuda (cuda:N for the N-th GPU; cuda:N,M,... for the GPUs of an expert-parallel "
          "--plan, in its order) or auto (default: cuda when this build has a "
          "CUDA runner and a usable GPU is present, else cpu)")
      ->type_name("DEVICE");
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
  cmd->add_option("--synthetic", flags.synthetic,
                  "a config.json: a model of that shape with random weights made in memory, in the --quant types "
                  "(instead of --model)");
  cmd->add_option("--routing-skew", flags.routing_skew,
                  "zipf:S: expert popularity of a --synthetic model falls with rank, exponent ~S (default uniform)");
}

std::unique_ptr<Model> open_model(const ModelFlags& flags, int threads, bool quiet, bool fill) {
  if (!flags.synthetic.empty())
    return open_synthetic_model(flags, threads, quiet, fill ? SyntheticFill::Now : SyntheticFill::Never);
  std::unique_ptr<Model> model = Model::load(flags.dir());
  quantize_as_flagged(*model, flags, threads, quiet);
  return model;
}

namespace {

double parse_routing_skew(const std::string& text) {
  if (text.empty()) return 0.0;
  double s = -1;
  size_t used = 0;
  if (text.rfind("zipf:", 0) == 0) {
    try {
      s = std::stod(text.substr(5), &used);
    } catch (const std::exception&) {
      used = 0;
    }
  }
  if (used == 0 || 5 + used != text.size() || !(s >= 0 && s <= 10))
    fail("--routing-skew '{}': expected zipf:S with an exponent S between 0 and 10 (e.g. zipf:1.2)", text);
  return s;
}

}  // namespace

std::unique_ptr<Model> open_synthetic_model(const ModelFlags& flags, int threads, bool quiet, SyntheticFill fill) {
  if (!flags.model.empty()) fail("give --model or --synthetic, not both");
  if (!flags.imatrix.empty()) fail("--imatrix needs real weights; a --synthetic model is random");
  std::ifstream in(flags.synthetic);
  if (!in) fail("--synthetic {}: cannot read the file", flags.synthetic);
  std::stringstream text;
  text << in.rdbuf();
  const ModelSpec spec = parse_model_spec(text.str(), flags.synthetic);
  const auto t0 = std::chrono::steady_clock::now();
  // Each tensor's type: the plan --quant makes for a real checkpoint, made on an unwritten F32 model
  // of the same shape (so a synthetic model is quantized exactly as a real one would be).
  std::map<std::tuple<int, int, int>, DType> types;
  const quant::QuantMix mix = quant::parse_quant_mix(flags.quant);
  if (!mix.empty()) {
    SyntheticOptions probe;
    probe.fill = SyntheticFill::Never;
    auto shape_only = Model::from_source(spec, make_synthetic_source(spec, probe));
    for (const QuantPlanEntry& e : plan_quantization(*shape_only, mix))
      if (e.choice.quantize) types[{int(e.key.role), e.key.layer, e.key.expert}] = e.choice.type;
  }
  ThreadPool pool(threads);
  SyntheticOptions options;
  options.fill = fill;
  options.pool = &pool;
  options.routing_skew = parse_routing_skew(flags.routing_skew);
  options.type_for = [&types](const WeightKey& key, int64_t, int64_t) {
    // Fused expert tensors are planned per projection under their per-expert roles.
    WeightRole role = key.role;
    if (role == WeightRole::ExpertsGate) role = WeightRole::ExpertGate;
    if (role == WeightRole::ExpertsUp) role = WeightRole::ExpertUp;
    if (role == WeightRole::ExpertsDown) role = WeightRole::ExpertDown;
    auto it = types.find({int(role), key.layer, key.expert});
    if (it == types.end()) it = types.find({int(role), key.layer, 0});
    return it == types.end() ? DType::F32 : it->second;
  };
  auto model = Model::from_source(spec, make_synthetic_source(spec, options));
  if (!quiet && fill != SyntheticFill::Never)
    fmt::print(stderr, "[spill] synthetic {} ({}) made in {:.2f} s{}\n", flags.synthetic,
               mix.empty() ? std::string("F32") : mix.str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               fill == SyntheticFill::OnDemand ? " (its matrices are written as the runner uploads them)" : "");
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
