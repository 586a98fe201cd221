#include "placement/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <span>

#include "core/error.h"

namespace spill::placement {

int64_t Plan::host_experts() const {
  int64_t n = 0;
  for (const LayerPlan& l : layers) n += int64_t(l.host_experts.size());
  return n;
}

int64_t Plan::host_bytes() const {
  int64_t b = embedding_on_host ? bytes.embedding : 0;
  for (const LayerPlan& l : layers) b += int64_t(l.host_experts.size()) * bytes.layers[size_t(l.layer)].routed_expert_bytes;
  return b;
}

int64_t Plan::routed_experts() const {
  int64_t n = 0;
  for (const LayerBytes& l : bytes.layers) n += l.n_routed_experts;
  return n;
}

namespace {

// What the split and the expert choice work from: fixed bytes per layer and per GPU.
struct Budgeting {
  const PlanRequest& req;
  const ModelBytes& mb;
  int64_t workspace = 0;
  bool embedding_on_gpu = true;
  std::vector<int64_t> layer_fixed{};  // weights except routed experts, plus the layer's KV
  std::vector<int64_t> layer_routed{};  // all routed experts of the layer

  int64_t gpu_extra(size_t g) const {
    int64_t b = req.gpu_reserve + workspace;
    if (g == 0 && embedding_on_gpu) b += mb.embedding;
    if (g + 1 == req.gpu_mem.size()) b += mb.lm_head;
    return b;
  }
  int64_t layer_need(size_t l, double host_fraction) const {
    return layer_fixed[l] + int64_t(std::ceil((1.0 - host_fraction) * double(layer_routed[l])));
  }
};

// Greedy contiguous split: each GPU in turn takes layers while it stays within cap x budget with
// host_fraction of every layer's experts in host RAM. Returns layers per GPU, or empty if some
// layer is left over.
std::vector<int64_t> greedy_split(const Budgeting& b, double host_fraction, double cap) {
  const size_t G = b.req.gpu_mem.size(), L = b.layer_fixed.size();
  std::vector<int64_t> counts(G, 0);
  size_t l = 0;
  for (size_t g = 0; g < G; ++g) {
    const double limit = cap * double(b.req.gpu_mem[g]);
    double used = double(b.gpu_extra(g));
    if (used > limit) return {};
    while (l < L && used + double(b.layer_need(l, host_fraction)) <= limit) {
      used += double(b.layer_need(l, host_fraction));
      ++counts[g];
      ++l;
    }
  }
  if (l < L) return {};
  return counts;
}

// The smallest x in [lo, hi] for which ok(x) holds, ok monotone, ok(hi) true; 50 halvings.
template <class F>
double smallest(double lo, double hi, F ok) {
  if (ok(lo)) return lo;
  for (int i = 0; i < 50; ++i) {
    const double mid = 0.5 * (lo + hi);
    (ok(mid) ? hi : lo) = mid;
  }
  return hi;
}

// Spreads n host experts over the given MoE layers as evenly as counts go; the layers that take
// one more are those whose next candidate is least used (then the lower layer). order[l] lists
// layer l's experts from least to most used.
std::vector<int64_t> spread(int64_t n, const std::vector<int64_t>& layers, const std::vector<int64_t>& experts_in,
                            const std::vector<std::vector<int32_t>>& order, const std::vector<std::vector<double>>& usage) {
  std::vector<int64_t> quota(layers.size(), 0);
  if (layers.empty() || n <= 0) return quota;
  int64_t capacity = 0;
  for (int64_t l : layers) capacity += experts_in[size_t(l)];
  n = std::min(n, capacity);
  const int64_t base = n / int64_t(layers.size());
  int64_t extra = n % int64_t(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) quota[i] = std::min(base, experts_in[size_t(layers[i])]);
  int64_t placed = 0;
  for (int64_t q : quota) placed += q;
  extra = n - placed;
  while (extra > 0) {
    // One more expert, to the layer whose next candidate costs least.
    size_t best = layers.size();
    double best_cost = 0;
    for (size_t i = 0; i < layers.size(); ++i) {
      const int64_t l = layers[i];
      if (quota[i] >= experts_in[size_t(l)]) continue;
      if (quota[i] > base) continue;  // at most one above the even share while others have room
      const double cost = usage[size_t(l)][size_t(order[size_t(l)][size_t(quota[i])])];
      if (best == layers.size() || cost < best_cost) best = i, best_cost = cost;
    }
    if (best == layers.size()) {  // every layer at base + 1: allow more (uneven expert counts only)
      for (size_t i = 0; i < layers.size() && best == layers.size(); ++i)
        if (quota[i] < experts_in[size_t(layers[i])]) best = i;
    }
    ++quota[best];
    --extra;
  }
  return quota;
}

std::string gib_str(int64_t b) { return format_bytes(b); }

// Why a model does not fit even with every expert that may move in host RAM (`gpus`: the GPUs at
// that share), with single changes that would fit it.
std::string refusal_message(const PlanRequest& req, const Plan& plan, const std::vector<GpuPlan>& gpus,
                            const std::vector<GpuPlan>& no_offload, int64_t kv_layer) {
  const ModelSpec& s = req.shape.spec;
  const ModelBytes& mb = plan.bytes;
  std::string msg;
  int64_t worst_over = 0;
  for (const GpuPlan& g : gpus) worst_over = std::max(worst_over, -g.room());
  const int64_t kv_total = plan.kv_bytes();
  const int64_t kv_per_seq = kv_total / std::max<int64_t>(1, req.max_seqs);
  if (!req.allow_offload) {
    int64_t over = 0;
    for (const GpuPlan& g : no_offload) over = std::max(over, -g.room());
    msg = fmt::format(
        "the model does not fit in VRAM without offload: the fullest GPU needs {} more than its {} ({} needed). Allow "
        "offload (drop --no-offload) to put the least-used routed experts in host RAM.",
        gib_str(over), gib_str(no_offload[0].budget), gib_str(no_offload[0].vram_total()));
  } else {
    msg = fmt::format(
        "the model does not fit even with every routed expert in host RAM: the fullest GPU is {} over its budget "
        "(per GPU: {}). What stays in VRAM is attention {}, shared experts {}, router {}, dense MLP {}, norms {}, "
        "head {}, KV {} ({} tokens of {}), workspace {} per GPU (--max-batch-tokens {}).",
        gib_str(worst_over),
        [&] {
          std::string t;
          for (const GpuPlan& g : gpus) t += fmt::format("{}gpu{} {} of {}", t.empty() ? "" : ", ", g.gpu, gib_str(g.vram_total()), gib_str(g.budget));
          return t;
        }(),
        gib_str(mb.total[TensorClass::Attention]), gib_str(mb.total[TensorClass::SharedExperts]),
        gib_str(mb.total[TensorClass::Router]), gib_str(mb.total[TensorClass::DenseMlp]), gib_str(mb.total[TensorClass::Norms]),
        gib_str(mb.lm_head), gib_str(kv_total), plan.kv_tokens, format_bytes(plan.kv_bytes_per_token),
        gib_str(plan.workspace_per_gpu), req.max_batch_tokens);
  }
  // What to change, with numbers.
  std::vector<std::string> fixes;
  int64_t total_over = 0;
  for (const GpuPlan& g : gpus) total_over += std::max<int64_t>(0, -g.room());
  if (kv_total > 0 && req.kv_mem == 0 && kv_per_seq > 0) {
    const int64_t seqs = req.max_seqs - (total_over + kv_per_seq - 1) / kv_per_seq;
    if (seqs >= 1) fixes.push_back(fmt::format("--max-seqs {} (each sequence of {} tokens holds {} of KV)", seqs, req.max_model_len, gib_str(kv_per_seq)));
    const int64_t per_token = std::max<int64_t>(1, req.max_seqs * plan.kv_bytes_per_token);
    const int64_t len = (req.max_model_len - (total_over + per_token - 1) / per_token) / req.kv_block_size * req.kv_block_size;
    if (len >= req.kv_block_size) fixes.push_back(fmt::format("--max-model-len {}", len));
  }
  if (req.kv_format != KvFormat::Fp8E4m3 && kv_total > 0)
    fixes.push_back(fmt::format("--kv-format fp8 (KV {} instead of {})",
                                gib_str(kv_total / kv_layer * kv_bytes_per_token_per_layer(s, KvFormat::Fp8E4m3)),
                                gib_str(kv_total)));
  if (req.max_batch_tokens > 512) fixes.push_back(fmt::format("--max-batch-tokens 512 (workspace {} per GPU)",
      gib_str(workspace_bytes(req.shape, {.max_batch_tokens = 512, .max_logit_rows = std::max<int64_t>(1, req.max_seqs)}))));
  if (!req.measured && dtype_bits_per_weight(req.types[TensorClass::Attention]) > 8.5)
    fixes.push_back("a smaller attention type (--quant attention=q8_0 halves bf16 attention)");
  if (!req.allow_offload) {
    // Smaller routed experts: what the fullest GPU would need with each smaller k-quant.
    for (DType smaller : {DType::Q4_K, DType::Q3_K, DType::Q2_K}) {
      if (dtype_bits_per_weight(smaller) >= dtype_bits_per_weight(req.types[TensorClass::RoutedExperts])) continue;
      PlanRequest r2 = req;
      r2.types[TensorClass::RoutedExperts] = smaller;
      r2.measured.reset();  // a file's mix: priced as its dominant types with the experts requantized
      r2.profile.reset();
      r2.allow_offload = true;  // only its no-offload figures are wanted; no nested suggestions
      const PlanOutcome o2 = make_plan(r2);
      int64_t need = 0;
      for (const GpuPlan& g : o2.no_offload) need = std::max(need, g.vram_total() - g.budget);
      fixes.push_back(fmt::format("--quant experts={} ({} {} the budget on the fullest GPU)", dtype_name(smaller),
                                  gib_str(std::abs(need)), need > 0 ? "still over" : "within"));
      if (need <= 0) break;
    }
    fixes.insert(fixes.begin(), "allow offload");
  }
  fixes.push_back("more or larger GPUs");
  msg += " To fit, change one of: " + fmt::format("{}", fmt::join(fixes, "; ")) + ".";
  return msg;
}


// ---- expert parallelism ---------------------------------------------------------------------------

// Which non-expert parts an expert-parallel plan splits over G GPUs: those whose shapes divide into
// whole heads and whole blocks of their type on every GPU; the rest are replicated, and the notes say why.
TensorSplit choose_split(const PlanRequest& req, int64_t G) {
  TensorSplit t;
  if (req.attention == AttentionParallel::Replicated) {
    t.notes.push_back("attention, shared experts, dense MLPs, embedding and head replicated on every GPU (--attention "
                      "replicated)");
    return t;
  }
  const ModelSpec& s = req.shape.spec;
  t.vocab = true;  // whole rows of the embedding and the head: any count splits
  const int64_t heads_each = s.n_heads % G == 0 ? s.n_heads / G : 0;
  const int64_t o_cols = heads_each * (s.attention == AttentionKind::Mla ? s.mla.v_head_dim : s.head_dim);
  const int64_t attn_block = dtype_block_elems(req.types[TensorClass::Attention]);
  if (s.attention == AttentionKind::Mla)
    t.notes.push_back("attention replicated: its latent KV (MLA) is one per token, shared by all heads");
  else if (heads_each == 0 || s.n_kv_heads % G != 0)
    t.notes.push_back(fmt::format("attention replicated: {} query / {} KV heads do not split over {} GPUs", s.n_heads,
                                  s.n_kv_heads, G));
  else if (o_cols % attn_block != 0)
    t.notes.push_back(fmt::format("attention replicated: {} heads' columns of o ({}) are not whole {} blocks of {}",
                                  heads_each, o_cols, dtype_name(req.types[TensorClass::Attention]), attn_block));
  else
    t.attention = true;
  // An MLP splits by width: gate/up by rows, down by columns, which must be whole blocks on each GPU.
  auto splits = [&](int64_t width, TensorClass c, const char* what) {
    if (width <= 0) return false;
    const int64_t block = dtype_block_elems(req.types[c]);
    if (width % G == 0 && (width / G) % block == 0) return true;
    t.notes.push_back(fmt::format("{} replicated: a width of {} does not split over {} GPUs into whole {} blocks of {}",
                                  what, width, G, dtype_name(req.types[c]), block));
    return false;
  };
  if (req.shape.shared.count > 0) t.shared = splits(req.shape.shared.intermediate_size, TensorClass::SharedExperts, "shared experts");
  bool any_dense = false;
  for (int64_t l = 0; l < s.n_layers; ++l) any_dense |= !s.layer_is_moe[size_t(l)];
  if (any_dense) t.dense = splits(s.intermediate_size, TensorClass::DenseMlp, "dense MLPs");
  return t;
}

// GPU g of an expert-parallel plan without its routed experts: its part (bytes / G, rounded up) of
// every split class, all of every replicated one. A replicated head is GPU 0's alone.
GpuPlan expert_parallel_base(const PlanRequest& req, const Plan& plan, size_t g, bool embedding_on_gpu, int64_t kv_layer) {
  const ModelSpec& s = req.shape.spec;
  const ModelBytes& mb = plan.bytes;
  const TensorSplit& t = plan.split;
  const int64_t G = int64_t(req.gpu_mem.size());
  auto part = [&](int64_t bytes, bool split) { return split ? (bytes + G - 1) / G : bytes; };
  GpuPlan gp;
  gp.gpu = int(g);
  gp.budget = req.gpu_mem[g];
  gp.n_layers = s.n_layers;
  gp.reserve = req.gpu_reserve;
  gp.workspace = plan.workspace_per_gpu;
  gp.embedding = embedding_on_gpu && mb.embedding > 0;
  if (gp.embedding) gp.weights[TensorClass::Embedding] = part(mb.embedding, t.vocab);
  gp.lm_head = t.vocab || g == 0;
  if (gp.lm_head) {
    gp.weights[TensorClass::LmHead] = part(mb.total[TensorClass::LmHead], t.vocab);
    gp.weights[TensorClass::Norms] += mb.lm_head - mb.total[TensorClass::LmHead];
  }
  for (int64_t l = 0; l < s.n_layers; ++l) {
    ClassBytes w = mb.layers[size_t(l)].weights;
    w[TensorClass::Attention] = part(w[TensorClass::Attention], t.attention);
    w[TensorClass::SharedExperts] = part(w[TensorClass::SharedExperts], t.shared);
    w[TensorClass::DenseMlp] = part(w[TensorClass::DenseMlp], t.dense);
    gp.weights += w;
    gp.kv += part(plan.kv_tokens_of_layer(s, l) * kv_layer, t.attention);
  }
  return gp;
}

// Per MoE layer and GPU, how many routed experts it holds in host RAM and in VRAM.
struct ExpertCounts {
  std::vector<std::vector<int64_t>> host, vram;  // [layer][gpu]
};

// Splits each layer's host experts evenly over the GPUs (a layer's remainder goes to the GPUs after
// the previous layer's, so every GPU's total is within one of the others') and its VRAM experts by
// each GPU's room for them (each expert to the GPU with the largest share of its room left, ties to
// the lower GPU). Empty when the VRAM experts do not fit the rooms; with `ignore_room`, VRAM
// experts are dealt evenly whatever the rooms (the everything-in-VRAM table).
std::optional<ExpertCounts> count_experts(const ModelBytes& mb, const std::vector<int64_t>& experts_in,
                                          const std::vector<int64_t>& host_per_layer, const std::vector<int64_t>& rooms,
                                          bool ignore_room) {
  const size_t L = experts_in.size(), G = rooms.size();
  ExpertCounts c{.host = std::vector<std::vector<int64_t>>(L, std::vector<int64_t>(G, 0)),
                 .vram = std::vector<std::vector<int64_t>>(L, std::vector<int64_t>(G, 0))};
  if (!ignore_room)
    for (int64_t r : rooms)
      if (r < 0) return std::nullopt;  // the GPU's share without experts is already over its budget
  std::vector<int64_t> left = rooms;
  size_t host_turn = 0, vram_turn = 0;
  for (size_t l = 0; l < L; ++l) {
    if (experts_in[l] == 0) continue;
    const int64_t H = host_per_layer[l], eb = mb.layers[l].routed_expert_bytes;
    for (int64_t i = 0; i < H; ++i) ++c.host[l][(host_turn + size_t(i)) % G];
    host_turn = (host_turn + size_t(H)) % G;
    for (int64_t i = 0; i < experts_in[l] - H; ++i) {
      size_t best = G;
      if (ignore_room) {
        best = vram_turn;
        vram_turn = (vram_turn + 1) % G;
      } else {
        for (size_t g = 0; g < G; ++g) {
          if (left[g] < eb) continue;
          // The largest left / room, compared without dividing: left_g x room_best > left_best x room_g.
          if (best == G || double(left[g]) * double(rooms[best]) > double(left[best]) * double(rooms[g])) best = g;
        }
        if (best == G) return std::nullopt;
      }
      ++c.vram[l][best];
      left[best] -= eb;
    }
  }
  return c;
}

// Deals `experts` (ascending usage) to GPUs with the given quotas, the most used first, each to the
// GPU with quota left whose share of this layer's usage is smallest (ties to the lower GPU), so
// that the GPUs' traffic in a layer is as even as whole experts allow.
void deal(std::span<const int32_t> experts, const std::vector<int64_t>& quota, const std::vector<double>& usage,
          std::vector<int32_t>& owner) {
  const size_t G = quota.size();
  std::vector<int64_t> left = quota;
  std::vector<double> load(G, 0.0);
  for (size_t i = experts.size(); i-- > 0;) {
    const int32_t e = experts[i];
    size_t best = G;
    for (size_t g = 0; g < G; ++g)
      if (left[g] > 0 && (best == G || load[g] < load[best])) best = g;
    owner[size_t(e)] = int32_t(best);
    load[best] += usage[size_t(e)];
    --left[best];
  }
}

// The expert-parallel plan into out.plan (gpus, layers, embedding home, split) and out.no_offload;
// the refusal's text when it does not fit.
std::optional<std::string> plan_expert_parallel(const PlanRequest& req, PlanOutcome& out,
                                                const std::vector<std::vector<int32_t>>& order,
                                                const std::vector<int64_t>& experts_in,
                                                const std::vector<int64_t>& moe_layers, int64_t forced, int64_t kv_layer) {
  Plan& plan = out.plan;
  const ModelBytes& mb = plan.bytes;
  const size_t G = req.gpu_mem.size(), L = experts_in.size();
  plan.split = choose_split(req, int64_t(G));
  const int64_t total_experts = std::accumulate(experts_in.begin(), experts_in.end(), int64_t(0));

  auto bases = [&](bool embedding_on_gpu) {
    std::vector<GpuPlan> gpus;
    for (size_t g = 0; g < G; ++g) gpus.push_back(expert_parallel_base(req, plan, g, embedding_on_gpu, kv_layer));
    return gpus;
  };
  auto rooms_of = [](const std::vector<GpuPlan>& gpus) {
    std::vector<int64_t> r;
    for (const GpuPlan& g : gpus) r.push_back(g.room());
    return r;
  };
  auto with_experts = [&](std::vector<GpuPlan> gpus, const ExpertCounts& c) {
    for (size_t l = 0; l < L; ++l)
      for (size_t g = 0; g < G; ++g) {
        const int64_t eb = mb.layers[l].routed_expert_bytes;
        gpus[g].weights[TensorClass::RoutedExperts] += c.vram[l][g] * eb;
        gpus[g].host_experts += c.host[l][g];
        gpus[g].host_bytes += c.host[l][g] * eb;
      }
    return gpus;
  };
  auto host_counts = [&](int64_t n) {
    std::vector<int64_t> per_layer(L, 0);
    const std::vector<int64_t> q = spread(n, moe_layers, experts_in, order, plan.usage);
    for (size_t i = 0; i < moe_layers.size(); ++i) per_layer[size_t(moe_layers[i])] = q[i];
    return per_layer;
  };

  // Everything in VRAM, each layer's experts dealt evenly: what the model needs without offload.
  const std::vector<GpuPlan> all_in = bases(true);
  out.no_offload = with_experts(all_in, *count_experts(mb, experts_in, std::vector<int64_t>(L, 0), rooms_of(all_in), true));
  bool everything_fits = forced == 0;
  for (const GpuPlan& g : out.no_offload) everything_fits &= g.room() >= 0;
  bool embedding_on_gpu = req.embedding == EmbeddingHome::Gpu || (req.embedding == EmbeddingHome::Auto && everything_fits);
  if (mb.tied_embedding) embedding_on_gpu = false;  // the lookup reads the head's rows; no separate table
  plan.embedding_on_host = !embedding_on_gpu && mb.embedding > 0;

  // The fewest host experts (at least the forced ones) for which every GPU's VRAM experts fit.
  const std::vector<GpuPlan> base = bases(embedding_on_gpu);
  const std::vector<int64_t> rooms = rooms_of(base);
  auto fits = [&](int64_t n) { return count_experts(mb, experts_in, host_counts(n), rooms, false).has_value(); };
  const int64_t most = req.allow_offload ? total_experts : forced;
  if (!fits(most)) {
    const ExpertCounts at_most = *count_experts(mb, experts_in, host_counts(most), rooms, true);
    std::string why = refusal_message(req, plan, with_experts(base, at_most), out.no_offload, kv_layer);
    for (const std::string& n : plan.split.notes) why += fmt::format(" (Expert parallel: {}.)", n);
    return why;
  }
  int64_t lo = forced, hi = most;  // fits(hi); bisection to the first n that fits
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) hi = mid;
    else lo = mid + 1;
  }
  const std::vector<int64_t> host_per_layer = host_counts(hi);
  const ExpertCounts counts = *count_experts(mb, experts_in, host_per_layer, rooms, false);
  plan.gpus = with_experts(base, counts);

