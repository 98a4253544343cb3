#include "kv/radix_cache.h"
#include "util/error.h"

#include <queue>

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

RadixCache::Match RadixCache::match(std::span<const int32_t> tokens, int64_t max_pages) {
    Match m;
    const int64_t limit = std::min<int64_t>(max_pages, static_cast<int64_t>(tokens.size()) / P_);
    Node* n = &root_;
    ++clock_;
    for (int64_t i = 0; i < limit; ++i) {
        auto it = n->children.find(key(tokens, i));
        if (it == n->children.end()) break;
        n = it->second.get();
        m.pages.push_back(n->page);
    }
    if (m.pages.empty()) return m;
    m.last = n;
    for (Node* p = n; p != &root_; p = p->parent) {
        add_ref(p);
        p->last_use = clock_;
    }
    return m;
}

void RadixCache::unlock(Handle last) {
    for (Node* p = last; p && p != &root_; p = p->parent) {
        PEREGRINE_CHECK(p->refs > 0, "radix cache: unlock of an unlocked node");
        if (--p->refs == 0) ++stats_.evictable_pages;
    }
}

void RadixCache::insert(std::span<const int32_t> tokens, std::span<const PageRow> pages, int64_t n_pages) {
    PEREGRINE_CHECK(
        static_cast<int64_t>(tokens.size()) >= n_pages * P_ && static_cast<int64_t>(pages.size()) >= n_pages,
        "radix cache: insert of {} pages needs their tokens and pages", n_pages);
    Node* n = &root_;
    ++clock_;
    for (int64_t i = 0; i < n_pages; ++i) {
        auto k = key(tokens, i);
        auto it = n->children.find(k);
        if (it != n->children.end()) {
            Node* c = it->second.get();
            if (c->page != pages[static_cast<size_t>(i)]) pool_.free(pages[static_cast<size_t>(i)]);  // duplicate
            n = c;
        } else {
            auto c = std::make_unique<Node>();
            c->parent = n;
            c->page = pages[static_cast<size_t>(i)];
            Node* raw = c.get();
            n->children.emplace(std::move(k), std::move(c));
            ++stats_.cached_pages;
            ++stats_.evictable_pages;
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
        auto c = std::make_unique<Node>();
        c->parent = n;
        c->page = pages[static_cast<size_t>(i)];
        c->refs = 1;  // locked by the sequence that is still using it
        c->last_use = clock_;
        Node* raw = c.get();
        n->children.emplace(std::move(k), std::move(c));
        ++stats_.cached_pages;
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

}  // namespace peregrine
