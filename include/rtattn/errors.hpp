// rtattn's C++ exceptions, header-only over the C ABI (rtattn.h): every failed C call is rebuilt here into the
// exception it stands for, with the same message, so no C++ type crosses the shared library's boundary.
// Error model: every failure surfaces as an exception derived from rtattn::Error. Nothing in the library calls
// exit() or abort(); a message always names what was wrong and what is allowed.
#pragma once
#if !defined(__cplusplus) || __cplusplus < 201703L
#error "rtattn's C++ API needs C++17 or newer; C callers include <rtattn/rtattn.h>"
#endif
#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "rtattn/rtattn.h"

namespace rtattn {

namespace detail {
struct FromC {};  // tags the constructors that rebuild an exception from the C ABI's last error
inline std::string str(const char* s) { return s ? std::string(s) : std::string(); }
}  // namespace detail

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A field of AttentionConfig (or RuntimeOptions, or a manifest entry) is out of range, or the plan cannot serve it.
class ConfigError : public Error {
public:
    ConfigError(std::string field, const std::string& message)
        : Error(field + ": " + message), field_(std::move(field)) {}
    ConfigError(detail::FromC, const std::string& what, std::string field) : Error(what), field_(std::move(field)) {}
    const std::string& field() const noexcept { return field_; }
private:
    std::string field_;
};

// A forward() argument is invalid: null or misaligned pointer, bad size or stride.
class ArgumentError : public Error {
public:
    ArgumentError(std::string field, const std::string& message)
        : Error(field + ": " + message), field_(std::move(field)) {}
    ArgumentError(detail::FromC, const std::string& what, std::string field) : Error(what), field_(std::move(field)) {}
    const std::string& field() const noexcept { return field_; }
private:
    std::string field_;
};

// NVRTC refused the rendered source (or could not be loaded: no log). Carries everything needed to reproduce it.
class CompileError : public Error {
public:
    CompileError(const std::string& message, std::string log, std::string options, std::string source)
        : Error(log.empty() ? message : message + "\n--- NVRTC log ---\n" + log), log_(std::move(log)),
          options_(std::move(options)), source_(std::move(source)) {}
    CompileError(detail::FromC, const std::string& what, std::string log, std::string options, std::string source)
        : Error(what), log_(std::move(log)), options_(std::move(options)), source_(std::move(source)) {}
    const std::string& log() const noexcept { return log_; }
    const std::string& options() const noexcept { return options_; }
    const std::string& source() const noexcept { return source_; }
private:
    std::string log_, options_, source_;
};

// A CUDA Driver API call failed (or no driver / no GPU is present).
class CudaError : public Error {
public:
    CudaError(std::string call, int result, const std::string& result_name, const std::string& message)
        : Error(call + " failed: " + result_name + " (" + std::to_string(result) + "): " + message),
          call_(std::move(call)), result_(result) {}
    CudaError(detail::FromC, const std::string& what, std::string call, int result)
        : Error(what), call_(std::move(call)), result_(result) {}
    const std::string& call() const noexcept { return call_; }
    int result() const noexcept { return result_; }
private:
    std::string call_;
    int result_;
};

// Cache-only mode found no cubin for a requested config; it refuses to compile.
class CacheMissError : public Error {
public:
    using Error::Error;
};

// The on-disk cache could not be read or written in a way that matters to the caller (e.g. a precompiled kernel
// that could not be stored).
class CacheError : public Error {
public:
    using Error::Error;
};

namespace detail {

// Throws the exception the thread's last C error stands for.
[[noreturn]] inline void throw_last_error(rtattn_status status) {
    const std::string what = str(rtattn_last_error_message());
    switch (status) {
        case RTATTN_ERROR_CONFIG: throw ConfigError(FromC{}, what, str(rtattn_last_error_field()));
        case RTATTN_ERROR_ARGUMENT: throw ArgumentError(FromC{}, what, str(rtattn_last_error_field()));
        case RTATTN_ERROR_COMPILE:
            throw CompileError(FromC{}, what, str(rtattn_last_error_log()), str(rtattn_last_error_options()),
                               str(rtattn_last_error_source()));
        case RTATTN_ERROR_CUDA:
            throw CudaError(FromC{}, what, str(rtattn_last_error_cuda_call()), rtattn_last_error_cuda_result());
        case RTATTN_ERROR_CACHE_MISS: throw CacheMissError(what);
        case RTATTN_ERROR_CACHE: throw CacheError(what);
        case RTATTN_ERROR_OUT_OF_MEMORY: throw std::bad_alloc();
        default: throw Error(what.empty() ? "librtattn: status " + std::to_string(status) : what);
    }
}

inline void check(rtattn_status status) {
    if (status != RTATTN_OK) throw_last_error(status);
}

// Reads a text output of the C ABI (buffer, size, needed) into a string.
template <class Call>
std::string read_text(Call call) {
    std::size_t needed = 0;
    check(call(static_cast<char*>(nullptr), std::size_t(0), &needed));
    std::string out(needed, '\0');
    check(call(out.data(), out.size(), &needed));
    out.resize(needed > 0 ? needed - 1 : 0);
    return out;
}

}  // namespace detail
}  // namespace rtattn
