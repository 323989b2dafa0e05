// spdlog's compiled part (SPDLOG_COMPILED_LIB), built from spdlog's own headers into PipeFill's
// static archive pipefill_spdlog (cmake/PipefillDependencies.cmake), on the external fmt of
// pipefill_fmt: no binary of ours needs libspdlog.so, and each carries a hidden copy that cannot
// meet the host application's spdlog (its registry, its loggers).
//
// As spdlog's own src/spdlog.cpp and src/stdout_sinks.cpp: without SPDLOG_HEADER_ONLY the -inl.h
// files define spdlog's functions out of line, and the class templates are instantiated for the
// mutexes in use. Only the core, the stdout/stderr sinks (src/common/log.cpp's stderr_sink_mt)
// and the colour console sinks (the registry's default logger) are built: code that starts using
// another sink (files, async) adds its -inl.h and instantiations here, or fails to link with an
// undefined spdlog symbol.
// (Header-only spdlog instead costs ~8 s per translation unit that includes it.)
#ifndef SPDLOG_COMPILED_LIB
#error "cmake/compiled-deps/spdlog.cpp needs SPDLOG_COMPILED_LIB (PipefillDependencies.cmake defines it)"
#endif

#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/console_globals.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/sinks/stdout_color_sinks-inl.h>
#include <spdlog/sinks/stdout_sinks-inl.h>
#include <spdlog/spdlog-inl.h>

#include <mutex>

template SPDLOG_API spdlog::logger::logger(std::string name, sinks_init_list::iterator begin,
                                           sinks_init_list::iterator end);
template class SPDLOG_API spdlog::sinks::base_sink<std::mutex>;
template class SPDLOG_API spdlog::sinks::base_sink<spdlog::details::null_mutex>;

template class SPDLOG_API spdlog::sinks::stdout_sink_base<spdlog::details::console_mutex>;
template class SPDLOG_API spdlog::sinks::stdout_sink_base<spdlog::details::console_nullmutex>;
template class SPDLOG_API spdlog::sinks::stdout_sink<spdlog::details::console_mutex>;
template class SPDLOG_API spdlog::sinks::stdout_sink<spdlog::details::console_nullmutex>;
template class SPDLOG_API spdlog::sinks::stderr_sink<spdlog::details::console_mutex>;
template class SPDLOG_API spdlog::sinks::stderr_sink<spdlog::details::console_nullmutex>;

template class SPDLOG_API spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>;
template class SPDLOG_API spdlog::sinks::ansicolor_sink<spdlog::details::console_nullmutex>;
template class SPDLOG_API spdlog::sinks::ansicolor_stdout_sink<spdlog::details::console_mutex>;
template class SPDLOG_API spdlog::sinks::ansicolor_stdout_sink<spdlog::details::console_nullmutex>;
template class SPDLOG_API spdlog::sinks::ansicolor_stderr_sink<spdlog::details::console_mutex>;
template class SPDLOG_API spdlog::sinks::ansicolor_stderr_sink<spdlog::details::console_nullmutex>;
