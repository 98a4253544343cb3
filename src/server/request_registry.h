#pragma once
// The server's in-flight requests by id (the response id, or /generate's `rid`), so that /abort_request can cancel
// them and a graceful shutdown can wait for them. Entries hold streams weakly, and a finished request drops out by
// itself (the engine may let go of its stream a moment after the end reached the client).
#include "engine/request.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace peregrine {

class RequestRegistry {
public:
    void add(const std::string& rid, const std::vector<std::shared_ptr<RequestStream>>& streams) {
        std::lock_guard lk(mu_);
        prune();
        auto& v = live_[rid];
        for (const auto& s : streams) v.push_back(s);
    }
    // Cancels the requests with this id (every one when `rid` is empty); returns how many were running.
    int abort(const std::string& rid) {
        std::lock_guard lk(mu_);
        int n = 0;
        for (auto& [id, v] : live_)
            if (rid.empty() || id == rid)
                for (auto& w : v)
                    if (auto s = w.lock(); s && !s->finished()) {
                        s->cancel();
                        ++n;
                    }
        return n;
    }
    // Requests still running.
    int alive() {
        std::lock_guard lk(mu_);
        prune();
        int n = 0;
        for (auto& [id, v] : live_) n += static_cast<int>(v.size());
        return n;
    }

private:
    void prune() {
        for (auto it = live_.begin(); it != live_.end();) {
            auto& v = it->second;
            std::erase_if(v, [](const std::weak_ptr<RequestStream>& w) {
                auto s = w.lock();
                return !s || s->finished();
            });
            it = v.empty() ? live_.erase(it) : std::next(it);
        }
    }
    std::mutex mu_;
    std::map<std::string, std::vector<std::weak_ptr<RequestStream>>> live_;
};

}  // namespace peregrine
