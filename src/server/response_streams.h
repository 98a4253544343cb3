#pragma once
// Bodies that follow engine requests as they generate, pulled by the HTTP transport without blocking a thread:
// SSE event streams, and non-streamed answers that take longer than a second.
#include "engine/request.h"
#include "server/http_server.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace peregrine {

// The part both share: a wake on every request's new output, and cancelling them all when the client leaves.
class RequestsBody : public BodyStream {
public:
    explicit RequestsBody(std::vector<std::shared_ptr<RequestStream>> streams) : streams_(std::move(streams)) {}
    ~RequestsBody() override;
    void start(std::function<void()> wake) override;
    void abandon() override;

protected:
    std::vector<std::shared_ptr<RequestStream>> streams_;
};

// Server-sent events over several requests: `head` first, then `on_delta`'s bytes for each delta with output (and
// each final one), then `on_end`'s after the last request finished. When nothing was sent for a second, `idle`
// goes out (a comment or a ping) so that proxies keep the connection.
class EventStream : public RequestsBody {
public:
    using OnDelta = std::function<std::string(size_t index, const RequestDelta& delta)>;
    using OnEnd = std::function<std::string(const std::vector<RequestDelta>& totals)>;  // usage counts per request
    EventStream(std::vector<std::shared_ptr<RequestStream>> streams, std::string head, OnDelta on_delta, OnEnd on_end,
                std::string idle);
    bool pull(std::string& out) override;

private:
    std::string head_, idle_;
    OnDelta on_delta_;
    OnEnd on_end_;
    std::vector<RequestDelta> totals_;
    std::vector<bool> done_;
    size_t left_;
    std::chrono::steady_clock::time_point last_sent_;
};

// A JSON answer built once every request finished. Until then a space goes out every half second (JSON ignores
// it), which keeps proxies from timing out.
class DeferredBody : public RequestsBody {
public:
    using Build = std::function<std::string(std::vector<RequestDelta>& finished)>;
    DeferredBody(std::vector<std::shared_ptr<RequestStream>> streams, std::shared_ptr<std::vector<RequestDelta>> acc,
                 Build build)
        : RequestsBody(std::move(streams)), acc_(std::move(acc)), build_(std::move(build)) {}
    bool pull(std::string& out) override;

private:
    std::shared_ptr<std::vector<RequestDelta>> acc_;
    Build build_;
    std::chrono::steady_clock::time_point last_sent_ = std::chrono::steady_clock::now();
};

// Adds what is ready for each request to `acc` (one entry per stream), waiting at most `budget` in all; true once
// every request has finished.
bool collect(const std::vector<std::shared_ptr<RequestStream>>& streams, std::vector<RequestDelta>& acc,
             std::chrono::milliseconds budget);

}  // namespace peregrine
