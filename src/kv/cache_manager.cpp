#include "kv/cache_manager.h"
#include "kv/radix_cache.h"
#include "util/error.h"

#include <algorithm>

namespace peregrine {

int64_t window_pages_wanted(const StateLayout& L, int max_running, int chunk_tokens, int64_t tails) {
    const int64_t rows = L.window_rows();
    if (rows < 0) return INT64_MAX;
    // Each sequence reads its window and writes a row (two when a page boundary falls inside its step); a
    // prefill chunk's rows come on top.
    return max_running * (rows + 2) + L.pages_for(chunk_tokens) + tails * rows;
}

CacheManager::CacheManager(StateMemory& memory, const StateLayout& layout, PagePool::Pages pages, bool prefix_cache,
                           const HiCacheOptions& tiers, SwaReplay replay)
    : pool_(memory, layout, pages), tiers_(tiers), replay_(replay) {
    if (layout.window_rows() < 0) replay_ = {};  // every window page is kept: nothing to replay
    PEREGRINE_CHECK(!tiers.enabled || prefix_cache, "the hierarchical cache needs the prefix cache");
    if (prefix_cache) cache_ = std::make_unique<RadixCache>(pool_, &tiers_);
}

CacheManager::~CacheManager() { cache_.reset(); }  // its pages back to the pool before the pool goes

int64_t CacheManager::available_pages(PageTable t) const {
    if (!cache_) return pool_.free_pages(t);
    const auto& cs = cache_->stats();
    return pool_.free_pages(t) + (t == kHistoryPages ? cs.evictable_pages : cs.evictable_window_pages);
}

int64_t CacheManager::admit(CachedSequence& s, std::span<const int32_t> tokens) {
    const StateLayout& L = pool_.layout();
    const int P = L.page_tokens;
    const int64_t n = static_cast<int64_t>(tokens.size());
    PrefixCache::Match m;
    if (cache_) m = cache_->match(tokens, (n - 1) / P, replay_.encoder ? L.window_rows() : 0);
    const int64_t matched = static_cast<int64_t>(m.pages.size());
    // The match holds the window pages from here (replayed: none).
    const int64_t window_from = m.replayed ? matched : L.window_first_row(matched * P);
    const int64_t need = L.pages_for(n + 1) - matched;
    const int64_t window_rows = L.window_rows();
    const int64_t window_need = window_rows < 0 ? need : std::min(need, window_rows + 2);
    // Rows brought back from host memory or storage count as such until the sequence is admitted (a later
    // attempt finds them on the device).
    s.host_hit_tokens += m.host_pages * P;
    s.storage_hit_tokens += m.storage_pages * P;
    if (need > available_pages(kHistoryPages) || window_need > available_pages(kWindowPages)) {
        if (m.last) {
            cache_->drop_window(m.last, window_from, matched);
            cache_->unlock(m.last);
        }
        return -1;
    }
    s.state.pages = m.pages;
    s.state.tokens.assign(tokens.begin(), tokens.begin() + matched * P);
    pool_.restore(s.state, matched * P);
    s.locked = m.last;
    s.shared_pages = matched;
    s.window_from = window_from;
    s.sharing_stopped = false;
    s.state.window_floor = m.replayed ? matched * P : 0;
    // The prefill's last window of tokens, from a page boundary, runs every layer (tokens[n - 1] is the last row);
    // none when the cached prefix reaches it.
    s.replay_from = replay_.decoder ? std::max<int64_t>(0, n - L.window_tokens) / P * P : 0;
    if (s.replay_from <= matched * P) s.replay_from = 0;
    return matched * P;
}

void CacheManager::trim_window(CachedSequence& s) {
    const int64_t to = std::min<int64_t>(pool_.layout().window_first_row(s.state.n_cached),
                                         static_cast<int64_t>(s.state.pages.size()));
    if (to <= s.window_from) return;
    const int64_t shared = std::min(to, s.shared_pages);
    if (shared > s.window_from) {  // the cache's rows: no longer read by this sequence
        cache_->drop_window(s.locked, s.window_from, shared);
        for (int64_t r = s.window_from; r < shared; ++r) s.state.pages[static_cast<size_t>(r)][kWindowPages] = -1;
    }
    pool_.drop_window(s.state, std::max(s.window_from, shared), to);
    s.window_from = to;
}

bool CacheManager::reserve(CachedSequence& s, int64_t n_tokens) {
    trim_window(s);
    const int64_t need = pool_.layout().pages_for(n_tokens) - static_cast<int64_t>(s.state.pages.size());
    if (need <= 0) return true;
    if (cache_) {
        if (pool_.free_pages(kHistoryPages) < need) cache_->evict(need - pool_.free_pages(kHistoryPages));
        if (pool_.free_pages(kWindowPages) < need) cache_->evict_window(need - pool_.free_pages(kWindowPages));
    }
    return pool_.reserve(s.state, n_tokens);
}

void CacheManager::release(CachedSequence& s, int64_t known_tokens) {
    SeqState& st = s.state;
    const int P = pool_.layout().page_tokens;
    if (cache_) {
        if (s.shared_pages > s.window_from) cache_->drop_window(s.locked, s.window_from, s.shared_pages);
        // Rows the prefill wrote below replay_from lack some layers' window K=V: their window pages stay out.
        pool_.drop_window(st, std::max(s.window_from, s.shared_pages), s.replay_from / P);
        const int64_t full = std::min<int64_t>(known_tokens / P, static_cast<int64_t>(st.pages.size()));
        cache_->insert(st.tokens, st.pages, full);
        for (size_t i = static_cast<size_t>(full); i < st.pages.size(); ++i) pool_.free(st.pages[i]);
        if (s.locked) cache_->unlock(s.locked);
        st.pages.clear();
    }
    pool_.release(st);  // the rest of its pages (without a cache: all) and its carry slot
    s.locked = nullptr;
    s.shared_pages = 0;
    s.window_from = 0;
    s.replay_from = 0;
    s.host_hit_tokens = s.storage_hit_tokens = 0;
    st.tokens.clear();
    st.n_cached = 0;
    st.window_floor = 0;
}

void CacheManager::share(CachedSequence& s, int64_t known_tokens) {
    if (!cache_ || s.sharing_stopped) return;
    const int P = pool_.layout().page_tokens;
    if (s.replay_from > 0) {  // decoder replay: the window pages of rows below replay_from stay out of the cache
        if (pool_.layout().window_first_row(s.state.n_cached) < s.replay_from / P) return;  // still read: later
        trim_window(s);  // gone, and with them every window page the sequence no longer reads
    }
    int64_t full = std::min<int64_t>(known_tokens / P, static_cast<int64_t>(s.state.pages.size()));
    if (full <= s.shared_pages) return;
    const int64_t want = full;
    s.locked = cache_->extend(s.locked, s.state.tokens, s.state.pages, s.shared_pages, full);
    s.shared_pages = full;
    if (full < want) s.sharing_stopped = true;
}

int64_t CacheManager::flush() { return cache_ ? cache_->clear() : 0; }

CacheManager::Stats CacheManager::stats() const {
    Stats st;
    st.pages_total = pool_.capacity(kHistoryPages);
    st.pages_used = pool_.used_pages(kHistoryPages);
    st.window_pages_total = pool_.capacity(kWindowPages);
    st.window_pages_used = pool_.used_pages(kWindowPages);
    if (cache_) {
        const auto& cs = cache_->stats();
        st.pages_cached = cs.cached_pages;
        st.pages_evictable = cs.evictable_pages;
        st.window_pages_cached = cs.window_pages;
        st.window_pages_evictable = cs.evictable_window_pages;
        st.cache = cs;
    }
    if (tiers_.enabled) st.host_pages_total = tiers_.host_pages[kHistoryPages];
    return st;
}

}  // namespace peregrine
