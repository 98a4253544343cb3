#include "tokenizer/bpe_model.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <queue>

namespace peregrine {

using json = nlohmann::json;

namespace {
inline uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
inline uint64_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}
constexpr uint64_t kEmpty = ~0ULL;
}  // namespace

void BpeModel::PairTable::build(const std::vector<std::pair<uint64_t, MergeInfo>>& items) {
    size_t cap = 16;
    while (cap < items.size() * 2) cap <<= 1;
    keys.assign(cap, kEmpty);
    vals.assign(cap, MergeInfo{0, -1});
    mask = cap - 1;
    for (auto& [k, v] : items) {
        size_t h = mix(k) & mask;
        while (keys[h] != kEmpty && keys[h] != k) h = (h + 1) & mask;
        keys[h] = k;  // a repeated pair keeps its last rank, as a hash map built in order would
        vals[h] = v;
    }
}

const BpeModel::MergeInfo* BpeModel::PairTable::find(uint64_t k) const {
    size_t h = mix(k) & mask;
    while (true) {
        uint64_t cur = keys[h];
        if (cur == k) return &vals[h];
        if (cur == kEmpty) return nullptr;
        h = (h + 1) & mask;
    }
}

BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

int32_t json_token_id(const json& v, const char* what) {
    PEREGRINE_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= kMaxTokenId,
                    "tokenizer.json: {} {} is not a token id (an integer in 0..{})", what, v.dump(), kMaxTokenId);
    return static_cast<int32_t>(v.get<int64_t>());
}

