#include "kv/host_pool.h"
#include "util/error.h"

#include <cmath>

namespace peregrine {

PagePool::Pages host_pages_for(const StateLayout& layout, PagePool::Pages device, double ratio, int64_t bytes) {
    if (bytes > 0) {
        const double device_bytes = static_cast<double>(device[kHistoryPages]) * layout.page_bytes[kHistoryPages] +
                                    static_cast<double>(device[kWindowPages]) * layout.page_bytes[kWindowPages];
        ratio = device_bytes > 0 ? static_cast<double>(bytes) / device_bytes : 0.0;
    }
    PagePool::Pages host{};
    for (size_t t = 0; t < kPageTables; ++t)
        host[t] = static_cast<int64_t>(std::floor(static_cast<double>(device[t]) * ratio));
    return host;
}

HostPool::HostPool(StateMemory& memory, const StateLayout& layout, PagePool::Pages pages)
    : memory_(memory), capacity_(pages), page_bytes_(layout.page_bytes) {
    for (size_t t = 0; t < kPageTables; ++t) {
        PEREGRINE_CHECK(capacity_[t] > 0 && capacity_[t] < INT32_MAX, "the host cache needs 1 to 2^31 pages, not {}",
                        capacity_[t]);
        base_[t] = memory_.alloc_host(std::max<size_t>(static_cast<size_t>(capacity_[t]) * page_bytes_[t], 64));
        free_[t].reserve(static_cast<size_t>(capacity_[t]));
        for (int64_t i = capacity_[t] - 1; i >= 0; --i) free_[t].push_back(static_cast<int32_t>(i));
    }
}

HostPool::~HostPool() {
    for (uint8_t* b : base_)
        if (b) memory_.free_host(b);
}

int32_t HostPool::alloc(PageTable t) {
    if (free_[t].empty()) return -1;
    const int32_t id = free_[t].back();
    free_[t].pop_back();
    return id;
}

}  // namespace peregrine
