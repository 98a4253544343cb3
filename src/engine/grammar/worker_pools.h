#pragma once
// Thread pools owned by the grammar engine. util's ThreadPool serves one parallel_for at a time, while
// grammar work runs beside model work (which uses the global pool) and beside itself (several requests
// compiling, the decode loop filling masks), so compilation and mask filling each get their own pool,
// entered by one caller at a time.
#include <cstdint>
#include <functional>

namespace peregrine::grammar {

enum class GrammarPool { kCompile, kMask };

// PEREGRINE_GRAMMAR_THREADS sets the pool sizes (default: hardware concurrency; masks at most 8).
void grammar_parallel_for(GrammarPool pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace peregrine::grammar
