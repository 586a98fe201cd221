#include "placement/profile.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/json_limits.h"

namespace spill::placement {

using ordered_json = nlohmann::ordered_json;

RoutingProfile RoutingProfile::empty_for(const ModelSpec& spec) {
  RoutingProfile p;
  p.n_layers = spec.n_layers;
  p.n_experts = spec.n_experts;
  p.top_k = spec.n_experts_per_token;
  p.layers.resize(size_t(spec.n_layers));
  for (int64_t l = 0; l < spec.n_layers; ++l) {
    LayerRouting& lr = p.layers[size_t(l)];
    lr.moe = spec.layer_is_moe[size_t(l)] && spec.n_experts > 0;
    if (!lr.moe) continue;
    lr.prefill.assign(size_t(spec.n_experts), 0);
    lr.decode.assign(size_t(spec.n_experts), 0);
    lr.coactivation.assign(size_t(spec.n_experts * spec.n_experts), 0);
  }
  return p;
}

RoutingProfile zipf_profile(const ModelSpec& spec, double exponent, uint64_t seed) {
  if (!(exponent >= 0 && exponent <= 10)) fail("zipf routing: the exponent must be between 0 and 10, got {}", exponent);
  RoutingProfile p = RoutingProfile::empty_for(spec);
  p.model = "assumed";
  p.source = fmt::format("zipf:{} (seed {})", exponent, seed);
  const int64_t E = spec.n_experts, k = spec.n_experts_per_token;
  if (E <= 0 || k <= 0 || k > E) return p;
  // Shares min(1, c w_r): c by bisection so that they sum to k (the sum grows with c, and reaches E >= k).
  std::vector<double> w(static_cast<size_t>(E));
  for (int64_t r = 0; r < E; ++r) w[size_t(r)] = std::pow(double(r + 1), -exponent);
  auto total = [&](double c) {
    double t = 0;
    for (double x : w) t += std::min(1.0, c * x);
    return t;
  };
  double lo = 0, hi = 1;
  while (total(hi) < double(k)) hi *= 2;  // ends: at c >= E^exponent every share is 1
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (total(mid) < double(k) ? lo : hi) = mid;
  }
  constexpr int64_t kTokens = 1'000'000;  // counts per layer, so that usage() is the share to 1e-6
  std::mt19937_64 rng(seed);
  for (int64_t l = 0; l < spec.n_layers; ++l) {
    LayerRouting& lr = p.layers[size_t(l)];
    if (!lr.moe) continue;
    std::vector<int32_t> rank_of(static_cast<size_t>(E));
    std::iota(rank_of.begin(), rank_of.end(), 0);
    std::shuffle(rank_of.begin(), rank_of.end(), rng);
    for (int64_t e = 0; e < E; ++e)
      lr.decode[size_t(e)] = std::llround(double(kTokens) * std::min(1.0, hi * w[size_t(rank_of[size_t(e)])]));
    lr.decode_tokens = kTokens;
  }
  return p;
}

double RoutingProfile::usage(int64_t layer, int64_t expert) const {
  const LayerRouting& lr = layers[size_t(layer)];
  if (!lr.moe) return 0.0;
  if (lr.decode_tokens > 0) return double(lr.decode[size_t(expert)]) / double(lr.decode_tokens);
  if (lr.prefill_tokens > 0) return double(lr.prefill[size_t(expert)]) / double(lr.prefill_tokens);
  return 0.0;
}

void RoutingProfile::merge(const RoutingProfile& o) {
  if (o.n_layers != n_layers || o.n_experts != n_experts || o.top_k != top_k)
    fail("cannot merge routing profiles of different shapes ({} layers x {} experts top-{} and {} x {} top-{})",
         n_layers, n_experts, top_k, o.n_layers, o.n_experts, o.top_k);
  steps += o.steps;
  for (size_t l = 0; l < layers.size(); ++l) {
    LayerRouting& a = layers[l];
    const LayerRouting& b = o.layers[l];
    if (a.moe != b.moe) fail("cannot merge routing profiles: layer {} is MoE in one and dense in the other", l);
    a.prefill_tokens += b.prefill_tokens;
    a.decode_tokens += b.decode_tokens;
    a.decode_steps += b.decode_steps;
    for (size_t i = 0; i < a.prefill.size(); ++i) a.prefill[i] += b.prefill[i];
    for (size_t i = 0; i < a.decode.size(); ++i) a.decode[i] += b.decode[i];
    for (size_t i = 0; i < a.coactivation.size(); ++i) a.coactivation[i] += b.coactivation[i];
  }
}

