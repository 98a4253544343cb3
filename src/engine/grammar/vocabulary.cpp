#include "engine/grammar/vocabulary.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "util/error.h"

namespace peregrine::grammar {

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, const std::vector<int32_t>& special_ids,
                       std::vector<int32_t> stop_ids)
    : bytes_(std::move(token_bytes)), special_(bytes_.size(), 0), stop_ids_(std::move(stop_ids)) {
    for (int32_t id : special_ids) {
        PEREGRINE_CHECK(id >= 0 && id < size(), "special token id {} outside the vocabulary", id);
        special_[id] = 1;
    }
    for (int32_t id : stop_ids_) {
        PEREGRINE_CHECK(id >= 0 && id < size(), "stop token id {} outside the vocabulary", id);
        special_[id] = 1;  // a stop token is never matched as text
    }
    for (int32_t id = 0; id < size(); ++id)
        if (!special_[id] && !bytes_[id].empty()) sorted_.push_back(id);
    std::stable_sort(sorted_.begin(), sorted_.end(),
                     [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });

    // Build the trie breadth-first so each node's children are consecutive nodes.
    struct Pending { int32_t node; size_t depth; };
    trie_.push_back({0, 0, 0, 0, static_cast<int32_t>(sorted_.size()), 0});
    std::vector<Pending> queue{{0, 0}};
    for (size_t qi = 0; qi < queue.size(); ++qi) {
        auto [node, depth] = queue[qi];
        int32_t i = trie_[node].tok_begin, end = trie_[node].tok_end;
        while (i < end && bytes_[sorted_[i]].size() == depth) ++i;
        trie_[node].tok_end_here = i;
        trie_[node].child_begin = static_cast<int32_t>(trie_.size());
        while (i < end) {
            uint8_t b = static_cast<uint8_t>(bytes_[sorted_[i]][depth]);
            int32_t j = i;
            while (j < end && static_cast<uint8_t>(bytes_[sorted_[j]][depth]) == b) ++j;
            int32_t child = static_cast<int32_t>(trie_.size());
            trie_.push_back({0, 0, i, i, j, b});
            queue.push_back({child, depth + 1});
            i = j;
        }
        trie_[node].child_end = static_cast<int32_t>(trie_.size());
    }
    below_.resize(trie_.size());
    for (int32_t n = static_cast<int32_t>(trie_.size()) - 1; n >= 0; --n)
        for (int32_t c = trie_[n].child_begin; c < trie_[n].child_end; ++c) {
            below_[n].add(trie_[c].byte);
            for (int k = 0; k < 4; ++k) below_[n].w[k] |= below_[c].w[k];
        }
}

bool Vocabulary::is_stop(int32_t id) const {
    return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

static std::string unhex(const std::string& h, int line) {
    PEREGRINE_CHECK(h.size() % 2 == 0, "vocabulary file line {}: odd hex length", line);
    std::string out(h.size() / 2, '\0');
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
    return out;
}

std::shared_ptr<const Vocabulary> Vocabulary::load(const std::string& path) {
    std::ifstream in(path);
    PEREGRINE_CHECK(in.good(), "cannot open vocabulary file {}", path);
    std::string header;
    int64_t n = 0;
    in >> header >> n;
    PEREGRINE_CHECK(header == "peregrine-vocab" && n > 0, "{} is not a peregrine-vocab file", path);
    std::vector<std::string> bytes(n);
    std::vector<int32_t> special, stop;
    std::string line;
    std::getline(in, line);
    for (int64_t id = 0; id < n; ++id) {
        PEREGRINE_CHECK(static_cast<bool>(std::getline(in, line)), "{}: expected {} tokens, got {}", path, n, id);
        std::istringstream ls(line);
        std::string kind, hex;
        ls >> kind >> hex;
        bytes[id] = unhex(hex, static_cast<int>(id + 2));
        if (kind == "s") special.push_back(static_cast<int32_t>(id));
        else if (kind == "e") stop.push_back(static_cast<int32_t>(id));
        else PEREGRINE_CHECK(kind == "n", "{} line {}: unknown token kind '{}'", path, id + 2, kind);
    }
    return std::make_shared<Vocabulary>(std::move(bytes), special, stop);
}

}  // namespace peregrine::grammar
