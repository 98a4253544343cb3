#include "server/structured_output.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <future>
#include <numeric>

#include <fmt/format.h>

namespace peregrine {

using grammar::CompileBudget;
using grammar::CompileCancelled;
using grammar::CompiledGrammar;
using grammar::GrammarCompiler;
using grammar::Vocabulary;

GrammarLogitProcessor::GrammarLogitProcessor(std::shared_ptr<const CompiledGrammar> g, int64_t max_new_tokens,
                                             int32_t steer_margin)
    : matcher_(std::move(g), kMaxRollback + 1), max_new_tokens_(max_new_tokens), steer_margin_(steer_margin) {
    mask_.resize(static_cast<size_t>(matcher_.compiled().vocab().mask_words()));
    // One token can raise the distance to the end by about a whole sentence (a second tool call, a nested
    // object): the steering zone must be wider than that jump.
    steer_margin_ = std::max<int32_t>(steer_margin_, 2 * std::min<int32_t>(matcher_.min_bytes_to_end(), 1 << 20));
}

void GrammarLogitProcessor::process(float* logits, int vocab) {
    matcher_.fill_next_token_bitmask(mask_.data());
    const int width = std::min<int>(vocab, matcher_.compiled().vocab().size());
    for (int i = 0; i < width; ++i)
        if (!(mask_[static_cast<size_t>(i) >> 5] >> (i & 31) & 1u)) logits[i] = -INFINITY;
    for (int i = width; i < vocab; ++i) logits[i] = -INFINITY;
    const int64_t remaining = max_new_tokens_ - generated_;  // tokens left, this one included
    if (remaining <= static_cast<int64_t>(matcher_.min_bytes_to_end()) + 1 + steer_margin_)
        steer(logits, vocab, remaining);
}

bool GrammarLogitProcessor::feasible(int32_t id, int64_t budget) {
    if (matcher_.compiled().vocab().is_stop(id)) return true;  // allowed only where the grammar can end
    if (!matcher_.accept_token(id)) return false;
    const bool ok = matcher_.is_terminated() || static_cast<int64_t>(matcher_.min_bytes_to_end()) + 1 <= budget;
    matcher_.rollback(1);
    return ok;
}

// Keeps only tokens that leave the text completable within the budget: the best allowed tokens by logit
// first, then single-byte tokens (one of them always continues a shortest completion), then all.
void GrammarLogitProcessor::steer(float* logits, int vocab, int64_t remaining) {
    const int64_t budget = remaining - 1;  // tokens left after this one
    std::vector<int32_t> allowed;
    for (int32_t i = 0; i < vocab; ++i)
        if (logits[i] != -INFINITY) allowed.push_back(i);
    if (allowed.empty()) return;
    const size_t top = std::min<size_t>(allowed.size(), 256);
    std::partial_sort(allowed.begin(), allowed.begin() + static_cast<std::ptrdiff_t>(top), allowed.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    std::vector<uint8_t> keep(static_cast<size_t>(vocab), 0), tested(static_cast<size_t>(vocab), 0);
    bool any = false;
    auto test = [&](int32_t id) {
        if (tested[static_cast<size_t>(id)]) return;
        tested[static_cast<size_t>(id)] = 1;
        if (feasible(id, budget)) keep[static_cast<size_t>(id)] = 1, any = true;
    };
    for (size_t k = 0; k < top; ++k) test(allowed[k]);
    const auto& voc = matcher_.compiled().vocab();
    if (!any)
        for (int32_t id : allowed)
            if (id < voc.size() && voc.token_bytes(id).size() == 1) test(id);
    if (!any)
        for (int32_t id : allowed) test(id);
    if (!any) return;  // the budget cannot be met: leave the grammar mask alone (the output is cut)
    for (int32_t id : allowed)
        if (!keep[static_cast<size_t>(id)]) logits[id] = -INFINITY;
}

void GrammarLogitProcessor::accept(int32_t id) {
    ++generated_;
    matcher_.accept_token(id);  // the mask allowed only accepted tokens
}

void GrammarLogitProcessor::rollback(int n_tokens) {
    matcher_.rollback(n_tokens);
    generated_ -= n_tokens;
}

StructuredOutput::StructuredOutput(const Tokenizer& tok, int32_t vocab_size, int32_t eos_id,
                                   GrammarCompileOptions opts)
    : tok_(tok), vocab_size_(vocab_size), eos_(eos_id), opts_(opts), pool_(opts.threads, opts.max_queued) {}

// Built on first use: a 128K vocabulary takes a moment to sort into the trie.
std::unique_ptr<GrammarCompiler> StructuredOutput::make_compiler(const std::vector<int32_t>& text_ids) const {
    const int32_t n = std::max<int32_t>(vocab_size_, tok_.vocab_size());
    std::vector<std::string> bytes(static_cast<size_t>(n));
    std::vector<int32_t> special;
    for (int32_t id = 0; id < n; ++id) {
        // The EOS id is never text, even where a byte-level tokenizer gives it a byte.
        const bool text = id != eos_ && tok_.is_valid(id) &&
                          (!tok_.is_added(id) || std::find(text_ids.begin(), text_ids.end(), id) != text_ids.end());
        if (text) bytes[static_cast<size_t>(id)] = tok_.token_bytes(id);
        else special.push_back(id);
    }
    std::vector<int32_t> stop;
    if (eos_ >= 0 && eos_ < n) stop.push_back(eos_);
    return std::make_unique<GrammarCompiler>(std::make_shared<Vocabulary>(std::move(bytes), special, std::move(stop)));
}

std::shared_ptr<const CompiledGrammar> StructuredOutput::compile(const grammar::ConstraintSpec& spec,
                                                                 const ClientGone& gone) {
    std::call_once(once_, [&] { compiler_ = make_compiler({}); });
    return run(*compiler_, GrammarCompiler::key_of(spec), [&] { return compiler_->compile(spec); }, gone);
}

std::shared_ptr<const CompiledGrammar> StructuredOutput::compile_tool_calls(
    const std::string& key, const std::function<grammar::Grammar()>& build, const ClientGone& gone) {
    std::call_once(tools_once_, [&] {
        std::vector<int32_t> text_ids;
        if (int32_t dsml = tok_.token_id("｜DSML｜"); dsml >= 0) text_ids.push_back(dsml);
        tools_compiler_ = make_compiler(text_ids);
    });
    return run(*tools_compiler_, key, [&] { return tools_compiler_->compile_cached(key, build); }, gone);
}

StructuredOutput::Result StructuredOutput::run(GrammarCompiler& compiler, const std::string& key,
                                               const std::function<Result()>& compile, const ClientGone& gone) {
    constexpr auto kPoll = std::chrono::milliseconds(5);
    // Compiled already, or under way for another request: wait for it here rather than take a compile thread.
    if (auto f = compiler.find(key)) {
        while (f->wait_for(kPoll) != std::future_status::ready)
            if (gone && gone()) throw CompileCancelled();
        try {
            return f->get();
        } catch (const CompileCancelled&) {
            // that request's client left before it finished: compile it for this one
        }
    }
    auto cancel = std::make_shared<std::atomic<bool>>(false);
    auto budget = std::make_shared<CompileBudget>(opts_.timeout, cancel);
    // Shared with the compile thread, which may still be returning from the task once the result is ready.
    auto task = std::make_shared<std::packaged_task<Result()>>([budget, &compile] {
        budget->start();
        grammar::BudgetScope scope(budget.get());
        budget->check();  // cancelled while it waited in the queue
        return compile();
    });
    auto result = task->get_future();
    if (!pool_.try_submit([task] { (*task)(); }))
        throw CompileQueueFull(fmt::format(
            "too many grammars are being compiled: {} compile threads are busy and {} compilations wait "
            "(--grammar-compile-threads, --grammar-compile-queue); retry later",
            pool_.threads(), pool_.max_queued()));
    // `compile` is used by the task until it ends: wait for it even once the client is gone (it stops promptly).
    while (result.wait_for(kPoll) != std::future_status::ready)
        if (gone && !cancel->load(std::memory_order_relaxed) && gone()) cancel->store(true);
    return result.get();
}

std::shared_ptr<LogitProcessor> StructuredOutput::processor(std::shared_ptr<const CompiledGrammar> g,
                                                            int64_t max_new_tokens) const {
    return std::make_shared<GrammarLogitProcessor>(std::move(g), max_new_tokens);
}

}  // namespace peregrine
