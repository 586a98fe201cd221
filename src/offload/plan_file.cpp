#include "offload/plan_file.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/json_limits.h"

namespace spill::offload {

int64_t PlacementPlan::host_expert_count() const {
  int64_t n = 0;
  for (const PlannedLayer& l : layers) n += int64_t(l.host.size());
  return n;
}

int64_t PlacementPlan::host_expert_bytes() const {
  int64_t n = 0;
  for (const PlannedLayer& l : layers) n += int64_t(l.host.size()) * l.expert_bytes;
  return n;
}

namespace {

using json = nlohmann::json;

// One reader per plan: every message starts "<where>: <field path>: ".
struct Reader {
  const std::string& where;

  [[noreturn]] void bad(const std::string& path, const std::string& what) const {
    fail("{}: {}: {}. The plan is the JSON `spill plan --out` writes (docs/placement.md); write it again or fix "
         "that field",
         where, path, what);
  }
  const json& member(const json& object, const std::string& path, const char* key) const {
    const auto it = object.find(key);
    if (it == object.end()) bad(path.empty() ? key : path + "." + key, "missing");
    return *it;
  }
  const json& object(const json& parent, const std::string& path, const char* key) const {
    const json& v = member(parent, path, key);
    if (!v.is_object()) bad(join(path, key), "must be an object, got " + describe_json(v));
    return v;
  }
  const json& array(const json& parent, const std::string& path, const char* key) const {
    const json& v = member(parent, path, key);
    if (!v.is_array()) bad(join(path, key), "must be an array, got " + describe_json(v));
    return v;
  }
  // An integer in [lo, hi]; floats (even 3.0), booleans and strings are refused.
  int64_t integer(const json& v, const std::string& path, int64_t lo, int64_t hi) const {
    int64_t x = 0;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) bad(path, "is out of range, got " + describe_json(v));
      x = int64_t(u);
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else {
      bad(path, "must be an integer, got " + describe_json(v));
    }
    if (x < lo || x > hi) bad(path, fmt::format("must be in [{}, {}], got {}", lo, hi, x));
    return x;
  }
  int64_t integer(const json& parent, const std::string& path, const char* key, int64_t lo, int64_t hi) const {
    return integer(member(parent, path, key), join(path, key), lo, hi);
  }
  bool boolean(const json& parent, const std::string& path, const char* key) const {
    const json& v = member(parent, path, key);
    if (!v.is_boolean()) bad(join(path, key), "must be true or false, got " + describe_json(v));
    return v.get<bool>();
  }
  std::string string(const json& parent, const std::string& path, const char* key) const {
    const json& v = member(parent, path, key);
    if (!v.is_string()) bad(join(path, key), "must be a string, got " + describe_json(v));
    return v.get<std::string>();
  }
  static std::string join(const std::string& path, const char* key) { return path.empty() ? key : path + "." + key; }
};

constexpr int64_t kMaxBytes = int64_t(1) << 50;  // 1 PiB: no expert or host share is larger

}  // namespace

