// Where the CLI finds a model when --model is not given.
#pragma once
#include <string>

namespace spill::cli {

// The model folder used when --model is not given: models/spill-tiny next to the installed
// executable or in the source tree it was built from.
std::string default_model_dir();

}  // namespace spill::cli