  for (size_t l = 0; l < L; ++l) {
    LayerPlan lp{.layer = int64_t(l), .gpu = -1, .moe = experts_in[l] > 0};
    if (lp.moe) {
      const std::span<const int32_t> ord(order[l]);
      const size_t H = size_t(host_per_layer[l]);
      lp.owner.assign(ord.size(), -1);
      deal(ord.first(H), counts.host[l], plan.usage[l], lp.owner);
      deal(ord.subspan(H), counts.vram[l], plan.usage[l], lp.owner);
      lp.host_experts.assign(ord.begin(), ord.begin() + std::ptrdiff_t(H));
      std::sort(lp.host_experts.begin(), lp.host_experts.end());
    }
    plan.layers.push_back(std::move(lp));
  }
  return std::nullopt;
}

}  // namespace

PlanOutcome make_plan(PlanRequest req) {
  const ModelSpec& s = req.shape.spec;
  if (req.gpu_mem.empty()) fail("--gpu-mem: give the usable memory of at least one GPU, e.g. 80G or 95.6G,95.6G");
  for (int64_t m : req.gpu_mem)
    if (m <= 0) fail("--gpu-mem: every GPU's memory must be positive");
  if (req.max_batch_tokens <= 0) fail("--max-batch-tokens must be positive, got {}", req.max_batch_tokens);
  if (req.kv_block_size <= 0) fail("KV block size must be positive, got {}", req.kv_block_size);
  if (req.min_host_fraction < 0 || req.min_host_fraction > 1)
    fail("--host-experts must be a share between 0% and 100%, got {}", req.min_host_fraction);
  if (req.kv_mem < 0 || req.max_model_len < 0 || req.max_seqs < 0) fail("KV sizes must not be negative");
  if (req.profile) check_profile_matches(*req.profile, s, req.profile_source.empty() ? "--profile" : req.profile_source);
  if (req.max_seqs == 0) req.max_seqs = 4;
  if (req.max_model_len == 0) req.max_model_len = std::min<int64_t>(s.max_position_embeddings > 0 ? s.max_position_embeddings : 4096, 32768);
  if (req.report_batch <= 0) req.report_batch = std::max<int64_t>(1, req.max_seqs);
  if (req.report_context <= 0) req.report_context = std::min<int64_t>(4096, req.max_model_len);

  PlanOutcome out;
  Plan& plan = out.plan;
  plan.bytes = req.measured ? *req.measured : account_weights(req.shape, req.types);
  const ModelBytes& mb = plan.bytes;
  const size_t L = size_t(s.n_layers), G = req.gpu_mem.size();
  if (mb.layers.size() != L) fail("{}: the measured weights cover {} layers of {}", req.shape.source, mb.layers.size(), L);
  const int64_t E = s.n_experts;
  // The smallest and largest routed expert over the MoE layers (equal unless a file mixes types per layer).
  int64_t eb_min = 0, eb_max = 0;
  for (const LayerBytes& lb : mb.layers)
    if (lb.n_routed_experts > 0) {
      eb_min = eb_min ? std::min(eb_min, lb.routed_expert_bytes) : lb.routed_expert_bytes;
      eb_max = std::max(eb_max, lb.routed_expert_bytes);
    }
  const std::string each = eb_min == eb_max ? format_bytes(eb_max)
                                            : fmt::format("{} to {} by layer", format_bytes(eb_min), format_bytes(eb_max));

  plan.max_model_len = req.max_model_len;
  plan.max_seqs = req.max_seqs;
  const int64_t kv_layer = kv_bytes_per_token_per_layer(s, req.kv_format);
  int64_t sliding_layers = 0;
  for (int64_t l = 0; l < s.n_layers; ++l) sliding_layers += s.sliding(l);
  plan.kv_bytes_per_token = (s.n_layers - sliding_layers) * kv_layer;
  plan.kv_sliding_bytes_per_token = sliding_layers * kv_layer;
  if (sliding_layers > 0) {
    const int32_t window[] = {int32_t(s.sliding_window)};
    plan.kv_sliding_tokens = req.max_seqs * kv_blocks_for_sequence(window, req.max_model_len, req.kv_block_size) *
                             req.kv_block_size;
  }
  if (req.kv_mem > 0) {
    // The sliding layers' windows first (they do not grow with the context), then whole blocks of
    // the full layers in what is left.
    const int64_t left = std::max<int64_t>(0, req.kv_mem - plan.kv_sliding_tokens * plan.kv_sliding_bytes_per_token);
    plan.kv_tokens = plan.kv_bytes_per_token > 0 ? left / plan.kv_bytes_per_token / req.kv_block_size * req.kv_block_size : 0;
  } else {
    const int64_t blocks = (req.max_model_len + req.kv_block_size - 1) / req.kv_block_size;
    plan.kv_tokens = req.max_seqs * blocks * req.kv_block_size;
  }
  plan.workspace_per_gpu = workspace_bytes(req.shape, {.max_batch_tokens = req.max_batch_tokens,
                                                       .max_logit_rows = std::max<int64_t>(1, req.max_seqs)});

  // Usage per (layer, expert) and each layer's experts from least to most used.
  plan.usage.assign(L, {});
  std::vector<std::vector<int32_t>> order(L);
  plan.usage_source = !req.profile                     ? "uniform (no profile)"
                      : req.profile->model == "assumed" ? req.profile_source  // zipf_profile: says it is assumed
                                                        : "profile " + req.profile_source;
  for (size_t l = 0; l < L; ++l) {
    if (!s.layer_is_moe[l] || E == 0) continue;
    plan.usage[l].resize(size_t(E));
    for (int64_t e = 0; e < E; ++e)
      plan.usage[l][size_t(e)] = req.profile ? req.profile->usage(int64_t(l), e) : double(s.n_experts_per_token) / double(E);
    order[l].resize(size_t(E));
    std::iota(order[l].begin(), order[l].end(), 0);
    std::stable_sort(order[l].begin(), order[l].end(),
                     [&](int32_t a, int32_t b) { return plan.usage[l][size_t(a)] < plan.usage[l][size_t(b)]; });
  }

  Budgeting b{.req = req, .mb = mb, .workspace = plan.workspace_per_gpu};
  for (size_t l = 0; l < L; ++l) {
    b.layer_fixed.push_back(mb.layers[l].weights.total() + plan.kv_tokens_of_layer(s, int64_t(l)) * kv_layer);
    b.layer_routed.push_back(mb.layers[l].routed_bytes());
  }
  std::vector<int64_t> moe_layers, experts_in(L, 0);
  for (size_t l = 0; l < L; ++l)
    if (mb.layers[l].n_routed_experts > 0) moe_layers.push_back(int64_t(l)), experts_in[l] = mb.layers[l].n_routed_experts;
  const int64_t total_experts = std::accumulate(experts_in.begin(), experts_in.end(), int64_t(0));
  const int64_t forced = int64_t(std::ceil(req.min_host_fraction * double(total_experts) - 1e-9));

  // GPU bytes of a split: per GPU, by class, with the given host experts per layer.
  auto fill_gpus = [&](const std::vector<int64_t>& counts, const std::vector<int64_t>& host_per_layer) {
    std::vector<GpuPlan> gpus(G);
    int64_t l = 0;
    for (size_t g = 0; g < G; ++g) {
      GpuPlan& gp = gpus[g];
      gp.gpu = int(g);
      gp.budget = req.gpu_mem[g];
      gp.first_layer = l;
      gp.n_layers = counts[g];
      gp.reserve = req.gpu_reserve;
      gp.workspace = plan.workspace_per_gpu;
      gp.embedding = g == 0 && b.embedding_on_gpu && mb.embedding > 0;
      gp.lm_head = g + 1 == G;
      if (gp.embedding) gp.weights[TensorClass::Embedding] = mb.embedding;
      if (gp.lm_head) {
        gp.weights[TensorClass::LmHead] = mb.total[TensorClass::LmHead];
        gp.weights[TensorClass::Norms] += mb.lm_head - mb.total[TensorClass::LmHead];
      }
      for (int64_t i = 0; i < counts[g]; ++i, ++l) {
        const LayerBytes& lb = mb.layers[size_t(l)];
        gp.weights += lb.weights;
        const int64_t h = host_per_layer.empty() ? 0 : host_per_layer[size_t(l)];
        gp.weights[TensorClass::RoutedExperts] += (lb.n_routed_experts - h) * lb.routed_expert_bytes;
        gp.host_experts += h;
        gp.host_bytes += h * lb.routed_expert_bytes;
        gp.kv += plan.kv_tokens_of_layer(s, l) * kv_layer;
      }
    }
    return gpus;
  };

  auto refuse = [&](std::string why) {
    out.fits = false;
    out.refusal = std::move(why);
    out.request = req;
    return out;
  };

  const bool expert_parallel = G > 1 && req.parallel == Parallelism::Experts;
  plan.parallel = expert_parallel ? Parallelism::Experts : Parallelism::Layers;
  if (expert_parallel) {
    if (std::optional<std::string> why = plan_expert_parallel(req, out, order, experts_in, moe_layers, forced, kv_layer))
      return refuse(std::move(*why));
  } else {
    // Everything in VRAM, split as evenly as it goes: what the model needs without offload.
    {
      b.embedding_on_gpu = true;
      std::vector<int64_t> counts = greedy_split(b, 0.0, smallest(0.0, 1e6, [&](double u) { return !greedy_split(b, 0.0, u).empty(); }));
      out.no_offload = fill_gpus(counts, {});
    }

    // Embedding home: Auto keeps it in VRAM only when nothing has to move.
    bool everything_fits = forced == 0;
    for (const GpuPlan& g : out.no_offload) everything_fits &= g.room() >= 0;
    b.embedding_on_gpu = req.embedding == EmbeddingHome::Gpu || (req.embedding == EmbeddingHome::Auto && everything_fits);
    if (mb.tied_embedding) b.embedding_on_gpu = false;  // the lookup reads the head's rows; no separate table
    plan.embedding_on_host = !b.embedding_on_gpu && mb.embedding > 0;

    // The smallest share of experts that must leave, then the most even split at that share.
    const double forced_share = total_experts ? double(forced) / double(total_experts) : 0.0;
    const double max_share = req.allow_offload ? 1.0 : forced_share;
    if (greedy_split(b, max_share, 1.0).empty()) {
      // Does not fit even with every expert that may move in host RAM.
      std::vector<int64_t> counts = greedy_split(b, max_share, smallest(0.0, 1e6, [&](double u) { return !greedy_split(b, max_share, u).empty(); }));
      std::vector<int64_t> host(L, 0);
      for (size_t l = 0; l < L; ++l) host[l] = int64_t(std::ceil(max_share * double(experts_in[l])));
      const std::vector<GpuPlan> gpus = fill_gpus(counts, host);
      return refuse(refusal_message(req, plan, gpus, out.no_offload, kv_layer));
    }
    const double share = smallest(forced_share, max_share, [&](double t) { return !greedy_split(b, t, 1.0).empty(); });
    const double cap = smallest(0.0, 1.0, [&](double u) { return !greedy_split(b, share, u).empty(); });
    const std::vector<int64_t> counts = greedy_split(b, share, cap);

    // Host experts per GPU: what its budget needs, spread over its layers; at least the forced share
    // spread over all layers.
    std::vector<int64_t> host_per_layer(L, 0);
    {
      const std::vector<int64_t> forced_q = spread(forced, moe_layers, experts_in, order, plan.usage);
      for (size_t i = 0; i < moe_layers.size(); ++i) host_per_layer[size_t(moe_layers[i])] = forced_q[i];
      const std::vector<GpuPlan> all_vram = fill_gpus(counts, {});
      int64_t l0 = 0;
      for (size_t g = 0; g < G; ++g) {
        std::vector<int64_t> mine;
        for (int64_t l = l0; l < l0 + counts[g]; ++l)
          if (experts_in[size_t(l)] > 0) mine.push_back(l);
        l0 += counts[g];
        const int64_t over = -all_vram[g].room();
        // Counted in this GPU's smallest experts, so that whichever layers give them up, enough bytes leave.
        int64_t eb = 0;
        for (int64_t l : mine) eb = eb ? std::min(eb, mb.layers[size_t(l)].routed_expert_bytes) : mb.layers[size_t(l)].routed_expert_bytes;
        if (over <= 0 || eb == 0) continue;
        const int64_t need = (over + eb - 1) / eb;
        const std::vector<int64_t> q = spread(need, mine, experts_in, order, plan.usage);
        for (size_t i = 0; i < mine.size(); ++i)
          host_per_layer[size_t(mine[i])] = std::max(host_per_layer[size_t(mine[i])], q[i]);
      }
    }
    plan.gpus = fill_gpus(counts, host_per_layer);
    {
      int64_t l = 0;
      for (size_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < counts[g]; ++i, ++l) {
          LayerPlan lp{.layer = l, .gpu = int(g), .moe = experts_in[size_t(l)] > 0};
          for (int64_t k = 0; k < host_per_layer[size_t(l)]; ++k) lp.host_experts.push_back(order[size_t(l)][size_t(k)]);
          std::sort(lp.host_experts.begin(), lp.host_experts.end());
          plan.layers.push_back(std::move(lp));
        }
    }
  }  // layer split
  for (const GpuPlan& g : plan.gpus)
    if (g.room() < 0)  // rounding of the split at its edge; cannot happen with whole-expert deficits
      return refuse(fmt::format("internal: gpu{} is {} over after the split", g.gpu, gib_str(-g.room())));

  if (req.host_mem > 0 && plan.host_bytes() > req.host_mem) {
    const int64_t over = plan.host_bytes() - req.host_mem;
    const int64_t q2_eb = 2 * matrix_bytes(DType::Q2_K, s.moe_intermediate_size, s.hidden_size) +
                          matrix_bytes(DType::Q2_K, s.hidden_size, s.moe_intermediate_size);
    const std::string smaller = q2_eb < eb_min && !req.measured ? fmt::format(", or smaller experts (--quant experts=q2_k: {} each)", format_bytes(q2_eb)) : "";
    return refuse(fmt::format(
        "host RAM: {} routed experts ({} each){} need {} but --host-mem allows {}: over by {}. Give more host RAM "
        "(--host-mem {}), more GPU memory{}",
        plan.host_experts(), each, plan.embedding_on_host ? fmt::format(" and the embedding ({})", gib_str(mb.embedding)) : "",
        gib_str(plan.host_bytes()), gib_str(req.host_mem), gib_str(over), gib_str(plan.host_bytes()), smaller));
  }
  out.fits = true;
  out.request = req;
  return out;
}

