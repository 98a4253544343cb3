#include "kv/radix_cache.h"
#include "util/error.h"
#include "util/log.h"

#include <queue>
#include <utility>

namespace peregrine {

namespace {
// What a stored row's bytes mean: a layout that places anything differently reads as another model.
std::string layout_signature(const StateLayout& L) {
    std::string s = fmt::format("P{} W{} H{} V{} C{} S{}", L.page_tokens, L.window_tokens,
                                L.page_bytes[kHistoryPages], L.page_bytes[kWindowPages], L.carry_bytes,
                                L.snapshot_offset);
    for (const auto& l : L.layers)
        for (const StateSection* sec : {&l.window, &l.comp, &l.index_k})
            s += fmt::format(" {}:{}:{}", sec->offset, sec->entry_bytes, sec->per_entry_tokens);
    return s;
}

using Node = PrefixCache::Node;

// Every node of the subtree at n, parents before their children (no recursion: paths may be long chains).
std::vector<Node*> subtree(Node* n) {
    std::vector<Node*> order{n};
    for (size_t i = 0; i < order.size(); ++i)
        for (auto& [k, c] : order[i]->children) order.push_back(c.get());
    return order;
}

// Nodes least recently used first.
struct Older {
    bool operator()(const Node* a, const Node* b) const { return a->last_use > b->last_use; }
};
using LruHeap = std::priority_queue<Node*, std::vector<Node*>, Older>;
}  // namespace

RadixCache::RadixCache(PagePool& pool, const HiCacheOptions* tiers) : pool_(pool), P_(pool.layout().page_tokens) {
    root_.refs = 1;
    if (!tiers || !tiers->enabled) return;
    write_through_ = tiers->write_through;
    host_ = std::make_unique<HostPool>(pool.memory(), pool.layout(), tiers->host_pages);
    if (tiers->storage_backend == "file")
        store_ = make_file_store(tiers->storage_dir);
    else if (tiers->storage_backend == "redis")
        store_ = make_redis_store(tiers->storage_url);
    else
        PEREGRINE_CHECK(tiers->storage_backend.empty(), "--hicache-storage-backend {}: expected file or redis",
                        tiers->storage_backend);
    if (store_) writer_ = std::make_unique<StoreWriter>(*store_);
    root_.key = identity_key(tiers->identity + " | " + layout_signature(pool.layout()));
}

RadixCache::~RadixCache() {
    flush_stores();
    // Return every device page the tree still owns (all sequences are gone by now); host pages go with host_.
    for (Node* n : subtree(&root_))
        if (n != &root_) pool_.free(n->page);
}

const PrefixCache::Stats& RadixCache::stats() const {
    if (writer_) {
        const auto& w = writer_->stats();
        stats_.storage_writes = w.written.load();
        stats_.storage_writes_dropped = w.dropped.load();
        stats_.bytes_to_storage = w.bytes.load();
    }
    return stats_;
}

std::vector<int32_t> RadixCache::key(std::span<const int32_t> tokens, int64_t page) const {
    auto b = tokens.begin() + page * P_;
    return {b, b + P_};
}

void RadixCache::add_ref(Node* n) {
    if (n->refs++ == 0 && n != &root_ && on_device(n)) --stats_.evictable_pages;
    unlist(n);
}

void RadixCache::unlist(Node* n) {
    if (!n->listed) return;
    evictable_.erase({n->listed_use, -n->row, n});
    n->listed = false;
}

void RadixCache::relist(Node* n) {
    unlist(n);
    if (n == &root_ || !on_device(n) || n->refs != 0) return;
    evictable_.insert({n->last_use, -n->row, n});
    n->listed = true;
    n->listed_use = n->last_use;
}

void RadixCache::touch(Node* n) {
    unlist(n);
    n->last_use = clock_;
    relist(n);
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

void RadixCache::adopt(Node* c, const PageRow& row) {
    c->page[kHistoryPages] = row[kHistoryPages];
    ++stats_.cached_pages;
    if (c->refs == 0) ++stats_.evictable_pages;
    relist(c);
    if (row[kWindowPages] >= 0) own_window(c, row[kWindowPages]);
}

RadixCache::Node* RadixCache::add_child(Node* parent, std::vector<int32_t> tokens, const PageRow& page, int64_t row) {
    auto c = std::make_unique<Node>();
    c->parent = parent;
    c->page = {page[kHistoryPages], -1};
    c->row = row;
    c->last_use = clock_;
    if (host_) c->key = chain_key(parent->key, tokens);
    ++stats_.cached_pages;
    ++stats_.evictable_pages;
    Node* raw = c.get();
    raw->tokens = &parent->children.emplace(std::move(tokens), std::move(c)).first->first;
    if (page[kWindowPages] >= 0) own_window(raw, page[kWindowPages]);
    relist(raw);
    return raw;
}

bool RadixCache::device_leaf(const Node* n) const {
    if (n == &root_ || !on_device(n) || n->refs != 0) return false;
    for (const auto& [k, c] : n->children)
        if (on_device(c.get())) return false;
    return true;
}

void RadixCache::free_device(Node* n) {
    if (!on_device(n)) return;
    unlist(n);
    if (n->page[kWindowPages] >= 0) {
        unlist_window(n);
        --stats_.window_pages;
    }
    pool_.free(n->page);
    n->page = {-1, -1};
    --stats_.cached_pages;
    if (n->refs == 0) --stats_.evictable_pages;
}

void RadixCache::free_host(Node* n) {
    if (n->host[kHistoryPages] < 0 && n->host[kWindowPages] < 0) return;
    flush_stores();
    if (writer_ && writer_->reading()) writer_->wait_reads();  // a queued write may still read the pages
    for (PageTable t : {kHistoryPages, kWindowPages}) {
        if (n->host[t] < 0) continue;
        host_->free(t, std::exchange(n->host[t], -1));
        --(t == kHistoryPages ? stats_.host_pages : stats_.host_window_pages);
    }
}

void RadixCache::erase(Node* n) {
    const std::vector<Node*> order = subtree(n);
    for (auto it = order.rbegin(); it != order.rend(); ++it) {  // each after its children
        Node* x = *it;
        free_device(x);
        free_host(x);
        auto& siblings = x->parent->children;
        siblings.erase(siblings.find(*x->tokens));
    }
}

RadixCache::Match RadixCache::match(std::span<const int32_t> tokens, int64_t max_pages, int64_t replay_rows) {
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
    std::vector<StoredRow> stored;  // the rows after the path that storage holds (as many as could fit)
    const int64_t fit = static_cast<int64_t>(path.size()) + pool_.free_pages(kHistoryPages) + stats_.evictable_pages;
    if (store_ && static_cast<int64_t>(path.size()) < limit)
        stored = read_storage(tokens, n->key, static_cast<int64_t>(path.size()), std::min(limit, fit));
    const size_t np = path.size(), total = np + stored.size();
    if (total == 0) return m;

    // Per row, prefix counts: rows with a window page anywhere ending here (run), rows to bring to the device,
    // device rows no one locks, device window pages, and those of them evictable.
    std::vector<int64_t> run(total), load(total + 1), unlocked(total + 1), dev_window(total + 1), listed(total + 1);
    for (size_t i = 0; i < total; ++i) {
        const Node* p = i < np ? path[i] : nullptr;
        const bool window = p ? p->page[kWindowPages] >= 0 || p->host[kWindowPages] >= 0
                              : !stored[i - np].window.empty();
        run[i] = window ? (i ? run[i - 1] : 0) + 1 : 0;
        load[i + 1] = load[i] + (!p || !on_device(p));
        unlocked[i + 1] = unlocked[i] + (p && on_device(p) && p->refs == 0);
        dev_window[i + 1] = dev_window[i] + (p && p->page[kWindowPages] >= 0);
        listed[i + 1] = listed[i] + (p && p->window_evictable);
    }
    // The deepest end whose window rows all have their window pages and whose rows fit on the device.
    const int64_t need = pool_.layout().window_rows();
    auto first_read_of = [&](size_t end) {
        return need < 0 ? size_t{0} : end - std::min(static_cast<size_t>(need), end);
    };
    // Window pages to bring to the device for a match ending at `end` that reads them from `first_read`.
    auto window_load_of = [&](size_t end, size_t first_read) {
        return static_cast<int64_t>(end - first_read) - (dev_window[end] - dev_window[first_read]);
    };
    auto fits = [&](size_t end, size_t first_read) {
        const int64_t history_free = pool_.free_pages(kHistoryPages) + stats_.evictable_pages - unlocked[end];
        const int64_t window_free =
            pool_.free_pages(kWindowPages) + stats_.evictable_window_pages - (listed[end] - listed[first_read]);
        return load[end] <= history_free && window_load_of(end, first_read) <= window_free;
    };
    size_t end = total;
    for (; end > 0; --end)
        if (run[end - 1] >= static_cast<int64_t>(end - first_read_of(end)) && fits(end, first_read_of(end))) break;
    // Replayed: the caller recomputes replay_rows rows of cached tokens, their window truncated below the end.
    const auto replay = static_cast<size_t>(std::max<int64_t>(replay_rows, 0));
    for (size_t deepest = total; replay > 0 && deepest > end + replay; --deepest)
        if (fits(deepest - replay, deepest - replay)) {
            end = deepest - replay;
            m.replayed = true;
            break;
        }
    if (end == 0) return m;
    path.resize(std::min(end, np));
    ++clock_;
    for (Node* p : path) {  // locked first: making room below never evicts the path
        add_ref(p);
        p->last_use = clock_;  // unlisted while locked
    }

    // The window pages the caller reads that are on the device already are held first, so that making room
    // never takes them; then room for every row and window page brought back, made at once (an eviction scans
    // the trie).
    const size_t first_read = m.replayed ? end : first_read_of(end);
    for (size_t i = first_read; i < path.size(); ++i)
        if (path[i]->page[kWindowPages] >= 0) hold_window(path[i]);
    PEREGRINE_CHECK(make_room(kHistoryPages, load[end]) && make_room(kWindowPages, window_load_of(end, first_read)),
                    "radix cache: no device pages for {} cached rows", load[end]);
    StateMemory& mem = pool_.memory();
    const auto& bytes = pool_.layout().page_bytes;
    auto to_device = [&](PageTable t, const uint8_t* src, bool pinned) {
        const int32_t id = pool_.alloc_page(t);
        if (bytes[t] == 0) return id;
        uint8_t* dst = pool_.base(t) + static_cast<size_t>(id) * bytes[t];
        pinned ? mem.page_from_host(dst, src, bytes[t]) : mem.from_host(dst, src, bytes[t]);
        (pinned ? stats_.bytes_from_host : stats_.bytes_from_storage) += static_cast<int64_t>(bytes[t]);
        return id;
    };
    n = &root_;
    for (size_t i = 0; i < end; ++i) {
        const bool read_window = i >= first_read;
        if (i < np) {
            n = path[i];
            if (!on_device(n)) {
                n->page[kHistoryPages] = to_device(kHistoryPages, host_->page(kHistoryPages, n->host[kHistoryPages]),
                                                   true);
                ++stats_.cached_pages;
                ++m.host_pages;
            }
            if (read_window && n->page[kWindowPages] < 0) {
                own_window(n, to_device(kWindowPages, host_->page(kWindowPages, n->host[kWindowPages]), true));
                hold_window(n);
            }
        } else {
            const StoredRow& r = stored[i - np];
            PageRow row{to_device(kHistoryPages, r.history.data(), false), -1};
            if (read_window) row[kWindowPages] = to_device(kWindowPages, r.window.data(), false);
            n = add_child(n, key(tokens, static_cast<int64_t>(i)), row, static_cast<int64_t>(i));
            n->stored = r.window.empty() ? 1 : 2;
            add_ref(n);
            if (read_window) hold_window(n);
            ++m.storage_pages;
        }
        m.pages.push_back(n->page);
        if (!read_window) m.pages.back()[kWindowPages] = -1;
    }
    m.last = n;
    n->ends = true;
    flush_stores();
    return m;
}

std::vector<StoredRow> RadixCache::read_storage(std::span<const int32_t> tokens, const PageKey& from, int64_t first,
                                                int64_t limit) {
    std::vector<StoredRow> rows;
    const auto& bytes = pool_.layout().page_bytes;
    const int64_t need = pool_.layout().window_rows();
    PageKey parent = from;
    for (int64_t i = first; i < limit; ++i) {
        const auto page = tokens.subspan(static_cast<size_t>(i * P_), static_cast<size_t>(P_));
        const EntryId id{chain_key(parent, page), parent, page, bytes[kHistoryPages], bytes[kWindowPages]};
        auto blob = store_->get(id.key, max_entry_bytes(id));
        if (!blob) break;
        auto row = decode_entry(id, *blob);
        if (!row) {
            if (stats_.storage_corrupt++ < 10)
                spdlog::warn("hicache storage: {} is truncated, corrupt or foreign: a miss", store_->where(id.key));
            break;
        }
        rows.push_back(std::move(*row));
        parent = id.key;
        // Only the last window's window pages can be read from where the rows end: the older ones are let go
        // at once (they are most of a row's bytes).
        if (need >= 0 && static_cast<int64_t>(rows.size()) > need)
            rows[rows.size() - 1 - static_cast<size_t>(need)].window = {};
    }
    return rows;
}

void RadixCache::unlock(Handle last) {
    for (Node* p = last; p && p != &root_; p = p->parent) {
        PEREGRINE_CHECK(p->refs > 0, "radix cache: unlock of an unlocked node");
        if (--p->refs == 0) ++stats_.evictable_pages;
        relist(p);
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
    std::vector<Node*> path;
    for (int64_t i = 0; i < n_pages; ++i) {
        const PageRow& row = pages[static_cast<size_t>(i)];
        auto k = key(tokens, i);
        auto it = n->children.find(k);
        if (it == n->children.end()) {
            n = add_child(n, std::move(k), row, i);
        } else if (Node* c = it->second.get(); !on_device(c)) {
            adopt(c, row);
            n = c;
        } else {
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
        }
        touch(n);
        path.push_back(n);
    }
    if (n != &root_) n->ends = true;
    // Window pages go along only before a point where a prompt resumes: the finished sequence's tail, another's end.
    if (write_through_)
        for (Node* p : path) backup(p, near_end(p));
    flush_stores();
}

PrefixCache::Handle RadixCache::extend(Handle last, std::span<const int32_t> tokens, std::span<const PageRow> pages,
                                     int64_t from_page, int64_t& to_page) {
    Node* n = last ? last : &root_;
    ++clock_;
    for (int64_t i = from_page; i < to_page; ++i) {
        auto k = key(tokens, i);
        const PageRow& row = pages[static_cast<size_t>(i)];
        auto it = n->children.find(k);
        Node* c = nullptr;
        if (it == n->children.end()) {
            c = add_child(n, std::move(k), row, i);
        } else if (!on_device(it->second.get())) {
            c = it->second.get();
            adopt(c, row);
        } else {  // computed concurrently by another sequence: keep ours private
            to_page = i;
            break;
        }
        touch(c);
        add_ref(c);  // locked by the sequence that is still using it
        if (c->page[kWindowPages] >= 0) hold_window(c);
        if (write_through_) backup(c, false);  // its window page goes as the sequence moves on
        n = c;
    }
    flush_stores();
    return n == &root_ ? nullptr : n;
}

int64_t RadixCache::evict(int64_t want) {
    if (want <= 0 || stats_.evictable_pages == 0) return 0;
    int64_t freed = 0;
    while (freed < want) {
        Node* n = nullptr;  // the least recently used leaf (a row with a device row below it stays)
        for (const auto& [use, row, x] : evictable_)
            if (device_leaf(x)) {
                n = x;
                break;
            }
        if (!n) break;
        if (host_ && backing_up_ && backup(n, true))
            free_device(n);  // it lives on in host memory
        else
            erase(n);
        ++freed;
        ++stats_.evicted_pages;
    }
    flush_stores();
    return freed;
}

int64_t RadixCache::evict_window(int64_t want) {
    int64_t freed = 0;
    while (freed < want && !window_lru_.empty()) {
        Node* n = window_lru_.front();
        // A tail's window page lives on in host memory; the others are read only by a prompt ending right there.
        if (host_ && backing_up_ && near_end(n)) backup(n, true);
        unlist_window(n);
        pool_.free({-1, std::exchange(n->page[kWindowPages], -1)});
        --stats_.window_pages;
        ++freed;
    }
    flush_stores();
    return freed;
}

int64_t RadixCache::clear() {
    backing_up_ = false;
    evict_window(stats_.evictable_window_pages);
    const int64_t freed = evict(stats_.cached_pages);
    backing_up_ = true;
    if (host_) {  // and every host copy no sequence uses (children before parents)
        const std::vector<Node*> order = subtree(&root_);
        for (auto it = order.rbegin(); it != order.rend(); ++it) {
            Node* n = *it;
            if (n == &root_) continue;
            if (!on_device(n) && n->refs == 0 && n->children.empty()) {
                erase(n);
            } else {
                free_host(n);
            }
        }
    }
    return freed;
}

// ---- the hierarchical cache

bool RadixCache::near_end(const Node* n) const {
    const int64_t need = pool_.layout().window_rows();
    for (int64_t depth = 0; depth < need; ++depth, n = n->children.begin()->second.get())
        if (n->children.size() != 1 || n->ends) return true;
    return need < 0;
}

bool RadixCache::backup(Node* n, bool with_window) {
    const bool history = n->host[kHistoryPages] < 0;
    const bool window = with_window && n->page[kWindowPages] >= 0 && n->host[kWindowPages] < 0;
    if (!history && !window) return true;
    if (!host_room(history, window, n)) return false;
    StateMemory& mem = pool_.memory();
    const auto& bytes = pool_.layout().page_bytes;
    for (PageTable t : {kHistoryPages, kWindowPages}) {
        if (t == kHistoryPages ? !history : !window) continue;
        const int32_t id = host_->alloc(t);
        if (bytes[t] > 0)
            mem.page_to_host(pool_.base(t) + static_cast<size_t>(n->page[t]) * bytes[t], bytes[t], host_->page(t, id));
        n->host[t] = id;
        ++(t == kHistoryPages ? stats_.host_pages : stats_.host_window_pages);
        stats_.bytes_to_host += static_cast<int64_t>(bytes[t]);
    }
    store(n);
    return true;
}

bool RadixCache::host_room(int64_t history, int64_t window, const Node* keep) {
    auto fits = [&](int64_t slack_h, int64_t slack_w) {
        return host_->free_pages(kHistoryPages) >= history + slack_h &&
               host_->free_pages(kWindowPages) >= window + slack_w;
    };
    if (fits(0, 0)) return true;
    // Host copies no sequence uses, least recently used first: of device rows (they stay on the device) and of
    // host-only leaves (they leave the trie). A 64th of the pool at a time, so that the scan is rare.
    auto candidate = [&](const Node* n) {
        return n != &root_ && n != keep && n->refs == 0 && n->host[kHistoryPages] >= 0 &&
               (on_device(n) || n->children.empty());
    };
    LruHeap heap;
    for (Node* n : subtree(&root_))
        if (candidate(n)) heap.push(n);
    const int64_t slack_h = host_->capacity(kHistoryPages) / 64, slack_w = host_->capacity(kWindowPages) / 64;
    while (!fits(slack_h, slack_w) && !heap.empty()) {
        Node* n = heap.top();
        heap.pop();
        Node* parent = n->parent;
        ++stats_.host_evicted_pages;
        if (on_device(n)) {
            free_host(n);
        } else {
            erase(n);
            if (candidate(parent)) heap.push(parent);
        }
    }
    return fits(0, 0);
}

void RadixCache::store(Node* n) {
    const int level = n->host[kWindowPages] >= 0 ? 2 : 1;
    if (!writer_ || n->stored >= level) return;
    const auto& bytes = pool_.layout().page_bytes;
    StoreWriter::Job job;
    job.id = {n->key, n->parent->key, {}, bytes[kHistoryPages], bytes[kWindowPages]};
    job.tokens = *n->tokens;
    job.history = host_->page(kHistoryPages, n->host[kHistoryPages]);
    job.window = level == 2 ? host_->page(kWindowPages, n->host[kWindowPages]) : nullptr;
    pending_.push_back(std::move(job));
    n->stored = level;
}

void RadixCache::flush_stores() {
    if (pending_.empty()) return;
    auto fence = pool_.memory().fence();  // the copies into host memory before it
    for (auto& job : pending_) {
        job.fence = fence;
        writer_->push(std::move(job));
    }
    pending_.clear();
}

bool RadixCache::make_room(PageTable t, int64_t n) {
    const int64_t short_by = n - pool_.free_pages(t);
    if (short_by > 0) t == kHistoryPages ? evict(short_by) : evict_window(short_by);
    return pool_.free_pages(t) >= n;
}

}  // namespace peregrine
