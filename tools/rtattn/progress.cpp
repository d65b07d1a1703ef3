#include "progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>

#include "common.hpp"
#include "util/format.hpp"

namespace rtattn::cli {

namespace {

std::size_t terminal_width() {
    struct winsize ws {};
    return ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? ws.ws_col : 80;
}

}  // namespace

Progress::Progress(std::size_t total, std::size_t to_compile, bool enabled, bool cache_only)
    : total_(total), to_compile_(to_compile), enabled_(enabled), cache_only_(cache_only),
      tty_(::isatty(STDERR_FILENO) == 1) {}

void Progress::log(LogLevel level, const std::string& msg) {
    static const char* names[] = {"", "warning", "info", "debug"};
    std::lock_guard<std::mutex> g(mu_);
    clear_line();
    util::print(stderr, "rtattn {}: {}\n", names[static_cast<int>(level)], msg);
    if (tty_ && shown_) draw(last_);  // a log file already has the last progress line
}

void Progress::finished(const std::string& what, const char* status, bool compiled, bool failed) {
    std::lock_guard<std::mutex> g(mu_);
    ++done_;
    compiled_ += compiled;
    failed_ += failed;
    if (enabled_) draw(util::format("{} {}", status, what));
}

void Progress::close() {
    std::lock_guard<std::mutex> g(mu_);
    if (tty_ && shown_) util::print(stderr, "\n");
    shown_ = false;
}

void Progress::clear_line() {
    if (tty_ && shown_) util::print(stderr, "\r\x1b[K");
}

void Progress::draw(const std::string& what) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::string eta;
    if (!cache_only_) {
        const std::size_t left = to_compile_ > compiled_ ? to_compile_ - compiled_ : 0;
        eta = left == 0 ? " ETA 0s" : compiled_ == 0 ? " ETA ?" : " ETA " + human_seconds(elapsed / compiled_ * left);
    }
    // Short enough that a typical line ("[12/96] 0 failed 3.1s ETA 42s compiled d132 bf16 causal h16:16 sm_90a")
    // fits 80 columns; a terminal narrower than the line gets it cut, since \r redraws only the last wrapped part.
    const std::string line = util::format("[{}/{}] {} {} {}{}  {}", done_, total_, failed_,
                                          cache_only_ ? "missing" : "failed", human_seconds(elapsed), eta, what);
    if (tty_) {
        clear_line();
        util::print(stderr, "\r{}", line.substr(0, terminal_width() - 1));
    } else {
        util::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
    shown_ = true;
    last_ = what;
}

}  // namespace rtattn::cli
