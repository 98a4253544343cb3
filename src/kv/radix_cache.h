#pragma once
// The prefix cache as a trie whose edges are one page of tokens (page_tokens ids) and whose nodes own the row of
// pages holding those tokens' state. Paths are locked by reference counts; only unreferenced leaves are evicted,
// least recently used first. Window pages no sequence reads wait in a list of their own, least recently used
// first, to be evicted alone when the window table runs short.
#include "kv/page_pool.h"
#include "kv/prefix_cache.h"

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <span>
#include <vector>

namespace peregrine {

struct PrefixCache::Node {
    Node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
    PageRow page{-1, -1};
    int64_t row = -1;          // the page of tokens [row*P, (row+1)*P)
    int64_t refs = 0;          // sequences whose locked path passes here
    int64_t window_refs = 0;   // sequences that still read its window page
    uint64_t last_use = 0;
    bool window_evictable = false;       // in the window list (it has a window page and window_refs is 0)
    std::list<Node*>::iterator window_lru;
};

class RadixCache final : public PrefixCache {
public:
    explicit RadixCache(PagePool& pool);
    ~RadixCache() override;
    RadixCache(const RadixCache&) = delete;
    RadixCache& operator=(const RadixCache&) = delete;

    Match match(std::span<const int32_t> tokens, int64_t max_pages) override;
    void unlock(Handle last) override;
    void drop_window(Handle last, int64_t from_row, int64_t to_row) override;
    void insert(std::span<const int32_t> tokens, std::span<const PageRow> pages, int64_t n_pages) override;
    Handle extend(Handle last, std::span<const int32_t> tokens, std::span<const PageRow> pages, int64_t from_page,
                  int64_t& to_page) override;
    int64_t evict(int64_t n) override;
    int64_t evict_window(int64_t n) override;
    int64_t clear() override;
    const Stats& stats() const override { return stats_; }

private:
    void add_ref(Node* n);
    void hold_window(Node* n);     // a sequence reads n's window page
    void release_window(Node* n);  // one fewer does
    void own_window(Node* n, int32_t page);  // n's window page is now `page`
    void list_window(Node* n);    // its window page becomes evictable, most recently used
    void unlist_window(Node* n);
    std::unique_ptr<Node> new_node(Node* parent, const PageRow& page, int64_t row);
    std::vector<int32_t> key(std::span<const int32_t> tokens, int64_t page) const;

    PagePool& pool_;
    int P_;
    Node root_;
    uint64_t clock_ = 0;
    std::list<Node*> window_lru_;  // evictable window pages, least recently used first
    Stats stats_;
};

}  // namespace peregrine
