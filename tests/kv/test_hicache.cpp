// The hierarchical cache: rows evicted from the device come back from host memory, and from storage (a
// directory, a Redis server started here) after a restart, byte for byte; bad entries and failing stores are
// misses, never wrong bytes or a crash.
#include "kv/radix_cache.h"
#include "kv/kv_test_util.h"
#include "util/error.h"

#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

using namespace peregrine;
namespace fs = std::filesystem;

namespace {

HostStateMemory memory;
const StateLayout& layout() {
    static const StateLayout L = test::small_layout(8);
    return L;
}
const int P = 8;

std::vector<int32_t> tokens(int pages, int start) {
    std::vector<int32_t> v(static_cast<size_t>(pages * P + 1));
    std::iota(v.begin(), v.end(), start);
    return v;
}

// Rows holding a pattern that names the row and the token run.
std::vector<PageRow> filled_rows(PagePool& pool, int n, int seed) {
    std::vector<PageRow> rows;
    for (int i = 0; i < n; ++i) {
        rows.push_back(pool.alloc());
        for (PageTable t : {kHistoryPages, kWindowPages}) {
            uint8_t* p = pool.base(t) + static_cast<size_t>(rows.back()[t]) * pool.layout().page_bytes[t];
            for (size_t b = 0; b < pool.layout().page_bytes[t]; ++b) p[b] = static_cast<uint8_t>(seed * 31 + i * 7 + b + t);
        }
    }
    return rows;
}

// The rows' bytes hold the pattern filled_rows wrote.
void expect_pattern(PagePool& pool, const std::vector<PageRow>& rows, int seed, int from = 0) {
    for (size_t i = static_cast<size_t>(from); i < rows.size(); ++i)
        for (PageTable t : {kHistoryPages, kWindowPages}) {
            if (rows[i][t] < 0) continue;
            const uint8_t* p = pool.base(t) + static_cast<size_t>(rows[i][t]) * layout().page_bytes[t];
            size_t bad = 0;
            for (size_t b = 0; b < layout().page_bytes[t]; ++b)
                bad += p[b] != static_cast<uint8_t>(seed * 31 + static_cast<int>(i) * 7 + b + t);
            EXPECT_EQ(bad, 0u) << "row " << i << " table " << t;
        }
}

HiCacheOptions tiers(int64_t host_rows, bool write_through = false) {
    HiCacheOptions h;
    h.enabled = true;
    h.host_pages = {host_rows, host_rows};
    h.write_through = write_through;
    h.identity = "test model";
    return h;
}

// write_through with a file store in `dir`.
HiCacheOptions file_tiers(const fs::path& dir) {
    HiCacheOptions h = tiers(32, true);
    h.storage_backend = "file";
    h.storage_dir = dir;
    return h;
}

struct TempDir {
    fs::path path = fs::temp_directory_path() / fmt::format("peregrine-hicache-{}-{}", ::getpid(), counter()++);
    TempDir() { fs::create_directories(path); }
    ~TempDir() { fs::remove_all(path); }
    static int& counter() {
        static int n = 0;
        return n;
    }
};

std::vector<fs::path> entries(const fs::path& dir) {
    std::vector<fs::path> out;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        if (e.path().extension() == ".kv") out.push_back(e.path());
    return out;
}

}  // namespace

TEST(HiCache, EvictedRowsComeBackFromHostMemoryByteForByte) {
    PagePool pool(memory, layout(), 8);
    auto opts = tiers(32);
    RadixCache cache(pool, &opts);
    const auto t = tokens(6, 100);
    auto rows = filled_rows(pool, 6, 1);
    cache.insert(t, rows, 6);
    EXPECT_EQ(cache.stats().host_pages, 0);  // write_back: nothing copied yet
    EXPECT_EQ(cache.evict(6), 6);
    EXPECT_EQ(cache.stats().cached_pages, 0);
    EXPECT_EQ(cache.stats().host_pages, 6);
    EXPECT_EQ(pool.used_pages(), 0);
    // Another sequence takes the device pages over and scribbles on them.
    auto other = filled_rows(pool, 8, 9);
    for (auto& r : other) pool.free(r);

    auto m = cache.match(t, 100);
    ASSERT_EQ(m.pages.size(), 6u);
    EXPECT_EQ(m.host_pages, 6);
    EXPECT_EQ(m.storage_pages, 0);
    expect_pattern(pool, m.pages, 1);
    EXPECT_EQ(cache.stats().cached_pages, 6);
    EXPECT_GT(cache.stats().bytes_from_host, 0);
    cache.unlock(m.last);
    // Back on the device: the next match is a device hit.
    auto again = cache.match(t, 100);
    EXPECT_EQ(again.pages.size(), 6u);
    EXPECT_EQ(again.host_pages, 0);
    cache.unlock(again.last);
}

