#include "kv/state_memory.h"
#include "util/error.h"

#include <cstdlib>
#include <cstring>

namespace peregrine {

uint8_t* StateMemory::alloc_host(size_t bytes) {
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (!p) fail("cannot allocate {} bytes of host memory for the hierarchical cache", bytes);
    return p;
}

void StateMemory::free_host(uint8_t* p) { std::free(p); }

uint8_t* HostStateMemory::alloc(size_t bytes) {
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (!p) fail("cannot allocate {} bytes of state memory", bytes);
    std::memset(p, 0, bytes);
    return p;
}

void HostStateMemory::free(uint8_t* p) { std::free(p); }
void HostStateMemory::to_host(const uint8_t* src, size_t bytes, void* dst) { std::memcpy(dst, src, bytes); }
void HostStateMemory::from_host(uint8_t* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void HostStateMemory::copy(uint8_t* dst, const uint8_t* src, size_t bytes) { std::memmove(dst, src, bytes); }

}  // namespace peregrine
