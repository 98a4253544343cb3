#include "engine/grammar/builder.h"

#include <algorithm>
#include <array>
#include <map>
#include <queue>
#include <tuple>

#include "engine/grammar/budget.h"
#include "util/error.h"

namespace peregrine::grammar {

int32_t GrammarBuilder::new_state() {
    poll_budget();
    if (static_cast<int32_t>(edges_.size()) >= limits_.max_nfa_states)
        throw GrammarTooComplex(
            fmt::format("grammar too complex: more than {} automaton states", limits_.max_nfa_states));
    edges_.emplace_back();
    return static_cast<int32_t>(edges_.size()) - 1;
}

int32_t GrammarBuilder::declare_rule(const std::string& name) {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) return it->second;
    int32_t id = static_cast<int32_t>(names_.size());
    names_.push_back(name);
    bodies_.push_back({});
    by_name_[name] = id;
    return id;
}

int32_t GrammarBuilder::find_rule(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? -1 : it->second;
}

std::string GrammarBuilder::fresh_rule_name(const std::string& base) {
    if (find_rule(base) < 0) return base;
    for (int i = 1;; ++i) {
        std::string n = base + "_" + std::to_string(i);
        if (find_rule(n) < 0) return n;
    }
}

void GrammarBuilder::set_body(int32_t rule, Frag body) {
    PEREGRINE_CHECK(bodies_[rule].start < 0, "rule '{}' is defined twice", names_[rule]);
    bodies_[rule] = body;
}

Frag GrammarBuilder::empty() {
    int32_t s = new_state(), e = new_state();
    add_edge(s, {Edge::kEps, 0, 0, e, -1});
    return {s, e};
}

Frag GrammarBuilder::byte_range(uint8_t lo, uint8_t hi) {
    int32_t s = new_state(), e = new_state();
    add_edge(s, {Edge::kBytes, lo, hi, e, -1});
    return {s, e};
}

Frag GrammarBuilder::literal(const std::string& bytes) {
    int32_t s = new_state(), cur = s;
    for (unsigned char c : bytes) {
        int32_t n = new_state();
        add_edge(cur, {Edge::kBytes, c, c, n, -1});
        cur = n;
    }
    return {s, cur};
}

Frag GrammarBuilder::codepoints(const CodepointSet& set) {
    int32_t s = new_state(), e = new_state();
    for (auto [lo, hi] : set.ranges()) {
        for (const ByteRangeSeq& seq : utf8_sequences(lo, hi)) {
            int32_t cur = s;
            for (size_t i = 0; i < seq.size(); ++i) {
                int32_t n = i + 1 == seq.size() ? e : new_state();
                add_edge(cur, {Edge::kBytes, seq[i].first, seq[i].second, n, -1});
                cur = n;
            }
        }
    }
    return {s, e};
}

Frag GrammarBuilder::call(int32_t rule) {
    int32_t s = new_state(), e = new_state();
    add_edge(s, {Edge::kCall, 0, 0, e, rule});
    return {s, e};
}

Frag GrammarBuilder::seq(Frag a, Frag b) {
    add_edge(a.end, {Edge::kEps, 0, 0, b.start, -1});
    return {a.start, b.end};
}

Frag GrammarBuilder::seq(const std::vector<Frag>& parts) {
    if (parts.empty()) return empty();
    Frag f = parts[0];
    for (size_t i = 1; i < parts.size(); ++i) f = seq(f, parts[i]);
    return f;
}

Frag GrammarBuilder::alt(const std::vector<Frag>& alts) {
    if (alts.size() == 1) return alts[0];
    int32_t s = new_state(), e = new_state();
    for (Frag f : alts) {
        add_edge(s, {Edge::kEps, 0, 0, f.start, -1});
        add_edge(f.end, {Edge::kEps, 0, 0, e, -1});
    }
    return {s, e};
}

Frag GrammarBuilder::optional(Frag f) {
    add_edge(f.start, {Edge::kEps, 0, 0, f.end, -1});
    return f;
}

