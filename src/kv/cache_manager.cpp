#include "kv/cache_manager.h"
#include "kv/radix_cache.h"

#include <algorithm>

namespace peregrine {

CacheManager::CacheManager(StateMemory& memory, const StateLayout& layout, int64_t n_pages, bool prefix_cache)
    : pool_(memory, layout, n_pages) {
    if (prefix_cache) cache_ = std::make_unique<RadixCache>(pool_);
}

CacheManager::~CacheManager() { cache_.reset(); }  // its pages back to the pool before the pool goes

int64_t CacheManager::available_pages() const {
    return pool_.free_rows() + (cache_ ? cache_->stats().evictable_pages : 0);
}

int64_t CacheManager::admit(CachedSequence& s, std::span<const int32_t> tokens) {
    const StateLayout& L = pool_.layout();
    const int P = L.page_tokens;
    const int64_t n = static_cast<int64_t>(tokens.size());
    PrefixCache::Match m;
    if (cache_) m = cache_->match(tokens, (n - 1) / P);
    const int64_t matched = static_cast<int64_t>(m.pages.size());
    if (L.pages_for(n + 1) - matched > available_pages()) {
        if (m.last) cache_->unlock(m.last);
        return -1;
    }
    s.state.pages = m.pages;
    s.state.tokens.assign(tokens.begin(), tokens.begin() + matched * P);
    pool_.restore(s.state, matched * P);
    s.locked = m.last;
    s.shared_pages = matched;
    s.sharing_stopped = false;
    return matched * P;
}

bool CacheManager::reserve(CachedSequence& s, int64_t n_tokens) {
    const int64_t need = pool_.layout().pages_for(n_tokens) - static_cast<int64_t>(s.state.pages.size());
    if (need <= 0) return true;
    if (pool_.free_rows() < need && cache_) cache_->evict(need - pool_.free_rows());
    if (pool_.free_rows() < need) return false;
    return pool_.reserve(s.state, n_tokens);
}

void CacheManager::release(CachedSequence& s, int64_t known_tokens) {
    SeqState& st = s.state;
    const int P = pool_.layout().page_tokens;
    if (cache_) {
        const int64_t full = std::min<int64_t>(known_tokens / P, static_cast<int64_t>(st.pages.size()));
        cache_->insert(st.tokens, st.pages, full);
        for (size_t i = static_cast<size_t>(full); i < st.pages.size(); ++i) pool_.free(st.pages[i]);
        if (s.locked) cache_->unlock(s.locked);
        st.pages.clear();
    }
    pool_.release(st);  // the rest of its pages (without a cache: all) and its carry slot
    s.locked = nullptr;
    s.shared_pages = 0;
    st.tokens.clear();
    st.n_cached = 0;
}

void CacheManager::share(CachedSequence& s, int64_t known_tokens) {
    if (!cache_ || s.sharing_stopped) return;
    const int P = pool_.layout().page_tokens;
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
    st.pages_total = pool_.capacity();
    st.pages_used = pool_.used_rows();
    st.pages_cached = cache_ ? cache_->stats().cached_pages : 0;
    st.pages_evictable = cache_ ? cache_->stats().evictable_pages : 0;
    return st;
}

}  // namespace peregrine
