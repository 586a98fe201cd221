// spill plan: where every routed expert lives (VRAM of which GPU, or host RAM), whether the model
// fits, and how fast it can decode: the fit report, and the plan as JSON.
#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/json_limits.h"
#include "model/model.h"
#include "placement/fit_report.h"
#include "placement/measured_bytes.h"
#include "placement/planner.h"

namespace spill::cli {

namespace {

using namespace spill::placement;

struct PlanArgs {
  std::string model, synthetic, quant, kv_format = "bf16", gpu_mem, gpu_reserve, host_mem, kv_mem, profile, out;
  std::string host_experts, embedding = "auto", topo, parallel = "experts", attention = "tensor", usage;
  int64_t max_model_len = 0, max_seqs = 0, max_batch_tokens = 2048, batch = 0, context = 0;
  double hbm_gbps = 0, host_read_gbps = 0, allreduce_us = -1;
  bool no_offload = false, no_profile = false;
};

// Bandwidth ceilings measured by `spill topo --json FILE`: the slowest GPU's figures.
void read_topo_ceilings(const std::string& path, Ceilings& c) {
  std::ifstream in(path);
  if (!in) fail("--topo {}: cannot read it (write it with spill topo --json {})", path, path);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const nlohmann::json j = parse_json<nlohmann::json>(text, "--topo " + path);
  double hbm = 0, host = 0;
  for (const auto& g : j.value("gpus", nlohmann::json::array())) {
    const double h = g.value("hbm_read_gbps", 0.0), p = g.value("host_read_gbps", 0.0);
    if (h > 0) hbm = hbm > 0 ? std::min(hbm, h) : h;
    if (p > 0) host = host > 0 ? std::min(host, p) : p;
  }
  if (hbm <= 0 || host <= 0)
    fail("--topo {}: no measured bandwidth in it (it was written without a GPU); give --hbm-gbps and --host-read-gbps", path);
  c.hbm_read_gbps = hbm;
  c.host_read_gbps = host;
}

void run_plan(const PlanArgs& a) {
  if (!a.model.empty() && !a.synthetic.empty()) fail("give --model or --synthetic, not both");
  if (a.kv_mem.size() && (a.max_model_len || a.max_seqs))
    fail("give the KV cache as --kv-mem or as --max-model-len and --max-seqs, not both");
  PlanRequest req;
  std::string model_dir;
  if (!a.synthetic.empty()) {
    req.shape = load_model_shape(a.synthetic);
  } else {
    model_dir = a.model.empty() ? default_model_dir() : a.model;
    if (std::filesystem::path(model_dir).extension() == ".gguf") {
      // A GGUF's types are the file's (often per layer): priced from its tensors as they load,
      // which maps the file and reads no weight bytes.
      if (!a.quant.empty())
        fail("--quant {}: a GGUF file's types are its own; plan it as it is, or requantize it first (spill quantize)", a.quant);
      const std::unique_ptr<Model> model = Model::load(model_dir);
      req.shape = shape_of(*model);
      req.measured = measure_weights(*model);
      req.types = dominant_types(*model);
      model_dir.clear();  // no routing_profile.json beside a file: give --profile
    } else {
      req.shape = load_model_shape(model_dir);
    }
  }
  if (!req.measured) req.types = parse_tensor_class_types(a.quant);
  req.kv_format = parse_kv_format(a.kv_format);
  if (a.gpu_mem.empty()) fail("--gpu-mem is required: the usable memory of each GPU, e.g. --gpu-mem 95.6G,95.6G");
  req.gpu_mem = parse_byte_sizes(a.gpu_mem, "--gpu-mem");
  if (!a.gpu_reserve.empty()) req.gpu_reserve = parse_byte_size(a.gpu_reserve, "--gpu-reserve");
  if (!a.host_mem.empty()) req.host_mem = parse_byte_size(a.host_mem, "--host-mem");
  if (!a.kv_mem.empty()) req.kv_mem = parse_byte_size(a.kv_mem, "--kv-mem");
  req.max_model_len = a.max_model_len;
  req.max_seqs = a.max_seqs;
  req.max_batch_tokens = a.max_batch_tokens;
  req.allow_offload = !a.no_offload;
  if (!a.host_experts.empty()) req.min_host_fraction = parse_share(a.host_experts, "--host-experts");
  if (a.embedding == "auto") req.embedding = EmbeddingHome::Auto;
  else if (a.embedding == "gpu") req.embedding = EmbeddingHome::Gpu;
  else if (a.embedding == "host") req.embedding = EmbeddingHome::Host;
  else fail("--embedding must be auto, gpu or host, got \"{}\"", a.embedding);
  if (a.parallel == "experts") req.parallel = Parallelism::Experts;
  else if (a.parallel == "layers") req.parallel = Parallelism::Layers;
  else fail("--parallel must be experts or layers, got \"{}\"", a.parallel);
  if (a.attention == "tensor") req.attention = AttentionParallel::Tensor;
  else if (a.attention == "replicated") req.attention = AttentionParallel::Replicated;
  else fail("--attention must be tensor or replicated, got \"{}\"", a.attention);
  if (!a.topo.empty()) read_topo_ceilings(a.topo, req.ceilings);
  if (a.allreduce_us >= 0) req.ceilings.allreduce_us = a.allreduce_us;
  if (a.hbm_gbps > 0) req.ceilings.hbm_read_gbps = a.hbm_gbps;
  if (a.host_read_gbps > 0) req.ceilings.host_read_gbps = a.host_read_gbps;
  req.report_batch = a.batch;
  req.report_context = a.context;

  if (!a.usage.empty()) {
    if (!a.profile.empty()) fail("give --profile (measured routing) or --usage (assumed routing), not both");
    double exponent = -1;
    size_t used = 0;
    if (a.usage.rfind("zipf:", 0) == 0) {
      try {
        exponent = std::stod(a.usage.substr(5), &used);
      } catch (const std::exception&) {
        used = 0;
      }
    }
    if (used == 0 || 5 + used != a.usage.size() || !(exponent >= 0 && exponent <= 10))
      fail("--usage '{}': expected zipf:S with an exponent S between 0 and 10 (e.g. zipf:0.7)", a.usage);
    req.profile = zipf_profile(req.shape.spec, exponent);
    req.profile_source = fmt::format("assumed, --usage {}", a.usage);
  }
  std::string profile_path = a.usage.empty() ? a.profile : std::string();
  if (profile_path.empty() && !model_dir.empty() && !a.no_profile &&
      std::filesystem::exists(std::filesystem::path(model_dir) / "routing_profile.json"))
    profile_path = (std::filesystem::path(model_dir) / "routing_profile.json").string();
  if (!profile_path.empty()) {
    req.profile = load_profile(profile_path);
    req.profile_source = profile_path;
  }

  const PlanOutcome outcome = make_plan(std::move(req));
  std::fputs(format_fit_report(outcome).c_str(), stdout);
  std::fflush(stdout);
  if (!outcome.fits) throw CLI::RuntimeError(1);  // the report has said why and what to change
  if (!a.out.empty()) {
    std::ofstream out(a.out, std::ios::trunc);
    if (!out) fail("--out {}: cannot write the plan", a.out);
    out << plan_to_json(outcome);
    if (!out) fail("--out {}: writing the plan failed", a.out);
    std::printf("plan written to %s\n", a.out.c_str());
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan",
                                 "Plan which routed experts live in VRAM and which in host RAM; print whether the model "
                                 "fits and how fast it can decode (docs/placement.md)");
  auto a = std::make_shared<PlanArgs>();
  cmd->add_option("--model", a->model,
                  "Hugging Face model folder, or a GGUF file (priced as its tensors are stored; default: the bundled "
                  "spill-tiny)");
  cmd->add_option("--synthetic", a->synthetic, "plan for a config.json alone (a shape such as docs/shapes/seed.json)");
  cmd->add_option("--quant", a->quant,
                  "types by tensor class: a preset (bf16, q8_0, q6_k, q4_k_m, q3_k_m, q2_k) and/or CLASS=TYPE items, "
                  "e.g. experts=q3_k,attention=q8_0,embed=q8_0,head=q6_k,shared=q6_k (default: bf16)");
  cmd->add_option("--gpu-mem", a->gpu_mem, "usable memory of each GPU, comma-separated: 80G or 95.6G,95.6G")->required();
  cmd->add_option("--gpu-reserve", a->gpu_reserve, "memory kept free on every GPU (CUDA context, allocator), e.g. 512M");
  cmd->add_option("--host-mem", a->host_mem, "pinned host RAM the plan may use (default: not limited)");
  cmd->add_option("--max-model-len", a->max_model_len, "tokens per sequence the KV cache holds (default: the model's, at most 32768)");
  cmd->add_option("--max-seqs", a->max_seqs, "sequences the KV cache holds at full length (default 4)");
  cmd->add_option("--kv-mem", a->kv_mem, "KV cache size in all, instead of --max-model-len x --max-seqs");
  cmd->add_option("--kv-format", a->kv_format, "KV cache format: f32 (CPU runner), bf16, fp8 (e4m3, per-head scales)")
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", a->max_batch_tokens, "tokens in one step (sets the workspace)")->capture_default_str();
  cmd->add_option("--profile", a->profile,
                  "routing profile from spill profile (default: <model>/routing_profile.json when present, else uniform)");
  cmd->add_flag("--no-profile", a->no_profile, "plan as if routing were uniform even when the model ships a profile");
  cmd->add_option("--usage", a->usage,
                  "assumed routing instead of a measured profile: zipf:S, the share of rank r (a seeded shuffle per "
                  "layer) proportional to r^-S; zipf:0 is uniform");
  cmd->add_option("--host-experts", a->host_experts, "at least this share of routed experts in host RAM, e.g. 30%");
  cmd->add_flag("--no-offload", a->no_offload, "every routed expert in VRAM, or refuse");
  cmd->add_option("--embedding", a->embedding, "home of the embedding table: auto (host when offloading), gpu or host")
      ->capture_default_str();
  cmd->add_option("--parallel", a->parallel,
                  "several GPUs: experts (each GPU a share of every layer's experts, read over its own link) or "
                  "layers (contiguous layer ranges, one GPU after another)")
      ->capture_default_str();
  cmd->add_option("--attention", a->attention,
                  "expert-parallel plans: tensor (attention with its KV, shared experts, dense MLPs, embedding and head "
                  "split over the GPUs where the shapes divide) or replicated (on every GPU)")
      ->capture_default_str();
  cmd->add_option("--allreduce-us", a->allreduce_us,
                  "latency of one decode all-reduce across the GPUs, for the expected speed (default 10, assumed)")
      ->check(number_validator(0, true, "microseconds", "US"));
  cmd->add_option("--topo", a->topo, "bandwidth ceilings measured by spill topo --json FILE");
  cmd->add_option("--hbm-gbps", a->hbm_gbps, "HBM read ceiling in GB/s (default 4530, an H200)")
      ->check(number_validator(0, false, "GB/s", "GBPS"));
  cmd->add_option("--host-read-gbps", a->host_read_gbps,
                  "in-place pinned host read ceiling in GB/s (default 50, PCIe Gen5 x16; a Gen4 host reads ~30: spill "
                  "topo measures it)")
      ->check(number_validator(0, false, "GB/s", "GBPS"));
  cmd->add_option("--batch", a->batch, "streams decoding at once for the batch figures (default: --max-seqs)");
  cmd->add_option("--context", a->context, "context tokens per stream for the decode figures (default: min(4096, --max-model-len))");
  cmd->add_option("--out", a->out, "write the plan as JSON here");
  cmd->callback([a] { run_plan(*a); });
}

}  // namespace spill::cli