BpeModel BpeModel::from_json(const json& m, bool byte_level) {
    PEREGRINE_CHECK(m.value("type", "BPE") == "BPE", "tokenizer.json: model type '{}' is not supported (only BPE)",
                    m.value("type", ""));
    PEREGRINE_CHECK(!m.value("byte_fallback", false), "tokenizer.json: BPE byte_fallback=true is not supported");
    if (m.contains("dropout") && !m["dropout"].is_null())
        PEREGRINE_CHECK(m["dropout"].get<double>() == 0.0, "tokenizer.json: BPE dropout is not supported");
    BpeModel bpe;
    bpe.byte_level_ = byte_level;
    bpe.ignore_merges_ = m.value("ignore_merges", false);
    bpe.fuse_unk_ = m.value("fuse_unk", false);
    if (m.contains("continuing_subword_prefix") && !m["continuing_subword_prefix"].is_null())
        bpe.continuing_prefix_ = m["continuing_subword_prefix"].get<std::string>();
    if (m.contains("end_of_word_suffix") && !m["end_of_word_suffix"].is_null())
        bpe.end_suffix_ = m["end_of_word_suffix"].get<std::string>();

    const json& vocab = m.at("vocab");
    int32_t max_id = -1;
    PEREGRINE_CHECK(vocab.is_object(), "tokenizer.json: the BPE vocab is not an object of token ids");
    for (auto it = vocab.begin(); it != vocab.end(); ++it)
        max_id = std::max(max_id, json_token_id(it.value(), "vocab id"));
    bpe.id_to_token_.resize(static_cast<size_t>(max_id + 1));
    bpe.token_to_id_.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
        const int32_t id = json_token_id(it.value(), "vocab id");
        bpe.token_to_id_[it.key()] = id;
        bpe.id_to_token_[id] = it.key();
    }
    if (m.contains("unk_token") && !m["unk_token"].is_null()) {
        auto it = bpe.token_to_id_.find(m["unk_token"].get<std::string>());
        PEREGRINE_CHECK(it != bpe.token_to_id_.end(), "tokenizer.json: unk_token is not in the vocabulary");
        bpe.unk_id_ = it->second;
    }

    // Piece-space keys: only tokens made entirely of byte characters can come out of byte-level BPE.
    bpe.piece_to_id_.reserve(vocab.size());
    for (auto& [tok, id] : bpe.token_to_id_) {
        if (!byte_level) {
            bpe.piece_to_id_[tok] = id;
            continue;
        }
        std::string raw;
        bool ok = utf8_is_valid(tok);
        for (size_t i = 0; ok && i < tok.size();) {
            char32_t cp;
            i += utf8_decode(tok, i, cp);
            int b = char_to_byte(cp);
            if (b < 0) ok = false;
            else raw.push_back(static_cast<char>(b));
        }
        if (ok) bpe.piece_to_id_[raw] = id;
    }
    bpe.byte_id_.fill(-1);
    if (byte_level) {
        for (int b = 0; b < 256; ++b) {
            std::string ch;
            utf8_append(ch, byte_to_char(static_cast<uint8_t>(b)));
            auto it = bpe.token_to_id_.find(ch);
            if (it != bpe.token_to_id_.end()) bpe.byte_id_[b] = it->second;
        }
    }

    static const json kNoMerges = json::array();
    const json& merges = m.contains("merges") ? m["merges"] : kNoMerges;
    std::vector<std::pair<uint64_t, MergeInfo>> items;
    items.reserve(merges.size());
    size_t prefix_len = bpe.continuing_prefix_.size();
    std::string merged;
    for (size_t r = 0; r < merges.size(); ++r) {
        std::string_view a, b;
        const json& e = merges[r];
        if (e.is_string()) {  // "a b"
            std::string_view s = e.get_ref<const std::string&>();
            size_t sp = s.find(' ');
            PEREGRINE_CHECK(sp != std::string_view::npos, "tokenizer.json: merge '{}' has no space", s);
            a = s.substr(0, sp);
            b = s.substr(sp + 1);
        } else {  // ["a", "b"]
            PEREGRINE_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                            "tokenizer.json: bad merge entry {}", e.dump());
            a = e[0].get_ref<const std::string&>();
            b = e[1].get_ref<const std::string&>();
        }
        auto ia = bpe.token_to_id_.find(a), ib = bpe.token_to_id_.find(b);
        PEREGRINE_CHECK(ia != bpe.token_to_id_.end() && ib != bpe.token_to_id_.end(),
                        "tokenizer.json: merge '{} {}' uses a token missing from the vocabulary", a, b);
        merged.assign(a);
        merged.append(prefix_len && b.substr(0, prefix_len) == bpe.continuing_prefix_ ? b.substr(prefix_len) : b);
        auto im = bpe.token_to_id_.find(merged);
        PEREGRINE_CHECK(im != bpe.token_to_id_.end(), "tokenizer.json: merge result '{}' is not in the vocabulary",
                        merged);
        items.push_back({pair_key(ia->second, ib->second), MergeInfo{static_cast<uint32_t>(r), im->second}});
    }
    bpe.merges_.build(items);
    return bpe;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
    auto it = token_to_id_.find(token);
    if (it == token_to_id_.end()) return std::nullopt;
    return it->second;
}

