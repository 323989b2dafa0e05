// Loads a CUDA library that one PipeFill feature needs (cuBLAS for GEMM fill items, CUPTI for
// calibration) at the first use of that feature, never when libpipefill or the Python extension
// is loaded. A library linked into a training process must not choose that process's CUDA
// libraries: a DT_NEEDED on libnccl.so.2 or libcublas.so.13 binds the *toolkit's* copy first, and
// PyTorch imported afterwards then runs on it (`libtorch_cuda.so: undefined symbol:
// ncclCommResume`, issue 16). So the order of preference is:
//   1. a copy the process already loaded (RTLD_NOLOAD by soname; glibc matches DT_SONAME), i.e.
//      the one PyTorch or the trainer brought;
//   2. the dynamic linker's search (LD_LIBRARY_PATH, the system's cache);
//   3. the toolkit this build was compiled against (an absolute path recorded at build time), so
//      the installed extension also loads on its own, with no RPATH and no torch in front of it.
// Header-only (the example fill jobs, which link no PipeFill library, use it too).
#pragma once

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace pipefill::cuda {

struct LazyLibrary {
  void* handle = nullptr;
  std::string path;   // what was opened ("libcublas.so.13 (already loaded)", or a path)
  std::string error;  // why nothing could be opened (every candidate's dlerror), when handle is null
};

// Opens `soname` by the order above. `fallback_path` may be null or empty.
inline LazyLibrary open_lazy_library(const char* soname, const char* fallback_path) {
  LazyLibrary lib;
  constexpr int kFlags = RTLD_NOW | RTLD_LOCAL;
  if ((lib.handle = dlopen(soname, kFlags | RTLD_NOLOAD)) != nullptr) {
    lib.path = std::string(soname) + " (already loaded in the process)";
    return lib;
  }
  if ((lib.handle = dlopen(soname, kFlags)) != nullptr) {
    lib.path = soname;
    return lib;
  }
  const char* why = dlerror();
  lib.error = std::string(soname) + ": " + (why != nullptr ? why : "not found");
  if (fallback_path != nullptr && *fallback_path != '\0') {
    if ((lib.handle = dlopen(fallback_path, kFlags)) != nullptr) {
      lib.path = fallback_path;
      lib.error.clear();
      return lib;
    }
    why = dlerror();
    lib.error += std::string("; ") + fallback_path + ": " + (why != nullptr ? why : "not found");
  }
  return lib;
}

// Resolves `symbol` into `*slot`; on failure appends the symbol to `missing`.
template <typename Fn>
inline void resolve_symbol(void* handle, const char* symbol, Fn* slot, std::string* missing) {
  *slot = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*slot == nullptr) *missing += (missing->empty() ? "" : ", ") + std::string(symbol);
}

}  // namespace pipefill::cuda

// Stringifies after macro expansion (cublas_v2.h maps cublasCreate to cublasCreate_v2).
#define PF_LAZY_STR_(x) #x
#define PF_LAZY_STR(x) PF_LAZY_STR_(x)
