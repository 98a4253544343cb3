// SeqState::backend_carry: a move keeps the backend's carry (vectors of states reallocate), a copy drops it
// but remembers whether the host carry is stale, so that a backend refuses to continue a copy from it.
#include "ops/state.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

using namespace peregrine;

TEST(BackendCarry, MoveKeepsCopyDrops) {
    SeqState a;
    a.backend_carry.p = std::make_shared<int>(7);
    a.backend_carry.host_stale = true;
    SeqState b = a;  // copy
    EXPECT_EQ(b.backend_carry.p, nullptr);
    EXPECT_TRUE(b.backend_carry.host_stale);
    EXPECT_NE(a.backend_carry.p, nullptr);
    SeqState c = std::move(a);
    ASSERT_NE(c.backend_carry.p, nullptr);
    EXPECT_EQ(*static_cast<int*>(c.backend_carry.p.get()), 7);
    b = c;  // copy-assign drops b's own and does not share c's
    EXPECT_EQ(b.backend_carry.p, nullptr);
    c = SeqState();  // a fresh state: nothing kept, host carry current
    EXPECT_EQ(c.backend_carry.p, nullptr);
    EXPECT_FALSE(c.backend_carry.host_stale);
    std::vector<SeqState> v(1);
    v[0].backend_carry.p = std::make_shared<int>(3);
    void* p = v[0].backend_carry.p.get();
    for (int i = 0; i < 64; ++i) v.emplace_back();  // reallocations move the states
    EXPECT_EQ(v[0].backend_carry.p.get(), p);
}
