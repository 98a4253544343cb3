// TaskPool: tasks run side by side on the fixed threads, and submissions past the queue bound are refused.
#include "util/task_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

namespace peregrine {
namespace {

TEST(TaskPool, RefusesPastTheQueueBound) {
    TaskPool pool(2, 3);
    std::promise<void> release;
    std::shared_future<void> gate = release.get_future().share();
    std::atomic<int> started{0}, finished{0};
    auto blocker = [&] {
        ++started;
        gate.wait();
        ++finished;
    };
    ASSERT_TRUE(pool.try_submit(blocker));
    ASSERT_TRUE(pool.try_submit(blocker));
    while (started < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // Both threads are busy: three may wait, the fourth is refused.
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(pool.try_submit(blocker));
    EXPECT_EQ(pool.queued(), 3u);
    EXPECT_EQ(pool.running(), 2);
    EXPECT_FALSE(pool.try_submit(blocker));
    release.set_value();
    while (finished < 5) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(started, 5);
    EXPECT_TRUE(pool.try_submit([] {}));
}

TEST(TaskPool, ZeroQueueTakesOnlyWhatThreadsCanStart) {
    TaskPool pool(1, 0);
    std::promise<void> release;
    std::shared_future<void> gate = release.get_future().share();
    EXPECT_TRUE(pool.try_submit([gate] { gate.wait(); }));
    EXPECT_FALSE(pool.try_submit([] {}));  // nothing may wait
    release.set_value();
    while (pool.running() + pool.queued() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(pool.try_submit([] {}));
}

TEST(TaskPool, DestructorRunsWhatIsQueued) {
    std::atomic<int> ran{0};
    {
        TaskPool pool(1, 16);
        for (int i = 0; i < 10; ++i)
            ASSERT_TRUE(pool.try_submit([&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
                ++ran;
            }));
    }
    EXPECT_EQ(ran, 10);
}

}  // namespace
}  // namespace peregrine