std::string profile_to_json(const RoutingProfile& p) {
  ordered_json layers = ordered_json::array();
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const LayerRouting& lr = p.layers[l];
    ordered_json j = {{"layer", l}, {"moe", lr.moe}};
    if (lr.moe) {
      ordered_json co = ordered_json::array();
      const int64_t E = p.n_experts;
      for (int64_t a = 0; a < E; ++a)
        for (int64_t b = a + 1; b < E; ++b)
          if (int64_t c = lr.coactivation[size_t(a * E + b)]) co.push_back({a, b, c});
      j["prefill_tokens"] = lr.prefill_tokens;
      j["decode_tokens"] = lr.decode_tokens;
      j["decode_steps"] = lr.decode_steps;
      j["prefill"] = lr.prefill;
      j["decode"] = lr.decode;
      j["decode_coactivation"] = co;
    }
    layers.push_back(j);
  }
  ordered_json root = {{"format", "spill-routing-profile"},
                       {"version", 1},
                       {"model", p.model},
                       {"source", p.source},
                       {"n_layers", p.n_layers},
                       {"n_experts", p.n_experts},
                       {"top_k", p.top_k},
                       {"steps", p.steps},
                       {"layers", layers}};
  return root.dump(1) + "\n";
}

namespace {

int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0)
    fail("{}: \"{}\" must be a non-negative integer", where, key);
  return j[key].get<int64_t>();
}

std::vector<int64_t> get_counts(const nlohmann::json& j, const char* key, int64_t n, const std::string& where) {
  if (!j.contains(key) || !j[key].is_array() || int64_t(j[key].size()) != n)
    fail("{}: \"{}\" must be a list of {} counts (one per expert)", where, key, n);
  std::vector<int64_t> out;
  for (const auto& v : j[key]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) fail("{}: \"{}\" holds a count that is not a non-negative integer", where, key);
    out.push_back(v.get<int64_t>());
  }
  return out;
}

}  // namespace

RoutingProfile parse_profile_json(const std::string& text, const std::string& where) {
  const nlohmann::json j = parse_json<nlohmann::json>(text, where);
  if (!j.is_object() || j.value("format", "") != "spill-routing-profile")
    fail("{}: not a routing profile (\"format\": \"spill-routing-profile\" missing); make one with spill profile", where);
  if (get_int(j, "version", where) != 1) fail("{}: routing profile version {} is not supported (1 is)", where, j["version"].dump());
  RoutingProfile p;
  p.model = j.value("model", "");
  p.source = j.value("source", "");
  p.n_layers = get_int(j, "n_layers", where);
  p.n_experts = get_int(j, "n_experts", where);
  p.top_k = get_int(j, "top_k", where);
  p.steps = get_int(j, "steps", where);
  if (!j.contains("layers") || !j["layers"].is_array() || int64_t(j["layers"].size()) != p.n_layers)
    fail("{}: \"layers\" must list {} layers", where, p.n_layers);
  const int64_t E = p.n_experts;
  for (int64_t l = 0; l < p.n_layers; ++l) {
    const nlohmann::json& jl = j["layers"][size_t(l)];
    const std::string lw = where + ": layer " + std::to_string(l);
    if (!jl.is_object() || !jl.contains("moe") || !jl["moe"].is_boolean()) fail("{}: needs \"moe\": true or false", lw);
    LayerRouting lr;
    lr.moe = jl["moe"].get<bool>();
    if (lr.moe) {
      lr.prefill_tokens = get_int(jl, "prefill_tokens", lw);
      lr.decode_tokens = get_int(jl, "decode_tokens", lw);
      lr.decode_steps = get_int(jl, "decode_steps", lw);
      lr.prefill = get_counts(jl, "prefill", E, lw);
      lr.decode = get_counts(jl, "decode", E, lw);
      lr.coactivation.assign(size_t(E * E), 0);
      if (jl.contains("decode_coactivation")) {
        for (const auto& t : jl["decode_coactivation"]) {
          if (!t.is_array() || t.size() != 3 || !t[0].is_number_integer() || !t[1].is_number_integer() ||
              !t[2].is_number_integer())
            fail("{}: decode_coactivation entries must be [a, b, steps]", lw);
          const int64_t a = t[0], b = t[1], c = t[2];
          if (a < 0 || b <= a || b >= E || c < 0) fail("{}: decode_coactivation entry [{}, {}, {}] is out of range", lw, a, b, c);
          lr.coactivation[size_t(a * E + b)] = c;
        }
      }
    }
    p.layers.push_back(std::move(lr));
  }
  return p;
}

RoutingProfile load_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot read the routing profile", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_profile_json(text.str(), path);
}

void save_profile(const RoutingProfile& profile, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) fail("{}: cannot write the routing profile", tmp);
    out << profile_to_json(profile);
    if (!out) fail("{}: writing the routing profile failed", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("{}: cannot replace the routing profile: {}", path, ec.message());
}

void check_profile_matches(const RoutingProfile& p, const ModelSpec& spec, const std::string& where) {
  if (p.n_layers != spec.n_layers || p.n_experts != spec.n_experts || p.top_k != spec.n_experts_per_token)
    fail("{}: the profile was measured on {} layers x {} experts top-{}, but the model has {} x {} top-{}; measure "
         "it on this model with spill profile",
         where, p.n_layers, p.n_experts, p.top_k, spec.n_layers, spec.n_experts, spec.n_experts_per_token);
  for (int64_t l = 0; l < spec.n_layers; ++l)
    if (p.layers[size_t(l)].moe != (spec.layer_is_moe[size_t(l)] && spec.n_experts > 0))
      fail("{}: layer {} is {} in the profile but {} in the model", where, l, p.layers[size_t(l)].moe ? "MoE" : "dense",
           p.layers[size_t(l)].moe ? "dense" : "MoE");
}

