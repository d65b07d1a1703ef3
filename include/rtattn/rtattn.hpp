// librtattn's C++ API (C++17, header-only over the C ABI in rtattn.h): AttentionConfig, Runtime, Kernel and the
// exceptions. Link the shared library (rtattn::rtattn) or the static one (rtattn::rtattn_static).
#pragma once
#include "rtattn/config.hpp"
#include "rtattn/errors.hpp"
#include "rtattn/rtattn.h"
#include "rtattn/runtime.hpp"
#include "rtattn/types.hpp"
