// Clang thread-safety annotations (abseil's names), checked by the clang -Wthread-safety build
// in scripts/test.sh and empty for other compilers. Annotate members with GUARDED_BY(mutex),
// functions that expect a lock held with REQUIRES(mutex), functions that take it with
// EXCLUDES(mutex). Use pipefill::Mutex (common/mutex.hpp): std::mutex carries no annotations
// in libstdc++, so the analysis cannot see it.
#pragma once

#if defined(__clang__)
#define PF_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define PF_THREAD_ANNOTATION_(x)
#endif

#define CAPABILITY(x) PF_THREAD_ANNOTATION_(capability(x))
#define SCOPED_CAPABILITY PF_THREAD_ANNOTATION_(scoped_lockable)
#define GUARDED_BY(x) PF_THREAD_ANNOTATION_(guarded_by(x))
#define PT_GUARDED_BY(x) PF_THREAD_ANNOTATION_(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) PF_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) PF_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#define REQUIRES(...) PF_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) PF_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
#define ACQUIRE(...) PF_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) PF_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) PF_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) PF_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) PF_THREAD_ANNOTATION_(assert_capability(x))
#define RETURN_CAPABILITY(x) PF_THREAD_ANNOTATION_(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS PF_THREAD_ANNOTATION_(no_thread_safety_analysis)
