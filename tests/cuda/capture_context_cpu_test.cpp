// A capture does not block bubble instructions (issue 33 item 4), with a fake driver: a capture
// keeps its capture stream's context pushed for its whole length (pfGraphCaptureContextPush ...
// Pop, seconds for a training step). Captured in a private capture context (registered with a
// mutex of its own), a graph launch's push of the fill partition's context on another thread -
// what an inline pfBubbleBegin does - goes through at once; captured in the fill partition's
// context itself, the launch waits for the capture's end, which is what the private context fixes.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "driver_api.hpp"
#include "stream_context.hpp"

namespace pipefill::cuda {
namespace {

const CUcontext kFillContext = reinterpret_cast<CUcontext>(0x2000);
const CUcontext kCaptureContext = reinterpret_cast<CUcontext>(0x5000);
void* const kFillStream = reinterpret_cast<void*>(0x20);
void* const kCaptureStream = reinterpret_cast<void*>(0x50);

thread_local std::vector<CUcontext> thread_stack;

CUresult CUDAAPI stream_context(CUstream stream, CUcontext* context) {
  *context = stream == static_cast<CUstream>(kFillStream) ? kFillContext : kCaptureContext;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI current(CUcontext* context) {
  *context = thread_stack.empty() ? nullptr : thread_stack.back();
  return CUDA_SUCCESS;
}
CUresult CUDAAPI push(CUcontext context) {
  thread_stack.push_back(context);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI pop(CUcontext* context) {
  if (thread_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  *context = thread_stack.back();
  thread_stack.pop_back();
  return CUDA_SUCCESS;
}

DriverApi fake_api() {
  DriverApi api;
  api.driver_version = 13000;
  api.stream_get_ctx = &stream_context;
  api.ctx_get_current = &current;
  api.ctx_push_current = &push;
  api.ctx_pop_current = &pop;
  return api;
}

// A bubble instruction's graph launch on another thread: the fill stream's context pushed and popped.
std::future<bool> launch_on_another_thread(const DriverApi& api) {
  return std::async(std::launch::async, [&api] {
    ScopedStreamContext scope(api);
    const bool entered = scope.enter(kFillStream) == pfSuccess && scope.switched();
    return entered && thread_stack.back() == kFillContext;
  });
}

TEST(CaptureContext, ALaunchIsNotBlockedByACaptureInAPrivateContext) {
  const DriverApi api = fake_api();
  register_private_context(kCaptureContext);
  // pfGraphCaptureContextPush, held through the capture.
  auto capture = std::make_unique<ScopedStreamContext>(api);
  ASSERT_EQ(capture->enter(kCaptureStream), pfSuccess) << last_error_message();
  ASSERT_TRUE(capture->switched());
  EXPECT_EQ(thread_stack.back(), kCaptureContext);
  std::future<bool> launch = launch_on_another_thread(api);
  const bool launched = launch.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  // Another push of the same private context (a launch of a graph captured in it) waits for the
  // capture: one thread at a time per green context.
  std::future<bool> same = std::async(std::launch::async, [&api] {
    ScopedStreamContext scope(api);
    return scope.enter(kCaptureStream) == pfSuccess;
  });
  const bool same_waited = same.wait_for(std::chrono::milliseconds(100)) == std::future_status::timeout;
  capture.reset();  // pfGraphCaptureContextPop
  EXPECT_TRUE(launched) << "the launch waited for the capture";
  EXPECT_TRUE(launch.get());
  EXPECT_TRUE(same_waited) << "the private context was pushed on two threads at once";
  EXPECT_TRUE(same.get());
  unregister_private_context(kCaptureContext);
  EXPECT_TRUE(thread_stack.empty());
}

TEST(CaptureContext, ACaptureInTheFillContextBlocksLaunchesUntilItsEnd) {
  const DriverApi api = fake_api();
  std::future<bool> launch;
  {
    ScopedStreamContext capture(api);  // the capture stream is a stream of the fill context
    ASSERT_EQ(capture.enter(kFillStream), pfSuccess);
    launch = launch_on_another_thread(api);
    EXPECT_EQ(launch.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout)
        << "the fill context was pushed on two threads at once";
  }
  ASSERT_EQ(launch.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(launch.get());
}

TEST(CaptureContext, AnUnregisteredContextFallsBackToTheProcessWideMutex) {
  const DriverApi api = fake_api();
  register_private_context(kCaptureContext);
  unregister_private_context(kCaptureContext);
  ScopedStreamContext capture(api);
  ASSERT_EQ(capture.enter(kCaptureStream), pfSuccess);
  std::unique_lock lock(context_push_mutex(), std::try_to_lock);
  EXPECT_TRUE(lock.owns_lock()) << "recursive: the owning thread may lock it again";
  std::future<bool> other = std::async(std::launch::async, [] {
    std::unique_lock other_lock(context_push_mutex(), std::try_to_lock);
    return other_lock.owns_lock();
  });
  EXPECT_FALSE(other.get()) << "the push holds the process-wide mutex";
}

}  // namespace
}  // namespace pipefill::cuda
