#pragma once
// Which DeepSeek chat encoding a model speaks, and the spellings that differ between them.
#include <string>
#include <string_view>

namespace peregrine {

enum class ChatFormat { deepseek_v41, deepseek_v4 };

// "deepseek-v41" / "deepseek-v4" (the names the CLI takes).
std::string_view chat_format_name(ChatFormat f);
ChatFormat chat_format_from_name(std::string_view name);
// From config.json's model_type: deepseek_v41* -> V4.1, deepseek_v4* -> V4.
ChatFormat chat_format_from_model_type(std::string_view model_type);
ChatFormat chat_format_from_model_dir(const std::string& dir);

// The special tokens of both encodings.
namespace tok {
inline constexpr std::string_view bos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view eos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view system = "<｜System｜>";
inline constexpr std::string_view user = "<｜User｜>";
inline constexpr std::string_view assistant = "<｜Assistant｜>";
inline constexpr std::string_view latest_reminder = "<｜latest_reminder｜>";
inline constexpr std::string_view think_open = "<think>";
inline constexpr std::string_view think_close = "</think>";
inline constexpr std::string_view dsml = "｜DSML｜";  // one token; the '<' / '</' before it are plain text
}  // namespace tok

// DSML tag names: V4.1 writes a space after ｜DSML｜ and calls the block " calls"; V4 uses "tool_calls".
struct DsmlNames {
    std::string_view block;      // " calls" | "tool_calls"
    std::string_view invoke;     // " invoke" | "invoke"
    std::string_view parameter;  // " parameter" | "parameter"
};
DsmlNames dsml_names(ChatFormat f);

}  // namespace peregrine
