# Finds PipeFill's C++ dependencies. Each one comes from the system (the Debian packages of
# scripts/install-deps.sh) when it is installed, else from the copy that scripts/stage-gpu-deps.sh
# put into PIPEFILL_DEPS_DIR (default: <source>/.gpu-deps, git-ignored) - the GPU machine has the
# CUDA toolkit, CMake and ninja but none of these packages, and nothing can be installed there.
# Either way the targets have the same names: fmt::fmt, spdlog::spdlog,
# nlohmann_json::nlohmann_json, CLI11::CLI11, GTest::gtest/gtest_main/gmock/gmock_main,
# benchmark::benchmark. A staged package, and fmt and spdlog always, also answer later
# find_package() calls for it (through CMAKE_FIND_PACKAGE_REDIRECTS_DIR), so subdirectories may
# keep calling find_package().
#
# fmt and spdlog: only their headers are used, the system's (/usr/include) or the staged copy's.
# Their compiled parts are built in this build, once, into two static archives with hidden
# symbols (pipefill_fmt from cmake/compiled-deps/fmt.cpp, pipefill_spdlog - compiled spdlog on
# that external fmt, never spdlog's bundled copy - from cmake/compiled-deps/spdlog.cpp), so no
# binary of ours has a DT_NEEDED on libfmt.so or libspdlog.so and none exports their symbols:
# the Python extension is self-contained (a manylinux wheel; scripts/build-wheel.sh checks it),
# and our copies never meet the ones a host process carries (torch has its own fmt). Header-only
# use would do the same at ~5 s (fmt) and ~8 s (spdlog) more per translation unit; it is the
# fallback only for an fmt other than 9, the version fmt.cpp's instantiations are written for.
#
# Other staged forms: nlohmann-json and CLI11 headers, and GoogleTest and Google Benchmark built
# from source inside this build (EXCLUDE_FROM_ALL: only what a target links is built).
#
# PIPEFILL_STAGED_DEPS: AUTO (system first, staged where absent), ON (staged only: what the GPU
# machine does, and how scripts/gpu-check-hidden-deps.sh proves it), OFF (system only).

set(PIPEFILL_DEPS_DIR "${PROJECT_SOURCE_DIR}/.gpu-deps" CACHE PATH
    "Dependencies staged by scripts/stage-gpu-deps.sh, used where a system package is absent")
set(PIPEFILL_STAGED_DEPS AUTO CACHE STRING
    "Use the staged dependencies: AUTO (where the system lacks one), ON (always), OFF (never)")
set_property(CACHE PIPEFILL_STAGED_DEPS PROPERTY STRINGS AUTO ON OFF)
set(PIPEFILL_DEPENDENCY_SOURCES "" CACHE INTERNAL "name=system|staged for each dependency")
set(PIPEFILL_DEPENDENCY_SOURCES "")

# Makes later find_package(<package>) calls succeed with the targets already defined here.
function(_pipefill_redirect_find_package package version)
  string(TOLOWER "${package}" lower)
  file(WRITE "${CMAKE_FIND_PACKAGE_REDIRECTS_DIR}/${lower}-config.cmake"
       "# ${package} ${version}: targets made by PipefillDependencies.cmake\n"
       "set(${package}_FOUND TRUE)\n")
  file(WRITE "${CMAKE_FIND_PACKAGE_REDIRECTS_DIR}/${lower}-config-version.cmake"
       "set(PACKAGE_VERSION \"${version}\")\n"
       "if(PACKAGE_FIND_VERSION AND PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)\n"
       "  set(PACKAGE_VERSION_COMPATIBLE FALSE)\n"
       "else()\n"
       "  set(PACKAGE_VERSION_COMPATIBLE TRUE)\n"
       "  if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)\n"
       "    set(PACKAGE_VERSION_EXACT TRUE)\n"
       "  endif()\n"
       "endif()\n")
endfunction()

# The staged copy's directory for `subdir`, or a fatal error that says how to get one.
function(_pipefill_staged_dir package subdir marker out)
  set(dir "${PIPEFILL_DEPS_DIR}/${subdir}")
  if(NOT EXISTS "${dir}/${marker}")
    message(FATAL_ERROR
      "PipeFill needs ${package}: install the Debian packages (bash scripts/install-deps.sh), or stage a "
      "copy with 'bash scripts/stage-gpu-deps.sh' (${dir}/${marker} is missing; "
      "PIPEFILL_STAGED_DEPS=${PIPEFILL_STAGED_DEPS}).")
  endif()
  set(${out} "${dir}" PARENT_SCOPE)
endfunction()

# The version a staged copy records in .gpu-deps/VERSIONS (written by the staging script).
function(_pipefill_staged_version name out)
  set(version "0")
  if(EXISTS "${PIPEFILL_DEPS_DIR}/VERSIONS")
    file(STRINGS "${PIPEFILL_DEPS_DIR}/VERSIONS" lines REGEX "^${name} ")
    if(lines)
      list(GET lines 0 line)
      string(REGEX REPLACE "^${name} ([^ ]+).*" "\\1" version "${line}")
    endif()
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