TEST(HiCache, WriteThroughCopiesWhenCachedAndEvictionCopiesNothingMore) {
    PagePool pool(memory, layout(), 8);
    auto opts = tiers(32, true);
    RadixCache cache(pool, &opts);
    const auto t = tokens(4, 5);
    auto rows = filled_rows(pool, 4, 2);
    cache.insert(t, rows, 4);
    EXPECT_EQ(cache.stats().host_pages, 4);
    const int64_t copied = cache.stats().bytes_to_host;
    EXPECT_GT(copied, 0);
    cache.evict(4);
    EXPECT_EQ(cache.stats().bytes_to_host, copied);
    auto m = cache.match(t, 100);
    EXPECT_EQ(m.host_pages, 4);
    expect_pattern(pool, m.pages, 2);
    cache.unlock(m.last);
}

// Write-through copies a running sequence's rows without their window pages (it drops them as it moves on) and
// its tail's when it ends; a window page evicted alone goes to host memory only where a path ends near it.
TEST(HiCache, OnlyTailWindowPagesGoToHostMemory) {
    const StateLayout L = test::small_layout(8, 16);  // a window of two rows
    ASSERT_EQ(L.window_rows(), 2);
    PagePool pool(memory, L, 16);
    auto opts = tiers(32, true);
    RadixCache cache(pool, &opts);
    const auto t = tokens(6, 40);
    auto rows = filled_rows(pool, 6, 3);
    int64_t shared = 6;
    PrefixCache::Handle h = cache.extend(nullptr, t, rows, 0, shared);  // a running sequence shares its rows
    EXPECT_EQ(cache.stats().host_pages, 6);
    EXPECT_EQ(cache.stats().host_window_pages, 0);
    cache.drop_window(h, 0, 4);  // it has moved past rows 0-3's windows
    EXPECT_EQ(cache.evict_window(4), 4);
    EXPECT_EQ(cache.stats().host_window_pages, 0);  // mid-path windows are not kept
    cache.drop_window(h, 4, 6);  // it ends: its tail is rows 4 and 5
    for (auto& r : rows) r[kWindowPages] = r[kWindowPages] >= 0 && &r - rows.data() >= 4 ? r[kWindowPages] : -1;
    cache.insert(t, rows, 6);
    cache.unlock(h);
    EXPECT_EQ(cache.stats().host_window_pages, 2);
    // Evicted from the device, the path resumes at its end from host memory, tail windows included.
    cache.evict(6);
    auto m = cache.match(t, 100);
    ASSERT_EQ(m.pages.size(), 6u);
    EXPECT_EQ(m.host_pages, 6);
    EXPECT_GE(m.pages[5][kWindowPages], 0);
    cache.unlock(m.last);
    // A next turn continues the path; the first turn's end (row 5) stays a resume point whose window pages,
    // evicted alone, go to host memory (write_back too).
    auto opts_back = tiers(32);
    PagePool pool2(memory, L, 16);
    RadixCache back(pool2, &opts_back);
    auto t2 = tokens(9, 40);
    auto rows2 = filled_rows(pool2, 9, 4);
    back.insert(t, rows2, 6);  // turn 1 ends at row 5
    back.insert(t2, rows2, 9);  // turn 2 goes on to row 8
    EXPECT_EQ(back.evict_window(9), 9);
    EXPECT_EQ(back.stats().host_window_pages, 4);  // rows 4-5 (turn 1's tail) and 7-8 (turn 2's)
    back.evict(9);
    auto m1 = back.match(t, 100);
    EXPECT_EQ(m1.pages.size(), 6u);
    expect_pattern(pool2, m1.pages, 4);
    if (m1.last) back.unlock(m1.last);
    // A finished sequence whose rows all still have window pages (its last chunk's): only its tail's are copied.
    PagePool pool3(memory, L, 16);
    RadixCache through(pool3, &opts);
    through.insert(t, filled_rows(pool3, 6, 5), 6);
    EXPECT_EQ(through.stats().host_pages, 6);
    EXPECT_EQ(through.stats().host_window_pages, 2);
}

