// Unit behaviour of the tokenizer layer; id parity with HF tokenizers is checked by the pytest files.
#include "tokenizer/engram_token_map.h"
#include "tokenizer/regex.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

using namespace peregrine;

namespace {
const std::string kSmall = std::string(PEREGRINE_TEST_DATA) + "/tokenizer-small/tokenizer.json";

const Tokenizer& small() {
    static const Tokenizer t = Tokenizer::from_file(kSmall);
    return t;
}
}  // namespace

TEST(Utf8, RepairMatchesPythonReplace) {
    // Expected values from Python: bytes.decode("utf-8", errors="replace").
    EXPECT_EQ(utf8_repair("abc"), "abc");
    EXPECT_EQ(utf8_repair("\xff"), "\xEF\xBF\xBD");
    EXPECT_EQ(utf8_repair("\xe4\xb8"), "\xEF\xBF\xBD");                                  // truncated: one U+FFFD
    EXPECT_EQ(utf8_repair("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");       // surrogate: three
    EXPECT_EQ(utf8_repair("\xc0\xaf"), "\xEF\xBF\xBD\xEF\xBF\xBD");                       // overlong
    EXPECT_EQ(utf8_repair("\xf0\x9f\x98x"), "\xEF\xBF\xBDx");
    EXPECT_EQ(utf8_repair(std::string("a\0b", 3)), std::string("a\0b", 3));
    EXPECT_TRUE(utf8_is_valid("\xf0\x9f\x98\x80"));
    EXPECT_FALSE(utf8_is_valid("\xf4\x90\x80\x80"));
}

TEST(Utf8, CompletePrefixHoldsOnlyIncompleteTails) {
    EXPECT_EQ(utf8_complete_prefix("ab"), 2u);
    EXPECT_EQ(utf8_complete_prefix("a\xe4\xb8"), 1u);
    EXPECT_EQ(utf8_complete_prefix("a\xe4\xb8\xad"), 4u);
    EXPECT_EQ(utf8_complete_prefix("\xf0\x9f\x98"), 0u);
    EXPECT_EQ(utf8_complete_prefix("a\xff"), 2u);      // can never complete: released
    EXPECT_EQ(utf8_complete_prefix("a\xe4" "b"), 3u);  // broken sequence: released
    EXPECT_EQ(utf8_complete_prefix("\xed\xa0"), 2u);   // surrogate start is invalid, not incomplete
}

TEST(Regex, TranslatesOnigurumaConstructs) {
    std::string t = Regex::translate("\\s+\\u4e00[\\s\\w]\\S");
    EXPECT_NE(t.find("\\x{85}"), std::string::npos);
    EXPECT_NE(t.find("\\x{4e00}"), std::string::npos);
    EXPECT_EQ(t.find("\\s"), std::string::npos);
    std::vector<Span> m;
    Regex("\\p{So}").find_all("a\xf0\x9f\xa9\xb7" "b", m);  // U+1FA77, assigned in Unicode 15
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0].begin, 1u);
    Regex("\\s").find_all("a\xc2\x85" "b\xe1\xa0\x8e", m);  // U+0085 is space, U+180E is not
    ASSERT_EQ(m.size(), 1u);
    EXPECT_EQ(m[0].begin, 1u);
    Regex("a*").find_all("baac", m);  // empty matches next to a match are skipped
    ASSERT_EQ(m.size(), 3u);  // [0,0) [1,3) [4,4), as Rust's find_iter
    EXPECT_EQ(m[1].begin, 1u);
    EXPECT_EQ(m[1].end, 3u);
}

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
    const Tokenizer& t = small();
    int32_t user = t.token_id("<｜User｜>");
    ASSERT_GE(user, 0);
    auto plain = t.encode("<｜User｜>hi");
    auto special = t.encode("<｜User｜>hi", true);
    EXPECT_GT(plain.size(), 2u);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), user), 0);
    ASSERT_GE(special.size(), 2u);
    EXPECT_EQ(special[0], user);
    EXPECT_EQ(t.decode(plain), "<｜User｜>hi");
    EXPECT_EQ(t.decode(special), "<｜User｜>hi");
}

TEST(Tokenizer, TokenBytesAndLookups) {
    const Tokenizer& t = small();
    EXPECT_EQ(t.vocab_size(), 4096);
    int32_t b = t.token_id("\xc3\xa4");  // byte 0xE4 is the character U+00E4 in byte-level form
    ASSERT_GE(b, 0);
    EXPECT_EQ(t.token_bytes(b), "\xe4");
    int32_t sp = t.token_id("\xc4\xa0");  // "Ġ" = space
    ASSERT_GE(sp, 0);
    EXPECT_EQ(t.token_bytes(sp), " ");
    EXPECT_EQ(t.token_bytes(0), "<｜begin▁of▁sentence｜>");
    EXPECT_TRUE(t.is_special(0));
    EXPECT_FALSE(t.is_special(t.token_id("<｜User｜>")));
    EXPECT_EQ(t.token_id("no such token"), -1);
    std::vector<int32_t> ids{0, sp, 1};
    EXPECT_EQ(t.decode(ids, true), " ");
    EXPECT_THROW(t.token_bytes(100000), Error);
}

TEST(Tokenizer, InvalidUtf8IsEncodedAsReplacementCharacter) {
    const Tokenizer& t = small();
    EXPECT_EQ(t.encode("a\xff" "b"), t.encode("a\xEF\xBF\xBD" "b"));
    EXPECT_EQ(t.encode("\xe4\xb8"), t.encode("\xEF\xBF\xBD"));
    EXPECT_TRUE(t.encode("").empty());
}