macro(_pipefill_note name source)
  list(APPEND PIPEFILL_DEPENDENCY_SOURCES "${name}=${source}")
  set(PIPEFILL_DEPENDENCY_SOURCES "${PIPEFILL_DEPENDENCY_SOURCES}" CACHE INTERNAL "")
endmacro()

# pipefill_dependency(<name> [version]): one of fmt, spdlog, nlohmann_json, CLI11, GTest, benchmark.
macro(pipefill_dependency name)
  set(_pf_found FALSE)
  if(NOT PIPEFILL_STAGED_DEPS STREQUAL "ON")
    if("${name}" STREQUAL "fmt" OR "${name}" STREQUAL "spdlog")
      cmake_language(CALL _pipefill_system_${name}_headers _pf_found)
    elseif("${name}" STREQUAL "GTest")
      find_package(GTest ${ARGN} QUIET)
      if(GTest_FOUND AND TARGET GTest::gtest AND TARGET GTest::gmock)
        set(_pf_found TRUE)
      endif()
    else()
      find_package(${name} ${ARGN} QUIET CONFIG)
      set(_pf_found ${${name}_FOUND})
    endif()
  endif()
  if(_pf_found)
    _pipefill_note(${name} system)
  elseif(PIPEFILL_STAGED_DEPS STREQUAL "OFF")
    message(FATAL_ERROR "PipeFill needs ${name} ${ARGN}: install the Debian packages (bash scripts/install-deps.sh); "
                        "PIPEFILL_STAGED_DEPS=OFF forbids the staged copy.")
  else()
    cmake_language(CALL _pipefill_staged_${name})
    _pipefill_note(${name} staged)
  endif()
endmacro()

# ---- fmt and spdlog: headers from the system or the staged copy, compiled parts built here ----
# The system's headers (no find_package: its imported targets are the shared libraries).
function(_pipefill_system_fmt_headers out)
  find_path(_pf_fmt_include fmt/format-inl.h NO_CACHE)
  if(_pf_fmt_include)
    _pipefill_compiled_fmt("${_pf_fmt_include}")
  endif()
  set(${out} ${_pf_fmt_include} PARENT_SCOPE)
endfunction()

function(_pipefill_system_spdlog_headers out)
  find_path(_pf_spdlog_include spdlog/spdlog-inl.h NO_CACHE)
  if(_pf_spdlog_include)
    _pipefill_compiled_spdlog("${_pf_spdlog_include}")
  endif()
  set(${out} ${_pf_spdlog_include} PARENT_SCOPE)
endfunction()

function(_pipefill_staged_fmt)
  _pipefill_staged_dir(fmt fmt include/fmt/format.h dir)
  _pipefill_compiled_fmt("${dir}/include")
endfunction()

function(_pipefill_staged_spdlog)
  _pipefill_staged_dir(spdlog spdlog include/spdlog/spdlog.h dir)
  _pipefill_compiled_spdlog("${dir}/include")
endfunction()

# The version the headers declare: FMT_VERSION (90100 -> 9.1.0), SPDLOG_VER_MAJOR/MINOR/PATCH.
function(_pipefill_header_version include_dir header macros out)
  set(parts "")
  foreach(macro IN LISTS macros)
    file(STRINGS "${include_dir}/${header}" line REGEX "^#define ${macro} [0-9]+")
    string(REGEX REPLACE "^#define ${macro} ([0-9]+).*" "\\1" number "${line}")
    list(APPEND parts "${number}")
  endforeach()
  if(macros STREQUAL "FMT_VERSION" AND parts MATCHES "^[0-9]+$")
    math(EXPR major "${parts} / 10000")
    math(EXPR minor "${parts} / 100 % 100")
    math(EXPR patch "${parts} % 100")
    set(parts "${major};${minor};${patch}")
  endif()
  list(JOIN parts "." version)
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

