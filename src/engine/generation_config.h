// The model's own sampling defaults, read from <model dir>/generation_config.json the way
// transformers applies them, or from a GGUF file's general.sampling.* keys the way llama.cpp does.
// One reader for every front end: `spill serve` (what an omitted temperature means), `spill
// generate` and `spill run-batch` (what their flags default to).
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "sampling/sampler.h"

namespace spill {

namespace gguf {
class Metadata;
}

// transformers samples only when do_sample is true: then temperature, top_p, top_k and min_p
// apply; otherwise generation is greedy and those are inert. repetition_penalty applies either
// way. Fields of the wrong type or outside what the sampler accepts (top_k of 1e38, top_p of 7)
// are ignored, since the file is the model's suggestion and must not break every request.
SamplingParams sampling_defaults_from_json(const nlohmann::json& config);

// A GGUF's general.sampling.temp / top_k / top_p / min_p (sampling with them), under the same range
// checks; none of them: SamplingParams' defaults.
SamplingParams sampling_defaults_from_gguf(const gguf::Metadata& metadata);

// From a model folder's generation_config.json or a GGUF file (model_path as --model names it); a
// folder without the file gives SamplingParams' defaults (temperature 1, no truncation). Throws
// spill::Error naming the file when it is not valid JSON.
SamplingParams load_sampling_defaults(const std::string& model_path);

}  // namespace spill
