#pragma once
// A cache of whole rows of state pages (sequence_state.h: a page of each table) keyed by the tokens before them.
// Since a full row is never written again and carries the compressor snapshot of its last token, any shared
// prefix of whole rows can be resumed exactly (PagePool::restore), whatever the compression ratios of the layers.
// Sequences lock the path they match or share; only rows no sequence uses are evicted. Counts are in rows ("pages").
//
// A row's window page is only read by sequences within a window after it, so the cache can drop it alone
// (evict_window) while keeping the row's history; a prefix can then be resumed only at a page boundary whose last
// window rows (StateLayout::window_rows) still have theirs. A sequence holds the window pages of the cached rows it
// still reads (match, extend) until it drops them (drop_window); the others are evicted least recently used first.
//
// With the hierarchical cache (host_pool.h, page_store.h), a row evicted from the device keeps a copy in host
// memory, and rows may be found in storage past the cached path: match brings both back to the device.
#include "kv/sequence_state.h"

#include <cstdint>
#include <span>
#include <vector>

namespace peregrine {

class PrefixCache {
public:
    // The end of a locked path (null: nothing locked).
    struct Node;
    using Handle = Node*;

    struct Match {
        std::vector<PageRow> pages;  // pages[i] holds tokens [i*P, (i+1)*P); window pages only of the rows read
        Handle last = nullptr;       // the matched path, locked until unlock(last)
        int64_t host_pages = 0;      // of pages, the ones brought back from host memory
        int64_t storage_pages = 0;   // and from storage
        bool replayed = false;       // no window pages: the caller recomputes the rows after it (replay_rows)
    };

    struct Stats {
        int64_t cached_pages = 0;     // rows the cache owns
        int64_t evictable_pages = 0;  // of those, the ones no sequence uses
        int64_t evicted_pages = 0;    // since start
        int64_t window_pages = 0;            // window pages the cache owns
        int64_t evictable_window_pages = 0;  // of those, the ones no sequence reads
        // The hierarchical cache, since start but the first two.
        int64_t host_pages = 0, host_window_pages = 0;  // copies in host memory now
        int64_t host_evicted_pages = 0;                 // host copies dropped to make room
        int64_t bytes_to_host = 0, bytes_from_host = 0, bytes_from_storage = 0, bytes_to_storage = 0;
        int64_t storage_writes = 0, storage_writes_dropped = 0, storage_corrupt = 0;
    };

    virtual ~PrefixCache() = default;

    // Longest cached prefix of `tokens`, in whole pages, at most max_pages, that ends where the window rows before
    // it are cached; the path is locked and those window pages held for the caller. With replay_rows > 0
    // (encoder SWA bounded replay), a prefix whose window pages are gone may end replay_rows rows before the
    // deepest cached row instead, without window pages (replayed), when that resumes later than an exact end.
    virtual Match match(std::span<const int32_t> tokens, int64_t max_pages, int64_t replay_rows = 0) = 0;
    virtual void unlock(Handle last) = 0;
    // The caller no longer reads the window pages of rows [from_row, to_row) of its path ending at `last`.
    virtual void drop_window(Handle last, int64_t from_row, int64_t to_row) = 0;
    // Hands a sequence's first n_pages pages over (pages[i] holds tokens [i*P, (i+1)*P)); a page whose prefix is
    // already cached under another page goes back to the pool (a window page fills the cached row's if it has
    // none).
    virtual void insert(std::span<const int32_t> tokens, std::span<const PageRow> pages, int64_t n_pages) = 0;
    // Shares a running sequence's newly completed pages [from_page, to_page) while it keeps using them, locked for
    // it below `last` (its locked path), their window pages held for it where it has them. Stops at a page whose
    // prefix another sequence cached under a different page (that page stays the sequence's own). Returns the new path end; `to_page` becomes the count shared.
    virtual Handle extend(Handle last, std::span<const int32_t> tokens, std::span<const PageRow> pages,
                          int64_t from_page, int64_t& to_page) = 0;
    // Frees up to n rows no sequence uses, least recently used first; returns how many.
    virtual int64_t evict(int64_t n) = 0;
    // Frees up to n window pages no sequence reads, least recently used first; returns how many.
    virtual int64_t evict_window(int64_t n) = 0;
    // Frees every row and window page no sequence uses; returns how many rows.
    virtual int64_t clear() = 0;
    virtual const Stats& stats() const = 0;
};

}  // namespace peregrine