PlacementPlan parse_plan(std::string_view text, const std::string& where, const PlanLimits& limits) {
  if (int64_t(text.size()) > limits.max_text_bytes)
    fail("{}: {} bytes is not a plan (at most {} accepted)", where, text.size(), limits.max_text_bytes);
  const json root = parse_json<json>(text, where);
  const Reader r{where};
  if (!root.is_object()) r.bad("(top level)", "must be an object, got " + describe_json(root));
  if (r.string(root, "", "format") != "spill-placement-plan")
    r.bad("format", "must be \"spill-placement-plan\", got " + describe_json(root["format"]));
  const int64_t version = r.integer(root, "", "version", 0, std::numeric_limits<int32_t>::max());
  if (version != 1 && version != 2)
    r.bad("version", fmt::format("this spill reads version 1 and 2 plans, the file is version {}", version));

  PlacementPlan p;
  p.where = where;
  const json& model = r.object(root, "", "model");
  p.n_layers = r.integer(model, "model", "n_layers", 1, limits.max_layers);
  p.n_experts = r.integer(model, "model", "n_experts", 0, limits.max_experts);
  p.top_k = r.integer(model, "model", "top_k", 0, std::max<int64_t>(p.n_experts, 0));
  p.hidden_size = r.integer(model, "model", "hidden_size", 1, int64_t(1) << 24);
  p.moe_intermediate_size = r.integer(model, "model", "moe_intermediate_size", 0, int64_t(1) << 24);
  const std::string type_name = r.string(r.object(root, "", "types"), "types", "experts");
  if (!parse_dtype_name(type_name, p.expert_type)) r.bad("types.experts", "unknown type \"" + type_name.substr(0, 40) + "\"");
  p.routed_expert_bytes = r.integer(root, "", "routed_expert_bytes", 0, kMaxBytes);
  const json& host = r.object(root, "", "host");
  p.host_experts = r.integer(host, "host", "experts", 0, p.n_layers * p.n_experts);
  p.host_bytes = r.integer(host, "host", "bytes", 0, kMaxBytes);
  const json& embedding = r.object(root, "", "embedding");
  p.embedding_on_host = r.string(embedding, "embedding", "home") == "host";
  const int64_t embedding_bytes = r.integer(embedding, "embedding", "bytes", 0, kMaxBytes);

  // Version 2: expert parallelism, every GPU in every layer.
  p.expert_parallel = version == 2;
  if (p.expert_parallel) {
    const json& parallel = r.object(root, "", "parallel");
    if (r.string(parallel, "parallel", "kind") != "experts")
      r.bad("parallel.kind", "must be \"experts\" in a version 2 plan, got " + describe_json(parallel["kind"]));
    const json& split = r.object(parallel, "parallel", "split");
    p.split = {.attention = r.boolean(split, "parallel.split", "attention"),
               .shared = r.boolean(split, "parallel.split", "shared"),
               .dense = r.boolean(split, "parallel.split", "dense"),
               .vocab = r.boolean(split, "parallel.split", "vocab")};
  } else if (root.contains("parallel")) {
    r.bad("parallel", "belongs to version 2 plans; this one is version 1 (a layer split)");
  }

  // GPUs: contiguous layer ranges in order, covering every layer once (version 2: every GPU all of them).
  const json& gpus = r.array(root, "", "gpus");
  if (gpus.empty() || int64_t(gpus.size()) > limits.max_gpus)
    r.bad("gpus", fmt::format("must list 1 to {} GPUs, got {}", limits.max_gpus, gpus.size()));
  p.n_gpus = int(gpus.size());
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t next_layer = 0;
  for (size_t g = 0; g < gpus.size(); ++g) {
    const std::string path = fmt::format("gpus[{}]", g);
    if (!gpus[g].is_object()) r.bad(path, "must be an object, got " + describe_json(gpus[g]));
    if (r.integer(gpus[g], path, "gpu", 0, limits.max_gpus) != int64_t(g))
      r.bad(path + ".gpu", fmt::format("GPUs must be listed in order 0, 1, ...; expected {}", g));
    const json& range = r.array(gpus[g], path, "layers");
    if (range.size() != 2) r.bad(path + ".layers", "must be [first, end)");
    const int64_t first = r.integer(range[0], path + ".layers[0]", 0, p.n_layers);
    const int64_t end = r.integer(range[1], path + ".layers[1]", first, p.n_layers);
    if (p.expert_parallel) {
      if (first != 0 || end != p.n_layers)
        r.bad(path + ".layers", fmt::format("is [{}, {}), but in an expert-parallel plan every GPU takes part in all {} "
                                            "layers: [0, {})",
                                            first, end, p.n_layers, p.n_layers));
      continue;
    }
    if (first != next_layer)
      r.bad(path + ".layers", fmt::format("starts at layer {}, but the layers before it end at {}: each GPU takes the "
                                          "next contiguous range",
                                          first, next_layer));
    next_layer = end;
    ranges.push_back({first, end});
  }
  if (!p.expert_parallel && next_layer != p.n_layers)
    r.bad("gpus", fmt::format("the GPUs' layer ranges end at layer {}, the model has {}", next_layer, p.n_layers));

  const json& layers = r.array(root, "", "layers");
  if (int64_t(layers.size()) != p.n_layers)
    r.bad("layers", fmt::format("lists {} layers, model.n_layers says {}", layers.size(), p.n_layers));
  p.layers.resize(size_t(p.n_layers));
  bool any_moe = false;
  int64_t max_layer_expert_bytes = 0;
  for (int64_t l = 0; l < p.n_layers; ++l) {
    const std::string path = fmt::format("layers[{}]", l);
    const json& j = layers[size_t(l)];
    if (!j.is_object()) r.bad(path, "must be an object, got " + describe_json(j));
    PlannedLayer& pl = p.layers[size_t(l)];
    pl.layer = r.integer(j, path, "layer", 0, p.n_layers - 1);
    if (pl.layer != l) r.bad(path + ".layer", fmt::format("layers must be listed in order; expected {}, got {}", l, pl.layer));
    if (p.expert_parallel) {
      if (j.contains("gpu"))
        r.bad(path + ".gpu", "an expert-parallel layer belongs to every GPU; its experts' GPUs are in owners");
      pl.gpu = -1;
    } else {
      pl.gpu = int(r.integer(j, path, "gpu", 0, p.n_gpus - 1));
      const auto [first, end] = ranges[size_t(pl.gpu)];
      if (l < first || l >= end)
        r.bad(path + ".gpu", fmt::format("is {}, but gpus[{}].layers is [{}, {})", pl.gpu, pl.gpu, first, end));
    }
    pl.moe = r.boolean(j, path, "moe");
    if (!pl.moe) {
      for (const char* key : {"experts", "expert_bytes", "host", "owners"})
        if (j.contains(key)) r.bad(path + "." + key, "a dense layer (moe false) has no routed experts");
      continue;
    }
    any_moe = true;
    pl.experts = r.integer(j, path, "experts", 1, limits.max_experts);
    if (pl.experts != p.n_experts)
      r.bad(path + ".experts", fmt::format("is {}, model.n_experts says {}", pl.experts, p.n_experts));
    pl.expert_bytes = r.integer(j, path, "expert_bytes", 1, kMaxBytes);
    // Layers may differ (a GGUF mix gives some layers larger down projections); routed_expert_bytes is the largest.
    if (pl.expert_bytes > p.routed_expert_bytes)
      r.bad(path + ".expert_bytes", fmt::format("is {}, more than routed_expert_bytes ({}), the largest expert of any layer",
                                                pl.expert_bytes, p.routed_expert_bytes));
    max_layer_expert_bytes = std::max(max_layer_expert_bytes, pl.expert_bytes);
    const json& list = r.array(j, path, "host");
    if (int64_t(list.size()) > pl.experts)
      r.bad(path + ".host", fmt::format("lists {} experts, the layer has {}", list.size(), pl.experts));
    pl.host.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = fmt::format("{}.host[{}]", path, i);
      const int64_t e = r.integer(list[i], at, 0, pl.experts - 1);
      if (!pl.host.empty() && e <= pl.host.back())
        r.bad(at, fmt::format("is {} after {}: host experts must be listed in ascending order, each once", e, pl.host.back()));
      pl.host.push_back(int32_t(e));
    }
    if (!p.expert_parallel) {
      if (j.contains("owners")) r.bad(path + ".owners", "belongs to version 2 (expert-parallel) plans");
      continue;
    }
    const json& owners = r.array(j, path, "owners");
    if (int64_t(owners.size()) != pl.experts)
      r.bad(path + ".owners", fmt::format("lists {} GPUs, one per expert of the layer's {}", owners.size(), pl.experts));
    pl.owners.reserve(owners.size());
    for (size_t e = 0; e < owners.size(); ++e)
      pl.owners.push_back(int32_t(r.integer(owners[e], fmt::format("{}.owners[{}]", path, e), 0, p.n_gpus - 1)));
  }
  if (any_moe && p.moe_intermediate_size == 0) r.bad("model.moe_intermediate_size", "must be positive for a MoE model");
  if (any_moe && max_layer_expert_bytes != p.routed_expert_bytes)
    r.bad("routed_expert_bytes", fmt::format("is {}, but the largest expert of any layer takes {}", p.routed_expert_bytes,
                                             max_layer_expert_bytes));

  if (p.host_expert_count() != p.host_experts)
    r.bad("host.experts", fmt::format("is {}, but the layers' host lists hold {}", p.host_experts, p.host_expert_count()));
  const int64_t expected_host_bytes = p.host_expert_bytes() + (p.embedding_on_host ? embedding_bytes : 0);
  if (p.host_bytes != expected_host_bytes)
    r.bad("host.bytes", fmt::format("is {}, but the host experts{} take {}", p.host_bytes,
                                    p.embedding_on_host ? " and the embedding" : "", expected_host_bytes));
  return p;
}

