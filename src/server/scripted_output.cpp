#include "server/scripted_output.h"

#include "util/error.h"
#include "util/file.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace peregrine {

namespace {

// Leaves only the next scripted token sampleable; finishes the request once all were emitted.
class ForcedTokens : public LogitProcessor {
public:
    explicit ForcedTokens(std::vector<int32_t> ids) : ids_(std::move(ids)) {}
    void process(float* logits, int vocab) override {
        if (pos_ >= ids_.size()) return;
        const int32_t want = ids_[pos_];
        PEREGRINE_CHECK(want >= 0 && want < vocab, "scripted token {} is outside the vocabulary ({})", want, vocab);
        for (int i = 0; i < vocab; ++i)
            if (i != want) logits[i] = -INFINITY;
        logits[want] = 0.0f;
    }
    void accept(int32_t) override { ++pos_; }
    bool done() const override { return pos_ >= ids_.size(); }

private:
    std::vector<int32_t> ids_;
    size_t pos_ = 0;
};

}  // namespace

std::shared_ptr<ScriptedOutput> ScriptedOutput::from_file(const std::string& path) {
    auto j = nlohmann::json::parse(read_file(path), nullptr, false);
    if (j.is_discarded() || !j.is_array()) fail("--scripted-output {}: expected a JSON list of strings", path);
    std::deque<std::string> out;
    for (auto& x : j) {
        if (!x.is_string() || x.get<std::string>().empty())
            fail("--scripted-output {}: every entry must be a non-empty string", path);
        out.push_back(x.get<std::string>());
    }
    return std::make_shared<ScriptedOutput>(std::move(out));
}

std::shared_ptr<LogitProcessor> ScriptedOutput::next(const Tokenizer& tok) {
    std::string text;
    {
        std::lock_guard lk(mu_);
        if (left_.empty()) return nullptr;
        text = std::move(left_.front());
        left_.pop_front();
    }
    return std::make_shared<ForcedTokens>(tok.encode(text, true, false));
}

}  // namespace peregrine
