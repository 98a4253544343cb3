#pragma once
// The state of the engine's running sequences: pages from one pool, shared through the prefix cache, counted in
// rows (a page of each table: sequence_state.h). A sequence is admitted (its prompt's cached prefix matched and
// locked, its state resumed after it), grows page by page (evicting unused cached pages when the pool runs short),
// shares its completed pages while it runs, and hands them to the cache when it ends or is preempted. As it grows,
// it gives up the window pages of rows its queries no longer read: its own go back to the pool at once, the
// cache's become evictable. So a running sequence holds window pages for its last window only, and a finished
// one leaves its last window in the cache with its rows (a prefix tail: the next turn resumes there exactly).
#include "kv/host_pool.h"
#include "kv/page_pool.h"
#include "kv/prefix_cache.h"

#include <cstdint>
#include <memory>
#include <span>

namespace peregrine {

// Window pages that `max_running` sequences can need at once, a prefill chunk of `chunk_tokens` among them, plus
// `tails` cached window tails (SGLang's --swa-prefix-tails); INT64_MAX when the layout keeps every window page.
int64_t window_pages_wanted(const StateLayout& layout, int max_running, int chunk_tokens, int64_t tails);

// SWA bounded replay (--enable-encoder-swa-bounded-replay, --enable-decoder-swa-bounded-replay): both trade exact
// numerics for less prefill work.
struct SwaReplay {
    // A prefix hit whose window pages are gone resumes a window before its end, the window K=V below the resume
    // point absent, instead of recomputing the whole prefix.
    bool encoder = false;
    // A prefill's layers after the last KV source run only over its last window of tokens (from a page boundary).
    bool decoder = false;
};

// One sequence as the cache manager tracks it.
struct CachedSequence {
    SeqState state;
    PrefixCache::Handle locked = nullptr;  // the cached path it uses
    int64_t shared_pages = 0;              // its leading pages the cache owns
    int64_t window_from = 0;               // the first row whose window page it still holds
    bool sharing_stopped = false;          // a concurrent duplicate: the rest of its pages stay private
    int64_t host_hit_tokens = 0;           // of the tokens admit resumed, those brought back from host memory
    int64_t storage_hit_tokens = 0;        // and from storage
    // Decoder replay: the prefill's rows below it skip the layers after the last KV source (BatchSeq::replay_from),
    // so the window pages of rows below it are never cached.
    int64_t replay_from = 0;
};

class CacheManager {
public:
    struct Stats {
        int64_t pages_total = 0, pages_used = 0, pages_cached = 0, pages_evictable = 0;  // history pages (rows)
        int64_t window_pages_total = 0, window_pages_used = 0, window_pages_cached = 0, window_pages_evictable = 0;
        int64_t host_pages_total = 0;  // the hierarchical cache's host rows
        PrefixCache::Stats cache{};  // the prefix cache's own figures, its host and storage tiers among them
    };

    // `pages`: of each table (PagePool::pages_for_budget); `prefix_cache` false: no sharing, pages go back to the
    // pool; `tiers`: the hierarchical cache (host memory and storage below the device's pages), when enabled.
    CacheManager(StateMemory& memory, const StateLayout& layout, PagePool::Pages pages, bool prefix_cache,
                 const HiCacheOptions& tiers = {}, SwaReplay replay = {});
    ~CacheManager();

    // Sets the sequence up to compute `tokens` after their longest cached prefix of whole pages (the last token
    // is always computed) with room for one more token. Returns the tokens resumed from the cache, or -1 (and
    // nothing held) when the pages are short right now. With SwaReplay, sets its window floor and replay_from.
    int64_t admit(CachedSequence& s, std::span<const int32_t> tokens);
    // Pages to cover n_tokens, evicting unused cached pages as needed; false (nothing allocated) when short.
    bool reserve(CachedSequence& s, int64_t n_tokens);
    // Speculative steps (PagePool::keep_step_carries, PagePool::cut): carry slots for a step of n_tokens, and the
    // sequence cut back to its first n_tokens after the drafts beyond were rejected.
    bool keep_step_carries(CachedSequence& s, int n_tokens) { return pool_.keep_step_carries(s.state, n_tokens); }
    void cut(CachedSequence& s, int64_t n_tokens) { pool_.cut(s.state, n_tokens); }
    // The pages of its first known_tokens tokens (whole pages) go to the prefix cache, the others to the pool.
    void release(CachedSequence& s, int64_t known_tokens);
    // Shares its completed pages (up to known_tokens) with the cache while it runs, so that concurrent requests
    // with the same prefix use them at once.
    void share(CachedSequence& s, int64_t known_tokens);

    // Pages of table t free or held only by the cache.
    int64_t available_pages(PageTable t = kHistoryPages) const;
    // Frees every cached page no sequence uses; returns how many.
    int64_t flush();
    Stats stats() const;
    const StateLayout& layout() const { return pool_.layout(); }
    int64_t capacity_tokens() const { return pool_.capacity(kHistoryPages) * pool_.layout().page_tokens; }
    PagePool& pool() { return pool_; }

private:
    void trim_window(CachedSequence& s);  // gives up the window pages its next query will not read
    PagePool pool_;
    HiCacheOptions tiers_;
    SwaReplay replay_;
    std::unique_ptr<PrefixCache> cache_;
};

}  // namespace peregrine
