// Feeds arbitrary bytes to the demo model's tokenizer (models/peregrine-demo-v4/tokenizer.json): encode with
// and without special-token parsing, decode the ids, and for valid UTF-8 without specials check that decoding
// gives the input back byte for byte. A mismatch, an exception or a crash is a finding.
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace peregrine;
    static const Tokenizer tok = Tokenizer::from_file(PEREGRINE_DEMO_TOKENIZER);
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const auto plain = tok.encode(text, false, false);
    const auto special = tok.encode(text, true, true);
    for (int32_t id : special)
        if (!tok.is_valid(id)) std::abort();
    tok.decode(special, true);
    if (utf8_is_valid(text) && tok.decode(plain) != text) {
        std::fprintf(stderr, "decode(encode(text)) differs from the text\n");
        std::abort();
    }
    return 0;
}
