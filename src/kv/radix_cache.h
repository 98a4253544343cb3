#pragma once
// Prefix cache over whole state pages: a trie whose edges are one page of tokens (page_tokens ids) and
// whose nodes own the page holding those tokens' state. Since a full page is never written again and
// carries the compressor snapshot of its last token, any shared prefix of at least one page can be
// resumed exactly (Model::restore_state), whatever the compression ratios of the layers.
//
// Sequences lock the path they matched (reference counts); only unreferenced leaves are evicted, least
// recently used first.
#include "kv/page_pool.h"

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

namespace peregrine {

class RadixCache {
public:
    struct Node {
        Node* parent = nullptr;
        std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
        int32_t page = -1;
        int64_t refs = 0;
        uint64_t last_use = 0;
    };

    struct Match {
        std::vector<int32_t> pages;  // pages[i] holds tokens [i*P, (i+1)*P)
        Node* last = nullptr;        // locked path end (nullptr: nothing matched, nothing locked)
    };

    struct Stats {
        int64_t cached_pages = 0;     // pages the tree owns
        int64_t evictable_pages = 0;  // of those, the ones no sequence uses
        int64_t evicted_pages = 0;    // since start
    };

    explicit RadixCache(PagePool& pool);
    ~RadixCache();
    RadixCache(const RadixCache&) = delete;
    RadixCache& operator=(const RadixCache&) = delete;

    // Longest cached prefix of `tokens`, in whole pages, at most max_pages; the matched path is locked
    // until unlock(match.last).
    Match match(std::span<const int32_t> tokens, int64_t max_pages);
    void unlock(Node* last);

    // Hands a sequence's first n_pages pages to the cache (pages[i] holds tokens [i*P, (i+1)*P)). A page
    // whose prefix is already cached under another page is returned to the pool.
    void insert(std::span<const int32_t> tokens, std::span<const int32_t> pages, int64_t n_pages);

    // Shares a running sequence's newly completed pages [from_page, to_page) while it keeps using them:
    // they are added below `last` (the end of the path the sequence has locked, nullptr for none) and
    // locked for it. Stops at a page whose prefix another sequence already cached under a different page
    // (that page stays the sequence's own). Returns the new path end; `to_page` becomes the count shared.
    Node* extend(Node* last, std::span<const int32_t> tokens, std::span<const int32_t> pages, int64_t from_page,
                 int64_t& to_page);

    // Frees up to n unreferenced pages (least recently used leaves first); returns how many were freed.
    int64_t evict(int64_t n);
    // Frees every unreferenced page.
    int64_t clear() { return evict(stats_.cached_pages); }

    const Stats& stats() const { return stats_; }
    int page_tokens() const { return P_; }

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
