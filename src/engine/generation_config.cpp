#include "engine/generation_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "core/json_limits.h"
#include "engine/model_bundle.h"
#include "formats/gguf.h"

namespace spill {

namespace {

// A finite number in [lo, hi], else nothing (so a cast to float or int is always defined).
std::optional<double> number_in(const nlohmann::json& g, const char* key, double lo, double hi) {
  const auto it = g.find(key);
  if (it == g.end() || !it->is_number()) return std::nullopt;
  const double x = it->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) return std::nullopt;
  return x;
}

}  // namespace

SamplingParams sampling_defaults_from_json(const nlohmann::json& g) {
  SamplingParams p;
  if (!g.is_object()) return p;
  const auto do_sample = g.find("do_sample");
  if (do_sample != g.end() && do_sample->is_boolean() && do_sample->get<bool>()) {
    SamplingParams candidate = p;
    if (auto t = number_in(g, "temperature", 0, 100)) candidate.temperature = float(*t);
    if (auto v = number_in(g, "top_p", 0, 1); v && *v > 0) candidate.top_p = float(*v);
    if (auto k = number_in(g, "top_k", -1, 1 << 30); k && *k == std::floor(*k)) candidate.top_k = int32_t(*k);
    if (auto m = number_in(g, "min_p", 0, 1)) candidate.min_p = float(*m);
    p = candidate;
  } else {
    p.temperature = 0.0f;
  }
  if (auto r = number_in(g, "repetition_penalty", 1e-6, 1e4)) p.repetition_penalty = float(*r);
  try {
    p.validate();
  } catch (const Error&) {
    p = SamplingParams{};
  }
  return p;
}

SamplingParams sampling_defaults_from_gguf(const gguf::Metadata& md) {
  nlohmann::json g = {{"do_sample", true}};
  bool any = false;
  for (auto [key, field] : {std::pair{"general.sampling.temp", "temperature"}, {"general.sampling.top_k", "top_k"},
                            {"general.sampling.top_p", "top_p"}, {"general.sampling.min_p", "min_p"}}) {
    if (!md.has(key)) continue;
    g[field] = md.number(key);
    any = true;
  }
  return any ? sampling_defaults_from_json(g) : SamplingParams{};
}

SamplingParams load_sampling_defaults(const std::string& model_path) {
  if (is_gguf_model_path(model_path)) return sampling_defaults_from_gguf(gguf::GgufFile::open(model_path)->metadata());
  const auto path = std::filesystem::path(model_path) / "generation_config.json";
  if (!std::filesystem::exists(path)) return {};
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read the file", path.string());
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::string why;
  const std::optional<nlohmann::json> g = try_parse_json<nlohmann::json>(text, &why);
  if (!g) fail("{} {}; fix or remove the file", path.string(), why);
  return sampling_defaults_from_json(*g);
}

}  // namespace spill
