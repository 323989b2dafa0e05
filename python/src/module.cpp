// pipefill._pipefill: the nanobind extension under the `pipefill` Python package.
//
// It binds the C API (include/pipefill/pipefill.h) and the example fill jobs
// (examples/fill_jobs/fill_jobs.h) only - never the C++ core's classes - so the core can be
// rewritten behind the stable C signatures. The Python package (python/pipefill/) builds the
// user-facing API (Config, Runtime, bubble context managers, jobs, dataclasses) on top.
//
// What this layer adds over the raw C calls:
//  - every failing call raises pipefill.PipeFillError(code, message) with the C message read
//    on the calling thread right after the call;
//  - handle lifetimes that Python cannot get wrong: a job keeps its runtime alive, a runtime
//    keeps its simulated world alive, closing a runtime destroys its jobs first, and a closed
//    handle raises instead of reaching C with a dangling pointer;
//  - calls that can block (waits, synchronisation, running the simulated world, destroying)
//    release the GIL, and a close racing with a call on another thread waits for that call;
//  - native launch callbacks for fill jobs (no Python runs in the fill loop): the example fill
//
// The extension's files, one per thing it binds: common.hpp (errors, lifetimes), runtime.* (the
// runtime, its config and the host device's stream calls), jobs.* (fill jobs and the example
// jobs' parameters), sim_world.* (the simulated world). This file is the module's entry point.

#include <cstdlib>
#include <string_view>

#include "core/env_check.hpp"
#include "runtime.hpp"

using namespace nb::literals;
using namespace pfpy;

NB_MODULE(_pipefill, m) {
  m.doc() =
      "Native layer of the pipefill package: the PipeFill C API and the example fill jobs.\n"
      "Use the `pipefill` package; this module's names are its building blocks.";
  nb::register_exception_translator(&translate_error);
  // nanobind lists, at interpreter exit, every instance, type and function of this module still
  // alive (~25 lines for a script that never closed its runtime: module globals are not collected
  // at exit). That is a check for this package's own tests (tests/python/conftest.py sets
  // PIPEFILL_LEAK_WARNINGS=1), not a message for a user's script, which exits quietly. What a
  // script leaves open is not closed at exit: the process ends its threads, and the item
  // trampolines call no Python once the interpreter is finalizing (streaming.cpp).
  const char* leak_warnings = std::getenv("PIPEFILL_LEAK_WARNINGS");
  nb::set_leak_warnings(leak_warnings != nullptr && std::string_view(leak_warnings) == "1");

  m.def(
      "set_error_type",
      [](nb::handle type) {
        Py_XINCREF(type.ptr());
        Py_XDECREF(g_error_type);
        g_error_type = type.ptr();
      },
      "type"_a, "Registers the exception class raised for failed calls (done by pipefill).");
  m.def(
      "error_string", [](int code) { return std::string(pfGetErrorString(static_cast<pfResult_t>(code))); },
      "code"_a, "pfGetErrorString: the static text naming a result code.");
  m.def(
      "version",
      [] {
        int v = 0;
        check(pfGetVersion(&v));
        return v;
      },
      "pfGetVersion: MAJOR*10000 + MINOR*100 + PATCH of the library linked in.");
  m.def(
      "fill_kind_name", [](int kind) { return std::string(fjKindName(kind)); }, "kind"_a,
      "fjKindName: name of an example fill job kind.");
  m.def(
      "known_environment_variables",
      [] {
        nb::list names;
        for (std::string_view name : pipefill::core::known_environment_variables()) {
          names.append(std::string(name));
        }
        return names;
      },
      "The PIPEFILL_* names the library, its tools and scripts read (the C library warns once "
      "about any other).");
  m.attr("HEADER_VERSION") = PIPEFILL_VERSION_CODE;
  m.attr("CONFIG_VERSION") = PF_CONFIG_VERSION;
  m.attr("UNSET_INT") = PF_UNSET_INT;
  m.attr("UNSET_DOUBLE") = PF_UNSET_DOUBLE;
  m.attr("UNSET_SIZE") = static_cast<size_t>(PF_UNSET_SIZE);
  m.attr("CONFIG_SIZE") = sizeof(pfConfig_t);
  m.attr("MAX_TRACKED_ITEMS") = SimTicketJob::kMaxTrackedItems;
  // Whether the CUDA backend is compiled in (it links no CUDA library either way).
#ifdef PIPEFILL_WITH_CUDA
  m.attr("WITH_CUDA") = true;
#else
  m.attr("WITH_CUDA") = false;
#endif

  bind_config(m);
  bind_fill_params(m);
  bind_sim_world(m);
  bind_jobs(m);
  bind_runtime(m);
}
