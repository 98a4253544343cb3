#pragma once
// Testing aid (`peregrine serve --scripted-output FILE`): a JSON list of completions, each the exact text
// the model must emit. Every generating chat or messages request takes the next completion, tokenized with
// the model's tokenizer (added tokens such as ｜DSML｜ and </think> as their ids), and the engine is forced
// to sample those tokens one by one through its normal path (a LogitProcessor masking every other token),
// so tool calls and thinking occur on demand with any model. When the list is used up, requests sample
// normally.
#include "engine/request.h"
#include "tokenizer/tokenizer.h"

#include <deque>
#include <memory>
#include <mutex>
#include <string>

namespace peregrine {

class ScriptedOutput {
public:
    static std::shared_ptr<ScriptedOutput> from_file(const std::string& path);
    explicit ScriptedOutput(std::deque<std::string> completions) : left_(std::move(completions)) {}
    // The processor forcing the next completion; null once the script is used up.
    std::shared_ptr<LogitProcessor> next(const Tokenizer& tok);

private:
    std::mutex mu_;
    std::deque<std::string> left_;
};

}  // namespace peregrine
