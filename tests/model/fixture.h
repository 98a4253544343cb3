#pragma once
// Reads a golden fixture (tests/fixtures/<name>): ids, logits, prefill length.
#include "util/file.h"
#include "util/switches.h"

#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace peregrine::test {

// PEREGRINE_TEST_DATA_DIR overrides the build-time path (test binaries built on one machine, run on another).
inline std::string fixture_dir(const std::string& name) {
    const std::string dir = switch_value("PEREGRINE_TEST_DATA_DIR");
    return (dir.empty() ? std::string(PEREGRINE_TEST_DATA) : dir) + "/" + name;
}

inline std::vector<int32_t> read_ids(const std::string& path) {
    std::vector<int32_t> ids;
    std::stringstream ss(read_file(path));
    std::string item;
    while (std::getline(ss, item, ',')) ids.push_back(std::stoi(item));
    return ids;
}

template <typename T>
inline std::vector<T> read_raw(const std::string& path) {
    std::string b = read_file(path);
    std::vector<T> v(b.size() / sizeof(T));
    std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
    return v;
}

// A fixture's name in test names: dsv41-tiny-a -> V41, dsv4-tiny-a -> V4, dsv4-tiny-b -> V4b.
inline std::string fixture_test_name(const std::string& fixture) {
    const std::string variant = fixture[4] == '1' ? "V41" : "V4";
    return variant + (fixture.back() == 'a' ? "" : fixture.substr(fixture.size() - 1));
}

// Per-row max |a - b| and top-1 agreement of [rows, vocab] logits.
struct RowDiff {
    std::vector<float> max_abs;
    double top1 = 0.0;
    float worst() const {
        float w = 0.0f;
        for (float v : max_abs) w = std::max(w, v);
        return w;
    }
};

inline RowDiff compare_logits(const std::vector<float>& a, const std::vector<float>& b, int vocab) {
    RowDiff d;
    const size_t rows = a.size() / vocab;
    int agree = 0;
    for (size_t r = 0; r < rows; ++r) {
        float m = 0.0f;
        size_t ia = 0, ib = 0;
        for (int v = 0; v < vocab; ++v) {
            size_t i = r * vocab + v;
            m = std::max(m, std::abs(a[i] - b[i]));
            if (a[i] > a[r * vocab + ia]) ia = v;
            if (b[i] > b[r * vocab + ib]) ib = v;
        }
        d.max_abs.push_back(m);
        agree += ia == ib;
    }
    d.top1 = rows ? static_cast<double>(agree) / rows : 1.0;
    return d;
}

}  // namespace peregrine::test
