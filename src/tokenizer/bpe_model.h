#pragma once
// tokenizer.json "model" of type BPE: vocabulary, ranked merges, and the merge loop of HF tokenizers
// (lowest rank first, leftmost first among equal ranks), with a bounded per-piece cache.
#include <array>
#include <memory>
#include <cstdint>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace peregrine {

// A token id of tokenizer.json (vocabulary, added tokens, post-processor): an integer in 0..kMaxTokenId, since ids
// index dense tables; anything else fails naming `what` (a float would convert with undefined behaviour, a negative
// id would index before the tables, a huge one allocate them).
constexpr int32_t kMaxTokenId = (1 << 24) - 1;
int32_t json_token_id(const nlohmann::json& v, const char* what);

class BpeModel {
public:
    // `byte_level`: pieces arrive as raw bytes and each byte is the vocabulary's byte character.
    static BpeModel from_json(const nlohmann::json& model, bool byte_level);
    BpeModel(BpeModel&&) noexcept;
    BpeModel& operator=(BpeModel&&) noexcept;
    ~BpeModel();

    // Appends the ids of one pre-token piece.
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

    const std::vector<std::string>& id_to_token() const { return id_to_token_; }
    std::optional<int32_t> token_to_id(std::string_view token) const;
    size_t size() const { return token_to_id_.size(); }
    int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

private:
    struct Hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    BpeModel() = default;
    void merge(std::vector<int32_t>& symbols) const;
    void encode_uncached(std::string_view piece, std::vector<int32_t>& out) const;

    struct MergeInfo {
        uint32_t rank;
        int32_t new_id;
    };
    // Open-addressing table from (left id, right id) to the merge.
    struct PairTable {
        std::vector<uint64_t> keys;
        std::vector<MergeInfo> vals;
        uint64_t mask = 0;
        void build(const std::vector<std::pair<uint64_t, MergeInfo>>& items);
        const MergeInfo* find(uint64_t key) const;
    };

    std::vector<std::string> id_to_token_;
    std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> token_to_id_;
    // Key of a piece in "piece space": raw bytes when byte-level, the token text otherwise.
    std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> piece_to_id_;
    std::array<int32_t, 256> byte_id_{};
    PairTable merges_;
    bool byte_level_ = false;
    bool ignore_merges_ = false;
    std::optional<int32_t> unk_id_;
    bool fuse_unk_ = false;
    std::string continuing_prefix_, end_suffix_;

    // Per-piece result cache, sharded to keep lock contention low when several threads encode.
    static constexpr size_t kShards = 16, kShardCapacity = 8192, kMaxCachedPiece = 256;
    struct Shard {
        std::mutex mu;
        std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map;
    };
    std::unique_ptr<Shard[]> cache_ = std::make_unique<Shard[]>(kShards);
};

}  // namespace peregrine
