// Decode speed of the CUDA runner (backend/cuda/cuda_runner.h) on a synthetic model of a given
// shape (default the S30 shape, Qwen3-30B-A3B), weights in --quant's types, next to the roofline:
// the bytes one step must read (every non-expert weight, the distinct routed experts' spans, the
// KV of every sequence) over the measured HBM read bandwidth.
//
// Method: B sequences are prefilled to --context tokens, then --steps decode steps of B tokens run
// through ModelRunner::forward (logits of every sequence copied back each step, as the engine
// needs them today); time per step is the median. One extra step, observed (not timed), counts the
// distinct experts each layer routes to, for the bytes.
//
// Usage: cuda_decode_bench [--shape s30.json] [--quant MIX] [--batches 1,4,8] [--context N]
//                          [--steps N] [--ceiling GBps] [--layers N]
//                          [--host-share F | --host-layers N | --plan FILE | --gpu-mem BYTES [--host-experts P%]]
//                          [--pcie-gbps G]
//                          [--expert-cache-mem BYTES] [--no-staging] [--cpu-experts SHARE|auto [--cpu-expert-threads N]]
//                          [--routing-skew zipf:S]
//                          [--warmup N] [--expert-parallel G] [--kv-format bf16|fp8|f32]
// --host-layers N: every routed expert of the first N MoE layers in host RAM, the rest in VRAM (the
// placement llama.cpp's --n-cpu-moe N gives its CPU, for a side-by-side on the same bytes).
// With host experts, the host bytes each step read are also measured (the runner's expert
// traffic counters) beside the prediction from the observed step's routing; with the expert cache,
// --warmup decode steps (default 300) run before the timed ones, so the cache has filled.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_runner.h"
#include "backend/cuda/expert_parallel_runner.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "model/model.h"
#include "model/runner.h"
#include "offload/expert_store.h"
#include "offload/model_experts.h"
#include "offload/plan_file.h"
#include "placement/memory.h"
#include "sampling/sampler.h"

using namespace spill;

