#include "tokenizer/tokenizer.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/file.h"

#include <nlohmann/json.hpp>

#include <deque>

namespace peregrine {

using json = nlohmann::json;

namespace {
std::string token_content(const json& j) {
    if (j.is_string()) return j.get<std::string>();
    if (j.is_object() && j.contains("content")) return j["content"].get<std::string>();
    return {};
}
}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
    PEREGRINE_CHECK(file_exists(path), "tokenizer file not found: {}", path);
    try {
        return from_json_text(read_file(path));
    } catch (const json::exception& e) {
        fail("{}: malformed tokenizer.json: {}", path, e.what());
    }
}

Tokenizer Tokenizer::from_model_dir(const std::string& dir) {
    Tokenizer t = from_file(dir + "/tokenizer.json");
    std::string cfg_path = dir + "/tokenizer_config.json";
    if (file_exists(cfg_path)) {
        json cfg = json::parse(read_file(cfg_path), nullptr, false);
        if (!cfg.is_discarded() && cfg.contains("bos_token")) {
            int32_t id = t.token_id(token_content(cfg["bos_token"]));
            if (id >= 0) t.bos_id_ = id;
        }
    }
    return t;
}

Tokenizer Tokenizer::from_json_text(std::string_view text) {
    json j = json::parse(text);
    Tokenizer t;
    t.normalizer_ = Normalizer::from_json(j.value("normalizer", json()));
    t.pre_tokenizer_ = PreTokenizer::from_json(j.value("pre_tokenizer", json()));
    PEREGRINE_CHECK(j.contains("model"), "tokenizer.json has no model");
    t.model_ = std::make_unique<BpeModel>(BpeModel::from_json(j["model"], t.pre_tokenizer_.byte_level()));

    json dec = j.value("decoder", json());
    t.decoder_type_ = dec.is_null() ? "null" : dec.value("type", "");
    if (t.decoder_type_ == "Sequence" && dec["decoders"].size() == 1)
        t.decoder_type_ = dec["decoders"][0].value("type", "");

    // Ids: the model's vocabulary, then added tokens (which may reuse vocabulary ids).
    size_t n = static_cast<size_t>(t.model_->max_id() + 1);
    if (j.contains("added_tokens"))
        for (auto& a : j["added_tokens"])
            n = std::max(n, static_cast<size_t>(json_token_id(a.at("id"), "added token id")) + 1);
    t.token_text_.assign(n, std::string());
    t.has_id_.assign(n, 0);
    t.is_special_.assign(n, 0);
    t.is_added_.assign(n, 0);
    const auto& vocab = t.model_->id_to_token();
    for (size_t id = 0; id < vocab.size(); ++id) {
        if (vocab[id].empty()) continue;
        t.token_text_[id] = vocab[id];
        t.has_id_[id] = 1;
        t.text_to_id_.emplace(vocab[id], static_cast<int32_t>(id));
    }
    if (j.contains("added_tokens")) {
        for (auto& a : j["added_tokens"]) {
            AddedToken tok;
            tok.id = json_token_id(a.at("id"), "added token id");
            tok.content = a.at("content").get<std::string>();
            tok.special = a.value("special", false);
            tok.normalized = a.value("normalized", !tok.special);
            tok.lstrip = a.value("lstrip", false);
            tok.rstrip = a.value("rstrip", false);
            tok.single_word = a.value("single_word", false);
            if (tok.content.empty()) continue;
            t.added_.push_back(tok);
            t.token_text_[tok.id] = tok.content;
            t.has_id_[tok.id] = 1;
            t.is_added_[tok.id] = 1;
            t.is_special_[tok.id] = tok.special ? 1 : 0;
            t.text_to_id_[tok.content] = tok.id;
        }
    }
    // Matching order of HF: special tokens first, then the others, each in file order.
    std::vector<const AddedToken*> raw, norm;
    std::vector<std::string> raw_pat, norm_pat;
    for (int pass = 0; pass < 2; ++pass) {
        for (auto& tok : t.added_) {
            if (tok.special != (pass == 0)) continue;
            if (tok.normalized) {
                norm.push_back(&tok);
                norm_pat.push_back(t.normalizer_.apply(tok.content));
            } else {
                raw.push_back(&tok);
                raw_pat.push_back(tok.content);
            }
        }
    }
    t.raw_matcher_.build(std::move(raw), std::move(raw_pat));
    t.normalized_matcher_.build(std::move(norm), std::move(norm_pat));

    t.token_bytes_.resize(n);
    for (size_t id = 0; id < n; ++id)
        t.token_bytes_[id] =
            t.decoder_type_ == "ByteLevel" ? byte_level_decode_token(t.token_text_[id]) : t.token_text_[id];

    // Post-processor.
    json post = j.value("post_processor", json());
    std::vector<json> procs;
    if (!post.is_null()) {
        if (post.value("type", "") == "Sequence") {
            for (auto& p : post["processors"]) procs.push_back(p);
        } else {
            procs.push_back(post);
        }
    }
    for (auto& p : procs) {
        std::string type = p.value("type", "");
        if (type == "ByteLevel") continue;
        if (type == "TemplateProcessing") {
            std::vector<int32_t> pre, suf;
            bool seen_seq = false;
            for (auto& item : p.at("single")) {
                if (item.contains("Sequence")) {
                    seen_seq = true;
                    continue;
                }
                std::string name = item.at("SpecialToken").at("id").get<std::string>();
                for (auto& id : p.at("special_tokens").at(name).at("ids"))
                    (seen_seq ? suf : pre).push_back(json_token_id(id, "post-processor id"));
            }
            t.post_prefix_.insert(t.post_prefix_.begin(), pre.begin(), pre.end());
            t.post_suffix_.insert(t.post_suffix_.end(), suf.begin(), suf.end());
        } else if (type == "BertProcessing" || type == "RobertaProcessing") {
            t.post_prefix_.insert(t.post_prefix_.begin(), json_token_id(p.at("cls").at(1), "cls id"));
            t.post_suffix_.push_back(json_token_id(p.at("sep").at(1), "sep id"));
        } else {
            t.post_supported_ = false;
            t.post_type_ = type;
        }
    }
    if (!t.post_prefix_.empty()) t.bos_id_ = t.post_prefix_.front();
    return t;
}

