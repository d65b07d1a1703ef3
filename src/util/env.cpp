#include "util/env.hpp"

#include <cstdlib>
#include <string>

#include "core/errors.hpp"
#include "util/text.hpp"
#include "util/format.hpp"

namespace rtattn::util {

namespace {
std::optional<std::string_view> env(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) return std::nullopt;
    return std::string_view(v);
}
}  // namespace

std::optional<bool> env_flag(const char* name) {
    const auto v = env(name);
    if (!v) return std::nullopt;
    if (*v == "1" || *v == "true") return true;
    if (*v == "0" || *v == "false") return false;
    throw ConfigError(name, util::format("{} is not understood; allowed: 1, 0, true, false (or unset)",
                                         quoted(std::string(*v))));
}

LogLevel parse_log_level(std::string_view value, const char* field) {
    if (value == "quiet") return LogLevel::quiet;
    if (value == "warn") return LogLevel::warn;
    if (value == "info") return LogLevel::info;
    if (value == "debug") return LogLevel::debug;
    throw ConfigError(field, util::format("{} is not a log level; allowed: quiet, warn, info, debug",
                                          quoted(std::string(value))));
}

std::optional<LogLevel> env_log_level() {
    const auto v = env("RTATTN_LOG_LEVEL");
    if (!v) return std::nullopt;
    return parse_log_level(*v, "RTATTN_LOG_LEVEL");
}

}  // namespace rtattn::util
