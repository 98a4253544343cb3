#include "kv/page_pool.h"
#include "util/error.h"


namespace peregrine {

PagePool::PagePool(Backend& backend, const StateLayout& layout, int64_t n_pages)
    : backend_(backend), layout_(layout), n_pages_(static_cast<size_t>(n_pages)) {
    PEREGRINE_CHECK(n_pages > 0, "page pool needs at least one page");
    base_ = backend_.alloc_state(n_pages_ * layout_.page_bytes);
    free_.reserve(n_pages_);
    for (int64_t i = n_pages - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

PagePool::~PagePool() { backend_.free_state(base_); }

int64_t PagePool::pages_for_budget(const StateLayout& layout, int64_t bytes) {
    return bytes / static_cast<int64_t>(layout.page_bytes);
}

int32_t PagePool::alloc() {
    if (free_.empty()) return -1;
    int32_t p = free_.back();
    free_.pop_back();
    return p;
}

void PagePool::free(int32_t page) { free_.push_back(page); }

bool PagePool::reserve(SeqState& s, int64_t n_tokens) {
    int64_t need = layout_.pages_for(n_tokens) - static_cast<int64_t>(s.pages.size());
    if (need <= 0) return true;
    if (need > free_pages()) return false;
    s.pool = base_;
    for (int64_t i = 0; i < need; ++i) s.pages.push_back(alloc());
    return true;
}

void PagePool::release(SeqState& s) {
    for (int32_t p : s.pages) free(p);
    s.pages.clear();
}

}  // namespace peregrine
