// spill info: what a model is and where its bytes go, by tensor class.
#include <fmt/format.h>

#include <map>
#include <set>

#include "backend/cuda/device_info.h"
#include "cli/commands.h"
#include "model/model.h"

namespace spill::cli {

namespace {

std::string human_bytes(int64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return fmt::format("{:.2f} {}", v, units[u]);
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

void run_info(const std::string& model_dir) {
  auto model = Model::load(model_dir);
  const ModelSpec& s = model->spec();
  Tally tally;
  tally.add("embeddings", model->embed);
  tally.add("embeddings", model->lm_head);
  tally.add("norms", model->final_norm);
  int64_t expert_bytes = 0;
  for (size_t l = 0; l < model->layers.size(); ++l) {
    const LayerWeights& w = model->layers[l];
    for (const TensorView* t : {&w.q, &w.k, &w.v, &w.o, &w.q_bias, &w.k_bias, &w.v_bias, &w.o_bias})
      tally.add("attention", *t);
    for (const TensorView* t : {&w.attn_norm, &w.mlp_norm, &w.q_norm, &w.k_norm}) tally.add("norms", *t);
    for (const TensorView* t : {&w.dense.gate, &w.dense.up, &w.dense.down}) tally.add("dense MLP", *t);
    tally.add("router", w.router);
    for (const ExpertWeights& e : w.experts) {
      for (const TensorView* t : {&e.gate, &e.up, &e.down}) tally.add("routed experts", *t);
      if (!expert_bytes) expert_bytes = int64_t(e.gate.nbytes() + e.up.nbytes() + e.down.nbytes());
    }
  }
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
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print a model's architecture, parameter count and bytes by tensor class");
  auto model = std::make_shared<std::string>();
  cmd->add_option("--model", *model, "Hugging Face model folder or GGUF file (default: the bundled spill-tiny)");
  cmd->callback([model] { run_info(model->empty() ? default_model_dir() : *model); });
}

}  // namespace spill::cli
