// The model's own sampling defaults, read from <model dir>/generation_config.json the way
// transformers applies them. One reader for every front end: `spill serve` (what an omitted
// temperature means), `spill generate` and `spill run-batch` (what their flags default to).
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "engine/sampler.h"

namespace spill {

// transformers samples only when do_sample is true: then temperature, top_p, top_k and min_p
// apply; otherwise generation is greedy and those are inert. repetition_penalty applies either
// way. Fields of the wrong type or outside what the sampler accepts (top_k of 1e38, top_p of 7)
// are ignored, since the file is the model's suggestion and must not break every request.
SamplingParams sampling_defaults_from_json(const nlohmann::json& config);

// Reads the file; a missing file gives SamplingParams' defaults (temperature 1, no truncation).
// Throws spill::Error naming the file when it is not valid JSON.
SamplingParams load_sampling_defaults(const std::string& model_dir);

}  // namespace spill
