// Feeds a tokenizer.json text to the tokenizer loader, then encodes and decodes a short text with what it built.
// Refusals (peregrine's errors naming the problem, the JSON library's parse and type errors, which Tokenizer::from_file
// names the file for) are expected; a crash, undefined behaviour, or any other escape is a finding.
#include "tokenizer/tokenizer.h"
#include "util/error.h"

#include <nlohmann/json.hpp>

#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace peregrine;
    try {
        const Tokenizer tok =
            Tokenizer::from_json_text(std::string_view(reinterpret_cast<const char*>(data), size));
        const auto ids = tok.encode("Hello, world! 12 <x>", true, true);
        tok.decode(ids, true);
    } catch (const Error&) {
    } catch (const nlohmann::json::exception&) {
    }
    return 0;
}