Frag GrammarBuilder::star(Frag f) {
    int32_t s = new_state(), e = new_state();
    add_edge(s, {Edge::kEps, 0, 0, f.start, -1});
    add_edge(s, {Edge::kEps, 0, 0, e, -1});
    add_edge(f.end, {Edge::kEps, 0, 0, f.start, -1});
    add_edge(f.end, {Edge::kEps, 0, 0, e, -1});
    return {s, e};
}

Frag GrammarBuilder::plus(Frag f) {
    int32_t e = new_state();
    add_edge(f.end, {Edge::kEps, 0, 0, f.start, -1});
    add_edge(f.end, {Edge::kEps, 0, 0, e, -1});
    return {f.start, e};
}

Frag GrammarBuilder::copy(Frag f) {
    std::unordered_map<int32_t, int32_t> map;
    std::vector<int32_t> work{f.start};
    map[f.start] = new_state();
    while (!work.empty()) {
        poll_budget();
        int32_t old = work.back();
        work.pop_back();
        for (size_t i = 0; i < edges_[old].size(); ++i) {
            Edge e = edges_[old][i];
            auto it = map.find(e.target);
            if (it == map.end()) {
                it = map.emplace(e.target, new_state()).first;
                work.push_back(e.target);
            }
            e.target = it->second;
            edges_[map[old]].push_back(e);
        }
    }
    if (!map.count(f.end)) map[f.end] = new_state();
    return {map[f.start], map[f.end]};
}

int32_t GrammarBuilder::size_of(Frag f) const {
    std::vector<int32_t> work{f.start};
    std::unordered_map<int32_t, bool> seen{{f.start, true}};
    while (!work.empty()) {
        int32_t s = work.back();
        work.pop_back();
        for (const Edge& e : edges_[s])
            if (seen.emplace(e.target, true).second) work.push_back(e.target);
    }
    return static_cast<int32_t>(seen.size());
}

Frag GrammarBuilder::repeat(Frag f, int64_t min, int64_t max) {
    PEREGRINE_CHECK(min >= 0 && (max < 0 || max >= min), "invalid repetition bounds {{{},{}}}", min, max);
    PEREGRINE_CHECK(min <= 10000 && max <= 10000, "repetition bound above 10000 is not supported");
    if (max == 0) return empty();
    // Every instance is a copy of the untouched template f (combinators modify their operands).
    std::vector<Frag> parts;
    for (int64_t i = 0; i < min; ++i) parts.push_back(copy(f));
    if (max < 0) {
        parts.push_back(star(copy(f)));
    } else if (max > min) {
        // Nested optionals f(f(f)?)? keep the automaton linear in max - min.
        Frag tail = optional(copy(f));
        for (int64_t i = 1; i < max - min; ++i) tail = optional(seq(copy(f), tail));
        parts.push_back(tail);
    }
    return seq(parts);
}

namespace {

struct VecHash {
    size_t operator()(const std::vector<int32_t>& v) const {
        size_t h = 1469598103934665603ull;
        for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
        return h;
    }
};

}  // namespace

