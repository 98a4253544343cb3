#include "server/protocol/prompt_ids.h"

#include "util/error.h"

namespace peregrine {

std::vector<int32_t> prompt_token_ids(const RenderedPrompt& p, const Tokenizer& tk) {
    std::vector<int32_t> ids;
    size_t pos = 0;
    auto plain = [&](size_t end) {
        if (end > pos) {
            auto part = tk.encode(std::string_view(p.text).substr(pos, end - pos), false);
            ids.insert(ids.end(), part.begin(), part.end());
        }
    };
    for (auto [b, e] : p.special_ranges) {
        plain(b);
        auto tok = tk.encode(std::string_view(p.text).substr(b, e - b), true);
        PEREGRINE_CHECK(tok.size() == 1, "'{}' is not one token in this tokenizer", p.text.substr(b, e - b));
        ids.push_back(tok[0]);
        pos = e;
    }
    plain(p.text.size());
    return ids;
}

}  // namespace peregrine
