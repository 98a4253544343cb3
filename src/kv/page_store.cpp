#include "kv/page_store.h"
#include "util/error.h"
#include "util/log.h"

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zlib.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace peregrine {

std::string PageKey::hex() const { return fmt::format("{:016x}{:016x}", hi, lo); }

PageKey identity_key(std::string_view identity) {
    const XXH128_hash_t h = XXH3_128bits(identity.data(), identity.size());
    return {h.high64, h.low64};
}

PageKey chain_key(const PageKey& parent, std::span<const int32_t> tokens) {
    const XXH128_hash_t h = XXH3_128bits_withSeed(tokens.data(), tokens.size_bytes(), parent.hi ^ parent.lo * 3);
    return {h.high64 ^ parent.lo, h.low64 ^ parent.hi};
}

// ---- entries: a header, the page's tokens, the history page, the window page (when kept)

namespace {
constexpr char kMagic[8] = {'P', 'G', 'K', 'V', 'R', 'O', 'W', '1'};

struct Header {
    char magic[8];
    uint64_t key_hi, key_lo, parent_hi, parent_lo;
    uint64_t history_bytes, window_bytes;  // window_bytes 0: no window page
    uint32_t n_tokens, crc;                // crc32 of the entry with this field 0
};
static_assert(sizeof(Header) == 64);

uint32_t entry_crc(std::span<const uint8_t> blob) {
    Header h;
    std::memcpy(&h, blob.data(), sizeof h);
    h.crc = 0;
    uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(&h), sizeof h);
    const uint8_t* p = blob.data() + sizeof h;
    size_t left = blob.size() - sizeof h;
    while (left > 0) {  // zlib takes 32-bit lengths
        const auto n = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
        crc = crc32(crc, p, n);
        p += n, left -= n;
    }
    return static_cast<uint32_t>(crc);
}
}  // namespace

size_t max_entry_bytes(const EntryId& id) {
    return sizeof(Header) + id.tokens.size_bytes() + id.history_bytes + id.window_bytes;
}

std::vector<uint8_t> encode_entry(const EntryId& id, const uint8_t* history, const uint8_t* window) {
    const size_t wb = window ? id.window_bytes : 0;
    std::vector<uint8_t> blob(sizeof(Header) + id.tokens.size_bytes() + id.history_bytes + wb);
    Header h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.key_hi = id.key.hi, h.key_lo = id.key.lo, h.parent_hi = id.parent.hi, h.parent_lo = id.parent.lo;
    h.history_bytes = id.history_bytes, h.window_bytes = wb;
    h.n_tokens = static_cast<uint32_t>(id.tokens.size());
    uint8_t* p = blob.data();
    std::memcpy(p, &h, sizeof h);
    p += sizeof h;
    if (!id.tokens.empty()) std::memcpy(p, id.tokens.data(), id.tokens.size_bytes());
    p += id.tokens.size_bytes();
    if (id.history_bytes) std::memcpy(p, history, id.history_bytes);
    if (wb) std::memcpy(p + id.history_bytes, window, wb);
    h.crc = entry_crc(blob);
    std::memcpy(blob.data(), &h, sizeof h);
    return blob;
}

std::optional<StoredRow> decode_entry(const EntryId& id, std::span<const uint8_t> blob) {
    if (blob.size() < sizeof(Header)) return std::nullopt;
    Header h;
    std::memcpy(&h, blob.data(), sizeof h);
    const size_t tb = id.tokens.size_bytes();
    if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.key_hi != id.key.hi || h.key_lo != id.key.lo ||
        h.parent_hi != id.parent.hi || h.parent_lo != id.parent.lo || h.history_bytes != id.history_bytes ||
        (h.window_bytes != 0 && h.window_bytes != id.window_bytes) || h.n_tokens != id.tokens.size() ||
        blob.size() != sizeof h + tb + h.history_bytes + h.window_bytes || h.crc != entry_crc(blob) ||
        (tb != 0 && std::memcmp(blob.data() + sizeof h, id.tokens.data(), tb) != 0))
        return std::nullopt;
    const uint8_t* p = blob.data() + sizeof h + tb;
    StoredRow row;
    row.history.assign(p, p + h.history_bytes);
    row.window.assign(p + h.history_bytes, p + h.history_bytes + h.window_bytes);
    return row;
}

// ---- the file store: <dir>/<2 hex>/<32 hex>.kv, written to a private name and renamed into place

