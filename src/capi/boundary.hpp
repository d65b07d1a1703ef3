// The rules at the C ABI (include/rtattn/rtattn.h): every exception becomes a status code and the thread's last
// error, and versioned structs are read and written only as far as the caller's struct_size says.
#pragma once
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>

#include "core/errors.hpp"
#include "rtattn/rtattn.h"

namespace rtattn::capi {

// The thread's last error (rtattn_last_error_*).
struct LastError {
    rtattn_status status = RTATTN_OK;
    std::string message, field, log, options, source, cuda_call;
    int cuda_result = 0;
};
LastError& last_error();

// Records the exception in flight (call from a catch block) and returns its status.
rtattn_status record_current_exception();
// Records an error the boundary itself finds (a NULL pointer, a struct_size) and returns `status`.
rtattn_status fail(rtattn_status status, const std::string& field, const std::string& message);

// Runs `body` with the thread's last error cleared first; any exception becomes a status.
template <class F>
rtattn_status guard(F&& body) noexcept {
    last_error() = LastError{};
    try {
        body();
        return RTATTN_OK;
    } catch (...) {
        return record_current_exception();
    }
}

// A struct_size below `min` (the struct's first version) is an uninitialized struct.
inline void check_struct_size(std::size_t given, std::size_t min, const char* name) {
    if (given < min)
        throw core::ArgumentError(std::string(name) + ".struct_size",
                                  std::to_string(given) + " is too small for this struct (" + std::to_string(min) +
                                      " bytes); set it with the matching rtattn_*_init function");
}

// Reads a versioned struct: defaults first (`init`), then the caller's bytes up to its struct_size, as far as this
// library's struct goes. `min_size` is the struct's first version: an older caller's struct_size is at least that,
// and the fields it lacks keep their defaults. A larger struct_size is a newer caller: bytes past this library's
// struct are never read, since struct_size is only the caller's word, and reading it as far as it claims went past the
// end of a caller's struct (a stack buffer, a page's end) when it was wrong.
template <class T, class Init>
T read_struct(const T* in, const char* name, Init init, std::size_t min_size = sizeof(T)) {
    T out;
    init(&out);
    if (!in) throw core::ArgumentError(name, "is NULL");
    const std::size_t n = in->struct_size;
    check_struct_size(n, min_size, name);
    std::memcpy(&out, in, n < sizeof(T) ? n : sizeof(T));
    out.struct_size = sizeof(T);
    return out;
}

// Writes a versioned struct into the caller's, as far as its struct_size reaches.
template <class T>
void write_struct(const T& value, T* out, const char* name) {
    if (!out) throw core::ArgumentError(name, "is NULL");
    const std::size_t n = out->struct_size;
    check_struct_size(n, sizeof(T), name);
    std::memcpy(out, &value, sizeof(T));
    out->struct_size = n;
}

}  // namespace rtattn::capi
