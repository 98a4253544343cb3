// Feeds a config.json text to the checkpoint configuration reader as the releases' readers call it: the
// shared keys, quantization_config, and the range checks every release must pass. Refusals naming the file
// and key are expected; any other escape (a library's exception text) or a crash is a finding.
#include "io/config_reader.h"
#include "util/error.h"

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace peregrine;
    static const std::string path = "config.json";
    const auto j = nlohmann::json::parse(data, data + size, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return 0;  // the variant reader refuses these before reading keys
    try {
        ModelConfig c;
        ConfigReader r{j, path};
        read_shared_config(r, c);
        if (j.contains("quantization_config")) read_quantization_config(j["quantization_config"], path, c);
        validate_shared_config(c, path);
    } catch (const Error&) {
    }
    return 0;
}
