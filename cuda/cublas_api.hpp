// cuBLAS reached through a function table loaded at first use (lazy_library.hpp says why): the
// GEMM fill items (opaque_gemm.cpp) and the example fill jobs (examples/fill_jobs/gpu_job.cu)
// call `cublas_api().cublasSgemm(...)` instead of linking libcublas. Header-only: both the
// library and the example jobs include it.
#pragma once

#include <cublas_v2.h>

#include "lazy_library.hpp"

// Every cuBLAS function PipeFill calls. Names as written in code; cublas_v2.h maps some of them
// to their _v2 symbols, which is what gets resolved.
#define PF_CUBLAS_FUNCTIONS(X)                                                              \
  X(cublasCreate) X(cublasDestroy) X(cublasSetStream) X(cublasSetWorkspace)                 \
  X(cublasSetMathMode) X(cublasSetSmCountTarget) X(cublasSgemm) X(cublasSgemmStridedBatched) X(cublasGetStatusName)

#ifndef PIPEFILL_CUBLAS_SONAME
#define PIPEFILL_CUBLAS_SONAME "libcublas.so." PF_LAZY_STR(CUBLAS_VER_MAJOR)
#endif
#ifndef PIPEFILL_CUBLAS_FALLBACK
#define PIPEFILL_CUBLAS_FALLBACK ""
#endif

namespace pipefill::cuda {

struct CublasApi {
#define PF_CUBLAS_FIELD(name) decltype(&::name) name = nullptr;
  PF_CUBLAS_FUNCTIONS(PF_CUBLAS_FIELD)
#undef PF_CUBLAS_FIELD
  bool ok = false;
  std::string where;  // the library opened
  std::string error;  // why cuBLAS is unavailable, when !ok
};

// Loaded once per process (thread-safe), on the first call.
inline const CublasApi& cublas_api() {
  static const CublasApi api = [] {
    CublasApi a;
    const LazyLibrary lib = open_lazy_library(PIPEFILL_CUBLAS_SONAME, PIPEFILL_CUBLAS_FALLBACK);
    if (lib.handle == nullptr) {
      a.error = "cuBLAS could not be loaded (" + lib.error + ")";
      return a;
    }
    std::string missing;
#define PF_CUBLAS_RESOLVE(name) resolve_symbol(lib.handle, PF_LAZY_STR(name), &a.name, &missing);
    PF_CUBLAS_FUNCTIONS(PF_CUBLAS_RESOLVE)
#undef PF_CUBLAS_RESOLVE
    a.where = lib.path;
    if (!missing.empty()) {
      a.error = "cuBLAS from " + lib.path + " lacks " + missing;
      return a;
    }
    a.ok = true;
    return a;
  }();
  return api;
}

}  // namespace pipefill::cuda
