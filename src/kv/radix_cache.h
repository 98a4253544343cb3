#pragma once
// The prefix cache as a trie whose edges are one page of tokens (page_tokens ids) and whose nodes own the row of
// pages holding those tokens' state. Paths are locked by reference counts; only unreferenced leaves are evicted,
// least recently used first. Window pages no sequence reads wait in a list of their own, least recently used
// first, to be evicted alone when the window table runs short.
//
// Device rows no sequence uses are kept ordered least recently used first (deepest first among equals), so that an
// eviction takes the oldest leaf without scanning the trie.
//
// With the hierarchical cache, a node's row may live on the device, in host memory or both: rows on the device
// form the top of the trie (a device row's parent is on the device), host-only rows hang below them. Eviction
// moves a device row to host memory (write_back; write_through copied it when it was cached) and drops host copies
// least recently used first when host memory runs short. Every host copy is written to storage as well.
#include "kv/host_pool.h"
#include "kv/page_pool.h"
#include "kv/page_store.h"
#include "kv/prefix_cache.h"

#include <cstdint>
#include <list>
#include <map>
#include <set>
#include <tuple>
#include <memory>
#include <span>
#include <vector>

namespace peregrine {

struct PrefixCache::Node {
    Node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
    const std::vector<int32_t>* tokens = nullptr;  // its page's tokens (its key in the parent's children)
    PageRow page{-1, -1};      // on the device (history -1: not on the device)
    PageRow host{-1, -1};      // its copy in host memory
    PageKey key;               // storage key of the tokens up to its end
    int stored = 0;            // in storage: 1 its history page, 2 with its window page
    bool ends = false;         // a sequence ended or resumed here: a prompt may well resume here again
    int64_t row = -1;          // the page of tokens [row*P, (row+1)*P)
    int64_t refs = 0;          // sequences whose locked path passes here
    int64_t window_refs = 0;   // sequences that still read its window page
    uint64_t last_use = 0;
    bool window_evictable = false;       // in the window list (it has a window page and window_refs is 0)
    std::list<Node*>::iterator window_lru;
    bool listed = false;                 // in the evictable set, under listed_use
    uint64_t listed_use = 0;
};

class RadixCache final : public PrefixCache {
public:
    // `tiers`: the hierarchical cache (null or not enabled: device pages only).
    explicit RadixCache(PagePool& pool, const HiCacheOptions* tiers = nullptr);
    ~RadixCache() override;
    RadixCache(const RadixCache&) = delete;
    RadixCache& operator=(const RadixCache&) = delete;

    Match match(std::span<const int32_t> tokens, int64_t max_pages, int64_t replay_rows = 0) override;
    void unlock(Handle last) override;
    void drop_window(Handle last, int64_t from_row, int64_t to_row) override;
    void insert(std::span<const int32_t> tokens, std::span<const PageRow> pages, int64_t n_pages) override;
    Handle extend(Handle last, std::span<const int32_t> tokens, std::span<const PageRow> pages, int64_t from_page,
                  int64_t& to_page) override;
    int64_t evict(int64_t n) override;
    int64_t evict_window(int64_t n) override;
    int64_t clear() override;
    const Stats& stats() const override;

private:
    static bool on_device(const Node* n) { return n->page[kHistoryPages] >= 0; }
    void add_ref(Node* n);
    void hold_window(Node* n);     // a sequence reads n's window page
    void release_window(Node* n);  // one fewer does
    void own_window(Node* n, int32_t page);  // n's window page is now `page`
    void list_window(Node* n);    // its window page becomes evictable, most recently used
    void unlist_window(Node* n);
    // n's place in the evictable set after its use, references or device page changed (in it: on the device and
    // no sequence uses it); unlist before its last_use changes.
    void relist(Node* n);
    void unlist(Node* n);
    void touch(Node* n);  // used now
    Node* add_child(Node* parent, std::vector<int32_t> tokens, const PageRow& page, int64_t row);
    void adopt(Node* c, const PageRow& row);  // c, only in host memory, takes a sequence's row of the same tokens
    std::vector<int32_t> key(std::span<const int32_t> tokens, int64_t page) const;
    void free_device(Node* n);     // its device pages back to the pool
    void free_host(Node* n);       // its host copy dropped
    void erase(Node* n);           // n and its subtree leave the trie
    bool device_leaf(const Node* n) const;

    // The hierarchical cache.
    // Copies what n has on the device (its window page only when `window`) and not in host memory; false: no room.
    bool backup(Node* n, bool window);
    // Within a window before a resume point: a path's end, a branch, a node a sequence ended or resumed at.
    bool near_end(const Node* n) const;
    bool host_room(int64_t history, int64_t window, const Node* keep);
    void store(Node* n);           // its host copy to storage (queued by flush_stores)
    void flush_stores();           // the queued copies to the writer, behind one fence
    bool make_room(PageTable t, int64_t n);  // n free device pages of table t, evicting others
    // Rows [first, limit) of `tokens` that storage holds after the key `from`, up to the first miss.
    std::vector<StoredRow> read_storage(std::span<const int32_t> tokens, const PageKey& from, int64_t first,
                                        int64_t limit);

    PagePool& pool_;
    int P_;
    Node root_;
    uint64_t clock_ = 0;
    std::list<Node*> window_lru_;  // evictable window pages, least recently used first
    // Device rows no sequence uses: (last use, -row, node), least recently used and deepest first.
    std::set<std::tuple<uint64_t, int64_t, Node*>> evictable_;
    mutable Stats stats_;
    bool write_through_ = false;
    bool backing_up_ = true;       // false while clear() drops everything
    std::unique_ptr<HostPool> host_;
    std::unique_ptr<PageStore> store_;
    std::unique_ptr<StoreWriter> writer_;  // after store_ and host_: it stops first
    std::vector<StoreWriter::Job> pending_;
};

}  // namespace peregrine
