// fmt's formatting engine compiled once. The library takes fmt header-only (no libfmt at run time: a wheel carries
// nothing else), and there fmt::format and fmt::print put the whole engine (the parser and every argument type's
// writer, floats included) into each file that calls them: 6-7 s of compile per file on 2 cores (config.cpp 15.3 s
// -> 8.6 s, 2026-11-28). These keep fmt's compile-time format-string checks and hand the type-erased arguments to
// util/format.cpp, the one file that instantiates the engine.
#pragma once
#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace rtattn::util {

std::string vformatted(fmt::string_view format, fmt::format_args args);
void vprinted(std::FILE* out, fmt::string_view format, fmt::format_args args);

// fmt::format's result.
template <class... T>
std::string format(fmt::format_string<T...> format, T&&... args) {
    return vformatted(format, fmt::make_format_args(args...));
}

// fmt::print to `out`, or to stdout.
template <class... T>
void print(std::FILE* out, fmt::format_string<T...> format, T&&... args) {
    vprinted(out, format, fmt::make_format_args(args...));
}
template <class... T>
void print(fmt::format_string<T...> format, T&&... args) {
    vprinted(stdout, format, fmt::make_format_args(args...));
}

}  // namespace rtattn::util