TEST(HiCache, FullHostMemoryDropsTheLeastRecentlyUsedCopies) {
    PagePool pool(memory, layout(), 8);
    auto opts = tiers(4);
    RadixCache cache(pool, &opts);
    const auto a = tokens(3, 1000), b = tokens(3, 2000);
    cache.insert(a, filled_rows(pool, 3, 3), 3);
    cache.evict(3);  // a's rows to host memory
    cache.insert(b, filled_rows(pool, 3, 4), 3);
    cache.evict(3);  // b's: a's oldest copies make room
    EXPECT_LE(cache.stats().host_pages, 4);
    EXPECT_GE(cache.stats().host_evicted_pages, 2);
    auto mb = cache.match(b, 100);
    EXPECT_EQ(mb.pages.size(), 3u);
    expect_pattern(pool, mb.pages, 4);
    cache.unlock(mb.last);
    auto ma = cache.match(a, 100);
    EXPECT_LT(ma.pages.size(), 3u);
    if (ma.last) cache.unlock(ma.last);
    // A flush drops every tier's copies.
    cache.clear();
    EXPECT_EQ(cache.stats().host_pages, 0);
    EXPECT_EQ(cache.stats().cached_pages, 0);
    EXPECT_EQ(pool.used_pages(), 0);
}

TEST(HiCache, FileStorageSurvivesARestartAndIsKeyedByModel) {
    TempDir dir;
    const auto t = tokens(5, 7);
    auto opts = file_tiers(dir.path);
    {
        PagePool pool(memory, layout(), 8);
        RadixCache cache(pool, &opts);
        cache.insert(t, filled_rows(pool, 5, 5), 5);
    }  // the writer finishes its queue as the cache goes
    EXPECT_EQ(entries(dir.path).size(), 5u);
    {
        PagePool pool(memory, layout(), 8);
        RadixCache cache(pool, &opts);
        auto m = cache.match(t, 100);
        ASSERT_EQ(m.pages.size(), 5u);
        EXPECT_EQ(m.storage_pages, 5);
        expect_pattern(pool, m.pages, 5);
        EXPECT_GT(cache.stats().bytes_from_storage, 0);
        cache.unlock(m.last);
        // A prompt that shares the first two pages only.
        auto u = t;
        u[static_cast<size_t>(2 * P + 1)] = -5;
        PagePool pool2(memory, layout(), 8);
        RadixCache fresh(pool2, &opts);
        auto m2 = fresh.match(u, 100);
        EXPECT_EQ(m2.pages.size(), 2u);
        expect_pattern(pool2, m2.pages, 5);
        fresh.unlock(m2.last);
    }
    auto other = opts;
    other.identity = "other weights";
    PagePool pool(memory, layout(), 8);
    RadixCache cache(pool, &other);
    EXPECT_TRUE(cache.match(t, 100).pages.empty());
}

