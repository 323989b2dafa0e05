// The host device's fill threads run at a lower priority than the main job's (EngineOptions::
// fill_nice, PIPEFILL_HOST_FILL_NICE): the fill streams' threads and the SM threads add it to
// the nice value they were started with, the main streams' threads keep it. Linux only (per
// thread nice values).
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "host_test_support.hpp"

namespace pipefill::host::testing {
namespace {

// Sets an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

#ifdef __linux__
int thread_nice() {
  return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
}

// The nice values the threads that ran a host function or an item had.
struct NiceLog {
  std::mutex mutex;
  std::set<int> seen;
  void record() {
    const int nice = thread_nice();
    std::lock_guard lock(mutex);
    seen.insert(nice);
  }
  static void host_fn(void* user) { static_cast<NiceLog*>(user)->record(); }
  static void item_fn(void* user, uint64_t) {
    static_cast<NiceLog*>(user)->record();
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // the blocks overlap
  }
};

std::unique_ptr<HostDevice> device_with_fill_nice(int sms, int fill_nice) {
  EngineOptions options;
  options.sm_count = sms;
  options.fill_nice = fill_nice;
  std::shared_ptr<Engine> engine;
  EXPECT_EQ(Engine::create(options, &engine), pfSuccess) << pfGetLastErrorMessage();
  return std::make_unique<HostDevice>(std::move(engine));
}

TEST(HostThreadPriority, FillThreadsAddTheFillNiceMainStreamsDoNot) {
  const int base = thread_nice();  // the engine's threads start with their creator's
  if (base >= 19) GTEST_SKIP() << "this process already runs at nice 19";
  const int fill_nice = 3;
  auto device = device_with_fill_nice(4, fill_nice);
  void* main_stream = make_stream(*device);
  void* fill_stream = make_fill_stream(*device);
  NiceLog main_log, fill_stream_log, blocks_log;
  PF_ASSERT_OK(pfHostLaunchHostFunc(main_stream, &NiceLog::host_fn, &main_log));
  PF_ASSERT_OK(pfHostLaunchHostFunc(fill_stream, &NiceLog::host_fn, &fill_stream_log));
  // Four blocks of opaque work: the fill stream's thread runs one, SM threads the others.
  PF_ASSERT_OK(pfHostLaunchOpaque(fill_stream, 0, 16, 4, &NiceLog::item_fn, &blocks_log));
  PF_ASSERT_OK(pfHostStreamSynchronize(main_stream));
  PF_ASSERT_OK(pfHostStreamSynchronize(fill_stream));
  EXPECT_EQ(main_log.seen, std::set<int>{base});
  const int lowered = std::min(19, base + fill_nice);
  EXPECT_EQ(fill_stream_log.seen, std::set<int>{lowered});
  EXPECT_EQ(blocks_log.seen, std::set<int>{lowered});
  EXPECT_EQ(thread_nice(), base);  // the caller's thread is never changed
}

TEST(HostThreadPriority, ZeroLeavesFillThreadsAtTheProcesssPriority) {
  const int base = thread_nice();
  auto device = device_with_fill_nice(2, 0);
  void* fill_stream = make_fill_stream(*device);
  NiceLog log;
  PF_ASSERT_OK(pfHostLaunchOpaque(fill_stream, 0, 8, 2, &NiceLog::item_fn, &log));
  PF_ASSERT_OK(pfHostStreamSynchronize(fill_stream));
  EXPECT_EQ(log.seen, std::set<int>{base});
}
#endif  // __linux__

TEST(HostThreadPriority, TheEnvironmentVariableIsParsedAndChecked) {
  {
    EngineOptions options;
    EXPECT_EQ(options.fill_nice, 10);  // the default: fill below the main job
    ScopedEnv env("PIPEFILL_HOST_FILL_NICE", "4");
    PF_ASSERT_OK(engine_options_from_env(&options));
    EXPECT_EQ(options.fill_nice, 4);
  }
  for (const char* bad : {"-1", "20", "ten", "5x", ""}) {
    ScopedEnv env("PIPEFILL_HOST_FILL_NICE", bad);
    EngineOptions options;
    EXPECT_FAILS_WITH(engine_options_from_env(&options), pfErrorInvalidArgument,
                      "PIPEFILL_HOST_FILL_NICE");
    EXPECT_EQ(options.fill_nice, 10) << bad;  // a refused value changes nothing
  }
}

// The host engine's other environment option, PIPEFILL_HOST_TIME_BUDGET (EngineOptions::
// time_budget, host_device_test.cpp TicketLaunchesThatAskStopAtTheirSlicesTimeBudget): off by
// default, 0 or 1, anything else refused by name without changing the option.
TEST(HostEngineOptions, TheTimeBudgetVariableIsParsedAndChecked) {
  {
    EngineOptions options;
    EXPECT_FALSE(options.time_budget);
    ScopedEnv env("PIPEFILL_HOST_TIME_BUDGET", "1");
    PF_ASSERT_OK(engine_options_from_env(&options));
    EXPECT_TRUE(options.time_budget);
  }
  for (const char* bad : {"2", "-1", "yes", ""}) {
    ScopedEnv env("PIPEFILL_HOST_TIME_BUDGET", bad);
    EngineOptions options;
    EXPECT_FAILS_WITH(engine_options_from_env(&options), pfErrorInvalidArgument,
                      "PIPEFILL_HOST_TIME_BUDGET");
    EXPECT_FALSE(options.time_budget) << bad;
  }
}

}  // namespace
}  // namespace pipefill::host::testing
