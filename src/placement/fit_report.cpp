#include "placement/fit_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace spill::placement {

namespace {

// Tables are in GiB, or in MiB for models under a few GiB, so small models still show numbers.
struct Unit {
  double div;
  const char* name;
  std::string operator()(int64_t b) const { return fmt::format("{:.2f}", double(b) / div); }
};
Unit pick_unit(const std::vector<GpuPlan>& gpus) {
  int64_t largest = 0;
  for (const GpuPlan& g : gpus) largest = std::max({largest, g.budget, g.vram_total()});
  if (largest < (int64_t(2) << 30)) return {double(1 << 20), "MiB"};
  return {double(int64_t(1) << 30), "GiB"};
}

// One row per GPU: the classes, KV, workspace, total, budget.
void gpu_table(std::string& out, const std::vector<GpuPlan>& gpus, bool with_host, const Unit& g2) {
  out += fmt::format("  {:<6}{:>8}{:>8}{:>10}{:>8}{:>8}{:>9}{:>8}{:>8}{:>8}{:>9}{:>8}{:>9}{:>9}{:>10}{:>9}{}\n", g2.name,
                     "layers", "embed", "attention", "router", "shared", "experts", "dense", "norms", "head", "weights",
                     "KV", "workspc", "total", "available", "free", with_host ? "   host experts" : "");
  for (const GpuPlan& g : gpus) {
    const ClassBytes& w = g.weights;
    const std::string layers = g.n_layers ? fmt::format("{}-{}", g.first_layer, g.first_layer + g.n_layers - 1) : "-";
    out += fmt::format("  gpu{:<3}{:>8}{:>8}{:>10}{:>8}{:>8}{:>9}{:>8}{:>8}{:>8}{:>9}{:>8}{:>9}{:>9}{:>10}{:>9}", g.gpu, layers,
                       g2(w[TensorClass::Embedding]), g2(w[TensorClass::Attention]), g2(w[TensorClass::Router]),
                       g2(w[TensorClass::SharedExperts]), g2(w[TensorClass::RoutedExperts]), g2(w[TensorClass::DenseMlp]),
                       g2(w[TensorClass::Norms]), g2(w[TensorClass::LmHead]), g2(w.total()), g2(g.kv), g2(g.workspace + g.reserve),
                       g2(g.vram_total()), g2(g.budget), g2(g.room()));
    if (with_host) out += fmt::format("   {} ({} {})", g.host_experts, g2(g.host_bytes), g2.name);
    if (g.room() < 0) out += fmt::format("   OVER by {}", format_bytes(-g.room()));
    out += "\n";
  }
}

}  // namespace