RoutingRecorder::RoutingRecorder(const ModelSpec& spec, std::string model, std::string source)
    : profile_(RoutingProfile::empty_for(spec)) {
  profile_.model = std::move(model);
  profile_.source = std::move(source);
  pending_.resize(size_t(spec.n_layers));
  touched_.resize(size_t(spec.n_experts));
}

void RoutingRecorder::on_router(int layer, int64_t n_tokens, int64_t k, const int32_t* expert_ids, const float*) {
  std::lock_guard lock(mutex_);
  if (layer < 0 || size_t(layer) >= pending_.size() || !profile_.layers[size_t(layer)].moe)
    fail("routing recorder: layer {} is not an MoE layer of this model", layer);
  PendingLayer& p = pending_[size_t(layer)];
  if (p.seen)  // a layer seen twice: the previous forward never reached end_step (it failed)
    for (PendingLayer& q : pending_) q = PendingLayer{};
  p.seen = true;
  p.n_tokens = n_tokens;
  p.k = k;
  p.ids.assign(expert_ids, expert_ids + n_tokens * k);
}

void RoutingRecorder::end_step(std::span<const StepChunkKind> chunks) {
  std::lock_guard lock(mutex_);
  int64_t n_step_tokens = 0;
  for (const StepChunkKind& c : chunks) n_step_tokens += c.n_tokens;
  const int64_t E = profile_.n_experts;
  bool counted = false;
  for (size_t l = 0; l < pending_.size(); ++l) {
    PendingLayer& p = pending_[l];
    if (!p.seen) continue;
    if (p.n_tokens != n_step_tokens)
      fail("routing recorder: layer {} routed {} tokens but the step has {}", l, p.n_tokens, n_step_tokens);
    LayerRouting& lr = profile_.layers[l];
    std::fill(touched_.begin(), touched_.end(), 0);
    bool any_decode = false;
    int64_t t = 0;
    for (const StepChunkKind& c : chunks) {
      std::vector<int64_t>& counts = c.decode ? lr.decode : lr.prefill;
      (c.decode ? lr.decode_tokens : lr.prefill_tokens) += c.n_tokens;
      for (int32_t i = 0; i < c.n_tokens; ++i, ++t)
        for (int64_t j = 0; j < p.k; ++j) {
          const int32_t e = p.ids[size_t(t * p.k + j)];
          if (e < 0 || e >= E) fail("routing recorder: expert id {} in layer {} is outside 0..{}", e, l, E - 1);
          ++counts[size_t(e)];
          if (c.decode) touched_[size_t(e)] = 1;
        }
      any_decode |= c.decode;
    }
    if (any_decode) {
      ++lr.decode_steps;
      // Pairs of the experts used, in increasing id order: O(used^2), not O(E^2).
      used_.clear();
      for (int64_t e = 0; e < E; ++e)
        if (touched_[size_t(e)]) used_.push_back(int32_t(e));
      for (size_t a = 0; a < used_.size(); ++a)
        for (size_t b = a + 1; b < used_.size(); ++b) ++lr.coactivation[size_t(used_[a] * E + used_[b])];
    }
    p = PendingLayer{};
    counted = true;
  }
  if (counted) ++profile_.steps;
}

RoutingProfile RoutingRecorder::snapshot() const {
  std::lock_guard lock(mutex_);
  return profile_;
}

int64_t RoutingRecorder::steps() const {
  std::lock_guard lock(mutex_);
  return profile_.steps;
}

ProfileFileWriter::ProfileFileWriter(const RoutingRecorder& recorder, std::string path, double interval_s)
    : recorder_(recorder), path_(std::move(path)), interval_s_(interval_s) {
  if (!(interval_s_ > 0)) fail("--record-profile-interval must be positive, got {}", interval_s_);
  write_now();  // fail early on an unwritable path: an empty profile of the right shape
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return stop_; });
      if (stop_) break;
      lock.unlock();
      try {
        write_now();
      } catch (const Error& e) {
        std::fprintf(stderr, "spill: warning: %s (will retry)\n", e.what());
      }
      lock.lock();
    }
  });
}

ProfileFileWriter::~ProfileFileWriter() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  try {
    write_now();
  } catch (const Error& e) {
    std::fprintf(stderr, "spill: warning: %s\n", e.what());
  }
}

void ProfileFileWriter::write_now() {
  std::lock_guard lock(write_mutex_);
  const RoutingProfile p = recorder_.snapshot();
  if (p.steps == written_steps_) return;
  save_profile(p, path_);
  written_steps_ = p.steps;
}

}  // namespace spill::placement