TEST(StreamDecoder, EmitsOnlyCompleteCharacters) {
    const Tokenizer& t = small();
    std::string text = "Hello 你好, 世界! 😀👨‍👩‍👧 naïve";
    auto ids = t.encode(text);
    ASSERT_GT(ids.size(), text.size() / 4);  // CJK and emoji are byte tokens in this small vocabulary
    StreamDecoder sd(t);
    std::string all;
    size_t held = 0;
    for (int32_t id : ids) {
        std::string piece = sd.push(id);
        EXPECT_TRUE(utf8_is_valid(piece)) << piece;
        if (piece.empty()) ++held;
        all += piece;
    }
    all += sd.flush();
    EXPECT_EQ(all, text);
    EXPECT_GT(held, 0u);
}

TEST(StreamDecoder, RandomIdsConcatenateToDecode) {
    const Tokenizer& t = small();
    std::mt19937 rng(5);
    for (int rep = 0; rep < 200; ++rep) {
        std::vector<int32_t> ids(rng() % 20);
        for (auto& id : ids) id = static_cast<int32_t>(rng() % t.vocab_size());
        StreamDecoder sd(t);
        std::string all;
        for (int32_t id : ids) all += sd.push(id);
        std::string tail = sd.flush();
        EXPECT_LE(tail.size(), 3u);
        EXPECT_EQ(all + tail, t.decode(ids));
    }
}

// A model may sample an id its tokenizer has no entry for (vocabularies padded beyond the tokenizer's): no text,
// and the stream goes on (the engine reports the id itself).
TEST(StreamDecoder, IdsOutsideTheVocabularyAddNoText) {
    const Tokenizer& t = small();
    StreamDecoder sd(t);
    const int32_t a = t.token_id("a");
    ASSERT_GE(a, 0);
    EXPECT_EQ(sd.push(t.vocab_size()), "");
    EXPECT_EQ(sd.push(t.vocab_size() + 1000), "");
    EXPECT_EQ(sd.push(a), "a");
    EXPECT_EQ(sd.flush(), "");
}

TEST(StreamDecoder, TruncatedCharacterComesOutOnFlush) {
    const Tokenizer& t = small();
    int32_t e4 = t.token_id("\xc3\xa4");
    StreamDecoder sd(t);
    EXPECT_EQ(sd.push(e4), "");
    EXPECT_EQ(sd.flush(), "\xe4");
}

TEST(Tokenizer, ConcurrentEncodeIsConsistent) {
    const Tokenizer& t = small();
    std::string text;
    for (int i = 0; i < 200; ++i) text += "Thread " + std::to_string(i) + " says: to be, or not to be? 你好\n";
    auto want = t.encode(text);
    std::vector<std::thread> th;
    std::vector<int> ok(4, 0);
    for (int k = 0; k < 4; ++k)
        th.emplace_back([&, k] {
            for (int r = 0; r < 20; ++r) ok[k] += t.encode(text) == want;
        });
    for (auto& x : th) x.join();
    for (int k = 0; k < 4; ++k) EXPECT_EQ(ok[k], 20);
}

TEST(Tokenizer, UnsupportedModelIsNamed) {
    try {
        Tokenizer::from_json_text(R"({"model": {"type": "Unigram", "vocab": []}})");
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("Unigram"), std::string::npos);
    }
}

TEST(EngramTokenMap, KeysFollowTheNormalizationChain) {
    const Tokenizer& t = small();
    int32_t the = t.token_id("the"), The = t.token_id("The"), sp_the = t.token_id("\xc4\xa0the");
    ASSERT_GE(the, 0);
    ASSERT_GE(The, 0);
    ASSERT_GE(sp_the, 0);
    EXPECT_EQ(engram_token_key(t, The), "the");
    EXPECT_EQ(engram_token_key(t, sp_the), "the");  // stripped
    EXPECT_EQ(engram_token_key(t, t.token_id("\xc4\xa0")), " ");  // a lone space survives Strip
    EXPECT_EQ(engram_token_key(t, t.token_id("\xc3\xa4")), "\xc3\xa4");  // partial UTF-8: raw token text
    auto m = build_engram_token_map(t);
    EXPECT_EQ(m.id_to_class[the], m.id_to_class[The]);
    EXPECT_EQ(m.id_to_class[0], 0);
    EXPECT_LT(m.num_classes, t.vocab_size());
}

// Token ids of a corrupt tokenizer.json are refused naming what they are: ids index dense tables, so a negative one
// would write before them, a huge one allocate gigabytes, and a float convert with undefined behaviour.
TEST(Tokenizer, CorruptIdsAreNamed) {
    const std::string ok = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}})";
    EXPECT_EQ(Tokenizer::from_json_text(ok).encode("ab", false, false).size(), 2u);
    const std::vector<std::pair<std::string, std::string>> cases = {
        {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": -5}, "merges": []}})", "vocab id -5 is not a token id"},
        {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1e30}, "merges": []}})", "vocab id 1e+30 is not"},
        {R"({"model": {"type": "BPE", "vocab": {"a": 2147483647}, "merges": []}})", "vocab id 2147483647 is not"},
        {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
            "added_tokens": [{"id": -1, "content": "<x>"}]})", "added token id -1 is not"},
        {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
            "post_processor": {"type": "BertProcessing", "cls": ["a", 2.5], "sep": ["a", 0]}})", "cls id 2.5 is not"},
    };
    for (const auto& [text, says] : cases) {
        std::string msg;
        try {
            Tokenizer::from_json_text(text);
        } catch (const std::exception& e) {
            msg = e.what();
        }
        EXPECT_NE(msg.find(says), std::string::npos) << says << ": " << msg;
    }
}
