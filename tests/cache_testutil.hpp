// Helpers shared by the cache test programs (test_cache.cpp: the cache's behaviour; test_cache_security.cpp: what
// it does with hostile or careless file systems).
#pragma once
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache.hpp"
#include "catch.hpp"
#include "util/sha256.hpp"

namespace rtattn::test {

namespace fs = std::filesystem;

inline constexpr std::uint64_t kNoCap = 0;

inline cache::DiskOptions disk_options(std::uint64_t max_bytes = kNoCap) {
    cache::DiskOptions o;
    o.max_bytes = max_bytes;
    return o;
}

inline std::string key_of(const std::string& name) { return util::to_hex(util::sha256(name.data(), name.size())); }

// Binary cubin bytes (NULs included) that differ per name; info shaped as the Runtime writes it.
inline cache::Entry make_entry(const std::string& name, const std::string& arch = "sm_90a",
                               std::size_t cubin_size = 256) {
    cache::Entry e;
    e.key = key_of(name);
    e.arch = arch;
    for (std::size_t i = 0; i < cubin_size; ++i) e.cubin.push_back(static_cast<char>((i * 31 + name.size()) & 0xff));
    e.info_json = R"({"config":{"name":")" + name + R"("},"registers":96})";
    return e;
}

// Offset of the cubin in an entry file: magic, format, arch_len, key, arch, cubin_size, info_size.
inline std::size_t header_len(const std::string& arch) { return 8 + 4 + 4 + 64 + arch.size() + 8 + 8; }
// The whole file: header, cubin, info and the trailing checksum.
inline std::size_t entry_size(const cache::Entry& e) {
    return header_len(e.arch) + e.cubin.size() + e.info_json.size() + 32;
}

inline std::uint64_t stored_bytes(cache::DiskCache& disk, const cache::Entry& e) {
    std::uint64_t bytes = 0;
    const std::string problem = disk.store(e, &bytes);
    INFO(problem);
    CHECK(problem.empty());
    return bytes;
}

// A Logger whose messages the test can inspect; copies share one buffer.
class CapturedLog {
public:
    util::Logger logger(LogLevel level = LogLevel::warn) const {
        auto state = state_;
        return util::Logger(level, [state](LogLevel lv, const std::string& msg) {
            std::lock_guard<std::mutex> g(state->mu);
            if (lv == LogLevel::warn) state->warnings.push_back(msg);
        });
    }
    std::vector<std::string> warnings() const {
        std::lock_guard<std::mutex> g(state_->mu);
        return state_->warnings;
    }
    bool any_warning_contains(const std::string& a, const std::string& b = "") const {
        for (const auto& w : warnings())
            if (w.find(a) != std::string::npos && w.find(b) != std::string::npos) return true;
        return false;
    }
    std::size_t count_containing(const std::string& a) const {
        std::size_t n = 0;
        for (const auto& w : warnings()) n += w.find(a) != std::string::npos;
        return n;
    }

private:
    struct State {
        std::mutex mu;
        std::vector<std::string> warnings;
    };
    std::shared_ptr<State> state_ = std::make_shared<State>();
};

inline void patch_byte(const fs::path& p, std::size_t offset, const std::function<char(char)>& change) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f);
    f.seekg(std::streamoff(offset));
    char c = 0;
    f.get(c);
    f.seekp(std::streamoff(offset));
    f.put(change(c));
}

inline void set_age(const fs::path& p, int seconds_ago) {
    struct timespec now {};
    clock_gettime(CLOCK_REALTIME, &now);
    struct timespec times[2] = {now, now};
    times[0].tv_sec -= seconds_ago;
    times[1].tv_sec -= seconds_ago;
    REQUIRE(utimensat(AT_FDCWD, p.c_str(), times, AT_SYMLINK_NOFOLLOW) == 0);
}

inline void write_file(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary);
    out << bytes;
}

// Every non-directory under `dir` (links and other nodes too) whose name starts with `prefix`.
inline std::vector<fs::path> files_under(const fs::path& dir, const std::string& prefix = "") {
    std::vector<fs::path> out;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
        if (!it->is_directory(ec) && it->path().filename().string().rfind(prefix, 0) == 0) out.push_back(it->path());
    return out;
}

// A builder that counts its calls and can be slowed down to widen races.
struct CountingBuilder {
    cache::Entry entry;
    std::chrono::milliseconds delay{0};
    std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
    cache::KernelCache::Builder fn() const {
        return [*this] {
            ++*calls;
            std::this_thread::sleep_for(delay);
            return entry;
        };
    }
};

template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "";
}

// Runs `body` in a forked child and returns its exit status (-1 if it did not exit). The child dies after
// `seconds` (a hang shows up as a failure, not a stuck test run) and, when `as_nobody` and we are root, runs as
// uid/gid 65534. The body reports through its return value: 0 = pass; no Catch2 assertions across the fork.
inline int in_child(const std::function<int()>& body, int seconds = 20, bool as_nobody = false) {
    std::fflush(nullptr);  // or the child would repeat buffered output
    const pid_t pid = ::fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        ::alarm(unsigned(seconds));
        if (as_nobody && ::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(90);
        int rc = 99;
        try {
            rc = body();
        } catch (...) {
            rc = 98;
        }
        ::_exit(rc);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace rtattn::test
