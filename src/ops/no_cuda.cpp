// Builds without nvcc have no CUDA backend; Model::load refuses --device cuda with a clear message.
#include "ops/backend.h"
#include "ops/comm.h"
#include "util/error.h"

namespace peregrine {

bool cuda_device_available(std::string* why) {
    if (why) *why = "this build has no CUDA backend (nvcc was not found at configure time)";
    return false;
}

std::vector<std::unique_ptr<Communicator>> make_nccl_group(int) {
    fail("this build has no CUDA backend, so no GPU group (nvcc was not found at configure time)");
}

}  // namespace peregrine
