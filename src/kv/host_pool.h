#pragma once
// The hierarchical cache's host tier (L2, SGLang's HiCache): copies of cached rows in host memory (pinned on a
// GPU), pages of each table carved from one allocation per table like the device's pool, so that a row evicted
// from the device comes back with a copy instead of a recompute.
#include "kv/page_pool.h"

#include <cstdint>
#include <string>
#include <vector>

namespace peregrine {

struct HiCacheOptions {
    bool enabled = false;              // --enable-hierarchical-cache
    PagePool::Pages host_pages{};      // host pages of each table
    bool write_through = false;        // copy rows to host when cached (write_through), else when evicted
    std::string storage_backend;       // "", "file" or "redis": the storage tier (L3)
    std::string storage_dir;           // file: the directory
    std::string storage_url;           // redis: redis://host:port or unix:///path
    std::string identity;              // the model's identity (weights, config): part of every storage key
};

// Host pages for `ratio` times the device pool's pages, or for `bytes` of host memory (when > 0) in the device
// pool's proportions of history and window pages.
PagePool::Pages host_pages_for(const StateLayout& layout, PagePool::Pages device, double ratio, int64_t bytes);

class HostPool {
public:
    HostPool(StateMemory& memory, const StateLayout& layout, PagePool::Pages pages);
    ~HostPool();
    HostPool(const HostPool&) = delete;
    HostPool& operator=(const HostPool&) = delete;

    int64_t capacity(PageTable t) const { return capacity_[t]; }
    int64_t free_pages(PageTable t) const { return static_cast<int64_t>(free_[t].size()); }
    // A free page of table t, or -1.
    int32_t alloc(PageTable t);
    void free(PageTable t, int32_t id) { free_[t].push_back(id); }
    uint8_t* page(PageTable t, int32_t id) const { return base_[t] + static_cast<size_t>(id) * page_bytes_[t]; }

private:
    StateMemory& memory_;
    PagePool::Pages capacity_;
    std::array<size_t, kPageTables> page_bytes_{};
    std::array<uint8_t*, kPageTables> base_{};
    std::array<std::vector<int32_t>, kPageTables> free_;
};

}  // namespace peregrine
