// The library's own exception types (rtattn::core): thrown inside, turned into status codes at the C ABI
// (src/capi/), and rebuilt from them by the public header-only layer (include/rtattn/errors.hpp).
// Error model: every failure surfaces as an exception derived from rtattn::Error.
// Nothing in the library calls exit() or abort(); a message always names what was wrong and what is allowed.
#pragma once
#include <stdexcept>
#include <string>

namespace rtattn::core {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A field of AttentionConfig (or a manifest entry) is out of range, or the plan cannot serve it.
class ConfigError : public Error {
public:
    ConfigError(std::string field, const std::string& message)
        : Error(field + ": " + message), field_(std::move(field)) {}
    const std::string& field() const noexcept { return field_; }
private:
    std::string field_;
};

// A forward() argument is invalid: null or misaligned pointer, bad size or stride.
class ArgumentError : public Error {
public:
    ArgumentError(std::string field, const std::string& message)
        : Error(field + ": " + message), field_(std::move(field)) {}
    const std::string& field() const noexcept { return field_; }
private:
    std::string field_;
};

// NVRTC refused the rendered source. Carries everything needed to reproduce the failure.
class CompileError : public Error {
public:
    CompileError(const std::string& message, std::string log, std::string options, std::string source)
        : Error(message + "\n--- NVRTC log ---\n" + log), log_(std::move(log)), options_(std::move(options)),
          source_(std::move(source)) {}
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

// The on-disk cache could not be read or written in a way that matters to the caller (e.g. `verify`).
class CacheError : public Error {
public:
    using Error::Error;
};

}  // namespace rtattn::core

// Internal code names these as rtattn::X. The public C++ API (include/rtattn/*.hpp) defines its own, header-only
// over the C ABI; a translation unit includes one set or the other, never both.
namespace rtattn {
using core::Error;
using core::ConfigError;
using core::ArgumentError;
using core::CompileError;
using core::CudaError;
using core::CacheMissError;
using core::CacheError;
}  // namespace rtattn
