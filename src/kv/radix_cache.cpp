#include "kv/radix_cache.h"
#include "util/error.h"

#include <queue>
#include <utility>

namespace peregrine {

RadixCache::RadixCache(PagePool& pool) : pool_(pool), P_(pool.layout().page_tokens) { root_.refs = 1; }

RadixCache::~RadixCache() {
    // Return every page the tree still owns (all sequences are gone by now).
    std::vector<Node*> stack{&root_};
    while (!stack.empty()) {
        Node* n = stack.back();
        stack.pop_back();
        if (n != &root_) pool_.free(n->page);
        for (auto& [k, c] : n->children) stack.push_back(c.get());
    }
}

std::vector<int32_t> RadixCache::key(std::span<const int32_t> tokens, int64_t page) const {
    auto b = tokens.begin() + page * P_;
    return {b, b + P_};
}

void RadixCache::add_ref(Node* n) {
    if (n->refs++ == 0 && n != &root_) --stats_.evictable_pages;
}

void RadixCache::unlist_window(Node* n) {
    if (!n->window_evictable) return;
    window_lru_.erase(n->window_lru);
    n->window_evictable = false;
    --stats_.evictable_window_pages;
}

void RadixCache::hold_window(Node* n) {
    if (n->window_refs++ == 0) unlist_window(n);
}

void RadixCache::list_window(Node* n) {
    n->window_lru = window_lru_.insert(window_lru_.end(), n);
    n->window_evictable = true;
    ++stats_.evictable_window_pages;
}

void RadixCache::release_window(Node* n) {
    PEREGRINE_CHECK(n->window_refs > 0, "radix cache: window page of row {} dropped but not held", n->row);
    if (--n->window_refs == 0 && n->page[kWindowPages] >= 0) list_window(n);
}

void RadixCache::own_window(Node* n, int32_t page) {
    PEREGRINE_CHECK(n->page[kWindowPages] < 0 && n->window_refs == 0, "radix cache: row {} has a window", n->row);
    n->page[kWindowPages] = page;
    ++stats_.window_pages;
    list_window(n);
}

std::unique_ptr<PrefixCache::Node> RadixCache::new_node(Node* parent, const PageRow& page, int64_t row) {
    auto c = std::make_unique<Node>();
    c->parent = parent;
    c->page = {page[kHistoryPages], -1};
    c->row = row;
    c->last_use = clock_;
    ++stats_.cached_pages;
    ++stats_.evictable_pages;
    if (page[kWindowPages] >= 0) own_window(c.get(), page[kWindowPages]);
    return c;
}

RadixCache::Match RadixCache::match(std::span<const int32_t> tokens, int64_t max_pages) {
    Match m;
    const int64_t limit = std::min<int64_t>(max_pages, static_cast<int64_t>(tokens.size()) / P_);
    std::vector<Node*> path;
    Node* n = &root_;
    for (int64_t i = 0; i < limit; ++i) {
        auto it = n->children.find(key(tokens, i));
        if (it == n->children.end()) break;
        n = it->second.get();
        path.push_back(n);
    }
    // The deepest end whose window rows all kept their window pages.
    const int64_t need = pool_.layout().window_rows();
    size_t end = 0;
    int64_t run = 0;  // rows with a window page just before row i + 1
    for (size_t i = 0; i < path.size(); ++i) {
        run = path[i]->page[kWindowPages] >= 0 ? run + 1 : 0;
        const int64_t want = static_cast<int64_t>(i) + 1;
        if (run >= (need < 0 ? want : std::min(need, want))) end = i + 1;
    }
    path.resize(end);
    if (path.empty()) return m;
    ++clock_;
    const size_t first_read = need < 0 ? 0 : end - std::min(static_cast<size_t>(need), end);
    for (size_t i = 0; i < path.size(); ++i) {
        Node* p = path[i];
        add_ref(p);
        p->last_use = clock_;
        m.pages.push_back(p->page);
        if (i < first_read)
            m.pages.back()[kWindowPages] = -1;
        else
            hold_window(p);
    }
    m.last = path.back();
    return m;
}

void RadixCache::unlock(Handle last) {
    for (Node* p = last; p && p != &root_; p = p->parent) {
        PEREGRINE_CHECK(p->refs > 0, "radix cache: unlock of an unlocked node");
        if (--p->refs == 0) ++stats_.evictable_pages;
    }
}

void RadixCache::drop_window(Handle last, int64_t from_row, int64_t to_row) {
    for (Node* p = last; p && p != &root_ && p->row >= from_row; p = p->parent)
        if (p->row < to_row) release_window(p);
}

void RadixCache::insert(std::span<const int32_t> tokens, std::span<const PageRow> pages, int64_t n_pages) {
    PEREGRINE_CHECK(
        static_cast<int64_t>(tokens.size()) >= n_pages * P_ && static_cast<int64_t>(pages.size()) >= n_pages,
        "radix cache: insert of {} pages needs their tokens and pages", n_pages);
    Node* n = &root_;
    ++clock_;
    for (int64_t i = 0; i < n_pages; ++i) {
        const PageRow& row = pages[static_cast<size_t>(i)];
        auto k = key(tokens, i);
        auto it = n->children.find(k);
        if (it != n->children.end()) {
            Node* c = it->second.get();
            if (c->page[kHistoryPages] != row[kHistoryPages]) {  // computed by another sequence too
                pool_.free({row[kHistoryPages], -1});
                if (row[kWindowPages] >= 0) {
                    if (c->page[kWindowPages] < 0)
                        own_window(c, row[kWindowPages]);
                    else
                        pool_.free({-1, row[kWindowPages]});
                }
            }
            n = c;
        } else {
            auto c = new_node(n, row, i);
            Node* raw = c.get();
            n->children.emplace(std::move(k), std::move(c));
            n = raw;
        }
        n->last_use = clock_;
    }
}

PrefixCache::Handle RadixCache::extend(Handle last, std::span<const int32_t> tokens, std::span<const PageRow> pages,
                                     int64_t from_page, int64_t& to_page) {
    Node* n = last ? last : &root_;
    ++clock_;
    for (int64_t i = from_page; i < to_page; ++i) {
        auto k = key(tokens, i);
        if (n->children.count(k)) {  // computed concurrently by another sequence: keep ours private
            to_page = i;
            break;
        }
        auto c = new_node(n, pages[static_cast<size_t>(i)], i);
        add_ref(c.get());  // locked by the sequence that is still using it
        if (c->page[kWindowPages] >= 0) hold_window(c.get());
        Node* raw = c.get();
        n->children.emplace(std::move(k), std::move(c));
        n = raw;
    }
    return n == &root_ ? nullptr : n;
}

int64_t RadixCache::evict(int64_t want) {
    if (want <= 0 || stats_.evictable_pages == 0) return 0;
    auto older = [](Node* a, Node* b) { return a->last_use > b->last_use; };
    std::priority_queue<Node*, std::vector<Node*>, decltype(older)> leaves(older);
    std::vector<Node*> stack{&root_};
    while (!stack.empty()) {
        Node* n = stack.back();
        stack.pop_back();
        if (n != &root_ && n->children.empty() && n->refs == 0) leaves.push(n);
        for (auto& [k, c] : n->children) stack.push_back(c.get());
    }
    int64_t freed = 0;
    while (freed < want && !leaves.empty()) {
        Node* n = leaves.top();
        leaves.pop();
        Node* parent = n->parent;
        if (n->page[kWindowPages] >= 0) {
            unlist_window(n);
            --stats_.window_pages;
        }
        pool_.free(n->page);
        ++freed;
        --stats_.cached_pages;
        --stats_.evictable_pages;
        ++stats_.evicted_pages;
        for (auto it = parent->children.begin(); it != parent->children.end(); ++it)
            if (it->second.get() == n) {
                parent->children.erase(it);
                break;
            }
        if (parent != &root_ && parent->children.empty() && parent->refs == 0) leaves.push(parent);
    }
    return freed;
}

int64_t RadixCache::evict_window(int64_t want) {
    int64_t freed = 0;
    while (freed < want && !window_lru_.empty()) {
        Node* n = window_lru_.front();
        unlist_window(n);
        pool_.free({-1, std::exchange(n->page[kWindowPages], -1)});
        --stats_.window_pages;
        ++freed;
    }
    return freed;
}

int64_t RadixCache::clear() {
    evict_window(stats_.evictable_window_pages);
    return evict(stats_.cached_pages);
}

}  // namespace peregrine
