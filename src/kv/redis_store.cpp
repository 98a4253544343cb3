// The storage tier in a Redis server (through hiredis): an entry is one string value under
// "peregrine:kv:<key>", written with a single SET, so readers see it whole or not at all.
#include "kv/page_store.h"
#include "util/error.h"
#include "util/log.h"

#include <hiredis/hiredis.h>

#include <csignal>
#include <chrono>
#include <ctime>
#include <pthread.h>

namespace peregrine {

namespace {
// A write to a server that went away raises SIGPIPE: blocked in this thread while a command runs, and one
// raised then is taken back, so that a store going away never kills the process, whatever its signal handling.
class NoSigpipe {
public:
    NoSigpipe() {
        sigemptyset(&pipe_);
        sigaddset(&pipe_, SIGPIPE);
        sigset_t pending;
        sigpending(&pending);
        was_pending_ = sigismember(&pending, SIGPIPE) == 1;
        pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    }
    ~NoSigpipe() {
        sigset_t pending;
        sigpending(&pending);
        if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
            const timespec zero{0, 0};
            sigtimedwait(&pipe_, nullptr, &zero);
        }
        pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    }

private:
    sigset_t pipe_, old_;
    bool was_pending_ = false;
};

class RedisStore final : public PageStore {
public:
    explicit RedisStore(std::string url) : url_(std::move(url)) {
        if (url_.rfind("unix://", 0) == 0) {
            socket_ = url_.substr(7);
        } else {
            std::string rest = url_.rfind("redis://", 0) == 0 ? url_.substr(8) : url_;
            rest = rest.substr(0, rest.find('/'));
            const size_t colon = rest.rfind(':');
            host_ = rest.substr(0, colon);
            port_ = colon == std::string::npos ? 6379 : std::atoi(rest.c_str() + colon + 1);
            PEREGRINE_CHECK(!host_.empty() && port_ > 0 && port_ < 65536,
                            "--hicache-storage-url {}: expected redis://host:port or unix:///path", url_);
        }
        std::string why;
        PEREGRINE_CHECK(connect(why), "--hicache-storage-url {}: cannot reach Redis ({})", url_, why);
    }
    ~RedisStore() override {
        if (ctx_) redisFree(ctx_);
    }
    std::string describe() const override { return "redis " + url_; }
    std::string where(const PageKey& key) const override { return url_ + " key peregrine:kv:" + key.hex(); }

    std::optional<std::vector<uint8_t>> get(const PageKey& key, size_t max_bytes) override {
        std::lock_guard lk(mu_);
        const std::string k = "peregrine:kv:" + key.hex();
        auto* r = command("GET %b", k.data(), k.size());
        if (!r) return std::nullopt;
        std::optional<std::vector<uint8_t>> out;
        if (r->type == REDIS_REPLY_STRING && r->len <= max_bytes)
            out.emplace(reinterpret_cast<const uint8_t*>(r->str), reinterpret_cast<const uint8_t*>(r->str) + r->len);
        freeReplyObject(r);
        return out;
    }

    bool put(const PageKey& key, std::span<const uint8_t> entry) override {
        std::lock_guard lk(mu_);
        const std::string k = "peregrine:kv:" + key.hex();
        auto* r = command("SET %b %b", k.data(), k.size(), entry.data(), entry.size());
        if (!r) return false;
        const bool ok = r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        return ok;
    }

private:
    bool connect(std::string& why) {
        if (ctx_) redisFree(ctx_);
        const timeval timeout{2, 0};
        ctx_ = socket_.empty() ? redisConnectWithTimeout(host_.c_str(), port_, timeout)
                               : redisConnectUnixWithTimeout(socket_.c_str(), timeout);
        if (ctx_ && !ctx_->err && redisSetTimeout(ctx_, timeout) == REDIS_OK) return true;
        why = ctx_ ? ctx_->errstr : "out of memory";
        if (ctx_) redisFree(ctx_);
        ctx_ = nullptr;
        return false;
    }

    // A reply, or null when the server is gone (then reconnects at most once a second; until then: misses).
    template <typename... Args>
    redisReply* command(const char* fmt, Args... args) {
        const auto now = std::chrono::steady_clock::now();
        if (!ctx_) {
            if (now < retry_at_) return nullptr;
            std::string why;
            if (!connect(why)) {
                retry_at_ = now + std::chrono::seconds(1);
                return nullptr;
            }
            spdlog::info("hicache storage: reconnected to {}", url_);
        }
        NoSigpipe guard;
        auto* r = static_cast<redisReply*>(redisCommand(ctx_, fmt, args...));
        if (r) return r;
        spdlog::warn("hicache storage: {} went away ({}); reads miss and writes drop until it is back", url_,
                     ctx_->errstr);
        redisFree(ctx_);
        ctx_ = nullptr;
        retry_at_ = now + std::chrono::seconds(1);
        return nullptr;
    }

    std::string url_, host_, socket_;
    int port_ = 0;
    std::mutex mu_;
    redisContext* ctx_ = nullptr;
    std::chrono::steady_clock::time_point retry_at_{};
};
}  // namespace

std::unique_ptr<PageStore> make_redis_store(const std::string& url) { return std::make_unique<RedisStore>(url); }

}  // namespace peregrine
