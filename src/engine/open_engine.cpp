#include "engine/open_engine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <string>

#include "backend/cuda/cuda_runner.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/expert_parallel_runner.h"
#include "core/error.h"
#include "core/strings.h"
#include "model/model.h"
#include "model/quantize_on_load.h"
#include "offload/model_experts.h"
#include "offload/expert_store.h"
#include "offload/plan_file.h"

namespace spill {

namespace {

// ==== CUDA runner: the one place it plugs in ==================================================
// Whether this build can run a model on a GPU.
#ifdef SPILL_HAVE_CUDA
constexpr bool kHaveCudaRunner = true;
#else
constexpr bool kHaveCudaRunner = false;
#endif

std::unique_ptr<ModelRunner> open_cuda_runner(const Model& model, const RunnerOptions& options, const DeviceChoice& device) {
  const int cuda_index = device.cuda_index;
  // kv.blocks == 0 and kv.bytes == 0: the pool takes what is left of the GPU after the weights and
  // the workspace (less a reserve); limits.max_model_len == 0: the model's context, capped by the pool.
  const RunnerLimits& limits = options.limits;
  CudaRunnerConfig config{.kv = {.block_size = options.kv.block_size, .n_blocks = options.kv.blocks},
                          .kv_budget_bytes = options.kv.bytes,
                          .device = cuda_index,
                          .max_batch_tokens = limits.max_batch_tokens,
                          .max_seqs = limits.max_seqs,
                          .max_model_len = limits.max_model_len,
                          .kv_format = options.kv_format.value_or(KvFormat::BF16)};
  if (!options.expert_plan.empty() && options.placement.requested())
    fail("--plan {} and --gpu-mem / --host-experts / --host-mem / --host-read-gbps both say where the experts go: give "
         "one (the start-up plan's flags only apply when spill makes the plan)",
         options.expert_plan);
  if (!options.expert_plan.empty()) config.expert_plan = offload::load_plan(options.expert_plan);
  if (options.placement.requested()) {
    // The plan is priced at this GPU's own in-place host read rate, not a nominal one: a PCIe Gen4
    // host carries ~30 GB/s where Gen5 carries ~50, and the fit report's expected speed follows it.
    offload::StartupPlacement placement = options.placement;
#ifdef SPILL_HAVE_CUDA
    if (placement.host_read_gbps <= 0) {
      const offload::HostReadProbe probe = offload::measure_host_reads(cuda_index);
      fmt::print(stderr, "[spill] in-place host reads on cuda:{}: {:.1f} GB/s (measured in {:.2f} s{})\n", cuda_index,
                 probe.gbps, probe.seconds,
                 probe.numa_node >= 0 ? fmt::format(", NUMA node {}", probe.numa_node) : std::string());
      placement.host_read_gbps = probe.gbps;
    }
#endif
    offload::StartupPlan planned =
        offload::plan_at_startup(model, placement, limits.max_seqs, limits.max_model_len, limits.max_batch_tokens,
                                 options.kv.bytes, config.kv_format);
    fmt::print(stderr, "[spill] placement at start-up:\n{}", planned.fit_report);
    config.expert_plan = std::move(planned.plan);
    // The KV pool takes what --gpu-mem leaves (unless --kv-mem or a block count says otherwise).
    if (options.kv.bytes == 0 && options.kv.blocks == 0) config.kv_budget_bytes = planned.kv_budget_bytes;
  }
  config.expert_cache_bytes = options.placement.expert_cache_bytes();
  config.cpu_expert_share = options.placement.cpu_expert_share();
  config.cpu_expert_threads = options.placement.cpu_expert_threads;
  if (config.cpu_expert_share != 0 && !config.expert_plan)
    fail("--cpu-experts computes experts that live in host RAM: give --gpu-mem (or --plan) so that some do");
  if (config.expert_cache_bytes > 0 && !config.expert_plan)
    fail("--expert-cache-mem caches experts that live in host RAM: give --gpu-mem (or --plan) so that some do");
  // An expert-parallel plan (version 2) runs on as many GPUs as it names: --device cuda:N,M,... in
  // the plan's order, or cuda_index and the ones after it (the group checks that they exist).
  if (config.expert_plan && config.expert_plan->expert_parallel) {
    const int n_gpus = config.expert_plan->n_gpus;
    if (!device.cuda_list.empty() && int(device.cuda_list.size()) != n_gpus)
      fail("the expert plan spreads the experts over {} GPUs; --device {} names {}", n_gpus, device_name(device),
           device.cuda_list.size());
    fmt::print(stderr, "[spill] expert-parallel over {} GPUs from --device {}, NCCL all-reduce after each MoE layer\n",
               n_gpus, device_name(device));
    return make_expert_parallel_runner(model, {.runner = config, .devices = device.cuda_list});
  }
  if (!device.cuda_list.empty())
    fail("--device {} names {} GPUs; only an expert-parallel plan (--plan, made with spill plan --parallel experts) "
         "runs on several",
         device_name(device), device.cuda_list.size());
  return make_cuda_runner(model, config);
}
// ===============================================================================================

}  // namespace

DeviceChoice parse_device(std::string_view text) {
  const std::string t = ascii_lower(text);
  if (t == "auto") return {Device::Auto, 0, {}};
  if (t == "cpu") return {Device::Cpu, 0, {}};
  if (t == "cuda" || t == "gpu") return {Device::Cuda, 0, {}};
  if (t.rfind("cuda:", 0) == 0) {
    DeviceChoice choice{Device::Cuda, 0, {}};
    const char* at = t.data() + 5;
    const char* last = t.data() + t.size();
    bool ok = at != last;
    while (ok && at != last) {
      int index = -1;
      const auto [end, ec] = std::from_chars(at, last, index);
      ok = ec == std::errc() && end != at && index >= 0 &&
           std::find(choice.cuda_list.begin(), choice.cuda_list.end(), index) == choice.cuda_list.end();
      choice.cuda_list.push_back(index);
      at = end;
      if (ok && at != last) ok = *at++ == ',' && at != last;
    }
    if (ok) {
      choice.cuda_index = choice.cuda_list.front();
      if (choice.cuda_list.size() == 1) choice.cuda_list.clear();
      return choice;
    }
  }
  fail("--device '{}': expected cpu, cuda, cuda:N (the N-th GPU, from 0), cuda:N,M,... (distinct GPUs, for a plan "
       "over several) or auto",
       text);
}

std::string device_name(const DeviceChoice& choice) {
  switch (choice.device) {
    case Device::Auto: return "auto";
    case Device::Cpu: return "cpu";
    case Device::Cuda:
      return choice.cuda_list.empty() ? fmt::format("cuda:{}", choice.cuda_index)
                                      : fmt::format("cuda:{}", fmt::join(choice.cuda_list, ","));
  }
  return "?";
}

DeviceChoice resolve_device(const DeviceChoice& choice) {
  if (choice.device == Device::Cpu) return choice;
  if (!kHaveCudaRunner) {
    if (choice.device == Device::Auto) return {Device::Cpu, 0, {}};
    fail("--device {}: this build has no CUDA runner (spill was built without CUDA: -DSPILL_CUDA=OFF or no nvcc at "
         "configure time); use --device cpu, or rebuild with the CUDA toolkit",
         device_name(choice));
  }
  std::string why;
  const std::vector<GpuInfo> gpus = list_gpus(&why);
  if (choice.device == Device::Auto) return gpus.empty() ? DeviceChoice{Device::Cpu, 0, {}} : DeviceChoice{Device::Cuda, 0, {}};
  if (gpus.empty()) fail("--device {}: no usable GPU ({}); use --device cpu", device_name(choice), why);
  for (int index : choice.cuda_list.empty() ? std::vector<int>{choice.cuda_index} : choice.cuda_list)
    if (index >= int(gpus.size()))
      fail("--device {}: there is no GPU {}; this machine has {} (cuda:0 to cuda:{}; spill info lists them)",
           device_name(choice), index, gpus.size(), gpus.size() - 1);
  return choice;
}

std::unique_ptr<ModelRunner> open_runner(const Model& model, const RunnerOptions& options) {
  const DeviceChoice device = resolve_device(options.device);
  if (device.device == Device::Cuda) return open_cuda_runner(model, options, device);
  if (options.placement.requested() || !options.placement.expert_cache_mem.empty() ||
      !options.placement.cpu_experts.empty())
    fail("--gpu-mem / --host-experts / --host-mem / --expert-cache-mem / --cpu-experts plan which experts a GPU reads from host RAM; on --device cpu every "
         "weight is in host RAM already (drop them, or run on cuda)");
  if (!options.expert_plan.empty())
    fail("--plan {}: a placement plan says which experts a GPU reads from host RAM; on --device cpu every weight is "
         "in host RAM already (drop --plan, or run on cuda)",
         options.expert_plan);
  if (options.kv_format && *options.kv_format != KvFormat::F32)
    fail("--kv-format {}: the CPU runner keeps its KV cache in f32 (its only format); bf16 and fp8 are for --device cuda",
         kv_format_name(*options.kv_format));
  return make_cpu_runner(model, CpuRunnerConfig{.kv = options.kv, .limits = options.limits, .n_threads = options.threads});
}

std::unique_ptr<Engine> open_engine(ModelBundle bundle, const EngineOptions& options, const EngineConfig& config) {
  if (!bundle.model) fail("open_engine: no model given (internal error)");
  std::unique_ptr<Model> model = std::move(bundle.model);
  // Before the runner exists: a device runner uploads the weights in the types they end up in.
  quantize_as_asked(*model, {.quant = options.quant, .imatrix = options.imatrix, .n_threads = options.runner.threads});
  RunnerOptions runner_options = options.runner;
  runner_options.limits = {.max_seqs = config.scheduler.max_running,
                           .max_batch_tokens = config.scheduler.max_batch_tokens,
                           .max_model_len = config.max_model_len};
  std::unique_ptr<ModelRunner> runner = open_runner(*model, runner_options);
  return std::make_unique<Engine>(
      EngineParts{.model = std::move(model), .runner = std::move(runner), .tokenizer = std::move(bundle.tokenizer)},
      config);
}

std::unique_ptr<Engine> open_engine(const std::string& model_path, const EngineOptions& options,
                                    const EngineConfig& config) {
  // Refuse an impossible --device before spending the time to load the weights.
  (void)resolve_device(options.runner.device);
  return open_engine(open_model_bundle(model_path, options.require_tokenizer), options, config);
}

}  // namespace spill
