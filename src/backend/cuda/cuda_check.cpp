#include "backend/cuda/cuda_check.h"

#include "core/error.h"

namespace spill::cuda {

void throw_error(const std::string& what) { throw Error(what); }

void throw_device_fatal(const std::string& what) { throw DeviceFatalError(what); }

bool device_error_is_fatal(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoDevice:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

}  // namespace spill::cuda
