#pragma once
// The prefix cache as a trie whose edges are one page of tokens (page_tokens ids) and whose nodes own the row of
// pages holding those tokens' state. Paths are locked by reference counts; only unreferenced leaves are evicted,
// least recently used first.
#include "kv/page_pool.h"
#include "kv/prefix_cache.h"

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

namespace peregrine {

struct PrefixCache::Node {
    Node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
    PageRow page{-1, -1};
    int64_t refs = 0;
    uint64_t last_use = 0;
};

class RadixCache final : public PrefixCache {
public:
    explicit RadixCache(PagePool& pool);
    ~RadixCache() override;
    RadixCache(const RadixCache&) = delete;
    RadixCache& operator=(const RadixCache&) = delete;

    Match match(std::span<const int32_t> tokens, int64_t max_pages) override;
    void unlock(Handle last) override;
    void insert(std::span<const int32_t> tokens, std::span<const PageRow> pages, int64_t n_pages) override;
    Handle extend(Handle last, std::span<const int32_t> tokens, std::span<const PageRow> pages, int64_t from_page,
                  int64_t& to_page) override;
    int64_t evict(int64_t n) override;
    int64_t clear() override { return evict(stats_.cached_pages); }
    const Stats& stats() const override { return stats_; }

private:
    void add_ref(Node* n);
    std::vector<int32_t> key(std::span<const int32_t> tokens, int64_t page) const;

    PagePool& pool_;
    int P_;
    Node root_;
    uint64_t clock_ = 0;
    Stats stats_;
};

}  // namespace peregrine