void Tokenizer::encode_text(std::string_view s, std::vector<int32_t>& out) const {
    if (s.empty()) return;
    thread_local std::vector<std::string_view> pieces;
    thread_local std::deque<std::string> storage;
    pieces.clear();
    storage.clear();
    pre_tokenizer_.split(s, pieces, storage);
    for (auto p : pieces) model_->encode_piece(p, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special, bool add_special) const {
    std::string repaired;
    std::string_view s = text;
    if (!utf8_is_valid(text)) {
        repaired = utf8_repair(text);
        s = repaired;
    }
    std::vector<int32_t> out;
    out.reserve(s.size() / 3 + 4);
    if (add_special) {
        PEREGRINE_CHECK(post_supported_, "tokenizer.json: post_processor '{}' is not supported", post_type_);
        out = post_prefix_;
    }
    auto encode_normalized = [&](std::string_view piece) {
        if (normalizer_.identity()) {
            encode_text(piece, out);
        } else {
            std::string norm = normalizer_.apply(piece);
            encode_text(norm, out);
        }
    };
    if (!parse_special || added_.empty()) {
        encode_normalized(s);
    } else {
        std::vector<TextSegment> outer, inner;
        raw_matcher_.find(s, outer);
        for (auto& seg : outer) {
            if (seg.token >= 0) {
                out.push_back(seg.token);
                continue;
            }
            std::string_view sub = s.substr(seg.begin, seg.end - seg.begin);
            std::string norm = normalizer_.identity() ? std::string(sub) : normalizer_.apply(sub);
            normalized_matcher_.find(norm, inner);
            for (auto& in : inner) {
                if (in.token >= 0) out.push_back(in.token);
                else encode_text(std::string_view(norm).substr(in.begin, in.end - in.begin), out);
            }
        }
    }
    if (add_special) out.insert(out.end(), post_suffix_.begin(), post_suffix_.end());
    return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
    PEREGRINE_CHECK(is_valid(id), "token id {} is not in the vocabulary (size {})", id, vocab_size());
    return token_bytes_[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
    PEREGRINE_CHECK(is_valid(id), "token id {} is not in the vocabulary (size {})", id, vocab_size());
    return token_text_[id];
}

int32_t Tokenizer::token_id(std::string_view token_text) const {
    auto it = text_to_id_.find(std::string(token_text));
    return it == text_to_id_.end() ? -1 : it->second;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
    PEREGRINE_CHECK(decoder_type_ == "ByteLevel", "tokenizer.json: decoder '{}' is not supported (only ByteLevel)",
                    decoder_type_);
    std::string out;
    for (int32_t id : ids) {
        if (skip_special && is_special(id)) continue;
        out += token_bytes(id);
    }
    return out;
}

}  // namespace peregrine