namespace {

struct Args {
  std::string shape = "/work/shared/shapes/s30.json";
  std::string model;  // a model file or folder instead of the synthetic shape
  std::string quant = "experts=q4_k,attention=q8_0,embed=q8_0,head=q8_0";
  std::vector<int> batches = {1, 4, 8};
  int context = 512;
  int prefill_chunk = 512;  // tokens per prefill step (the runner's max batch tokens)
  int steps = 20;
  double ceiling_gbps = 4530.0;  // measured HBM read bandwidth of the H200 (issue 12)
  // In-place reads of pinned host memory by a kernel, GB/s: --pcie-gbps, or measured here
  // (offload::measure_host_reads) when experts go to host RAM.
  double pcie_gbps = 0;
  int layers = 0;                // > 0: override the shape's layer count (quick runs)
  bool profile = false;          // time each op with events (steps launched eagerly, no graphs)
  bool graphs = true;
  bool host_logits = false;
  double host_share = 0;  // > 0: this share of every MoE layer's experts in host RAM (a uniform plan)
  int host_layers = 0;    // > 0: every expert of the first N MoE layers in host RAM
  std::string cpu_experts;  // --cpu-experts SHARE|auto: CPU threads compute that share of the host experts
  int cpu_expert_threads = 0;
  std::string plan;       // a placement plan file (spill plan --out) instead
  int expert_parallel = 0;  // --expert-parallel G: the plan's experts spread over cuda:0..G-1 (expert e on e % G)
  std::string gpu_mem;    // --gpu-mem: plan at start-up as spill serve does (the fit report is printed)
  std::string host_experts;  // --host-experts: with --gpu-mem, at least this share of experts on host
  bool staging = true;       // --no-staging: prefill reads host experts in place
  std::string cache_mem;  // --expert-cache-mem
  KvFormat kv_format = KvFormat::BF16;  // --kv-format
  std::string routing_skew;
  // --expert-counts / --no-expert-counts: count always / never (default: with a plan, as serving does)
  CudaRunnerConfig::ExpertCounting counting = CudaRunnerConfig::ExpertCounting::WithPlan;
  int warmup = -1;        // decode steps before the timed ones (-1: 300 with a cache, else 0)
};

// Counts distinct routed experts per layer.
class RouteCounter final : public ForwardObserver {
 public:
  std::vector<std::set<int32_t>> per_layer;
  void on_router(int layer, int64_t n_tokens, int64_t k, const int32_t* ids, const float*) override {
    if (per_layer.size() <= size_t(layer)) per_layer.resize(size_t(layer) + 1);
    for (int64_t i = 0; i < n_tokens * k; ++i) per_layer[size_t(layer)].insert(ids[i]);
  }
};

int64_t bytes_of(const TensorView& t) { return t.empty() ? 0 : int64_t(t.nbytes()); }

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", f.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (f == "--shape") a.shape = next();
    else if (f == "--model") a.model = next();
    else if (f == "--host-share") a.host_share = std::atof(next().c_str());
    else if (f == "--host-layers") a.host_layers = std::atoi(next().c_str());
    else if (f == "--pcie-gbps") a.pcie_gbps = std::atof(next().c_str());
    else if (f == "--plan") a.plan = next();
    else if (f == "--expert-parallel") a.expert_parallel = std::atoi(next().c_str());
    else if (f == "--expert-cache-mem") a.cache_mem = next();
    else if (f == "--gpu-mem") a.gpu_mem = next();
    else if (f == "--host-experts") a.host_experts = next();
    else if (f == "--no-staging") a.staging = false;
    else if (f == "--cpu-experts") a.cpu_experts = next();
    else if (f == "--cpu-expert-threads") a.cpu_expert_threads = std::atoi(next().c_str());
    else if (f == "--no-expert-counts") a.counting = CudaRunnerConfig::ExpertCounting::Off;
    else if (f == "--expert-counts") a.counting = CudaRunnerConfig::ExpertCounting::Always;
    else if (f == "--routing-skew") a.routing_skew = next();
    else if (f == "--warmup") a.warmup = std::atoi(next().c_str());
    else if (f == "--kv-format") a.kv_format = parse_kv_format(next());
    else if (f == "--quant") a.quant = next();
    else if (f == "--context") a.context = std::atoi(next().c_str());
    else if (f == "--prefill-chunk") a.prefill_chunk = std::atoi(next().c_str());
    else if (f == "--steps") a.steps = std::atoi(next().c_str());
    else if (f == "--ceiling") a.ceiling_gbps = std::atof(next().c_str());
    else if (f == "--layers") a.layers = std::atoi(next().c_str());
    else if (f == "--profile") a.profile = true;
    else if (f == "--no-graphs") a.graphs = false;
    else if (f == "--host-logits") a.host_logits = true;
    else if (f == "--batches") {
      a.batches.clear();
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) a.batches.push_back(std::atoi(item.c_str()));
    } else {
      std::fprintf(stderr, "usage: %s [--shape F | --model FILE.gguf] [--quant MIX] [--host-share X | --host-layers N | --plan FILE] [--batches 1,4,8] [--context N] [--prefill-chunk N] [--steps N] "
                           "[--ceiling GBps] [--layers N] [--profile] [--no-graphs] [--host-logits]\n", argv[0]);
      return 2;
    }
  }
  if (a.context < 1 || a.steps < 1 || a.batches.empty()) {
    std::fprintf(stderr, "--context, --steps and --batches must be positive\n");
    return 2;
  }
  try {
    std::string shape_path = a.shape;
    if (a.layers > 0) {  // a copy of the shape with fewer layers
      std::ifstream in(a.shape);
      if (!in) fail("{}: cannot read", a.shape);
      std::stringstream text;
      text << in.rdbuf();
      std::string s = text.str();
      const size_t at = s.find("\"num_hidden_layers\"");
      if (at == std::string::npos) fail("{}: no num_hidden_layers", a.shape);
      const size_t colon = s.find(':', at), end = s.find_first_of(",}", colon);
      s = s.substr(0, colon + 1) + " " + std::to_string(a.layers) + s.substr(end);
      shape_path = "/tmp/cuda_decode_bench_shape.json";
      std::ofstream(shape_path) << s;
    }
    cli::ModelFlags flags;
    flags.synthetic = shape_path;
    flags.quant = a.quant;
    flags.routing_skew = a.routing_skew;
    const auto t0 = std::chrono::steady_clock::now();
    // --model: a real file (a GGUF as published, or the random-weight GGUF a peer is measured on).
    auto model = a.model.empty() ? cli::open_synthetic_model(flags, 0, false, SyntheticFill::OnDemand) : Model::load(a.model);
    const ModelSpec& spec = model->spec();
    const int max_b = *std::max_element(a.batches.begin(), a.batches.end());
    const int32_t bs = 16;
    const int warmup = a.warmup >= 0 ? a.warmup : !a.cache_mem.empty() ? 300 : 0;
    const int32_t blocks_per_seq = (a.context + warmup + a.steps + 2 + bs - 1) / bs;
    CudaRunnerConfig config;
    config.kv = {.block_size = bs, .n_blocks = int64_t(blocks_per_seq) * max_b};
    config.kv_format = a.kv_format;
    config.max_batch_tokens = std::max<int64_t>(a.prefill_chunk, max_b);
    config.max_seqs = std::max(max_b, 1);
    config.max_model_len = int64_t(blocks_per_seq) * bs;
    config.profile_ops = a.profile;
    config.cuda_graphs = a.graphs;
    config.count_experts = a.counting;
    config.stage_host_experts = a.staging;
    if (!a.cpu_experts.empty()) {
      offload::StartupPlacement flags;
      flags.cpu_experts = a.cpu_experts;
      config.cpu_expert_share = flags.cpu_expert_share();
      config.cpu_expert_threads = a.cpu_expert_threads;
    }
    const bool host_experts = !a.plan.empty() || a.host_share > 0 || a.host_layers > 0 || !a.gpu_mem.empty();
    if (host_experts && a.pcie_gbps <= 0) {
      const offload::HostReadProbe probe = offload::measure_host_reads(0);
      a.pcie_gbps = probe.gbps;
      std::printf("in-place host reads measured at %.1f GB/s (%.2f s): the host ceiling of the rooflines below\n",
                  probe.gbps, probe.seconds);
    }
    if (a.pcie_gbps <= 0) a.pcie_gbps = 50.0;  // no host experts: unused
    if (!a.plan.empty()) config.expert_plan = offload::load_plan(a.plan);
    else if (a.host_share > 0) config.expert_plan = offload::uniform_plan_for(*model, a.host_share, 1);
    else if (a.host_layers > 0) {
      offload::PlacementPlan plan = offload::uniform_plan_for(*model, 0.0, 1);
      int placed = 0;
      for (offload::PlannedLayer& pl : plan.layers) {
        if (!pl.moe || placed == a.host_layers) continue;
        pl.host.clear();
        for (int64_t e = 0; e < pl.experts; ++e) pl.host.push_back(int32_t(e));
        ++placed;
      }
      if (placed < a.host_layers) fail("--host-layers {}: the model has {} MoE layers", a.host_layers, placed);
      plan.where = "the experts of the first " + std::to_string(a.host_layers) + " MoE layers in host RAM";
      plan.host_experts = plan.host_expert_count();
      plan.host_bytes = plan.host_expert_bytes();
      config.expert_plan = std::move(plan);
    }
    else if (!a.gpu_mem.empty()) {
      offload::StartupPlacement flags_mem{.gpu_mem = a.gpu_mem,
                                          .host_experts = a.host_experts,
                                          .expert_cache_mem = a.cache_mem,
                                          .host_read_gbps = a.pcie_gbps};
      offload::StartupPlan planned =
          offload::plan_at_startup(*model, flags_mem, max_b, config.max_model_len, config.max_batch_tokens, 0);
      std::printf("placement at start-up (--gpu-mem %s):\n%s\n", a.gpu_mem.c_str(), planned.fit_report.c_str());
      config.expert_plan = std::move(planned.plan);
    }
    if (!a.cache_mem.empty()) config.expert_cache_bytes = placement::parse_byte_size(a.cache_mem, "--expert-cache-mem");
    std::unique_ptr<ModelRunner> runner;
    CudaRunnerStats st;
    if (a.expert_parallel > 0) {
      // The same placement as a group of G GPUs (expert e of every layer on GPU e % G), everything
      // else replicated; G = 1 runs the group's code (router share, NCCL all-reduce) on one GPU.
      offload::PlacementPlan plan = config.expert_plan ? *config.expert_plan : offload::uniform_plan_for(*model, 0.0, 1);
      plan.expert_parallel = true;
      plan.n_gpus = a.expert_parallel;
      plan.split = {};
      for (offload::PlannedLayer& pl : plan.layers) {
        pl.gpu = -1;
        pl.owners.clear();
        for (int64_t e = 0; pl.moe && e < pl.experts; ++e) pl.owners.push_back(int32_t(e % a.expert_parallel));
      }
      config.expert_plan = std::move(plan);
      runner = make_expert_parallel_runner(*model, {.runner = config});
      std::printf("%s\n", runner->describe().c_str());
    } else {
      runner = make_cuda_runner(*model, config);
      st = cuda_runner_stats(*runner);
    }
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // Bytes every step reads whatever the routing: all weights but the routed experts.
    int64_t dense_bytes = bytes_of(model->lm_head) + bytes_of(model->final_norm);
    int64_t expert_bytes = 0;  // one expert's gate + up + down
    for (const LayerWeights& w : model->layers) {
      for (const TensorView* t : {&w.attn_norm, &w.q, &w.k, &w.v, &w.o, &w.q_bias, &w.k_bias, &w.v_bias, &w.o_bias,
                                  &w.q_norm, &w.k_norm, &w.mlp_norm, &w.dense.gate, &w.dense.up, &w.dense.down,
                                  &w.router, &w.router_bias, &w.shared.gate, &w.shared.up, &w.shared.down})
        dense_bytes += bytes_of(*t);
      if (!w.experts.empty())
        expert_bytes = bytes_of(w.experts[0].gate) + bytes_of(w.experts[0].up) + bytes_of(w.experts[0].down);
    }
    const int64_t kv_token_bytes = kv_bytes_per_token(spec, config.kv_format);
    std::printf("cuda_decode_bench: %s, %lld layers, quant %s, context %d, block %d, KV %s\n",
                a.model.empty() ? a.shape.c_str() : a.model.c_str(),
                (long long)spec.n_layers, a.model.empty() ? a.quant.c_str() : "as stored", a.context, bs, std::string(kv_format_name(config.kv_format)).c_str());
    std::printf("model made and uploaded in %.1f s: weights %.2f GiB on the GPU, KV pool %.2f GiB, workspace %.2f GiB\n",
                load_s, st.weight_bytes / 1073741824.0, st.kv_bytes / 1073741824.0, st.workspace_bytes / 1073741824.0);
    if (config.expert_plan)
      std::printf("experts: %s\n  %.2f GiB in VRAM, %.2f GiB in host RAM (read over PCIe; the roofline below counts "
                  "them at HBM speed)\n%s\n",
                  config.expert_plan->where.c_str(), st.vram_expert_bytes / 1073741824.0,
                  st.host_expert_bytes / 1073741824.0, st.expert_store_summary.c_str());
    if (config.expert_cache_bytes > 0 || config.cpu_expert_share != 0) std::printf("%s\n", runner->describe().c_str());
    std::printf("roofline: bytes per step / %.0f GB/s; non-expert weights %.1f MB per step, %.2f MB per expert\n\n",
                a.ceiling_gbps, dense_bytes / 1e6, expert_bytes / 1e6);
    std::printf("%6s %10s %12s %12s %10s %10s %12s %10s %9s\n", "batch", "ms/step", "tok/s/strm", "tok/s total",
                "experts/L", "MB/step", "roof ms", "roof tok/s", "achieved");

    std::vector<double> prefill_times;
    for (int B : a.batches) {
      // Sequence i uses blocks [i * blocks_per_seq, (i + 1) * blocks_per_seq).
      std::vector<std::vector<int32_t>> tables(static_cast<size_t>(B));
      for (int i = 0; i < B; ++i)
        for (int32_t b = 0; b < blocks_per_seq; ++b) tables[size_t(i)].push_back(i * blocks_per_seq + b);
      std::vector<float> logits;
      // Prefill each sequence (chunks of up to max_batch_tokens); the first one's time is reported.
      double prefill_ms = 0;
      for (int i = 0; i < B; ++i) {
        const auto p_start = std::chrono::steady_clock::now();
        for (int32_t p0 = 0; p0 < a.context; p0 += int32_t(config.max_batch_tokens)) {
          const int32_t n = std::min<int32_t>(int32_t(config.max_batch_tokens), a.context - p0);
          ForwardBatch fb;
          for (int32_t j = 0; j < n; ++j) fb.tokens.push_back(int32_t((p0 + j) * 31 + i) % int32_t(spec.vocab_size));
          fb.seqs.push_back({.first_token = 0, .n_tokens = n, .start_pos = p0, .block_table = tables[size_t(i)],
                             .want_logits = p0 + n == a.context});
          runner->forward(fb, logits);
        }
        if (i == 0) {
          prefill_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p_start).count();
          if (a.profile && a.expert_parallel == 0 && B == a.batches.front()) {
            std::printf("       prefill device time by op, last chunk (us per layer; embedding, final norm, LM head: per step):");
            for (const auto& [op, op_ms] : cuda_runner_stats(*runner).op_ms_last_step)
              std::printf(" %s %.1f;", op.c_str(),
                          1e3 * op_ms / (op == "embedding" || op == "final norm" || op == "LM head" ? 1.0 : double(spec.n_layers)));
            std::printf("\n");
          }
        }
      }
      prefill_times.push_back(prefill_ms);
      auto decode_batch = [&](int32_t pos) {
        ForwardBatch fb;
        for (int i = 0; i < B; ++i) {
          fb.tokens.push_back(int32_t((pos * 7 + i * 13) % spec.vocab_size));
          fb.seqs.push_back({.first_token = i, .n_tokens = 1, .start_pos = pos, .block_table = tables[size_t(i)],
                             .want_logits = true});
        }
        return fb;
      };
      int32_t pos = a.context;
      RouteCounter routes;
      runner->forward(decode_batch(pos++), logits, &routes);
      double experts_per_layer = 0;
      for (const auto& s : routes.per_layer) experts_per_layer += double(s.size());
      const int64_t distinct = int64_t(experts_per_layer);
      if (!routes.per_layer.empty()) experts_per_layer /= double(routes.per_layer.size());
      // Each decode step as the engine runs it: greedy samplers, the pick made where the logits are
      // (--host-logits: every row's logits copied to the host instead).
      SamplingParams greedy;
      greedy.temperature = 0.0f;
      std::vector<SequenceSampler> samplers;
      for (int i = 0; i < B; ++i) samplers.emplace_back(greedy, std::span<const int32_t>{}, uint64_t(i));
      std::vector<SequenceSampler*> sampler_ptrs;
      for (auto& sm : samplers) sampler_ptrs.push_back(&sm);
      StepResult sampled;
      for (int s = 0; s < warmup; ++s) {
        runner->forward_sample(decode_batch(pos), sampler_ptrs, sampled);
        ++pos;
      }
      const ExpertTraffic before = runner->expert_traffic();
      const CudaRunnerStats cpu_before = a.expert_parallel == 0 ? cuda_runner_stats(*runner) : CudaRunnerStats{};
      std::vector<double> ms;
      for (int s = 0; s < a.steps; ++s) {
        const ForwardBatch fb = decode_batch(pos);
        const auto s0 = std::chrono::steady_clock::now();
        if (a.host_logits) runner->forward(fb, logits);
        else runner->forward_sample(fb, sampler_ptrs, sampled);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count());
        ++pos;
      }
      const ExpertTraffic after_steps = runner->expert_traffic();
      std::sort(ms.begin(), ms.end());
      const double step_ms = ms[ms.size() / 2];
      const int64_t bytes = dense_bytes + distinct * expert_bytes + int64_t(B) * (pos - 1) * kv_token_bytes;
      // With experts in host RAM: the routed ones there cross PCIe (in-place reads, ~50 GB/s measured).
      int64_t host_routed = 0;
      if (config.expert_plan)
        for (size_t l = 0; l < routes.per_layer.size() && l < config.expert_plan->layers.size(); ++l)
          for (int32_t e : routes.per_layer[l]) {
            const std::vector<int32_t>& h = config.expert_plan->layers[l].host;
            host_routed += std::binary_search(h.begin(), h.end(), e);
          }
      const double host_bytes = double(host_routed * expert_bytes);
      const double roof_ms = (double(bytes) - host_bytes) / (a.ceiling_gbps * 1e9) * 1e3 + host_bytes / (a.pcie_gbps * 1e9) * 1e3;
      if (config.expert_plan)
        std::printf("       %.1f of %.1f routed experts per layer in host RAM: %.1f MB over PCIe per step (roofline: "
                    "VRAM bytes at %.0f GB/s + host bytes at %.0f GB/s)\n",
                    double(host_routed) / double(std::max<size_t>(routes.per_layer.size(), 1)), experts_per_layer,
                    host_bytes / 1e6, a.ceiling_gbps, a.pcie_gbps);
      std::printf("%6d %10.3f %12.1f %12.1f %10.1f %10.1f %12.3f %10.1f %8.1f%%\n", B, step_ms, 1e3 / step_ms,
                  B * 1e3 / step_ms, experts_per_layer, bytes / 1e6, roof_ms, 1e3 / roof_ms, 100 * roof_ms / step_ms);
      if (config.expert_plan) {
        // What the timed steps read, counted by the MoE kernels themselves.
        const double steps = double(a.steps), tokens = double(after_steps.tokens - before.tokens);
        const double host_mb = double(after_steps.host_bytes - before.host_bytes) / steps / 1e6;
        const int64_t host_r = after_steps.host_routings - before.host_routings;
        const int64_t cache_r = after_steps.cache_routings - before.cache_routings;
        const int64_t all_r = after_steps.routings - before.routings;
        const double measured_roof_ms =
            (double(bytes) - host_bytes) / (a.ceiling_gbps * 1e9) * 1e3 + host_mb * 1e6 / (a.pcie_gbps * 1e9) * 1e3;
        std::printf("       measured: %.1f MB over PCIe per step (predicted %.1f), host routings %.1f%% of %.1f per "
                    "token, cache served %.1f%% of host-expert routings (%lld slots used of %lld, %lld copies, %lld "
                    "evictions so far); roofline at the measured host bytes %.3f ms (%.1f%% achieved)\n",
                    host_mb, host_bytes / 1e6, all_r ? 100.0 * double(host_r) / double(all_r) : 0.0,
                    tokens > 0 ? double(all_r) / tokens : 0.0,
                    host_r + cache_r ? 100.0 * double(cache_r) / double(host_r + cache_r) : 0.0,
                    (long long)after_steps.cache_slots_used, (long long)after_steps.cache_slots,
                    (long long)after_steps.cache_copies, (long long)after_steps.cache_evictions, measured_roof_ms,
                    100 * measured_roof_ms / step_ms);
      }
      if (config.cpu_expert_share != 0 && a.expert_parallel == 0) {
        const CudaRunnerStats c = cuda_runner_stats(*runner);
        const double calls = double(c.cpu_expert_calls - cpu_before.cpu_expert_calls);
        const double gb = double(c.cpu_expert_bytes - cpu_before.cpu_expert_bytes) / 1e9;
        const double busy = c.cpu_expert_busy_seconds - cpu_before.cpu_expert_busy_seconds;
        std::printf("       CPU experts: %.1f MB per step in %.0f us of CPU time per step (%.1f calls), %.1f GB/s while busy\n",
                    1e3 * gb / a.steps, 1e6 * busy / a.steps, calls / a.steps, busy > 0 ? gb / busy : 0.0);
      }
      if (a.profile && a.expert_parallel == 0) {
        const CudaRunnerStats ps = cuda_runner_stats(*runner);
        double total = 0;
        for (const auto& [op, op_ms] : ps.op_ms_last_step) total += op_ms;
        std::printf("       device time by op, last step (us per layer; embedding, final norm, LM head: per step; total %.3f ms):", total);
        for (const auto& [op, op_ms] : ps.op_ms_last_step)
          std::printf(" %s %.1f;", op.c_str(), 1e3 * op_ms / (op == "embedding" || op == "final norm" || op == "LM head" ? 1.0 : double(spec.n_layers)));
        std::printf("\n");
      }
    }
    std::printf("\nprefill of one %d-token prompt (chunks of %lld), eager launches:", a.context,
                (long long)config.max_batch_tokens);
    for (double ms : prefill_times) std::printf(" %.1f ms (%.0f tok/s)", ms, a.context * 1e3 / ms);
    std::printf("\n");
    if (a.expert_parallel > 0) return 0;  // a group has no one runner's stats
    const CudaRunnerStats after = cuda_runner_stats(*runner);
    std::printf("\nkernel launches in the last step (batch %d): %lld (%.1f per layer)\n", a.batches.back(),
                (long long)after.launches_last_step, double(after.launches_last_step) / double(spec.n_layers));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_decode_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