std::string format_fit_report(const PlanOutcome& o) {
  const PlanRequest& r = o.request;
  const ModelSpec& s = r.shape.spec;
  const Plan& p = o.plan;
  const ModelBytes& mb = p.bytes;
  std::string out;
  const Unit unit = pick_unit(o.no_offload);
  out += fmt::format("model: {} ({}, {} layers, {} routed experts top-{}, {} shared, hidden {}, expert width {})\n",
                     r.shape.source, s.model_type, s.n_layers, s.n_experts, s.n_experts_per_token, r.shape.shared.count,
                     s.hidden_size, s.moe_intermediate_size);
  if (r.measured) out += fmt::format("types: as the file stores them (most bytes of each class: {})\n", format_tensor_class_types(r.types));
  else out += fmt::format("types: {}\n", format_tensor_class_types(r.types));
  for (const std::string& n : mb.notes) out += fmt::format("  note: {}\n", n);
  int64_t eb_min = mb.routed_expert_bytes;
  for (const LayerBytes& lb : mb.layers)
    if (lb.n_routed_experts > 0) eb_min = std::min(eb_min, lb.routed_expert_bytes);
  if (eb_min != mb.routed_expert_bytes)
    out += fmt::format("routed expert: {} to {} bytes by layer ({} to {}; {} weights, {:.4f} to {:.4f} bits per weight "
                       "with block scales); all routed experts {}\n",
                       eb_min, mb.routed_expert_bytes, format_bytes(eb_min), format_bytes(mb.routed_expert_bytes),
                       mb.routed_expert_weights, 8.0 * double(eb_min) / double(mb.routed_expert_weights),
                       8.0 * double(mb.routed_expert_bytes) / double(mb.routed_expert_weights),
                       format_bytes(mb.total[TensorClass::RoutedExperts]));
  else if (mb.routed_expert_bytes > 0)
    out += fmt::format("routed expert: {} bytes ({}; {} weights, {:.4f} bits per weight with block scales); all routed "
                       "experts {}\n",
                       mb.routed_expert_bytes, format_bytes(mb.routed_expert_bytes), mb.routed_expert_weights,
                       8.0 * double(mb.routed_expert_bytes) / double(mb.routed_expert_weights),
                       format_bytes(mb.total[TensorClass::RoutedExperts]));
  out += fmt::format("weights: {} in all (embedding {}, attention {}, dense {}, router {}, shared {}, routed {}, "
                     "norms {}, head {}){}\n",
                     format_bytes(mb.total.total()), format_bytes(mb.total[TensorClass::Embedding]),
                     format_bytes(mb.total[TensorClass::Attention]), format_bytes(mb.total[TensorClass::DenseMlp]),
                     format_bytes(mb.total[TensorClass::Router]), format_bytes(mb.total[TensorClass::SharedExperts]),
                     format_bytes(mb.total[TensorClass::RoutedExperts]), format_bytes(mb.total[TensorClass::Norms]),
                     format_bytes(mb.total[TensorClass::LmHead]), mb.tied_embedding ? "; embedding tied to the head" : "");
  out += fmt::format("KV: {} per token ({}), {} tokens = {} x {} ({}); workspace {} per GPU for --max-batch-tokens {}\n",
                     format_bytes(p.kv_bytes_per_token), kv_format_name(r.kv_format), p.kv_tokens,
                     r.kv_mem > 0 ? std::string("--kv-mem") : fmt::format("{}", p.max_seqs),
                     r.kv_mem > 0 ? format_bytes(r.kv_mem) : fmt::format("{} tokens", p.max_model_len),
                     format_bytes(p.kv_tokens * p.kv_bytes_per_token), format_bytes(p.workspace_per_gpu), r.max_batch_tokens);
  if (p.kv_sliding_bytes_per_token > 0)
    out += fmt::format("KV of the sliding-window layers: {} per token, {} tokens ({} windows of {} in blocks of {}) = {}; "
                       "KV in all {}\n",
                       format_bytes(p.kv_sliding_bytes_per_token), p.kv_sliding_tokens, p.max_seqs,
                       r.shape.spec.sliding_window, r.kv_block_size,
                       format_bytes(p.kv_sliding_tokens * p.kv_sliding_bytes_per_token), format_bytes(p.kv_bytes()));
  if (r.gpu_reserve > 0) out += fmt::format("reserve: {} per GPU (counted with the workspace)\n", format_bytes(r.gpu_reserve));

  out += "\nwithout offload (everything in VRAM):\n";
  gpu_table(out, o.no_offload, false, unit);
  bool no_offload_fits = true;
  for (const GpuPlan& g : o.no_offload) no_offload_fits &= g.room() >= 0;
  out += no_offload_fits ? "  fits without offload\n" : "  does not fit without offload\n";

  if (!o.fits) {
    out += fmt::format("\nREFUSED: {}\n", o.refusal);
    return out;
  }

  out += fmt::format("\nwith the plan (usage: {}):\n", p.usage_source);
  gpu_table(out, p.gpus, true, unit);
  if (p.parallel == Parallelism::Experts) {
    // Per layer, the spread of host experts over the GPUs: the slowest link sets a layer's time.
    int64_t spread_max = 0;
    for (const LayerPlan& l : p.layers) {
      if (!l.moe) continue;
      std::vector<int64_t> per_gpu(p.gpus.size(), 0);
      for (int32_t e : l.host_experts) ++per_gpu[size_t(l.owner[size_t(e)])];
      spread_max = std::max(spread_max, *std::max_element(per_gpu.begin(), per_gpu.end()) -
                                            *std::min_element(per_gpu.begin(), per_gpu.end()));
    }
    auto yes = [](bool b) { return b ? "split" : "replicated"; };
    auto part = [&](TensorClass c, bool split) { return mb.total[c] == 0 ? "none" : yes(split); };
    out += fmt::format("  expert parallel over {} GPUs: every GPU holds a share of each layer's routed experts and reads "
                       "its host ones over its own link (host experts of a layer differ by at most {} between GPUs); "
                       "attention and KV {}, shared experts {}, dense MLPs {}, embedding and head {}; router and norms "
                       "replicated\n",
                       p.gpus.size(), spread_max, yes(p.split.attention), part(TensorClass::SharedExperts, p.split.shared),
                       part(TensorClass::DenseMlp, p.split.dense), yes(p.split.vocab));
    for (const std::string& n : p.split.notes) out += fmt::format("  note: {}\n", n);
    if (p.split.attention || p.split.shared || p.split.dense || p.split.vocab)
      out += "  note: spill's expert-parallel runner runs plans that replicate all but the routed experts; this one is "
             "for sizing (plan with --attention replicated to serve it)\n";
  }
  int64_t min_h = std::numeric_limits<int64_t>::max(), max_h = 0, n_moe = 0;
  for (const LayerPlan& l : p.layers) {
    if (!l.moe) continue;
    ++n_moe;
    min_h = std::min<int64_t>(min_h, int64_t(l.host_experts.size()));
    max_h = std::max<int64_t>(max_h, int64_t(l.host_experts.size()));
  }
  if (n_moe == 0) min_h = 0;
  const int64_t routed = p.routed_experts();
  out += fmt::format("  host RAM: {}: {} of {} routed experts ({:.1f}%; per layer min {} / max {}){}\n", format_bytes(p.host_bytes()),
                     p.host_experts(), routed, routed ? 100.0 * double(p.host_experts()) / double(routed) : 0.0, min_h,
                     max_h, p.embedding_on_host ? fmt::format(" (with the embedding, {})", format_bytes(mb.embedding)) : "");
  if (r.host_mem > 0) out += fmt::format("  host RAM allowed: {}\n", format_bytes(r.host_mem));

  out += fmt::format("\ndecode (ceilings: HBM read {:.0f} GB/s, in-place host read {:.1f} GB/s; {} tokens of context "
                     "per stream). bound: per layer the larger of its VRAM and host reads, compute and latency not "
                     "counted; expected: per layer its VRAM reads at the {:.0f} GB/s spill's decode kernels reach, then "
                     "its host reads, plus {:.1f} + {:.2f} x batch us of kernel latency (the CUDA runner measured on "
                     "an H200):\n",
                     r.ceilings.hbm_read_gbps, r.ceilings.host_read_gbps, r.report_context,
                     std::min(r.ceilings.decode_vram_gbps, r.ceilings.hbm_read_gbps), r.ceilings.layer_overhead_us,
                     r.ceilings.layer_overhead_us_per_token);
  if (p.parallel == Parallelism::Experts)
    out += fmt::format("  expert parallel: a layer takes as long as its slowest GPU, plus its all-reduces at {:.1f} us "
                       "each (assumed, --allreduce-us; spill has not measured one yet)\n",
                       r.ceilings.allreduce_us);
  out += fmt::format("  {:>6}{:>18}{:>20}{:>18}{:>12}{:>16}{:>14}{:>14}{:>16}\n", "batch", "host MiB/token",
                     "host experts/step", "VRAM GiB/step", "bound ms", "bound tok/s", "tok/s total", "expected ms",
                     "expected tok/s");
  std::vector<int64_t> batches{1};
  if (r.report_batch > 1) batches.push_back(r.report_batch);
  for (int64_t B : batches) {
    const DecodeEstimate d = estimate_decode(p, r, B, r.report_context);
    out += fmt::format("  {:>6}{:>18.2f}{:>20.1f}{:>18.3f}{:>12.3f}{:>16.1f}{:>14.1f}{:>14.3f}{:>16.1f}\n", B,
                       d.host_bytes_per_token / double(1 << 20), d.expected_host_experts_per_step,
                       d.vram_bytes_per_step / double(int64_t(1) << 30), 1e3 * d.step_seconds,
                       d.tokens_per_s_per_stream, d.tokens_per_s_per_stream * double(B),
                       1e3 * d.expected_step_seconds, d.expected_tokens_per_s_per_stream);
  }
  out += "  fits\n";
  return out;
}

}  // namespace spill::placement
