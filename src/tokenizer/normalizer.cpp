#include "tokenizer/normalizer.h"

#include "tokenizer/utf8.h"
#include "util/error.h"

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <cstdlib>

namespace peregrine {

using json = nlohmann::json;

bool is_unicode_whitespace(char32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {
std::string utf8proc_normalize(std::string_view s, int options) {
    if (s.empty()) return {};
    utf8proc_uint8_t* out = nullptr;
    utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                      static_cast<utf8proc_ssize_t>(s.size()), &out,
                                      static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
    if (n < 0) fail("unicode normalization failed: {}", utf8proc_errmsg(n));
    std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
    return r;
}

template <typename F>
void for_each_cp(std::string_view s, F&& f) {
    size_t i = 0;
    while (i < s.size()) {
        char32_t cp;
        i += utf8_decode(s, i, cp);
        f(cp);
    }
}

std::string lowercase(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for_each_cp(s, [&](char32_t cp) {
        if (cp == 0x130) {  // the one unconditional multi-character lowercase mapping
            out += "i\xCC\x87";
        } else {
            utf8_append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
        }
    });
    return out;
}

std::string strip_accents(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for_each_cp(s, [&](char32_t cp) {
        auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
        if (cat != UTF8PROC_CATEGORY_MN && cat != UTF8PROC_CATEGORY_MC && cat != UTF8PROC_CATEGORY_ME)
            utf8_append(out, cp);
    });
    return out;
}

std::string strip(std::string_view s, bool left, bool right) {
    size_t b = 0, e = s.size();
    if (left) {
        while (b < e) {
            char32_t cp;
            size_t n = utf8_decode(s, b, cp);
            if (!is_unicode_whitespace(cp)) break;
            b += n;
        }
    }
    if (right) {
        while (e > b) {
            size_t k = e - 1;
            while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
            char32_t cp;
            utf8_decode(s, k, cp);
            if (!is_unicode_whitespace(cp)) break;
            e = k;
        }
    }
    return std::string(s.substr(b, e - b));
}

std::string replace(std::string_view s, const Regex& re, const std::string& content) {
    std::vector<Span> m;
    re.find_all(s, m);
    if (m.empty()) return std::string(s);
    std::string out;
    size_t prev = 0;
    for (auto& sp : m) {
        out.append(s.substr(prev, sp.begin - prev));
        out += content;
        prev = sp.end;
    }
    out.append(s.substr(prev));
    return out;
}
}  // namespace

void Normalizer::add_strip(bool left, bool right) {
    Step st = make_step(Kind::Strip);
    st.left = left;
    st.right = right;
    steps_.push_back(std::move(st));
}

void Normalizer::add_replace_regex(std::string_view pattern, std::string content) {
    Step st = make_step(Kind::Replace);
    st.regex = std::make_shared<Regex>(pattern);
    st.content = std::move(content);
    steps_.push_back(std::move(st));
}

void Normalizer::add_replace_string(std::string_view literal, std::string content) {
    add_replace_regex(Regex::escape_literal(literal), std::move(content));
}

void Normalizer::parse_into(const json& j, Normalizer& n) {
    if (j.is_null()) return;
    std::string type = j.value("type", "");
    if (type == "Sequence") {
        for (auto& sub : j.at("normalizers")) parse_into(sub, n);
    } else if (type == "NFC") {
        n.steps_.push_back(make_step(Kind::NFC));
    } else if (type == "NFD") {
        n.steps_.push_back(make_step(Kind::NFD));
    } else if (type == "NFKC") {
        n.steps_.push_back(make_step(Kind::NFKC));
    } else if (type == "NFKD") {
        n.steps_.push_back(make_step(Kind::NFKD));
    } else if (type == "Lowercase") {
        n.steps_.push_back(make_step(Kind::Lowercase));
    } else if (type == "StripAccents") {
        n.steps_.push_back(make_step(Kind::StripAccents));
    } else if (type == "Strip") {
        n.add_strip(j.value("strip_left", true), j.value("strip_right", true));
    } else if (type == "Replace") {
        auto& pat = j.at("pattern");
        std::string content = j.at("content").get<std::string>();
        if (pat.contains("Regex")) n.add_replace_regex(pat["Regex"].get<std::string>(), content);
        else if (pat.contains("String")) n.add_replace_string(pat["String"].get<std::string>(), content);
        else fail("tokenizer.json: Replace normalizer pattern must be String or Regex");
    } else if (type == "Prepend") {
        Step st = make_step(Kind::Prepend);
        st.content = j.at("prepend").get<std::string>();
        n.steps_.push_back(std::move(st));
    } else {
        fail("tokenizer.json: normalizer type '{}' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, "
             "Lowercase, Strip, StripAccents, Replace, Prepend)", type);
    }
}

Normalizer Normalizer::from_json(const json& j) {
    Normalizer n;
    parse_into(j, n);
    return n;
}

std::string Normalizer::apply(std::string_view in) const {
    std::string s(in);
    for (auto& st : steps_) {
        switch (st.kind) {
            case Kind::NFC: s = utf8proc_normalize(s, UTF8PROC_COMPOSE); break;
            case Kind::NFD: s = utf8proc_normalize(s, UTF8PROC_DECOMPOSE); break;
            case Kind::NFKC: s = utf8proc_normalize(s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT); break;
            case Kind::NFKD: s = utf8proc_normalize(s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT); break;
            case Kind::Lowercase: s = lowercase(s); break;
            case Kind::StripAccents: s = strip_accents(s); break;
            case Kind::Strip: s = strip(s, st.left, st.right); break;
            case Kind::Replace: s = replace(s, *st.regex, st.content); break;
            case Kind::Prepend:
                if (!s.empty()) s = st.content + s;
                break;
        }
    }
    return s;
}

}  // namespace peregrine
