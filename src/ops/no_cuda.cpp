// Builds without nvcc have no CUDA backend; Model::load refuses --device cuda with a clear message.
#include "ops/backend.h"

namespace peregrine {

bool cuda_device_available(std::string* why) {
    if (why) *why = "this build has no CUDA backend (nvcc was not found at configure time)";
    return false;
}

}  // namespace peregrine
