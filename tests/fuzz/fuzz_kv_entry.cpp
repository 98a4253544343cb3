// Feeds bytes to the storage tier's entry decoder as a file or a Redis value would hold them (another server's,
// a truncated or corrupt one), checked against the identity its header claims (so the fuzzer reaches the checksum
// and the sizes) and against a fixed one. A decoded row must have exactly the sizes asked for; a crash, an
// out-of-bounds read or a row of other sizes is a finding.
#include "kv/page_store.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace {

using namespace peregrine;

void check(const EntryId& id, std::span<const uint8_t> blob) {
    auto row = decode_entry(id, blob);
    if (!row) return;
    if (row->history.size() != id.history_bytes ||
        (!row->window.empty() && row->window.size() != id.window_bytes) || blob.size() > max_entry_bytes(id))
        std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::span<const uint8_t> blob(data, size);
    // The identity the header claims: keys, sizes (bounded) and the tokens after it.
    if (size >= 64) {
        uint64_t h[6];
        uint32_t n_tokens;
        std::memcpy(h, data + 8, sizeof h);
        std::memcpy(&n_tokens, data + 56, sizeof n_tokens);
        if (n_tokens <= 4096 && h[4] <= (1u << 20) && h[5] <= (1u << 20) && size >= 64 + 4 * size_t{n_tokens}) {
            std::vector<int32_t> tokens(n_tokens);
            if (n_tokens) std::memcpy(tokens.data(), data + 64, 4 * size_t{n_tokens});
            check({{h[0], h[1]}, {h[2], h[3]}, tokens, h[4], h[5] ? h[5] : 128}, blob);
        }
    }
    // A fixed identity, as a server with this model would ask.
    static const std::vector<int32_t> tokens(16, 7);
    const PageKey parent = identity_key("fuzz");
    check({chain_key(parent, tokens), parent, tokens, 256, 512}, blob);
    return 0;
}
