#pragma once
// The PEREGRINE_* environment switches, every one declared once in switches.cpp with the values it takes and
// what it does; `peregrine info --env` prints the table with the values in effect. Code reads a switch only
// through these functions: an undeclared name fails at its first use, and a value outside the declared ones is
// refused with the list.
#include <string>
#include <vector>

namespace peregrine {

struct Switch {
    const char* name;
    const char* fallback;  // the value in effect when the variable is unset
    const char* values;    // "a|b|c" (one of them), "<int>" (an integer) or "<text>" (anything)
    const char* area;      // who reads it: runtime, engine, grammar, cuda, tests
    const char* help;
};

// Every declared switch, by area.
const std::vector<Switch>& switches();
// The switch's value: the environment's when set (and declared valid), else its fallback.
std::string switch_value(const char* name);
bool switch_is(const char* name, const char* value);
// An integer switch; fails unless its value is an integer in [lo, hi].
long long switch_int(const char* name, long long lo, long long hi);
// Whether the variable is set in the environment at all.
bool switch_set(const char* name);

}  // namespace peregrine
