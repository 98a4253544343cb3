#pragma once
// A grammar as Peregrine executes it: a set of rules, each a deterministic byte automaton whose states
// may also call other rules (a recursive transition network, i.e. a pushdown automaton over bytes).
// JSON Schema, regex and EBNF all compile into this form (see builder.h); it does not depend on any
// vocabulary. Vocabulary-specific precomputation lives in CompiledGrammar.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace peregrine::grammar {

// How deep regex groups, EBNF parentheses and JSON Schema subschemas may nest. The compilers recurse once a level,
// so a request nesting thousands of levels would exhaust a thread's stack; past this it is a clear error instead.
inline constexpr int kMaxNesting = 128;
// Nested expressions an EBNF grammar's rules expand to once its non-recursive rules are inlined.
inline constexpr int kMaxInlineDepth = 42000;  // two per rule of a chain: 21,000 rules

// Counts one level of nesting for as long as it lives; `too_deep` (which must throw) runs past kMaxNesting.
struct NestingLevel {
    int& depth;
    template <typename F>
    NestingLevel(int& d, F&& too_deep) : depth(d) {
        if (++depth > kMaxNesting) {
            --depth;
            too_deep();
        }
    }
    ~NestingLevel() { --depth; }
};

struct Grammar {
    struct Rule {
        std::string name;
        int32_t start = -1;  // DFA state
    };
    std::vector<Rule> rules;
    int32_t root_rule = 0;

    // Per DFA state. Byte transitions are a flat table (256 entries for each state that has any).
    std::vector<int32_t> rule_of;
    std::vector<uint8_t> accepting;
    std::vector<int32_t> byte_table;  // state -> offset into next_ (or -1: no byte edges)
    std::vector<int32_t> next;        // byte_table[s] + b -> target state or -1
    std::vector<std::vector<std::pair<int32_t, int32_t>>> calls;  // (called rule, return state)
    std::vector<uint8_t> reachable;   // can be a stack top while matching from the root
    std::vector<int32_t> min_to_accept;  // fewest bytes from the state to the end of its rule

    int32_t num_states() const { return static_cast<int32_t>(rule_of.size()); }
    bool has_bytes(int32_t s) const { return byte_table[s] >= 0; }
    int32_t step(int32_t s, uint8_t b) const { return byte_table[s] < 0 ? -1 : next[byte_table[s] + b]; }
    int32_t root_start() const { return rules[root_rule].start; }

    // Human-readable dump for debugging (`peregrine grammar-sample --dump-grammar`).
    std::string describe() const;
};

}  // namespace peregrine::grammar
