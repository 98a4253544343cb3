#include "tokenizer/engram_token_map.h"

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

#include <unordered_map>

namespace peregrine {

namespace {
const Normalizer& engram_normalizer() {
    static const Normalizer n = [] {
        Normalizer x;
        x.add_nfkc();
        x.add_nfd();
        x.add_strip_accents();
        x.add_lowercase();
        x.add_replace_regex("[ \t\r\n]+", " ");
        x.add_replace_regex("^ $", "\xEE\x80\x80");  // a lone space is kept through Strip via U+E000
        x.add_strip(true, true);
        x.add_replace_string("\xEE\x80\x80", " ");
        return x;
    }();
    return n;
}
}  // namespace

std::string engram_token_key(const Tokenizer& tok, int32_t id) {
    if (!tok.is_valid(id)) return {};
    // HF's decode of a single id: its bytes with invalid UTF-8 replaced.
    std::string text = utf8_repair(tok.token_bytes(id));
    if (text.find("\xEF\xBF\xBD") != std::string::npos) return tok.token_text(id);
    std::string norm = engram_normalizer().apply(text);
    return norm.empty() ? text : norm;
}

EngramTokenMap build_engram_token_map(const Tokenizer& tok) {
    EngramTokenMap m;
    m.id_to_class.resize(static_cast<size_t>(tok.vocab_size()));
    std::unordered_map<std::string, int32_t> classes;
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        auto [it, inserted] = classes.emplace(engram_token_key(tok, id), m.num_classes);
        if (inserted) ++m.num_classes;
        m.id_to_class[id] = it->second;
    }
    return m;
}

}  // namespace peregrine
