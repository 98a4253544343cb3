#pragma once
// Builds grammars from Thompson-style NFA fragments (bytes, code point sets, rule calls, sequences,
// alternatives, repetition) and determinizes each rule into the Grammar automaton.
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/grammar/char_set.h"
#include "engine/grammar/grammar.h"

namespace peregrine::grammar {

struct Frag {
    int32_t start = -1, end = -1;
};

struct BuildLimits {
    int32_t max_dfa_states = 60000;   // over all rules: bounds memory (1 KiB per state) and compile time
    int32_t max_nfa_states = 2000000;
};

class GrammarBuilder {
public:
    explicit GrammarBuilder(BuildLimits limits = {}) : limits_(limits) {}

    // Rules: declared by name (forward references allowed), bodies set once.
    int32_t declare_rule(const std::string& name);
    int32_t find_rule(const std::string& name) const;  // -1 if absent
    void set_body(int32_t rule, Frag body);
    bool has_body(int32_t rule) const { return bodies_[rule].start >= 0; }
    const std::string& rule_name(int32_t rule) const { return names_[rule]; }
    int32_t num_rules() const { return static_cast<int32_t>(names_.size()); }
    std::string fresh_rule_name(const std::string& base);

    Frag empty();
    Frag byte_range(uint8_t lo, uint8_t hi);
    Frag literal(const std::string& bytes);
    Frag codepoints(const CodepointSet& set);  // any one code point of the set, UTF-8 encoded
    Frag call(int32_t rule);
    Frag seq(Frag a, Frag b);
    Frag seq(const std::vector<Frag>& parts);
    Frag alt(const std::vector<Frag>& alts);
    Frag optional(Frag f);
    Frag star(Frag f);
    Frag plus(Frag f);
    // f repeated min..max times (max < 0: unbounded); f is copied as needed.
    Frag repeat(Frag f, int64_t min, int64_t max);
    Frag copy(Frag f);

    // Raw construction for shapes combinators cannot share (JSON object members): bare states,
    // epsilon links and byte edges.
    int32_t node() { return new_state(); }
    void link(int32_t from, int32_t to) { add_edge(from, {Edge::kEps, 0, 0, to, -1}); }
    void link_bytes(int32_t from, uint8_t lo, uint8_t hi, int32_t to) {
        add_edge(from, {Edge::kBytes, lo, hi, to, -1});
    }
    // Number of NFA states reachable from f.start (decides whether a repeated part becomes a rule).
    int32_t size_of(Frag f) const;

    // Determinizes every rule and checks the result (productive, no left recursion).
    Grammar build(int32_t root_rule) const;

private:
    struct Edge {
        enum Kind : uint8_t { kEps, kBytes, kCall } kind;
        uint8_t lo, hi;
        int32_t target;
        int32_t rule;
    };
    int32_t new_state();
    void add_edge(int32_t from, Edge e) { edges_[from].push_back(e); }

    BuildLimits limits_;
    std::vector<std::vector<Edge>> edges_;
    std::vector<std::string> names_;
    std::vector<Frag> bodies_;
    std::unordered_map<std::string, int32_t> by_name_;
};

}  // namespace peregrine::grammar