void BpeModel::merge(std::vector<int32_t>& sym) const {
    size_t n = sym.size();
    if (n < 2) return;
    if (n <= 48) {
        // Short pieces: rescan for the best pair; fewer moving parts than the heap, same result.
        while (sym.size() >= 2) {
            uint32_t best_rank = UINT32_MAX;
            size_t best = 0;
            int32_t best_id = -1;
            for (size_t i = 0; i + 1 < sym.size(); ++i) {
                const MergeInfo* mi = merges_.find(pair_key(sym[i], sym[i + 1]));
                if (mi && mi->rank < best_rank) {
                    best_rank = mi->rank;
                    best = i;
                    best_id = mi->new_id;
                }
            }
            if (best_id < 0) break;
            sym[best] = best_id;
            sym.erase(sym.begin() + static_cast<long>(best) + 1);
        }
        return;
    }
    // Long pieces: linked list + priority queue ordered by (rank, position), stale entries skipped.
    struct Node {
        int32_t id;
        int32_t prev, next;
        bool alive;
    };
    std::vector<Node> nodes(n);
    for (size_t i = 0; i < n; ++i)
        nodes[i] = {sym[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
    struct Cand {
        uint32_t rank;
        int32_t pos;
        int32_t new_id;
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
    for (size_t i = 0; i + 1 < n; ++i)
        if (const MergeInfo* mi = merges_.find(pair_key(sym[i], sym[i + 1])))
            q.push({mi->rank, static_cast<int32_t>(i), mi->new_id});
    while (!q.empty()) {
        Cand c = q.top();
        q.pop();
        Node& left = nodes[c.pos];
        if (!left.alive || left.next < 0) continue;
        Node& right = nodes[left.next];
        const MergeInfo* mi = merges_.find(pair_key(left.id, right.id));
        if (!mi || mi->new_id != c.new_id) continue;
        left.id = c.new_id;
        right.alive = false;
        left.next = right.next;
        if (right.next >= 0) nodes[right.next].prev = c.pos;
        if (left.prev >= 0)
            if (const MergeInfo* p = merges_.find(pair_key(nodes[left.prev].id, left.id)))
                q.push({p->rank, left.prev, p->new_id});
        if (left.next >= 0)
            if (const MergeInfo* p = merges_.find(pair_key(left.id, nodes[left.next].id)))
                q.push({p->rank, c.pos, p->new_id});
    }
    sym.clear();
    for (auto& nd : nodes)
        if (nd.alive) sym.push_back(nd.id);
}

void BpeModel::encode_uncached(std::string_view piece, std::vector<int32_t>& out) const {
    if (ignore_merges_) {
        auto it = piece_to_id_.find(piece);
        if (it != piece_to_id_.end()) {
            out.push_back(it->second);
            return;
        }
    }
    std::vector<int32_t> sym;
    sym.reserve(piece.size());
    // Unknown characters become unk (fused when fuse_unk) or, without unk_token, are dropped.
    bool pending_unk = false;
    auto push_known = [&](int32_t id) {
        if (pending_unk) sym.push_back(*unk_id_), pending_unk = false;
        sym.push_back(id);
    };
    auto push_unknown = [&] {
        if (!unk_id_) return;
        if (pending_unk && !fuse_unk_) sym.push_back(*unk_id_);
        pending_unk = true;
    };
    if (byte_level_ && continuing_prefix_.empty() && end_suffix_.empty()) {
        for (unsigned char b : piece) {
            int32_t id = byte_id_[b];
            if (id >= 0) push_known(id);
            else push_unknown();
        }
    } else {
        std::string key;
        size_t i = 0;
        while (i < piece.size()) {
            size_t len = 1;
            if (!byte_level_) {
                char32_t cp;
                len = utf8_decode(piece, i, cp);
            }
            key.clear();
            if (i > 0) key += continuing_prefix_;
            if (byte_level_) utf8_append(key, byte_to_char(static_cast<uint8_t>(piece[i])));
            else key.append(piece.substr(i, len));
            if (i + len == piece.size()) key += end_suffix_;
            auto it = token_to_id_.find(key);
            if (it != token_to_id_.end()) push_known(it->second);
            else push_unknown();
            i += len;
        }
    }
    if (pending_unk) sym.push_back(*unk_id_);
    merge(sym);
    out.insert(out.end(), sym.begin(), sym.end());
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.empty()) return;
    if (piece.size() > kMaxCachedPiece) return encode_uncached(piece, out);
    size_t h = Hash{}(piece);
    Shard& sh = cache_[h % kShards];
    {
        std::lock_guard<std::mutex> lk(sh.mu);
        auto it = sh.map.find(piece);
        if (it != sh.map.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    size_t start = out.size();
    encode_uncached(piece, out);
    std::lock_guard<std::mutex> lk(sh.mu);
    if (sh.map.size() >= kShardCapacity) sh.map.clear();
    sh.map.emplace(std::string(piece), std::vector<int32_t>(out.begin() + static_cast<long>(start), out.end()));
}

}  // namespace peregrine
