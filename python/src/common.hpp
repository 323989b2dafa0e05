// Shared by the extension's files (python/src/*.cpp): errors raised as pipefill.PipeFillError
// with the C layer's message, the lifetime guard that keeps a closed handle from reaching C,
// pointer <-> int conversion for handles, and pfConfig_t as a plain record.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "fill_jobs.h"
#include "pipefill/pipefill.h"

namespace nb = nanobind;

namespace pfpy {

// ---- errors -----------------------------------------------------------------------------

// A failed call: the result code and the message the C layer gave for it.
struct CallError {
  int code;
  std::string message;
};

// pipefill.PipeFillError, registered by the package's __init__ (set_error_type). Until then
// (e.g. when stubgen imports the bare extension) errors are raised as RuntimeError.
inline PyObject* g_error_type = nullptr;

[[noreturn]] inline void raise_error(pfResult_t code, const char* message) {
  std::string text = (message != nullptr && *message != '\0') ? message : pfGetErrorString(code);
  throw CallError{static_cast<int>(code), std::move(text)};
}

// Checks a pf* result; the message is this thread's last error, read at once.
inline void check(pfResult_t result) {
  if (result != pfSuccess) raise_error(result, pfGetLastErrorMessage());
}

// Checks an fj* (example fill jobs) result: they keep their own last-error message.
inline void check_fill(pfResult_t result) {
  if (result != pfSuccess) raise_error(result, fjGetLastErrorMessage());
}

[[noreturn]] inline void raise_state(const std::string& message) {
  throw CallError{static_cast<int>(pfErrorInvalidState), message};
}

// The exception translator registered by the module (CallError -> PipeFillError).
inline void translate_error(const std::exception_ptr& pointer, void*) {
  try {
    std::rethrow_exception(pointer);
  } catch (const CallError& error) {
    if (g_error_type == nullptr) {
      PyErr_SetString(PyExc_RuntimeError, error.message.c_str());
      return;
    }
    PyObject* instance = PyObject_CallFunction(g_error_type, "is", error.code, error.message.c_str());
    if (instance == nullptr) return;  // constructing the exception raised; that error stands
    PyErr_SetObject(g_error_type, instance);
    Py_DECREF(instance);
  }
}

// ---- lifetimes ----------------------------------------------------------------------------

// ---- the GIL ------------------------------------------------------------------------------
// The rule (issue 25): a binding that calls into the C library, or takes a lock that a native
// thread may hold, releases the GIL first. A fill stream's thread (host backend) or the
// simulated world's run loop calls Python items and slice observers, taking the GIL while it
// holds the runtime's state lock or sits inside a slice that pfJobCreate, pfJobDestroy or
// pfRuntimeSynchronize wait for; a binding holding the GIL while it waits for that lock or that
// slice deadlocks the process. Python objects are read before and built after (never touched
// inside f). tests/python/test_gil_audit.py checks every binding against this rule.
template <class F>
decltype(auto) without_gil(F&& f) {
  nb::gil_scoped_release release;
  return std::forward<F>(f)();
}

// Guards one C handle against use after its destruction. Calls hold the lock shared for their
// duration, always with the GIL released (Use refuses otherwise); destruction holds it
// exclusively, also without the GIL, and may wait for fill threads that need the GIL: a call
// waiting for the shared lock while holding the GIL would deadlock with it.
struct Lifetime {
  std::shared_mutex mutex;
  bool alive = true;
};

class Use {
 public:
  Use(Lifetime& life, const char* what) {
    // A binding that forgot without_gil fails loudly in every test that calls it, instead of
    // deadlocking once in a while on a user's machine.
    if (PyGILState_Check() != 0) {
      throw CallError{static_cast<int>(pfErrorInternal),
                      std::string(what) +
                          ": a pipefill binding took the handle's lock holding the GIL (a bug in "
                          "pipefill; please report)"};
    }
    lock_ = std::shared_lock<std::shared_mutex>(life.mutex);
    if (!life.alive) raise_state(std::string(what) + " is closed");
  }

 private:
  std::shared_lock<std::shared_mutex> lock_;
};

inline std::string to_hex(uintptr_t value) {
  char buffer[24];
  std::snprintf(buffer, sizeof buffer, "%llx", static_cast<unsigned long long>(value));
  return buffer;
}

// A native thread (a fill stream's, a host worker's) calling into Python must not take the GIL
// while the interpreter shuts down: it would block or crash.
inline bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// The steady-clock time `timeout_s` seconds from now (a negative timeout: now), for the timed
// waits of the item record and the fill window.
inline std::chrono::steady_clock::time_point deadline_after(double timeout_s) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(std::max(0.0, timeout_s)));
}

// A timed wait that pipefill.torch's daemon threads (feeder, drainer) call in a loop, GIL
// released. If the interpreter began to finalize meanwhile, taking the GIL back would end the
// thread inside nanobind's (noexcept) GIL guard - CPython ends daemon threads that ask for the
// GIL at exit with a forced unwind, and a noexcept frame turns that into std::terminate ("a
// script that leaves a job open aborted at exit", issue 32) - so the thread parks instead: the
// process is ending. `wait` must not throw.
template <class F>
auto waiting_without_gil(F&& wait) noexcept -> decltype(wait()) {
  PyThreadState* state = PyEval_SaveThread();
  auto result = std::forward<F>(wait)();
  while (interpreter_finalizing()) std::this_thread::sleep_for(std::chrono::seconds(1));
  PyEval_RestoreThread(state);
  return result;
}

inline void* as_pointer(uintptr_t handle) { return reinterpret_cast<void*>(handle); }
inline uintptr_t as_handle(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer); }

// ---- configuration ------------------------------------------------------------------------

// pfConfig_t as a plain record; starts from PF_CONFIG_INITIALIZER (every field unset).
struct RawConfig {
  pfConfig_t c;
  RawConfig() { pfConfigInit(&c); }
};

}  // namespace pfpy
