// config.json (the model's shape) and generation_config.json (sampling defaults), as a downloaded
// model folder brings them.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_limits.h"
#include "formats/model_spec.h"
#include "fuzz_common.h"
#include "server/api_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(spill::fuzz::as_text(data, size));
  try {
    spill::parse_model_spec(text, "config.json");
  } catch (const spill::Error&) {
  }
  if (auto j = spill::try_parse_json<nlohmann::json>(text); j && j->is_object()) {
    spill::server::GenerationDefaults::from_json(*j);
  }
  return 0;
}
