#include "server/response_streams.h"

#include <algorithm>

namespace peregrine {

using Clock = std::chrono::steady_clock;

RequestsBody::~RequestsBody() {
    for (auto& s : streams_) s->set_listener(nullptr);  // the wake may outlive this body: nothing calls it now
}

void RequestsBody::start(std::function<void()> wake) {
    for (auto& s : streams_) s->set_listener(wake);
}

void RequestsBody::abandon() {
    for (auto& s : streams_) s->cancel();
}

EventStream::EventStream(std::vector<std::shared_ptr<RequestStream>> streams, std::string head, OnDelta on_delta,
                         OnEnd on_end, std::string idle)
    : RequestsBody(std::move(streams)), head_(std::move(head)), idle_(std::move(idle)), on_delta_(std::move(on_delta)),
      on_end_(std::move(on_end)), totals_(streams_.size()), done_(streams_.size(), false), left_(streams_.size()),
      last_sent_(Clock::now()) {}

bool EventStream::pull(std::string& out) {
    out += std::move(head_);
    head_.clear();
    for (size_t i = 0; i < streams_.size(); ++i) {
        RequestDelta d;
        while (!done_[i] && streams_[i]->next(d, std::chrono::milliseconds(0))) {
            totals_[i].prompt_tokens = d.prompt_tokens;
            totals_[i].cached_tokens = d.cached_tokens;
            totals_[i].cached_host = d.cached_host;
            totals_[i].cached_storage = d.cached_storage;
            totals_[i].completion_tokens = d.completion_tokens;
            if (d.finished) {
                done_[i] = true;
                --left_;
            }
            if (d.text.empty() && d.tokens.empty() && !d.finished) continue;
            out += on_delta_(i, d);
        }
    }
    if (left_ == 0) {
        out += on_end_(totals_);
        return false;
    }
    const auto now = Clock::now();
    if (out.empty() && now - last_sent_ >= std::chrono::seconds(1)) out = idle_;
    if (!out.empty()) last_sent_ = now;
    return true;
}

bool collect(const std::vector<std::shared_ptr<RequestStream>>& streams, std::vector<RequestDelta>& acc,
             std::chrono::milliseconds budget) {
    const auto deadline = Clock::now() + budget;
    bool all = true;
    for (size_t i = 0; i < streams.size(); ++i) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        all = streams[i]->wait_for(acc[i], std::max(left, std::chrono::milliseconds(0))) && all;
    }
    return all;
}

bool DeferredBody::pull(std::string& out) {
    if (collect(streams_, *acc_, std::chrono::milliseconds(0))) {
        out += build_(*acc_);
        return false;
    }
    const auto now = Clock::now();
    if (now - last_sent_ >= std::chrono::milliseconds(500)) {
        out += ' ';
        last_sent_ = now;
    }
    return true;
}

}  // namespace peregrine
