// fmt's compiled part, built from fmt's own headers into PipeFill's static archive
// pipefill_fmt (cmake/PipefillDependencies.cmake): every binary of ours then carries its own
// hidden copy, so none needs libfmt.so (the Python wheel must not; a GPU node has no fmt) and none
// clashes with another copy in the process (torch carries its own fmt).
//
// What libfmt's src/format.cc does: the out-of-line functions (FMT_FUNC) come from including
// format-inl.h without FMT_HEADER_ONLY; the templates the headers declare but define only in
// format-inl.h are instantiated explicitly below. The list is fmt 9's: every symbol Debian's
// libfmt.so.9 exports, except the file API of src/os.cc (fmt/os.h), which nothing here uses.
// (FMT_HEADER_ONLY everywhere instead costs ~5 s per translation unit that formats floats.)
#include <fmt/format-inl.h>

#if FMT_VERSION < 90000 || FMT_VERSION >= 100000
#error "cmake/compiled-deps/fmt.cpp lists fmt 9's instantiations; PipefillDependencies.cmake uses it only for fmt 9"
#endif

FMT_BEGIN_NAMESPACE
namespace detail {

template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;

#ifndef FMT_STATIC_THOUSANDS_SEPARATOR
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
#endif

template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char*, const char*);
template FMT_API void vformat_to(buffer<char>&, string_view, basic_format_args<FMT_BUFFER_CONTEXT(char)>,
                                 locale_ref);

template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template FMT_API auto decimal_point_impl(locale_ref) -> wchar_t;
template FMT_API void buffer<wchar_t>::append(const wchar_t*, const wchar_t*);

}  // namespace detail
FMT_END_NAMESPACE
