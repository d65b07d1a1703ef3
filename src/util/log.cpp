#include "util/log.hpp"

#include <cstdio>

namespace rtattn::util {

void Logger::log(LogLevel level, const std::string& msg) const {
    if (level == LogLevel::quiet || static_cast<int>(level) > static_cast<int>(level_)) return;
    if (sink_) {
        sink_(level, msg);
        return;
    }
    static const char* names[] = {"", "warning", "info", "debug"};
    std::fprintf(stderr, "rtattn %s: %s\n", names[static_cast<int>(level)], msg.c_str());
}

}  // namespace rtattn::util
