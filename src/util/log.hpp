// Library-internal logging through RuntimeOptions' sink and level.
#pragma once
#include <functional>
#include <string>

#include "core/config.hpp"
#include "rtattn/types.hpp"

namespace rtattn::util {

class Logger {
public:
    Logger() = default;
    Logger(LogLevel level, std::function<void(LogLevel, const std::string&)> sink)
        : level_(level), sink_(std::move(sink)) {}
    void log(LogLevel level, const std::string& msg) const;
    void warn(const std::string& msg) const { log(LogLevel::warn, msg); }
    void info(const std::string& msg) const { log(LogLevel::info, msg); }
    void debug(const std::string& msg) const { log(LogLevel::debug, msg); }
private:
    LogLevel level_ = LogLevel::warn;
    std::function<void(LogLevel, const std::string&)> sink_;
};

}  // namespace rtattn::util