# fmt::fmt: fmt's compiled part as a static archive with hidden symbols (header-only for an fmt
# other than 9: cmake/compiled-deps/fmt.cpp lists fmt 9's template instantiations).
function(_pipefill_compiled_fmt include_dir)
  _pipefill_header_version("${include_dir}" fmt/core.h FMT_VERSION version)
  if(version VERSION_GREATER_EQUAL 9 AND version VERSION_LESS 10)
    message(STATUS "PipeFill: fmt ${version} (${include_dir}) compiled into pipefill_fmt")
    add_library(pipefill_fmt STATIC ${PROJECT_SOURCE_DIR}/cmake/compiled-deps/fmt.cpp)
    target_include_directories(pipefill_fmt SYSTEM PUBLIC "${include_dir}")
    set_target_properties(pipefill_fmt PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  else()
    message(STATUS "PipeFill: fmt ${version} (not 9) is used header-only (FMT_HEADER_ONLY): a slower build")
    add_library(pipefill_fmt INTERFACE)
    target_include_directories(pipefill_fmt SYSTEM INTERFACE "${include_dir}")
    target_compile_definitions(pipefill_fmt INTERFACE FMT_HEADER_ONLY=1)
  endif()
  add_library(fmt::fmt ALIAS pipefill_fmt)
  _pipefill_redirect_find_package(fmt "${version}")
endfunction()

# spdlog::spdlog: spdlog's compiled part (SPDLOG_COMPILED_LIB) on the fmt above, a static archive
# with hidden symbols.
function(_pipefill_compiled_spdlog include_dir)
  _pipefill_header_version("${include_dir}" spdlog/version.h "SPDLOG_VER_MAJOR;SPDLOG_VER_MINOR;SPDLOG_VER_PATCH" version)
  if(NOT TARGET fmt::fmt)
    message(FATAL_ERROR "PipefillDependencies: resolve fmt before spdlog")
  endif()
  if(NOT EXISTS "${include_dir}/spdlog/spdlog-inl.h")
    message(FATAL_ERROR "spdlog in ${include_dir} has no spdlog-inl.h: PipeFill needs spdlog 1.x's headers")
  endif()
  message(STATUS "PipeFill: spdlog ${version} (${include_dir}) compiled into pipefill_spdlog")
  add_library(pipefill_spdlog STATIC ${PROJECT_SOURCE_DIR}/cmake/compiled-deps/spdlog.cpp)
  target_include_directories(pipefill_spdlog SYSTEM PUBLIC "${include_dir}")
  target_compile_definitions(pipefill_spdlog PUBLIC SPDLOG_COMPILED_LIB=1 SPDLOG_FMT_EXTERNAL=1)
  target_link_libraries(pipefill_spdlog PUBLIC fmt::fmt Threads::Threads)
  set_target_properties(pipefill_spdlog PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  add_library(spdlog::spdlog ALIAS pipefill_spdlog)
  _pipefill_redirect_find_package(spdlog "${version}")
endfunction()

function(_pipefill_staged_nlohmann_json)
  _pipefill_staged_dir(nlohmann-json nlohmann_json include/nlohmann/json.hpp dir)
  _pipefill_staged_version(nlohmann_json version)
  add_library(pipefill_staged_nlohmann_json INTERFACE)
  target_include_directories(pipefill_staged_nlohmann_json SYSTEM INTERFACE "${dir}/include")
  add_library(nlohmann_json::nlohmann_json ALIAS pipefill_staged_nlohmann_json)
  _pipefill_redirect_find_package(nlohmann_json "${version}")
endfunction()

function(_pipefill_staged_CLI11)
  _pipefill_staged_dir(CLI11 cli11 include/CLI/CLI.hpp dir)
  _pipefill_staged_version(CLI11 version)
  add_library(pipefill_staged_cli11 INTERFACE)
  target_include_directories(pipefill_staged_cli11 SYSTEM INTERFACE "${dir}/include")
  add_library(CLI11::CLI11 ALIAS pipefill_staged_cli11)
  _pipefill_redirect_find_package(CLI11 "${version}")
endfunction()

function(_pipefill_staged_GTest)
  _pipefill_staged_dir(GoogleTest googletest CMakeLists.txt dir)
  _pipefill_staged_version(googletest version)
  set(BUILD_GMOCK ON CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(gtest_force_shared_crt ON CACHE BOOL "" FORCE)
  # Old cmake_minimum_required lines of third-party sources stay accepted by CMake >= 4.
  set(CMAKE_POLICY_VERSION_MINIMUM 3.5)
  add_subdirectory("${dir}" "${PROJECT_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL SYSTEM)
  foreach(t gtest gtest_main gmock gmock_main)
    if(NOT TARGET GTest::${t})
      message(FATAL_ERROR "staged GoogleTest in ${dir} did not define GTest::${t}")
    endif()
  endforeach()
  _pipefill_redirect_find_package(GTest "${version}")
endfunction()

function(_pipefill_staged_benchmark)
  _pipefill_staged_dir("Google Benchmark" benchmark CMakeLists.txt dir)
  _pipefill_staged_version(benchmark version)
  foreach(off BENCHMARK_ENABLE_TESTING BENCHMARK_ENABLE_GTEST_TESTS BENCHMARK_ENABLE_INSTALL
              BENCHMARK_INSTALL_DOCS BENCHMARK_ENABLE_WERROR BENCHMARK_FORCE_WERROR BENCHMARK_ENABLE_LIBPFM
              BENCHMARK_DOWNLOAD_DEPENDENCIES BENCHMARK_ENABLE_LTO BENCHMARK_ENABLE_ASSEMBLY_TESTS)
    set(${off} OFF CACHE BOOL "" FORCE)
  endforeach()
  set(CMAKE_POLICY_VERSION_MINIMUM 3.5)
  add_subdirectory("${dir}" "${PROJECT_BINARY_DIR}/_deps/benchmark" EXCLUDE_FROM_ALL SYSTEM)
  if(NOT TARGET benchmark::benchmark)
    message(FATAL_ERROR "staged Google Benchmark in ${dir} did not define benchmark::benchmark")
  endif()
  _pipefill_redirect_find_package(benchmark "${version}")
endfunction()