// Merges equivalent DFA states: Hopcroft's partition refinement over bytes, calls and acceptance. Each distinct
// state costs one vocabulary walk at compile time, so duplicates are worth removing. Moore's round-by-round
// refinement needed as many rounds as the longest chain has states (a literal repeated 255 times: quadratic,
// tens of seconds); splitting by the predecessors of one block at a time is O(transitions * log(states)).
static void minimize(Grammar& g) {
    const int32_t n = g.num_states();
    const int32_t sink = n;  // stands for "no transition"
    // Inverse transitions: byte runs of equal target (a few per state) and call slots.
    struct InRun {
        int32_t from;
        uint8_t lo, hi;
    };
    std::vector<std::vector<InRun>> in_runs(static_cast<size_t>(n) + 1);
    std::vector<std::vector<std::pair<int32_t, int32_t>>> in_calls(static_cast<size_t>(n) + 1);  // (from, slot)
    // Initial blocks: rule, acceptance, which bytes have edges (and whether any table), the called rules in order.
    std::vector<int32_t> block_of(static_cast<size_t>(n) + 1);
    int32_t n_blocks = 0;
    {
        std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
        std::vector<int32_t> key;
        for (int32_t s = 0; s < n; ++s) {
            poll_budget();
            key.assign({g.rule_of[s], g.accepting[s], g.byte_table[s] >= 0 ? 1 : -2});
            if (g.byte_table[s] >= 0) {
                int32_t lo = 0, prev_t = g.next[g.byte_table[s]];
                key.push_back(prev_t >= 0);
                for (int b = 1; b <= 256; ++b) {
                    const int32_t t = b < 256 ? g.next[g.byte_table[s] + b] : -3;
                    if (t == prev_t) continue;
                    in_runs[prev_t >= 0 ? prev_t : sink].push_back(
                        {s, static_cast<uint8_t>(lo), static_cast<uint8_t>(b - 1)});
                    if ((t >= 0) != (prev_t >= 0) || b == 256) key.push_back(b);  // where edges start or stop
                    lo = b;
                    prev_t = t;
                }
            }
            for (size_t i = 0; i < g.calls[s].size(); ++i) {
                const auto [q, ret] = g.calls[s][i];
                key.push_back(q);
                in_calls[ret >= 0 ? ret : sink].push_back({s, static_cast<int32_t>(i)});
            }
            block_of[s] = ids.emplace(key, static_cast<int32_t>(ids.size())).first->second;
        }
        n_blocks = static_cast<int32_t>(ids.size());
        block_of[sink] = n_blocks++;
    }
    // Blocks are ranges [first, end) of `elems`; pos is a state's index there.
    std::vector<int32_t> elems(static_cast<size_t>(n) + 1), pos(static_cast<size_t>(n) + 1);
    std::vector<int32_t> first(n_blocks + 1, 0), end;
    for (int32_t s = 0; s <= n; ++s) ++first[block_of[s] + 1];
    for (int32_t b = 0; b < n_blocks; ++b) first[b + 1] += first[b];
    first.pop_back();
    end = first;
    for (int32_t s = 0; s <= n; ++s) pos[s] = end[block_of[s]]++, elems[pos[s]] = s;
    std::vector<int32_t> work(n_blocks);
    std::vector<uint8_t> in_work(n_blocks, 1);
    for (int32_t b = 0; b < n_blocks; ++b) work[b] = b;

    // What leads from a state into the splitter: its bytes (a 256-bit set) and call slots.
    struct Into {
        std::array<uint64_t, 4> bytes{};
        std::vector<int32_t> slots;
        bool operator<(const Into& o) const { return std::tie(bytes, slots) < std::tie(o.bytes, o.slots); }
        bool operator==(const Into& o) const { return bytes == o.bytes && slots == o.slots; }
    };
    std::vector<Into> into(static_cast<size_t>(n) + 1);
    std::vector<uint8_t> touched(static_cast<size_t>(n) + 1, 0);
    std::vector<int32_t> sources, splitter;
    while (!work.empty()) {
        const int32_t a = work.back();
        work.pop_back();
        in_work[a] = 0;
        splitter.assign(elems.begin() + first[a], elems.begin() + end[a]);
        sources.clear();
        for (int32_t t : splitter) {
            poll_budget();
            for (const InRun& r : in_runs[t]) {
                if (!touched[r.from]) touched[r.from] = 1, sources.push_back(r.from);
                for (int w = r.lo >> 6; w <= r.hi >> 6; ++w) {  // bits lo..hi, a word at a time
                    const int lo = std::max<int>(r.lo, w * 64) - w * 64;
                    const int hi = std::min<int>(r.hi, w * 64 + 63) - w * 64;
                    into[r.from].bytes[w] |= hi - lo == 63 ? ~uint64_t{0} : ((uint64_t{1} << (hi - lo + 1)) - 1) << lo;
                }
            }
            for (auto [from, slot] : in_calls[t]) {
                if (!touched[from]) touched[from] = 1, sources.push_back(from);
                into[from].slots.push_back(slot);
            }
        }
        for (int32_t s : sources) std::sort(into[s].slots.begin(), into[s].slots.end());
        // Per block, the sources with equal ways into the splitter form one part; states with none another.
        std::sort(sources.begin(), sources.end(), [&](int32_t x, int32_t y) {
            if (block_of[x] != block_of[y]) return block_of[x] < block_of[y];
            if (!(into[x] == into[y])) return into[x] < into[y];
            return x < y;
        });
        for (size_t i = 0; i < sources.size();) {
            const int32_t y = block_of[sources[i]];
            size_t j = i;
            std::vector<std::pair<size_t, size_t>> parts;  // ranges of `sources`
            while (j < sources.size() && block_of[sources[j]] == y) {
                size_t k = j;
                while (k < sources.size() && block_of[sources[k]] == y && into[sources[k]] == into[sources[j]]) ++k;
                parts.push_back({j, k});
                j = k;
            }
            const size_t size_y = static_cast<size_t>(end[y] - first[y]);
            const bool untouched_rest = j - i < size_y;
            if (untouched_rest || parts.size() > 1) {
                // y keeps the untouched states, else its largest part; the other parts become blocks.
                size_t keep = parts.size();
                if (!untouched_rest)
                    for (size_t p = keep = 0; p < parts.size(); ++p)
                        if (parts[p].second - parts[p].first > parts[keep].second - parts[keep].first) keep = p;
                std::vector<int32_t> made;  // blocks split off y
                for (size_t p = 0; p < parts.size(); ++p) {
                    if (p == keep) continue;
                    const int32_t nb = n_blocks++, old_end = end[y];
                    for (size_t q = parts[p].first; q < parts[p].second; ++q) {
                        const int32_t s = sources[q], last = elems[end[y] - 1];
                        std::swap(elems[pos[s]], elems[end[y] - 1]);
                        pos[last] = pos[s];
                        pos[s] = --end[y];
                        block_of[s] = nb;
                    }
                    first.push_back(end[y]);
                    end.push_back(old_end);
                    in_work.push_back(0);
                    made.push_back(nb);
                }
                // Hopcroft: a block waiting as a splitter waits with all its parts; otherwise all parts but the
                // largest wait (splitting by the others and by the whole implies splitting by it).
                auto size = [&](int32_t blk) { return end[blk] - first[blk]; };
                int32_t largest = y;
                if (!in_work[y])
                    for (int32_t nb : made)
                        if (size(nb) > size(largest)) largest = nb;
                made.push_back(y);
                for (int32_t blk : made)
                    if (blk != largest && !in_work[blk]) work.push_back(blk), in_work[blk] = 1;
            }
            i = j;
        }
        for (int32_t s : sources) touched[s] = 0, into[s] = Into{};
    }
    // Classes numbered by their lowest state, as the states are.
    std::vector<int32_t> cls(n), number(n_blocks, -1);
    int32_t count = 0;
    for (int32_t s = 0; s < n; ++s) {
        if (number[block_of[s]] < 0) number[block_of[s]] = count++;
        cls[s] = number[block_of[s]];
    }
    // Rebuild with one representative per class (the lowest state id).
    std::vector<int32_t> rep(count, -1);
    for (int32_t s = 0; s < n; ++s)
        if (rep[cls[s]] < 0) rep[cls[s]] = s;
    Grammar m;
    m.rules = g.rules;
    m.root_rule = g.root_rule;
    for (auto& r : m.rules) r.start = cls[r.start];
    m.rule_of.resize(count);
    m.accepting.resize(count);
    m.byte_table.assign(count, -1);
    m.calls.resize(count);
    for (int32_t c = 0; c < count; ++c) {
        int32_t s = rep[c];
        m.rule_of[c] = g.rule_of[s];
        m.accepting[c] = g.accepting[s];
        if (g.byte_table[s] >= 0) {
            m.byte_table[c] = static_cast<int32_t>(m.next.size());
            for (int b = 0; b < 256; ++b) {
                int32_t t = g.next[g.byte_table[s] + b];
                m.next.push_back(t >= 0 ? cls[t] : -1);
            }
        }
        for (auto [q, ret] : g.calls[s]) m.calls[c].push_back({q, cls[ret]});
    }
    g = std::move(m);
}

