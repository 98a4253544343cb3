// Feeds a JSON Schema text (as response_format json_schema carries it) to the schema compiler, then compiles
// the grammar over a small vocabulary and walks a few tokens. Errors naming the problem (400s) are expected;
// any other escape or a crash is a finding.
#include "engine/grammar/constraint.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace peregrine;
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        const fuzz::ServeBudget budget;
        fuzz::compile_and_walk(grammar::build_grammar({grammar::ConstraintKind::kJsonSchema, text}), text);
    } catch (const Error&) {
    }
    return 0;
}
