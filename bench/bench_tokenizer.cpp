// Tokenizer encode/decode throughput on one core, in MB of UTF-8 input per second.
//   PEREGRINE_BENCH_TOKENIZER=path/to/tokenizer.json (default: tests/fixtures/tokenizer-small)
//   PEREGRINE_BENCH_TEXT=path/to/text (default: a generated 4 MB mix of prose, code, CJK, digits, emoji)
#include "util/switches.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "util/file.h"

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>

using namespace peregrine;

namespace {
std::string env_or(const char* name, const std::string& fallback) {
    const std::string v = switch_value(name);
    return v.empty() ? fallback : v;
}

const Tokenizer& bench_tokenizer() {
    static const Tokenizer t =
        Tokenizer::from_file(env_or("PEREGRINE_BENCH_TOKENIZER", std::string(PEREGRINE_TEST_DATA) +
                                                                     "/tokenizer-small/tokenizer.json"));
    return t;
}

// Mixed text with a long tail of distinct words (random syllables), so the per-piece cache sees
// realistic misses rather than a handful of repeated strings.
std::string generated_text(size_t bytes) {
    static const char* syll[] = {"ka", "lo", "mi", "tra", "ven", "os", "qu", "ing", "the", "an", "er", "st",
                                 "pre", "ly", "tion", "ab", "ze", "ro", "ph", "ch"};
    static const char* code[] = {
        "for (int i = 0; i < n; ++i) {\n    sum += a[i];\n}\n", "def f(x):\n    return x ** 2  # square\n",
        "{\"key\": [1, 2.5, null], \"ok\": true}\n", "    if (ptr != nullptr && ptr->next) { return ptr->value; }\n"};
    static const char* emoji[] = {"😀", "👍🏽", "🚀", "❤️", "🇫🇷"};
    std::mt19937 rng(42);
    std::string s;
    s.reserve(bytes + 256);
    while (s.size() < bytes) {
        unsigned r = rng() % 100;
        if (r < 70) {
            int n = 1 + rng() % 4;
            std::string w;
            for (int k = 0; k < n; ++k) w += syll[rng() % 20];
            if (rng() % 10 == 0) w[0] = static_cast<char>(w[0] - 32);
            s += w;
            s += (rng() % 12 == 0) ? ". " : (rng() % 15 == 0 ? ",\n" : " ");
        } else if (r < 78) {
            s += code[rng() % 4];
        } else if (r < 90) {
            for (int k = 0, n = 2 + rng() % 8; k < n; ++k) {
                char32_t cp = 0x4E00 + rng() % 3000;
                s += static_cast<char>(0xE0 | (cp >> 12));
                s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                s += static_cast<char>(0x80 | (cp & 0x3F));
            }
            s += "，";
        } else if (r < 96) {
            s += std::to_string(rng() % 1000000) + (rng() % 2 ? "." + std::to_string(rng() % 100) : "") + " ";
        } else if (r < 98) {
            s += emoji[rng() % 5];
            s += " ";
        } else {
            s += "\n\n    \t";
        }
    }
    return s;
}

const std::string& bench_text() {
    static const std::string text = [] {
        std::string path = env_or("PEREGRINE_BENCH_TEXT", "");
        return path.empty() ? generated_text(4 << 20) : read_file(path);
    }();
    return text;
}

void BM_Encode(benchmark::State& state) {
    const Tokenizer& t = bench_tokenizer();
    const std::string& text = bench_text();
    size_t n = 0;
    for (auto _ : state) {
        auto ids = t.encode(text);
        n = ids.size();
        benchmark::DoNotOptimize(ids.data());
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
    state.counters["tokens"] = static_cast<double>(n);
}
BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_Decode(benchmark::State& state) {
    const Tokenizer& t = bench_tokenizer();
    const std::string& text = bench_text();
    auto ids = t.encode(text);
    for (auto _ : state) {
        std::string s = t.decode(ids);
        benchmark::DoNotOptimize(s.data());
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond);

void BM_StreamDecode(benchmark::State& state) {
    const Tokenizer& t = bench_tokenizer();
    const std::string& text = bench_text();
    auto ids = t.encode(text);
    for (auto _ : state) {
        StreamDecoder sd(t);
        size_t total = 0;
        for (int32_t id : ids) total += sd.push(id).size();
        total += sd.flush().size();
        benchmark::DoNotOptimize(total);
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}
BENCHMARK(BM_StreamDecode)->Unit(benchmark::kMillisecond);
}  // namespace

BENCHMARK_MAIN();
