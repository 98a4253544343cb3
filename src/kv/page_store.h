#pragma once
// The storage tier of the hierarchical cache (L3): rows of state pages kept outside the process, in a directory
// (local NVMe or a shared filesystem) or a Redis server, so that they outlive a restart and are shared by the
// servers of one model. An entry's key is a hash of its page's tokens chained from the prompt's start and seeded
// with the model's identity (weights, config, state layout), so identical prefixes share entries. An entry also
// holds its tokens, its parent's key and a checksum: a colliding, truncated, corrupt or foreign entry is a miss.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace peregrine {

struct PageKey {
    uint64_t hi = 0, lo = 0;
    bool operator==(const PageKey&) const = default;
    std::string hex() const;  // 32 hex digits
};

// The key of the root: the model's and the state format's identity.
PageKey identity_key(std::string_view identity);
// The key of a page of `tokens` after the prefix whose key is `parent`.
PageKey chain_key(const PageKey& parent, std::span<const int32_t> tokens);

// A row as stored: its history page and, when it was kept, its window page (empty otherwise).
struct StoredRow {
    std::vector<uint8_t> history, window;
};

// What an entry is checked against when read: all of it must match, or the entry is a miss.
struct EntryId {
    PageKey key, parent;
    std::span<const int32_t> tokens;
    size_t history_bytes = 0, window_bytes = 0;
};

std::vector<uint8_t> encode_entry(const EntryId& id, const uint8_t* history, const uint8_t* window);
std::optional<StoredRow> decode_entry(const EntryId& id, std::span<const uint8_t> blob);
// The largest entry of these sizes (a store reads no more).
size_t max_entry_bytes(const EntryId& id);

// A key-value store of entries. Both calls may run on different threads at once.
class PageStore {
public:
    virtual ~PageStore() = default;
    virtual std::string describe() const = 0;
    // Where the entry under `key` lives (a file's path, a Redis key), for messages.
    virtual std::string where(const PageKey& key) const = 0;
    // The entry under `key` (at most max_bytes), or nothing: missing, unreadable or the store is gone.
    virtual std::optional<std::vector<uint8_t>> get(const PageKey& key, size_t max_bytes) = 0;
    // Stores an entry whole or not at all (readers never see part of one); false when it could not.
    virtual bool put(const PageKey& key, std::span<const uint8_t> entry) = 0;
};

// Entries as files of `dir` (which must exist and be writable: checked here, with a clear error).
std::unique_ptr<PageStore> make_file_store(const std::string& dir);
// Entries in a Redis server at `url` (redis://host:port or unix:///path), through hiredis; fails when it cannot
// be reached at start, reconnects later.
std::unique_ptr<PageStore> make_redis_store(const std::string& url);

// Writes entries in the background so that the engine never waits for storage. A job reads host pages once its
// fence (the device-to-host copies before it) is done; the caller must not reuse those pages before
// wait_reads(). Writes that fail, or find the queue full, are dropped with a warning.
class StoreWriter {
public:
    struct Job {
        EntryId id;
        std::vector<int32_t> tokens;  // id.tokens points here
        const uint8_t* history = nullptr;
        const uint8_t* window = nullptr;  // null: no window page
        std::function<void()> fence;
    };
    struct Stats {
        std::atomic<int64_t> written{0}, dropped{0}, bytes{0};
    };
    explicit StoreWriter(PageStore& store, size_t max_queued = 4096);
    ~StoreWriter();  // finishes the queued writes
    void push(Job job);
    // Returns once no queued job still has host pages to read.
    void wait_reads();
    bool reading() const { return unread_.load() > 0; }
    const Stats& stats() const { return stats_; }

private:
    void loop();
    PageStore& store_;
    size_t max_queued_;
    std::mutex mu_;
    std::condition_variable cv_, read_cv_;
    std::deque<Job> queue_;
    std::atomic<int64_t> unread_{0};
    bool stop_ = false;
    Stats stats_;
    std::thread thread_;
};

}  // namespace peregrine
