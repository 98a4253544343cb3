// peregrine tokenize / detokenize: the tokenizer from the command line, byte-exact both ways.
//   tokenize   --tokenizer FILE|--model DIR (--text T | --file F | --jsonl-file F) [--json] [--special] [--add-bos]
//   detokenize --tokenizer FILE|--model DIR (--ids 1,2,3 | --jsonl-file F) [--skip-special]
#include "commands.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>

namespace peregrine {

namespace {
struct Source {
    std::string tokenizer, model;
};

void add_source(CLI::App* cmd, Source& src) {
    auto* a = cmd->add_option("--tokenizer", src.tokenizer, "tokenizer.json file");
    auto* b = cmd->add_option("--model", src.model, "Model directory holding tokenizer.json");
    a->excludes(b);
}

Tokenizer load(const Source& src) {
    PEREGRINE_CHECK(!src.tokenizer.empty() || !src.model.empty(), "give --tokenizer FILE or --model DIR");
    return src.tokenizer.empty() ? Tokenizer::from_model_dir(src.model) : Tokenizer::from_file(src.tokenizer);
}

void write_all(const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); }

std::string ids_line(const std::vector<int32_t>& ids, bool as_json) {
    std::string out = as_json ? "[" : "";
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += as_json ? "," : " ";
        out += std::to_string(ids[i]);
    }
    if (as_json) out += "]";
    return out + "\n";
}

std::vector<int32_t> parse_ids(const std::string& s) {
    std::vector<int32_t> ids;
    std::string cur;
    auto flush = [&] {
        if (cur.empty()) return;
        size_t used = 0;
        long long v = 0;
        try {
            v = std::stoll(cur, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        PEREGRINE_CHECK(used == cur.size() && v >= INT32_MIN && v <= INT32_MAX, "bad token id '{}'", cur);
        ids.push_back(static_cast<int32_t>(v));
        cur.clear();
    };
    for (char c : s) {
        if (c == ',' || c == ' ' || c == '[' || c == ']' || c == '\n' || c == '\t') flush();
        else cur += c;
    }
    flush();
    return ids;
}
}  // namespace

static RegisterCommand reg_tokenize([](CLI::App& app, int& exit_code) {
    auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
    auto src = std::make_shared<Source>();
    auto text = std::make_shared<std::string>();
    auto file = std::make_shared<std::string>();
    auto jsonl = std::make_shared<std::string>();
    auto as_json = std::make_shared<bool>(false);
    auto special = std::make_shared<bool>(false);
    auto add_bos = std::make_shared<bool>(false);
    add_source(cmd, *src);
    auto* o_text = cmd->add_option("--text", *text, "Text to tokenize");
    auto* o_file = cmd->add_option("--file", *file, "File whose bytes are the text (- for stdin)");
    auto* o_jsonl = cmd->add_option("--jsonl-file", *jsonl,
                                    "Batch mode: one JSON string per line in, one JSON array per line out");
    o_text->excludes(o_file)->excludes(o_jsonl);
    o_file->excludes(o_jsonl);
    cmd->add_flag("--json", *as_json, "Print one JSON array on one line");
    cmd->add_flag("--special", *special, "Recognise added/special token strings in the text (as HF encode does)");
    cmd->add_flag("--add-bos", *add_bos, "Prepend the BOS token");
    cmd->callback([=, &exit_code] {
        Tokenizer tok = load(*src);
        std::optional<int32_t> bos;
        if (*add_bos) {
            bos = tok.bos_id();
            PEREGRINE_CHECK(bos.has_value(), "--add-bos: no BOS token known (no tokenizer_config.json bos_token and "
                                             "no post-processor special token)");
        }
        auto run = [&](std::string_view t) {
            std::vector<int32_t> ids = tok.encode(t, *special);
            if (bos) ids.insert(ids.begin(), *bos);
            return ids;
        };
        if (!jsonl->empty()) {
            std::ifstream in(*jsonl, std::ios::binary);
            PEREGRINE_CHECK(in.good(), "cannot open {}", *jsonl);
            std::string line, out;
            while (std::getline(in, line)) {
                if (line.empty()) continue;
                auto j = nlohmann::json::parse(line);
                PEREGRINE_CHECK(j.is_string(), "--jsonl-file: each line must be a JSON string");
                out += ids_line(run(j.get_ref<const std::string&>()), true);
            }
            write_all(out);
        } else {
            PEREGRINE_CHECK(o_text->count() || o_file->count(), "give --text, --file or --jsonl-file");
            std::string input;
            if (o_text->count()) {
                input = *text;
            } else if (*file == "-") {
                std::string buf(1 << 16, '\0');
                size_t n;
                while ((n = std::fread(buf.data(), 1, buf.size(), stdin)) > 0) input.append(buf.data(), n);
            } else {
                input = read_file(*file);
            }
            write_all(ids_line(run(input), *as_json));
        }
        exit_code = 0;
    });
});

static RegisterCommand reg_detokenize([](CLI::App& app, int& exit_code) {
    auto* cmd = app.add_subcommand("detokenize", "Print the text of token ids, byte-exact");
    auto src = std::make_shared<Source>();
    auto ids = std::make_shared<std::string>();
    auto jsonl = std::make_shared<std::string>();
    auto skip = std::make_shared<bool>(false);
    add_source(cmd, *src);
    auto* o_ids = cmd->add_option("--ids", *ids, "Comma-separated ids, e.g. 1,2,3");
    auto* o_jsonl = cmd->add_option("--jsonl-file", *jsonl,
                                    "Batch mode: one JSON id array per line in, one JSON string per line out "
                                    "(invalid UTF-8 shown as U+FFFD)");
    o_ids->excludes(o_jsonl);
    cmd->add_flag("--skip-special", *skip, "Leave out special tokens");
    cmd->callback([=, &exit_code] {
        Tokenizer tok = load(*src);
        if (!jsonl->empty()) {
            std::ifstream in(*jsonl, std::ios::binary);
            PEREGRINE_CHECK(in.good(), "cannot open {}", *jsonl);
            std::string line, out;
            while (std::getline(in, line)) {
                if (line.empty()) continue;
                std::string text = tok.decode(parse_ids(line), *skip);
                out += nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
            }
            write_all(out);
        } else {
            PEREGRINE_CHECK(o_ids->count(), "give --ids or --jsonl-file");
            write_all(tok.decode(parse_ids(*ids), *skip));
        }
        exit_code = 0;
    });
});

}  // namespace peregrine