TEST(HiCache, TruncatedCorruptOrForeignEntriesAreMisses) {
    TempDir dir;
    const auto t = tokens(4, 70);
    auto opts = file_tiers(dir.path);
    {
        PagePool pool(memory, layout(), 8);
        RadixCache cache(pool, &opts);
        cache.insert(t, filled_rows(pool, 4, 6), 4);
    }
    auto files = entries(dir.path);
    ASSERT_EQ(files.size(), 4u);
    auto rows_found = [&] {
        PagePool pool(memory, layout(), 8);
        RadixCache cache(pool, &opts);
        auto m = cache.match(t, 100);
        const size_t n = m.pages.size();
        expect_pattern(pool, m.pages, 6);
        if (m.last) cache.unlock(m.last);
        return n;
    };
    ASSERT_EQ(rows_found(), 4u);
    auto bytes_of = [](const fs::path& p) {
        std::ifstream f(p, std::ios::binary);
        return std::vector<char>(std::istreambuf_iterator<char>(f), {});
    };
    auto write = [](const fs::path& p, const std::vector<char>& b) {
        std::ofstream(p, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
    };
    std::vector<std::vector<char>> saved;
    for (auto& f : files) saved.push_back(bytes_of(f));
    // Each damaged file cuts the match short at its page (the others stay whole): never wrong bytes.
    for (size_t i = 0; i < files.size(); ++i) {
        auto b = saved[i];
        b[b.size() / 2] ^= 0x40;  // corrupt
        write(files[i], b);
        EXPECT_LT(rows_found(), 4u) << "corrupt " << files[i];
        b = saved[i];
        b.resize(b.size() - 9);  // truncated
        write(files[i], b);
        EXPECT_LT(rows_found(), 4u) << "truncated " << files[i];
        write(files[i], saved[(i + 1) % files.size()]);  // another page's entry under this key: foreign
        EXPECT_LT(rows_found(), 4u) << "foreign " << files[i];
        write(files[i], saved[i]);
    }
    EXPECT_EQ(rows_found(), 4u);
}

TEST(HiCache, StorageDirectoryMustExistAndBeWritable) {
    auto opts = tiers(8);
    opts.storage_backend = "file";
    PagePool pool(memory, layout(), 8);
    opts.storage_dir = "/nonexistent/peregrine-cache";
    try {
        RadixCache cache(pool, &opts);
        FAIL() << "a missing directory was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("no such directory"), std::string::npos) << e.what();
    }
    opts.storage_dir = "/proc";  // exists, takes no new files (even as root)
    try {
        RadixCache cache(pool, &opts);
        FAIL() << "an unwritable directory was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not writable"), std::string::npos) << e.what();
    }
}