Grammar GrammarBuilder::build(int32_t root_rule) const {
    for (int32_t r = 0; r < num_rules(); ++r)
        PEREGRINE_CHECK(bodies_[r].start >= 0, "rule '{}' is referenced but not defined", names_[r]);

    Grammar g;
    g.root_rule = root_rule;
    g.rules.resize(names_.size());
    std::vector<std::vector<std::pair<int32_t, int32_t>>> calls;
    std::vector<std::vector<std::pair<std::pair<uint8_t, uint8_t>, int32_t>>> byte_edges;

    // Epsilon closure of a set of NFA states, sorted and without repeats. Membership by generation stamps: a search
    // of `seen` per edge made closures of inlined rule chains quadratic.
    std::vector<uint32_t> stamp(edges_.size(), 0);
    uint32_t generation = 0;
    auto closure = [&](const std::vector<int32_t>& set) {
        ++generation;
        std::vector<int32_t> seen, work;
        for (int32_t s : set)
            if (stamp[s] != generation) stamp[s] = generation, seen.push_back(s), work.push_back(s);
        while (!work.empty()) {
            poll_budget();
            int32_t s = work.back();
            work.pop_back();
            for (const Edge& e : edges_[s])
                if (e.kind == Edge::kEps && stamp[e.target] != generation) {
                    stamp[e.target] = generation;
                    seen.push_back(e.target);
                    work.push_back(e.target);
                }
        }
        std::sort(seen.begin(), seen.end());
        return seen;
    };

    for (int32_t r = 0; r < num_rules(); ++r) {
        g.rules[r].name = names_[r];
        std::unordered_map<std::vector<int32_t>, int32_t, VecHash> ids;
        std::vector<std::vector<int32_t>> sets;
        auto intern = [&](std::vector<int32_t> set) {
            auto it = ids.find(set);
            if (it != ids.end()) return it->second;
            int32_t id = static_cast<int32_t>(g.rule_of.size());
            if (id >= limits_.max_dfa_states)
                throw GrammarTooComplex(fmt::format("grammar too complex: more than {} automaton states after "
                                                    "determinization", limits_.max_dfa_states));
            g.rule_of.push_back(r);
            g.accepting.push_back(std::binary_search(set.begin(), set.end(), bodies_[r].end));
            calls.emplace_back();
            byte_edges.emplace_back();
            ids.emplace(set, id);
            sets.push_back(std::move(set));
            return id;
        };
        int32_t first = static_cast<int32_t>(g.rule_of.size());
        g.rules[r].start = intern(closure({bodies_[r].start}));
        for (int32_t k = 0; first + k < static_cast<int32_t>(g.rule_of.size()); ++k) {
            poll_budget();
            int32_t d = first + k;
            std::vector<int32_t> set = sets[k];
            std::vector<const Edge*> bytes;
            std::map<int32_t, std::vector<int32_t>> by_rule;
            std::vector<int> cuts;
            for (int32_t s : set)
                for (const Edge& e : edges_[s]) {
                    if (e.kind == Edge::kBytes) {
                        bytes.push_back(&e);
                        cuts.push_back(e.lo);
                        cuts.push_back(e.hi + 1);
                    } else if (e.kind == Edge::kCall) {
                        by_rule[e.rule].push_back(e.target);
                    }
                }
            std::sort(cuts.begin(), cuts.end());
            cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
            for (size_t i = 0; i + 1 < cuts.size(); ++i) {
                int lo = cuts[i], hi = cuts[i + 1] - 1;
                std::vector<int32_t> tgt;
                for (const Edge* e : bytes)
                    if (e->lo <= lo && e->hi >= hi) tgt.push_back(e->target);
                if (tgt.empty()) continue;
                int32_t t = intern(closure(tgt));
                byte_edges[d].push_back({{uint8_t(lo), uint8_t(hi)}, t});
            }
            for (auto& [rule, tgts] : by_rule) {
                int32_t t = intern(closure(tgts));
                calls[d].push_back({rule, t});
            }
        }
    }

    const int32_t n = g.num_states();
    // Productive states: some path to acceptance exists (through calls of productive rules). Found backwards from
    // the accepting states: sweeping every state until nothing changed took a sweep per state of a long chain.
    std::vector<uint8_t> prod(n, 0);
    {
        std::vector<std::vector<std::pair<int32_t, int32_t>>> preds(n);  // (state, its call index; -1: a byte edge)
        for (int32_t s = 0; s < n; ++s) {
            for (auto& [range, t] : byte_edges[s]) preds[t].push_back({s, -1});
            for (size_t i = 0; i < calls[s].size(); ++i) {
                preds[calls[s][i].second].push_back({s, static_cast<int32_t>(i)});
                preds[g.rules[calls[s][i].first].start].push_back({s, static_cast<int32_t>(i)});
            }
        }
        std::vector<int32_t> work;
        for (int32_t s = 0; s < n; ++s)
            if (g.accepting[s]) prod[s] = 1, work.push_back(s);
        while (!work.empty()) {
            poll_budget();
            const int32_t t = work.back();
            work.pop_back();
            for (auto [s, c] : preds[t]) {
                if (prod[s]) continue;
                if (c < 0 || (prod[g.rules[calls[s][c].first].start] && prod[calls[s][c].second]))
                    prod[s] = 1, work.push_back(s);
            }
        }
    }
    PEREGRINE_CHECK(prod[g.root_start()], "grammar matches no string (rule '{}' cannot complete)",
                    names_[root_rule]);

    g.byte_table.assign(n, -1);
    g.calls.resize(n);
    for (int32_t s = 0; s < n; ++s) {
        for (auto& [range, t] : byte_edges[s]) {
            if (!prod[t]) continue;
            if (g.byte_table[s] < 0) {
                g.byte_table[s] = static_cast<int32_t>(g.next.size());
                g.next.resize(g.next.size() + 256, -1);
            }
            for (int b = range.first; b <= range.second; ++b) g.next[g.byte_table[s] + b] = t;
        }
        for (auto [q, ret] : calls[s])
            if (prod[g.rules[q].start] && prod[ret]) g.calls[s].push_back({q, ret});
    }

    // Left recursion would make the stack grow without consuming input; reject it.
    std::vector<uint8_t> nullable(names_.size(), 0);
    auto eps_reach = [&](int32_t rule) {
        std::vector<int32_t> seen{g.rules[rule].start}, work{g.rules[rule].start};
        while (!work.empty()) {
            poll_budget();
            int32_t s = work.back();
            work.pop_back();
            for (auto [q, ret] : g.calls[s])
                if (nullable[q] && std::find(seen.begin(), seen.end(), ret) == seen.end())
                    seen.push_back(ret), work.push_back(ret);
        }
        return seen;
    };
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < num_rules(); ++r) {
            if (nullable[r]) continue;
            for (int32_t s : eps_reach(r))
                if (g.accepting[s]) { nullable[r] = 1, changed = true; break; }
        }
    }
    std::vector<std::vector<int32_t>> left(names_.size());
    for (int32_t r = 0; r < num_rules(); ++r)
        for (int32_t s : eps_reach(r))
            for (auto [q, ret] : g.calls[s]) left[r].push_back(q);
    std::vector<int> color(names_.size(), 0);
    std::vector<int32_t> path;
    std::function<void(int32_t)> dfs = [&](int32_t r) {
        poll_budget();
        color[r] = 1;
        path.push_back(r);
        for (int32_t q : left[r]) {
            if (color[q] == 1) {
                std::string cycle;
                for (auto it = std::find(path.begin(), path.end(), q); it != path.end(); ++it)
                    cycle += names_[*it] + " -> ";
                fail("left recursion is not supported: {}{}", cycle, names_[q]);
            }
            if (color[q] == 0) dfs(q);
        }
        path.pop_back();
        color[r] = 2;
    };
    for (int32_t r = 0; r < num_rules(); ++r)
        if (color[r] == 0) dfs(r);

    minimize(g);

    // Shortest completion of every state: Knuth's generalization of Dijkstra over bytes and calls (a call costs its
    // rule's shortest completion plus its return state's). Bellman-Ford sweeps took a sweep per state of a chain.
    const int32_t m = g.num_states();
    constexpr int32_t kInf = 1 << 29;
    g.min_to_accept.assign(m, kInf);
    {
        std::vector<std::vector<std::pair<int32_t, int32_t>>> preds(m);  // (state, its call index; -1: a byte edge)
        std::vector<int32_t> targets;
        for (int32_t s = 0; s < m; ++s) {
            if (g.byte_table[s] >= 0) {
                targets.clear();
                for (int b = 0; b < 256; ++b)
                    if (int32_t t = g.next[g.byte_table[s] + b]; t >= 0) targets.push_back(t);
                std::sort(targets.begin(), targets.end());
                targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
                for (int32_t t : targets) preds[t].push_back({s, -1});
            }
            for (size_t i = 0; i < g.calls[s].size(); ++i) {
                preds[g.calls[s][i].second].push_back({s, static_cast<int32_t>(i)});
                preds[g.rules[g.calls[s][i].first].start].push_back({s, static_cast<int32_t>(i)});
            }
        }
        std::priority_queue<std::pair<int32_t, int32_t>, std::vector<std::pair<int32_t, int32_t>>, std::greater<>> heap;
        for (int32_t s = 0; s < m; ++s)
            if (g.accepting[s]) g.min_to_accept[s] = 0, heap.push({0, s});
        std::vector<uint8_t> done(m, 0);
        while (!heap.empty()) {
            poll_budget();
            const auto [d, t] = heap.top();
            heap.pop();
            if (done[t] || d != g.min_to_accept[t]) continue;
            done[t] = 1;
            for (auto [s, c] : preds[t]) {
                if (done[s]) continue;
                int32_t best = kInf;
                if (c < 0) {
                    best = d + 1;
                } else {  // a call: once both its rule's start and its return state are final
                    const int32_t start = g.rules[g.calls[s][c].first].start, ret = g.calls[s][c].second;
                    if (done[start] && done[ret]) best = g.min_to_accept[start] + g.min_to_accept[ret];
                }
                if (best < g.min_to_accept[s]) g.min_to_accept[s] = best, heap.push({best, s});
            }
        }
    }

    // States that can be on top of the stack when matching from the root.
    g.reachable.assign(g.num_states(), 0);
    std::vector<int32_t> work{g.root_start()};
    g.reachable[g.root_start()] = 1;
    auto visit = [&](int32_t s) {
        if (!g.reachable[s]) g.reachable[s] = 1, work.push_back(s);
    };
    while (!work.empty()) {
        int32_t s = work.back();
        work.pop_back();
        if (g.byte_table[s] >= 0)
            for (int b = 0; b < 256; ++b)
                if (int32_t t = g.next[g.byte_table[s] + b]; t >= 0) visit(t);
        for (auto [q, ret] : g.calls[s]) visit(g.rules[q].start), visit(ret);
    }
    return g;
}

std::string Grammar::describe() const {
    std::string out;
    for (size_t r = 0; r < rules.size(); ++r) {
        out += "rule " + rules[r].name + (int32_t(r) == root_rule ? " (root)" : "") + " start " +
               std::to_string(rules[r].start) + "\n";
    }
    for (int32_t s = 0; s < num_states(); ++s) {
        if (!reachable[s]) continue;
        out += "  " + std::to_string(s) + " [" + rules[rule_of[s]].name + "]" + (accepting[s] ? " accept" : "");
        if (has_bytes(s)) {
            int b = 0;
            while (b < 256) {
                int32_t t = next[byte_table[s] + b];
                int e = b;
                while (e + 1 < 256 && next[byte_table[s] + e + 1] == t) ++e;
                if (t >= 0) out += " " + std::to_string(b) + (e > b ? "-" + std::to_string(e) : "") + "->" +
                                   std::to_string(t);
                b = e + 1;
            }
        }
        for (auto [q, ret] : calls[s]) out += " call " + rules[q].name + "->" + std::to_string(ret);
        out += "\n";
    }
    return out;
}

}  // namespace peregrine::grammar
