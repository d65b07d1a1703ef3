// The environment variables a server or operator configures the library with (README: Environment). Each is read
// strictly: a value that is set but not understood is a ConfigError naming the variable, never ignored.
#pragma once
#include <optional>
#include <string_view>

#include "core/config.hpp"
#include "rtattn/types.hpp"

namespace rtattn::util {

// "1"/"true" or "0"/"false"; nullopt when unset or empty.
std::optional<bool> env_flag(const char* name);

// "quiet", "warn", "info", "debug"; throws ConfigError(field, ...) otherwise.
LogLevel parse_log_level(std::string_view value, const char* field);

// RTATTN_LOG_LEVEL; nullopt when unset or empty.
std::optional<LogLevel> env_log_level();

}  // namespace rtattn::util