TEST(HiCache, FullDiskOrVanishedDirectoryDropsWritesAndServingGoesOn) {
    TempDir dir;
    auto opts = file_tiers(dir.path);
    const auto t = tokens(3, 300);
    {  // a full disk: writes fail with EFBIG here (SIGXFSZ ignored)
        auto old = std::signal(SIGXFSZ, SIG_IGN);
        rlimit saved{};
        getrlimit(RLIMIT_FSIZE, &saved);
        rlimit tiny = saved;
        tiny.rlim_cur = 16;
        setrlimit(RLIMIT_FSIZE, &tiny);
        {
            PagePool pool(memory, layout(), 8);
            RadixCache cache(pool, &opts);
            cache.insert(t, filled_rows(pool, 3, 7), 3);
            cache.evict(3);
            auto m = cache.match(t, 100);  // host memory still serves
            EXPECT_EQ(m.pages.size(), 3u);
            expect_pattern(pool, m.pages, 7);
            cache.unlock(m.last);
        }
        setrlimit(RLIMIT_FSIZE, &saved);
        std::signal(SIGXFSZ, old);
    }
    EXPECT_TRUE(entries(dir.path).empty());  // no partial entry left behind
    {
        PagePool pool(memory, layout(), 8);
        RadixCache cache(pool, &opts);
        EXPECT_TRUE(cache.match(t, 100).pages.empty());
        fs::remove_all(dir.path);  // the store goes away while serving
        cache.insert(t, filled_rows(pool, 3, 8), 3);
        auto m = cache.match(t, 100);
        EXPECT_EQ(m.pages.size(), 3u);
        cache.unlock(m.last);
        cache.clear();
        EXPECT_TRUE(cache.match(t, 100).pages.empty());
        for (int i = 0; i < 200 && cache.stats().storage_writes_dropped < 3; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_EQ(cache.stats().storage_writes_dropped, 3);
    }
    fs::create_directories(dir.path);
}

TEST(HiCache, TwoWritersSharingADirectoryNeverShowATornEntry) {
    TempDir dir;
    auto a = make_file_store(dir.path), b = make_file_store(dir.path);
    std::vector<int32_t> toks(P, 3);
    EntryId id{chain_key(identity_key("x"), toks), identity_key("x"), toks, 4096, 8192};
    std::vector<uint8_t> h1(4096, 1), w1(8192, 2), h2(4096, 3);
    const auto e1 = encode_entry(id, h1.data(), w1.data()), e2 = encode_entry(id, h2.data(), nullptr);
    std::atomic<bool> stop{false};
    auto writer = [&](PageStore& s, const std::vector<uint8_t>& e) {
        while (!stop) ASSERT_TRUE(s.put(id.key, e));
    };
    std::thread ta(writer, std::ref(*a), std::cref(e1)), tb(writer, std::ref(*b), std::cref(e2));
    int whole = 0, torn = 0;
    for (int i = 0; i < 3000 || (whole == 0 && i < 300000); ++i) {  // until the writers have started, too
        auto blob = a->get(id.key, max_entry_bytes(id));
        if (!blob) continue;
        auto row = decode_entry(id, *blob);
        row ? ++whole : ++torn;
        if (row) {
            EXPECT_TRUE(row->history == h1 || row->history == h2);
        }
    }
    stop = true;
    ta.join();
    tb.join();
    EXPECT_EQ(torn, 0);
    EXPECT_GT(whole, 0);
    for (const auto& e : fs::recursive_directory_iterator(dir.path))  // no temporary left over
        EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

namespace {
// A real redis-server on a unix socket in a temporary directory.
struct RedisServer {
    fs::path dir;
    pid_t pid = -1;
    explicit RedisServer(const fs::path& d) : dir(d) { start(); }
    ~RedisServer() { stop(); }
    std::string url() const { return "unix://" + (dir / "redis.sock").string(); }
    void start() {
        pid = ::fork();
        if (pid == 0) {
            const std::string sock = (dir / "redis.sock").string(), wd = dir.string();
            ::execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", sock.c_str(), "--save", "",
                     "--appendonly", "no", "--dir", wd.c_str(), "--loglevel", "warning", nullptr);
            ::_exit(127);
        }
        for (int i = 0; i < 500 && !fs::exists(dir / "redis.sock"); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    void stop() {
        if (pid <= 0) return;
        ::kill(pid, SIGTERM);
        ::waitpid(pid, nullptr, 0);
        pid = -1;
        fs::remove(dir / "redis.sock");
    }
};
}  // namespace

TEST(HiCache, RedisStorageServesAfterARestartAndSurvivesAnOutage) {
    TempDir dir;
    RedisServer redis(dir.path);
    ASSERT_TRUE(fs::exists(dir.path / "redis.sock")) << "redis-server did not start (scripts/install-deps.sh installs it)";
    auto opts = tiers(32, true);
    opts.storage_backend = "redis";
    opts.storage_url = redis.url();
    const auto t = tokens(4, 900);
    {
        PagePool pool(memory, layout(), 8);
        RadixCache cache(pool, &opts);
        cache.insert(t, filled_rows(pool, 4, 11), 4);
    }
    {
        PagePool pool(memory, layout(), 8);
        RadixCache cache(pool, &opts);
        auto m = cache.match(t, 100);
        ASSERT_EQ(m.pages.size(), 4u);
        EXPECT_EQ(m.storage_pages, 4);
        expect_pattern(pool, m.pages, 11);
        cache.unlock(m.last);
        // The server goes away: reads miss, writes drop, nothing fails.
        redis.stop();
        cache.clear();
        EXPECT_TRUE(cache.match(t, 100).pages.empty());
        const auto u = tokens(2, 5000);
        cache.insert(u, filled_rows(pool, 2, 12), 2);
        for (int i = 0; i < 300 && cache.stats().storage_writes_dropped < 2; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_EQ(cache.stats().storage_writes_dropped, 2);
        // Back (empty): the store reconnects within a second.
        redis.start();
        std::this_thread::sleep_for(std::chrono::milliseconds(1100));
        cache.clear();
        cache.insert(u, filled_rows(pool, 2, 13), 2);
    }
    PagePool pool(memory, layout(), 8);
    RadixCache cache(pool, &opts);
    auto m = cache.match(tokens(2, 5000), 100);
    EXPECT_EQ(m.storage_pages, 2);
    expect_pattern(pool, m.pages, 13);
    if (m.last) cache.unlock(m.last);
    auto bad = opts;
    bad.storage_url = "unix://" + (dir.path / "nothing.sock").string();
    EXPECT_THROW(RadixCache(pool, &bad), Error);
}
