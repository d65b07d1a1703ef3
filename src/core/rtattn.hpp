// Everything of the library's own API (rtattn::core, visible as rtattn::X), for the library, the CLI and the tests.
#pragma once
#include "core/config.hpp"
#include "core/errors.hpp"
#include "core/runtime.hpp"
