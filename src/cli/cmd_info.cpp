// spill info: what a model is and where its bytes go, by tensor class.
#include <fmt/format.h>

#include <map>
#include <set>
#include <tuple>

#include "backend/cuda/device_info.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "model/model.h"
#include "model/quantize_on_load.h"
#include "model/runner.h"
#include "placement/measured_bytes.h"

namespace spill::cli {

namespace {

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return fmt::format("{:.2f} {}", v, units[u]);
}

int64_t first_moe_layer(const ModelSpec& s) {
  for (int64_t l = 0; l < s.n_layers; ++l)
    if (s.layer_is_moe[size_t(l)]) return l;
  return -1;
}

struct Tally {
  std::map<std::string, std::pair<int64_t, int64_t>> by_class;  // class -> (params, bytes)
  std::set<const void*> seen;                                    // tied tensors count once
  void add(const std::string& cls, const TensorView& t) {
    if (t.empty() || !seen.insert(t.data).second) return;
    by_class[cls].first += t.numel();
    by_class[cls].second += int64_t(t.nbytes());
  }
};

// What --quant would make of this model: per class the types and bytes, per weight role the
// type of each layer when the mix varies it, and every row-width fallback.
void print_quant_plan(const Model& model, const std::string& spec) {
  const quant::QuantMix mix = quant::parse_quant_mix(spec);
  const std::vector<QuantPlanEntry> plan = plan_quantization(model, mix);
  struct ClassTally {
    int64_t before = 0, after = 0, params = 0;
    std::map<std::string, int64_t> types;  // "Q4_K" -> tensors
  };
  std::map<int, ClassTally> classes;
  // (class, role) -> type -> layers; fallbacks by (class, role, from, to, cols) -> layers.
  std::map<std::pair<int, int>, std::map<std::string, std::set<int>>> layer_types;
  struct Fallback {
    std::set<int> layers;
    int64_t count = 0;
    std::string reason;
  };
  std::map<std::tuple<int, int, std::string, std::string, int64_t>, Fallback> fallbacks;
  int64_t before = 0, after = 0;
  for (const QuantPlanEntry& p : plan) {
    const DType to = p.choice.quantize ? p.choice.type : p.from;
    const int64_t b0 = p.rows * row_bytes(p.from, p.cols), b1 = p.rows * row_bytes(to, p.cols);
    ClassTally& c = classes[int(p.cls)];
    c.before += b0, c.after += b1, c.params += p.rows * p.cols;
    before += b0, after += b1;
    const std::string type = std::string(dtype_name(to)) + (p.choice.quantize ? "" : " (kept)");
    c.types[type] += 1;
    layer_types[{int(p.cls), int(p.key.role)}][type].insert(p.key.layer);
    if (p.choice.fell_back()) {
      auto& f = fallbacks[{int(p.cls), int(p.key.role), std::string(dtype_name(p.choice.wanted)),
                           std::string(dtype_name(p.choice.type)), p.cols}];
      f.layers.insert(p.key.layer);
      f.count += 1;
      f.reason = p.choice.fallback_reason;
    }
  }
  auto layers_str = [](const std::set<int>& ls) {
    if (ls.count(-1)) return std::string("model level");
    return fmt::format("layers {}", fmt::join(ls, ","));
  };
  fmt::print("\nquantization   --quant {} -> {} (llama.cpp-style mix; docs/QUANT.md)\n", spec, mix.str());
  fmt::print("weights        {} -> {} ({:.3f} bits per quantizable weight)\n", human_bytes(before), human_bytes(after),
             [&] {
               int64_t n = 0;
               for (auto& [cls, c] : classes) n += c.params;
               return n ? 8.0 * double(after) / double(n) : 0.0;
             }());
  fmt::print("{:<10} {:>14} {:>14}  {}\n", "class", "bytes", "quantized", "types (tensors)");
  for (auto& [cls, c] : classes) {
    std::string types;
    for (auto& [t, n] : c.types) types += (types.empty() ? "" : ", ") + fmt::format("{} x{}", t, n);
    fmt::print("{:<10} {:>14} {:>14}  {}\n", quant::tensor_class_name(quant::TensorClass(cls)), c.before, c.after, types);
  }
  fmt::print("by role and layer:\n");
  for (auto& [key, types] : layer_types) {
    std::string s;
    for (auto& [t, ls] : types) s += (s.empty() ? "" : "; ") + fmt::format("{} in {}", t, layers_str(ls));
    fmt::print("  {:<10} {:<18} {}\n", quant::tensor_class_name(quant::TensorClass(key.first)),
               weight_role_name(WeightRole(key.second)), s);
  }
  if (fallbacks.empty()) {
    fmt::print("fallbacks: none (every row is a whole number of blocks)\n");
  } else {
    fmt::print("fallbacks (rows that are not a whole number of blocks of the type asked for):\n");
    for (auto& [k, f] : fallbacks) {
      auto& [cls, role, from, to, cols] = k;
      fmt::print("  {} {} x{} ({}): {} -> {}: {}\n", quant::tensor_class_name(quant::TensorClass(cls)),
                 weight_role_name(WeightRole(role)), f.count, layers_str(f.layers), from, to, f.reason);
    }
  }
}

void run_info(const ModelFlags& flags) {
  // A synthetic model is described without writing its weights: sizes of any shape in seconds.
  auto model = flags.synthetic.empty() ? Model::load(flags.dir()) : open_model(flags, 1, true, /*fill=*/false);
  const ModelSpec& s = model->spec();
  Tally tally;
  int64_t expert_bytes = 0;  // the first routed expert's
  placement::visit_weights(*model, [&](placement::TensorClass c, int64_t layer, int64_t expert, const TensorView& t) {
    using placement::TensorClass;
    switch (c) {
      case TensorClass::Embedding:
      case TensorClass::LmHead: tally.add("embeddings", t); break;
      case TensorClass::Attention: tally.add("attention", t); break;
      case TensorClass::DenseMlp: tally.add("dense MLP", t); break;
      case TensorClass::Router: tally.add("router", t); break;
      case TensorClass::SharedExperts: tally.add("shared experts", t); break;
      case TensorClass::Norms: tally.add("norms", t); break;
      case TensorClass::RoutedExperts:
        tally.add("routed experts", t);
        if (expert == 0 && layer == first_moe_layer(s)) expert_bytes += int64_t(t.nbytes());
        break;
    }
  });
  int64_t total_params = 0, total_bytes = 0;
  for (auto& [cls, pb] : tally.by_class) total_params += pb.first, total_bytes += pb.second;
  const int64_t expert_params = tally.by_class.count("routed experts") ? tally.by_class["routed experts"].first : 0;
  const int64_t active = total_params - expert_params +
                         (s.n_experts ? expert_params / s.n_experts * s.n_experts_per_token : 0);

  fmt::print("model          {}\n", model->where());
  fmt::print("architecture   {} ({} layers, hidden {}, {} heads / {} KV heads x {}, vocab {})\n", s.model_type,
             s.n_layers, s.hidden_size, s.n_heads, s.n_kv_heads, s.head_dim, s.vocab_size);
  if (s.n_experts)
    fmt::print("experts        {} routed per MoE layer, top-{}, {} MoE layers of {}, expert width {}{}\n",
               s.n_experts, s.n_experts_per_token, s.n_moe_layers(), s.n_layers, s.moe_intermediate_size,
               s.norm_topk_prob ? ", top-k renormalised" : "");
  if (s.attention == AttentionKind::Mla)
    fmt::print("attention      MLA: q_lora_rank {}, kv_lora_rank {}, rope {} / nope {} / v {} per head\n", s.mla.q_lora_rank,
               s.mla.kv_lora_rank, s.mla.qk_rope_head_dim, s.mla.qk_nope_head_dim, s.mla.v_head_dim);
  const KvGroups kv_groups_of_model = kv_groups(s);
  if (kv_groups_of_model.size() == 1 && kv_groups_of_model.groups[0].window == 0) {
    fmt::print("KV cache       {} values per token per layer ({}), {} bytes per token in f32 over {} layers\n",
               s.kv_values_per_token(), s.attention == AttentionKind::Mla ? "latent + rope key" : "K + V",
               kv_bytes_per_token(s, KvFormat::F32), s.n_layers);
  } else {
    // Sliding layers keep a window, not the context: the honest figure is per layer kind.
    const int64_t per_layer = kv_bytes_per_token_per_layer(s, KvFormat::F32);
    int64_t full_layers = 0, sliding_layers = 0;
    for (const KvGroup& g : kv_groups_of_model.groups) (g.window > 0 ? sliding_layers : full_layers) += int64_t(g.layers.size());
    const int64_t context = s.max_position_embeddings;
    fmt::print("KV cache       {} values per token per layer (K + V), {} bytes per token in f32 over {} full-attention "
               "layers, plus {} bytes per token of the last {} over {} sliding-window layers: {} bytes for a sequence of "
               "{} tokens ({} bytes per token), in blocks of 16\n",
               s.kv_values_per_token(), full_layers * per_layer, full_layers, sliding_layers * per_layer,
               s.sliding_window, sliding_layers, kv_bytes_for_sequence(s, KvFormat::F32, context, 16), context,
               context > 0 ? kv_bytes_for_sequence(s, KvFormat::F32, context, 16) / context : 0);
  }
  fmt::print("parameters     {:.3f} M total, {:.3f} M active per token\n", total_params / 1e6, active / 1e6);
  fmt::print("weights        {} ({} bytes)\n\n", human_bytes(total_bytes), total_bytes);
  fmt::print("{:<16} {:>14} {:>14} {:>7}\n", "tensor class", "parameters", "bytes", "share");
  for (const char* cls : {"embeddings", "attention", "norms", "router", "dense MLP", "shared experts", "routed experts"}) {
    auto it = tally.by_class.find(cls);
    const int64_t p = it == tally.by_class.end() ? 0 : it->second.first;
    const int64_t b = it == tally.by_class.end() ? 0 : it->second.second;
    fmt::print("{:<16} {:>14} {:>14} {:>6.1f}%\n", cls, p, b, total_bytes ? 100.0 * b / total_bytes : 0.0);
  }
  if (s.n_experts)
    fmt::print("\nbytes per routed expert: {} ({}), {} routed experts in all\n", expert_bytes, human_bytes(expert_bytes),
               s.n_experts * s.n_moe_layers());
  std::string why;
  auto gpus = list_gpus(&why);
  if (gpus.empty()) fmt::print("\nGPUs: none ({})\n", why);
  for (const GpuInfo& g : gpus)
    fmt::print("\nGPU {}: {} (sm_{}{}), {} total, {} free, {} SMs", g.index, g.name, g.compute_major, g.compute_minor,
               human_bytes(g.total_memory), human_bytes(g.free_memory), g.multiprocessors);
  if (!gpus.empty()) fmt::print("\n");
  if (!flags.quant.empty()) print_quant_plan(*model, flags.quant);
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print a model's architecture, parameter count and bytes by tensor class");
  auto flags = std::make_shared<ModelFlags>();
  add_model_flags(cmd, *flags);
  cmd->callback([flags] { run_info(*flags); });
}

}  // namespace spill::cli
