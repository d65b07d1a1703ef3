// The library throws the public exception types (include/rtattn/errors.hpp: header-only, no library code) inside;
// the C ABI (src/capi/) turns them into status codes, and the public C++ layer rebuilds them from those. One
// definition of each, for the library and its callers.
// Error model: every failure surfaces as an exception derived from rtattn::Error. Nothing in the library calls
// exit() or abort(); a message always names what was wrong and what is allowed.
#pragma once
#include "rtattn/errors.hpp"

namespace rtattn::core {
using rtattn::Error;
using rtattn::ConfigError;
using rtattn::ArgumentError;
using rtattn::CompileError;
using rtattn::CudaError;
using rtattn::CacheMissError;
using rtattn::CacheError;
}  // namespace rtattn::core