namespace {
class FileStore final : public PageStore {
public:
    explicit FileStore(std::string dir) : dir_(std::move(dir)) {
        namespace fs = std::filesystem;
        std::error_code ec;
        PEREGRINE_CHECK(fs::is_directory(dir_, ec), "--hicache-storage-dir {}: no such directory", dir_);
        const std::string probe = fmt::format("{}/.probe.{}", dir_, ::getpid());
        const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
        PEREGRINE_CHECK(fd >= 0, "--hicache-storage-dir {}: not writable ({})", dir_, std::strerror(errno));
        ::close(fd);
        ::unlink(probe.c_str());
    }
    std::string describe() const override { return "file " + dir_; }
    std::string where(const PageKey& key) const override { return path(key); }

    std::optional<std::vector<uint8_t>> get(const PageKey& key, size_t max_bytes) override {
        const int fd = ::open(path(key).c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) return std::nullopt;
        std::vector<uint8_t> blob;
        struct stat st{};
        if (::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) <= max_bytes) {
            blob.resize(static_cast<size_t>(st.st_size));
            size_t got = 0;
            while (got < blob.size()) {
                const ssize_t n = ::read(fd, blob.data() + got, blob.size() - got);
                if (n <= 0) break;
                got += static_cast<size_t>(n);
            }
            blob.resize(got);
        }
        ::close(fd);
        return blob;
    }

    bool put(const PageKey& key, std::span<const uint8_t> entry) override {
        const std::string final_path = path(key);
        const std::string sub = final_path.substr(0, final_path.find_last_of('/'));
        if (::mkdir(sub.c_str(), 0755) != 0 && errno != EEXIST) return fail_put(sub);
        static std::atomic<uint64_t> seq{0};  // one per process: ranks' stores share the directory
        const std::string tmp = fmt::format("{}.tmp.{}.{}", final_path, ::getpid(), ++seq);
        const int fd = ::open(tmp.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) return fail_put(tmp);
        size_t done = 0;
        while (done < entry.size()) {
            const ssize_t n = ::write(fd, entry.data() + done, entry.size() - done);
            if (n <= 0) break;
            done += static_cast<size_t>(n);
        }
        const bool ok = done == entry.size() && ::close(fd) == 0;
        if (!ok || ::rename(tmp.c_str(), final_path.c_str()) != 0) {
            const int e = errno;
            ::unlink(tmp.c_str());
            errno = e;
            return fail_put(final_path);
        }
        return true;
    }

private:
    std::string path(const PageKey& key) const {
        const std::string h = key.hex();
        return fmt::format("{}/{}/{}.kv", dir_, h.substr(0, 2), h);
    }
    bool fail_put(const std::string& what) {
        spdlog::debug("hicache storage: cannot write {}: {}", what, std::strerror(errno));
        return false;
    }
    std::string dir_;
};
}  // namespace

std::unique_ptr<PageStore> make_file_store(const std::string& dir) { return std::make_unique<FileStore>(dir); }

// ---- the background writer

StoreWriter::StoreWriter(PageStore& store, size_t max_queued)
    : store_(store), max_queued_(max_queued), thread_([this] { loop(); }) {}

StoreWriter::~StoreWriter() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void StoreWriter::push(Job job) {
    {
        std::lock_guard lk(mu_);
        if (queue_.size() >= max_queued_) {
            if (stats_.dropped++ % 1000 == 0)
                spdlog::warn("hicache storage ({}): the write queue is full, entries dropped", store_.describe());
            return;
        }
        job.id.tokens = job.tokens;
        ++unread_;
        queue_.push_back(std::move(job));
    }
    cv_.notify_one();
}

void StoreWriter::wait_reads() {
    std::unique_lock lk(mu_);
    read_cv_.wait(lk, [&] { return unread_.load() == 0; });
}

void StoreWriter::loop() {
    std::unique_lock lk(mu_);
    for (;;) {
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping with nothing left
        Job job = std::move(queue_.front());
        queue_.pop_front();
        lk.unlock();
        if (job.fence) job.fence();
        std::vector<uint8_t> blob = encode_entry(job.id, job.history, job.window);
        lk.lock();
        --unread_;
        read_cv_.notify_all();
        lk.unlock();
        if (store_.put(job.id.key, blob)) {
            ++stats_.written;
            stats_.bytes += static_cast<int64_t>(blob.size());
        } else if (stats_.dropped++ % 1000 == 0) {
            spdlog::warn("hicache storage ({}): a write failed ({}); entries are dropped, serving goes on",
                         store_.describe(), std::strerror(errno));
        }
        lk.lock();
    }
}

}  // namespace peregrine
