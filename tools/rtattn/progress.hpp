// `rtattn precompile`'s progress on stderr: on a terminal one line redrawn in place (never wider than the terminal),
// otherwise (logs, CI) one line per finished config. Library log messages go through here too, so they never land in
// the middle of the progress line.
#pragma once
#include <chrono>
#include <cstddef>
#include <mutex>
#include <string>

#include "core/rtattn.hpp"

namespace rtattn::cli {

class Progress {
public:
    // `to_compile`: the configs whose cubin was not on disk when the run started. The ETA is that compile work left
    // at the wall-clock rate of compiles so far (cache hits cost nothing, so counting them would make it optimistic).
    Progress(std::size_t total, std::size_t to_compile, bool enabled, bool cache_only);
    void log(LogLevel level, const std::string& msg);
    // A config is done: `compiled` when it took a compile (stored or not), `failed` when it is counted as a failure.
    void finished(const std::string& what, const char* status, bool compiled, bool failed);
    void close();  // ends the redrawn line so that what follows starts on a fresh one

private:
    void clear_line();
    void draw(const std::string& what);

    std::mutex mu_;
    const std::size_t total_, to_compile_;
    const bool enabled_, cache_only_, tty_;
    const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
    std::size_t done_ = 0, compiled_ = 0, failed_ = 0;
    bool shown_ = false;
    std::string last_;
};

}  // namespace rtattn::cli