PlacementPlan load_plan(const std::string& path, const PlanLimits& limits) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--plan {}: cannot open the file; give a plan written by `spill plan --out`", path);
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) fail("--plan {}: cannot read the file", path);
  if (int64_t(size) > limits.max_text_bytes) fail("--plan {}: {} bytes is not a plan", path, int64_t(size));
  in.seekg(0);
  std::string text(size_t(size), '\0');
  if (!in.read(text.data(), size)) fail("--plan {}: cannot read the file", path);
  return parse_plan(text, path, limits);
}

PlacementPlan uniform_plan(const UniformPlanParams& u) {
  if (u.n_layers <= 0 || u.n_experts <= 0 || u.expert_bytes <= 0 || u.host_share < 0 || u.host_share > 1)
    fail("uniform_plan: needs layers, experts, expert bytes and a host share in [0, 1]");
  PlacementPlan p;
  p.where = "uniform plan";
  p.n_layers = u.n_layers;
  p.n_experts = u.n_experts;
  p.top_k = u.top_k;
  p.hidden_size = u.hidden_size;
  p.moe_intermediate_size = u.moe_intermediate_size;
  p.expert_type = u.expert_type;
  p.routed_expert_bytes = u.expert_bytes;
  p.n_gpus = 1;
  std::mt19937_64 rng(u.seed);
  const int64_t per_layer = int64_t(u.host_share * double(u.n_experts) + 0.5);
  for (int64_t l = 0; l < u.n_layers; ++l) {
    PlannedLayer pl{.layer = l, .gpu = 0, .moe = u.layer_is_moe.empty() || u.layer_is_moe[size_t(l)]};
    if (pl.moe) {
      pl.experts = u.n_experts;
      pl.expert_bytes = u.expert_bytes;
      std::vector<int32_t> ids(size_t(u.n_experts));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      pl.host.assign(ids.begin(), ids.begin() + per_layer);
      std::sort(pl.host.begin(), pl.host.end());
    }
    p.layers.push_back(std::move(pl));
  }
  p.host_experts = p.host_expert_count();
  p.host_bytes = p.host_expert_bytes();
  return p;
}

}  // namespace spill::offload
