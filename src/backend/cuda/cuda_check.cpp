#include "backend/cuda/cuda_check.h"

#include "core/error.h"

namespace spill::cuda {

void throw_error(const std::string& what) { throw Error(what); }

}  // namespace spill::cuda