DecodeEstimate estimate_decode(const Plan& plan, const PlanRequest& req, int64_t batch, int64_t context) {
  DecodeEstimate d{.batch = batch, .context = context};
  const ModelSpec& s = req.shape.spec;
  const double hbm = req.ceilings.hbm_read_gbps * 1e9, host = req.ceilings.host_read_gbps * 1e9;
  const double vram_rate = std::min(req.ceilings.decode_vram_gbps, req.ceilings.hbm_read_gbps) * 1e9;
  const int64_t kv_layer = kv_bytes_per_token_per_layer(s, req.kv_format);
  const ModelBytes& mb = plan.bytes;
  double seconds = 0, expected = 0;
  const double overhead =
      1e-6 * (req.ceilings.layer_overhead_us + req.ceilings.layer_overhead_us_per_token * double(batch));
  const bool ep = plan.parallel == Parallelism::Experts;
  const size_t G = ep ? plan.gpus.size() : 1;
  for (const LayerPlan& lp : plan.layers) {
    const LayerBytes& lb = mb.layers[size_t(lp.layer)];
    // A sliding layer reads its window, not the whole context.
    const int64_t seen = s.sliding(lp.layer) ? std::min<int64_t>(context, s.sliding_window) : context;
    if (ep) {
      // Each GPU reads its part of the layer's weights and KV and its own experts, all at once.
      const TensorSplit& t = plan.split;
      auto part = [&](double bytes, bool split) { return split ? bytes / double(G) : bytes; };
      const ClassBytes& w = lb.weights;
      const double fixed = part(double(w[TensorClass::Attention]), t.attention) +
                           part(double(w[TensorClass::SharedExperts]), t.shared) +
                           part(double(w[TensorClass::DenseMlp]), t.dense) + double(w[TensorClass::Router]) +
                           double(w[TensorClass::Norms]) +
                           part(double(batch) * double(seen) * double(kv_layer), t.attention);
      std::vector<double> vram_g(G, fixed), host_g(G, 0.0);
      for (size_t e = 0; lp.moe && e < lp.owner.size(); ++e) {
        const double touched = 1.0 - std::pow(1.0 - std::min(1.0, plan.usage[size_t(lp.layer)][e]), double(batch));
        const bool on_host = std::binary_search(lp.host_experts.begin(), lp.host_experts.end(), int32_t(e));
        (on_host ? host_g : vram_g)[size_t(lp.owner[e])] += touched * double(lb.routed_expert_bytes);
        if (on_host) d.expected_host_experts_per_step += touched;
      }
      double bound = 0, slowest = 0;
      size_t worst_link = 0;
      for (size_t g = 0; g < G; ++g) {
        d.vram_bytes_per_step += vram_g[g];
        d.host_bytes_per_step += host_g[g];
        bound = std::max(bound, std::max(vram_g[g] / hbm, host_g[g] / host));
        slowest = std::max(slowest, vram_g[g] / vram_rate + host_g[g] / host);
        if (host_g[g] > host_g[worst_link]) worst_link = g;
      }
      d.slowest_link_host_bytes_per_step += host_g[worst_link];
      const int64_t allreduces = t.attention ? 2 : 1;  // after attention when split, after the MLP always
      d.allreduces_per_step += allreduces;
      seconds += bound;
      expected += slowest + overhead + 1e-6 * req.ceilings.allreduce_us * double(allreduces);
      continue;
    }
    double vram = double(lb.weights.total()) + double(batch) * double(seen) * double(kv_layer);
    double host_b = 0;
    if (lp.moe) {
      std::vector<uint8_t> on_host(size_t(lb.n_routed_experts), 0);
      for (int32_t e : lp.host_experts) on_host[size_t(e)] = 1;
      for (int64_t e = 0; e < lb.n_routed_experts; ++e) {
        // Distinct experts a step of `batch` independent tokens touches: 1 - (1 - p)^B each.
        const double touched = 1.0 - std::pow(1.0 - std::min(1.0, plan.usage[size_t(lp.layer)][size_t(e)]), double(batch));
        if (on_host[size_t(e)]) {
          host_b += touched * double(lb.routed_expert_bytes);
          d.expected_host_experts_per_step += touched;
        } else {
          vram += touched * double(lb.routed_expert_bytes);
        }
      }
    }
    d.vram_bytes_per_step += vram;
    d.host_bytes_per_step += host_b;
    d.slowest_link_host_bytes_per_step += host_b;
    // Within a layer the GPU can read its VRAM and host experts at once; layers run in order.
    seconds += std::max(vram / hbm, host_b / host);
    expected += vram / vram_rate + host_b / host + overhead;
  }
  // Head every step (split by vocabulary rows: each GPU its part at once, the logits gathered); one
  // embedding row per token.
  const bool vocab_split = ep && plan.split.vocab;
  const double head_read = vocab_split ? double(mb.lm_head) / double(G) : double(mb.lm_head);
  d.vram_bytes_per_step += double(mb.lm_head);
  seconds += head_read / hbm;
  expected += head_read / vram_rate;
  if (vocab_split) {
    d.allreduces_per_step += 2;  // the embedding rows' sum and the logits' gather
    expected += 2e-6 * req.ceilings.allreduce_us;
  }
  const double rows = double(batch) * double(mb.embedding_row);
  if (plan.embedding_on_host) {
    d.host_bytes_per_step += rows;
    seconds += rows / host;
    expected += rows / host;
  } else {
    d.vram_bytes_per_step += rows;
    seconds += rows / hbm;
    expected += rows / vram_rate;
  }
  d.expected_step_seconds = expected;
  d.expected_tokens_per_s_per_stream = expected > 0 ? 1.0 / expected : 0;
  d.host_bytes_per_token = d.host_bytes_per_step / double(batch);
  d.step_seconds = seconds;
  d.tokens_per_s_per_stream = seconds > 0 ? 1.0 / seconds : 0;
  return d;
}

