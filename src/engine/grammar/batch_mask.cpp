#include "engine/grammar/batch_mask.h"

#include "engine/grammar/worker_pools.h"

namespace peregrine::grammar {

void fill_next_token_bitmasks(const std::vector<GrammarMatcher*>& matchers, uint32_t* bitmasks, int32_t words) {
    std::vector<int64_t> rows;
    for (size_t i = 0; i < matchers.size(); ++i)
        if (matchers[i]) rows.push_back(static_cast<int64_t>(i));
    auto fill = [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k)
            matchers[rows[k]]->fill_next_token_bitmask(bitmasks + rows[k] * static_cast<int64_t>(words));
    };
    if (rows.size() <= 1) fill(0, static_cast<int64_t>(rows.size()));
    else grammar_parallel_for(GrammarPool::kMask, static_cast<int64_t>(rows.size()), fill);
}

std::future<void> fill_next_token_bitmasks_async(std::vector<GrammarMatcher*> matchers, uint32_t* bitmasks,
                                                 int32_t words) {
    return std::async(std::launch::async, [m = std::move(matchers), bitmasks, words] {
        fill_next_token_bitmasks(m, bitmasks, words);
    });
}

}  // namespace peregrine::grammar
