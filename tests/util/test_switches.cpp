// The environment switch registry: fallbacks, refused values, undeclared names, and every switch the sources
// read is declared.
#include "util/error.h"
#include "util/file.h"
#include "util/switches.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>

using namespace peregrine;

namespace {
struct ScopedEnv {
    const char* name;
    ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
    ~ScopedEnv() { unsetenv(name); }
};
}  // namespace

TEST(Switches, FallbackWhenUnset) {
    unsetenv("PEREGRINE_CUDA_NUMERICS");
    EXPECT_EQ(switch_value("PEREGRINE_CUDA_NUMERICS"), "fast");
    EXPECT_FALSE(switch_set("PEREGRINE_CUDA_NUMERICS"));
    EXPECT_EQ(switch_int("PEREGRINE_INDEX_SCORE_MB", 1, 1 << 20), 1024);
}

TEST(Switches, ValuesAreChecked) {
    {
        ScopedEnv e("PEREGRINE_CUDA_NUMERICS", "exact");
        EXPECT_TRUE(switch_is("PEREGRINE_CUDA_NUMERICS", "exact"));
        EXPECT_TRUE(switch_set("PEREGRINE_CUDA_NUMERICS"));
    }
    {
        ScopedEnv e("PEREGRINE_CUDA_NUMERICS", "fastest");
        EXPECT_THROW(switch_value("PEREGRINE_CUDA_NUMERICS"), Error);
    }
    {
        ScopedEnv e("PEREGRINE_INDEX_SCORE_MB", "12x");
        EXPECT_THROW(switch_int("PEREGRINE_INDEX_SCORE_MB", 1, 1 << 20), Error);
    }
    {
        ScopedEnv e("PEREGRINE_INDEX_SCORE_MB", "0");
        EXPECT_THROW(switch_int("PEREGRINE_INDEX_SCORE_MB", 1, 1 << 20), Error);
    }
    const std::string undeclared = std::string("PEREGRINE_") + "NO_SUCH_SWITCH";
    EXPECT_THROW(switch_value(undeclared.c_str()), Error);
}

// Every PEREGRINE_* name that code under src/, apps/, tests/ or bench/ hands to a switch function is declared (a
// typo would otherwise fail only when that line first runs).
TEST(Switches, EverySwitchReadIsDeclared) {
    std::set<std::string> declared;
    for (const Switch& s : switches()) {
        EXPECT_TRUE(declared.insert(s.name).second) << s.name << " declared twice";
        EXPECT_NE(std::string(s.help), "") << s.name;
    }
    const std::regex use(R"(switch_(?:value|is|int|set)\("(PEREGRINE_[A-Z0-9_]+)\")");
    int uses = 0;
    for (const char* dir : {"src", "apps", "tests", "bench"})
        for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(PEREGRINE_SOURCE_DIR) + "/" + dir)) {
            const std::string ext = e.path().extension();
            if (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh") continue;
            const std::string text = read_file(e.path().string());
            for (std::sregex_iterator m(text.begin(), text.end(), use), end; m != end; ++m, ++uses)
                EXPECT_TRUE(declared.count((*m)[1])) << (*m)[1] << " in " << e.path() << " is not declared";
        }
    EXPECT_GT(uses, 20);
}
