// Released text and stop strings, including stop strings split across tokens and partial UTF-8.
#include "engine/text_stream.h"
#include "tokenizer/byte_tokenizer.h"

#include <gtest/gtest.h>

using namespace peregrine;

namespace {
// Feeds text byte by byte (one token per byte with the byte tokenizer); returns what was released.
std::string run(TextStream& ts, const std::string& text, size_t* stopped_at = nullptr) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        out += ts.push(static_cast<uint8_t>(text[i]));
        if (ts.stopped()) {
            if (stopped_at) *stopped_at = i;
            return out;
        }
    }
    return out + ts.flush();
}
}  // namespace

TEST(TextStream, ByteTokenizerRoundTrips) {
    Tokenizer tok = byte_tokenizer();
    std::string s = "héllo <｜User｜> \x01 日本";
    auto ids = tok.encode(s, true);
    ASSERT_EQ(ids.size(), s.size());
    for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(ids[i], static_cast<uint8_t>(s[i]));
    TextStream ts(&tok, {}, true);
    EXPECT_EQ(run(ts, s), s);
}

TEST(TextStream, StopStringAcrossTokens) {
    Tokenizer tok = byte_tokenizer();
    TextStream ts(&tok, {"END", "日本"}, true);
    size_t at = 0;
    EXPECT_EQ(run(ts, "abc EN ENxEND tail", &at), "abc EN ENx");
    EXPECT_TRUE(ts.stopped());
    EXPECT_EQ(ts.matched(), "END");
    EXPECT_EQ(at, 12u);
    TextStream ts2(&tok, {"END", "日本"}, true);
    EXPECT_EQ(run(ts2, "x日本y"), "x");
    EXPECT_EQ(ts2.matched(), "日本");
    TextStream ts3(&tok, {"END"}, true);
    EXPECT_EQ(run(ts3, "no stop EN"), "no stop EN");  // held-back tail released at the end
    EXPECT_FALSE(ts3.stopped());
}

TEST(TextStream, HeldBackTextIsNotReleasedEarly) {
    Tokenizer tok = byte_tokenizer();
    TextStream ts(&tok, {"STOP"}, true);
    EXPECT_EQ(ts.push('a'), "a");
    EXPECT_EQ(ts.push('S'), "");
    EXPECT_EQ(ts.push('T'), "");
    EXPECT_EQ(ts.push('x'), "STx");
}
