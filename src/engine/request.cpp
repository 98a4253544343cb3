#include "engine/request.h"

#include <algorithm>

namespace peregrine {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::stop: return "stop";
        case FinishReason::length: return "length";
        case FinishReason::abort: return "abort";
        case FinishReason::error: return "error";
        default: return "";
    }
}

bool RequestStream::next(RequestDelta& out, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    if (delivered_final_) return false;
    if (!has_new_) cv_.wait_for(lk, timeout, [&] { return has_new_; });
    if (!has_new_) return false;
    out = std::move(pending_);
    pending_ = RequestDelta();
    pending_.prompt_tokens = out.prompt_tokens;
    pending_.cached_tokens = out.cached_tokens;
    pending_.cached_host = out.cached_host;
    pending_.cached_storage = out.cached_storage;
    pending_.completion_tokens = out.completion_tokens;
    pending_.preemptions = out.preemptions;
    has_new_ = false;
    if (out.finished) delivered_final_ = true;
    return true;
}

RequestDelta RequestStream::wait() {
    RequestDelta all;
    while (!wait_for(all, std::chrono::milliseconds(1000))) {
    }
    return all;
}

bool RequestStream::wait_for(RequestDelta& all, std::chrono::milliseconds timeout) {
    RequestDelta d;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!all.finished) {  // reads what is ready even with no time left (a zero timeout polls)
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (!next(d, std::max(left, std::chrono::milliseconds(0)))) break;
        for (auto& t : d.tokens) all.tokens.push_back(std::move(t));
        all.text += d.text;
        all.finished = d.finished;
        all.finish = d.finish;
        all.matched_stop = d.matched_stop;
        all.error = d.error;
        all.prompt_tokens = d.prompt_tokens;
        all.cached_tokens = d.cached_tokens;
        all.cached_host = d.cached_host;
        all.cached_storage = d.cached_storage;
        all.completion_tokens = d.completion_tokens;
        all.preemptions = d.preemptions;
    }
    return all.finished;
}

void RequestStream::cancel() {
    cancelled_.store(true);
    if (waker_) waker_();
}

void RequestStream::push(TokenOutput tok, const std::string& text, int64_t completion_tokens) {
    {
        std::lock_guard lk(mu_);
        pending_.tokens.push_back(std::move(tok));
        pending_.text += text;
        pending_.completion_tokens = completion_tokens;
        has_new_ = true;
        if (listener_) listener_();
    }
    cv_.notify_all();
}

void RequestStream::finish(FinishReason r, std::string text, std::string matched, std::string error,
                           int64_t completion_tokens) {
    {
        std::lock_guard lk(mu_);
        pending_.completion_tokens = completion_tokens;
        pending_.text += text;
        pending_.finished = true;
        pending_.finish = r;
        pending_.matched_stop = std::move(matched);
        pending_.error = std::move(error);
        has_new_ = true;
        done_ = true;
        if (listener_) listener_();
    }
    cv_.notify_all();
}

void RequestStream::set_listener(std::function<void()> l) {
    std::lock_guard lk(mu_);
    listener_ = std::move(l);
}

void RequestStream::set_usage(int64_t prompt, int64_t cached, int64_t preemptions, int64_t cached_host,
                              int64_t cached_storage) {
    std::lock_guard lk(mu_);
    pending_.prompt_tokens = prompt;
    pending_.cached_tokens = cached;
    pending_.cached_host = cached_host;
    pending_.cached_storage = cached_storage;
    pending_.preemptions = preemptions;
}

}  // namespace peregrine
