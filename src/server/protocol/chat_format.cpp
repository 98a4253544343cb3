#include "server/protocol/chat_format.h"

#include "util/error.h"
#include "util/file.h"

#include <nlohmann/json.hpp>

namespace peregrine {

std::string_view chat_format_name(ChatFormat f) {
    return f == ChatFormat::deepseek_v41 ? "deepseek-v41" : "deepseek-v4";
}

ChatFormat chat_format_from_name(std::string_view name) {
    if (name == "deepseek-v41" || name == "deepseek_v41") return ChatFormat::deepseek_v41;
    if (name == "deepseek-v4" || name == "deepseek_v4") return ChatFormat::deepseek_v4;
    fail("unknown chat format '{}' (expected deepseek-v41 or deepseek-v4)", name);
}

ChatFormat chat_format_from_model_type(std::string_view mt) {
    if (mt.starts_with("deepseek_v41")) return ChatFormat::deepseek_v41;
    if (mt.starts_with("deepseek_v4")) return ChatFormat::deepseek_v4;
    fail("model_type '{}' has no DeepSeek chat format (expected deepseek_v41 or deepseek_v4)", mt);
}

ChatFormat chat_format_from_model_dir(const std::string& dir) {
    std::string path = dir + "/config.json";
    PEREGRINE_CHECK(file_exists(path), "{} not found", path);
    auto cfg = nlohmann::json::parse(read_file(path), nullptr, false);
    PEREGRINE_CHECK(cfg.is_object() && cfg.contains("model_type") && cfg["model_type"].is_string(),
                    "{}: no model_type", path);
    return chat_format_from_model_type(cfg["model_type"].get<std::string>());
}

DsmlNames dsml_names(ChatFormat f) {
    if (f == ChatFormat::deepseek_v41) return {" calls", " invoke", " parameter"};
    return {"tool_calls", "invoke", "parameter"};
}

}  // namespace peregrine