std::string plan_to_json(const PlanOutcome& o) {
  using ordered_json = nlohmann::ordered_json;
  const Plan& p = o.plan;
  const PlanRequest& r = o.request;
  const ModelSpec& s = r.shape.spec;
  auto classes = [](const ClassBytes& c) {
    ordered_json j;
    for (int i = 0; i < kNumTensorClasses; ++i) j[std::string(tensor_class_key(TensorClass(i)))] = c.bytes[size_t(i)];
    return j;
  };
  ordered_json gpus = ordered_json::array();
  for (const GpuPlan& g : p.gpus) {
    ordered_json vram = classes(g.weights);
    vram["kv"] = g.kv;
    vram["workspace"] = g.workspace;
    vram["reserve"] = g.reserve;
    vram["total"] = g.vram_total();
    gpus.push_back({{"gpu", g.gpu},
                    {"budget", g.budget},
                    {"layers", {g.first_layer, g.first_layer + g.n_layers}},
                    {"embedding", g.embedding},
                    {"lm_head", g.lm_head},
                    {"vram", vram},
                    {"free", g.room()},
                    {"host_experts", g.host_experts},
                    {"host_expert_bytes", g.host_bytes}});
  }
  const bool ep = p.parallel == Parallelism::Experts;
  ordered_json layers = ordered_json::array();
  for (const LayerPlan& l : p.layers) {
    ordered_json j = {{"layer", l.layer}};
    if (!ep) j["gpu"] = l.gpu;
    j["moe"] = l.moe;
    if (l.moe) {
      j["experts"] = p.bytes.layers[size_t(l.layer)].n_routed_experts;
      j["expert_bytes"] = p.bytes.layers[size_t(l.layer)].routed_expert_bytes;
      j["host"] = l.host_experts;
      if (ep) j["owners"] = l.owner;
    }
    layers.push_back(j);
  }
  ordered_json root = {
      {"format", "spill-placement-plan"},
      {"version", ep ? 2 : 1},
      {"model",
       {{"source", r.shape.source},
        {"model_type", s.model_type},
        {"n_layers", s.n_layers},
        {"n_experts", s.n_experts},
        {"top_k", s.n_experts_per_token},
        {"hidden_size", s.hidden_size},
        {"moe_intermediate_size", s.moe_intermediate_size},
        {"n_shared_experts", r.shape.shared.count}}},
      {"types", [&] {
         ordered_json j;
         for (int i = 0; i < kNumTensorClasses; ++i)
           j[std::string(tensor_class_key(TensorClass(i)))] = std::string(dtype_name(r.types.types[size_t(i)]));
         return j;
       }()},
      {"kv", {{"format", std::string(kv_format_name(r.kv_format))}, {"tokens", p.kv_tokens}, {"bytes_per_token", p.kv_bytes_per_token},
              {"sliding_tokens", p.kv_sliding_tokens}, {"sliding_bytes_per_token", p.kv_sliding_bytes_per_token},
              {"max_model_len", p.max_model_len}, {"max_seqs", p.max_seqs}, {"block_size", r.kv_block_size}}},
      {"max_batch_tokens", r.max_batch_tokens},
      {"usage", p.usage_source},
      {"routed_expert_bytes", p.bytes.routed_expert_bytes},
      {"embedding", {{"home", p.embedding_on_host ? "host" : (p.bytes.tied_embedding ? "lm_head" : ep ? (p.split.vocab ? "split" : "every_gpu") : "gpu0")},
                     {"bytes", p.bytes.embedding}}},
      {"lm_head", {{"home", ep ? (p.split.vocab ? std::string("split") : std::string("gpu0")) : fmt::format("gpu{}", p.gpus.size() - 1)},
                   {"bytes", p.bytes.lm_head}}},
      {"host", {{"experts", p.host_experts()}, {"bytes", p.host_bytes()}}}};
  if (ep)
    root["parallel"] = {{"kind", "experts"},
                        {"split", {{"attention", p.split.attention}, {"shared", p.split.shared}, {"dense", p.split.dense},
                                   {"vocab", p.split.vocab}}}};
  root["gpus"] = gpus;
  root["layers"] = layers;
  return root.dump(1) + "\n";
}

}  // namespace spill::placement
