// The disk cache's file-system plumbing: small classes over POSIX calls with one error style (Status), so that the
// policy in disk_cache.cpp (scan, evict, verify) reads apart from system calls.
//
// Below a directory handle (Dir) every name is resolved relative to its descriptor (openat, unlinkat, renameat)
// and never through a symlink, so a path component swapped for a link cannot send an operation outside the cache.
// Files are only ever opened as regular files, without blocking on a FIFO; removing a name removes that link or
// node itself, never what it points to.
#pragma once
#include <sys/stat.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace rtattn::cache::fsys {

// The outcome of one step: ok, or what failed with the path and the reason ("cannot open X: Permission denied").
// err() is the errno of the failing call, or 0 when the failure is not a system error (e.g. a FIFO where a
// regular file belongs), so callers can tell a plain miss (ENOENT) from a problem.
class Status {
public:
    Status() = default;
    static Status failure(int err, std::string message) { return Status(err, std::move(message)); }
    // "cannot <what> <path>: <strerror(err)>".
    static Status sys(int err, std::string_view what, const std::string& path);
    bool ok() const { return message_.empty(); }
    int err() const { return err_; }
    const std::string& message() const { return message_; }

private:
    Status(int err, std::string message) : err_(err), message_(std::move(message)) {}
    int err_ = 0;
    std::string message_;
};

std::string errno_text(int err);
// "a FIFO", "a symlink", "a directory", ... for messages about what sits where a regular file belongs.
std::string node_type(mode_t mode);

// An owned file descriptor.
class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd&& o) noexcept : fd_(o.release()) {}
    Fd& operator=(Fd&& o) noexcept;
    ~Fd();
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    int get() const { return fd_; }
    int release();
    bool valid() const { return fd_ >= 0; }

private:
    int fd_ = -1;
};

// An open directory.
class Dir {
public:
    Dir() = default;
    // Opens `path` as given (symlinks in it are followed: the caller chose it), first creating it and any missing
    // parents with `mode` (less the umask) when `create` is set.
    static Status open_path(const std::string& path, bool create, mode_t mode, Dir* out);
    // Opens the child directory `name` without following a symlink, first creating it with `mode` when `create`.
    Status open_child(const std::string& name, bool create, mode_t mode, Dir* out) const;

    bool is_open() const { return fd_.valid(); }
    int fd() const { return fd_.get(); }
    const std::string& path() const { return path_; }
    std::string child_path(std::string_view name) const { return path_ + "/" + std::string(name); }

    Status stat(struct stat* st) const;                                 // the directory itself
    Status stat_child(const std::string& name, struct stat* st) const;  // the name itself, not a link's target
    Status list(std::vector<std::string>* names) const;                 // every name but . and ..
    Status remove(const std::string& name) const;                       // unlinkat: the link or node itself
    Status sync() const;                                                // makes renames in it durable

private:
    Fd fd_;
    std::string path_;
};

// Opens the regular file `name` in `dir` for reading, never through a symlink and without blocking on a FIFO;
// anything else at the name is refused (err 0, "X is a FIFO, not a regular file"). `st` receives its fstat.
Status open_regular(const Dir& dir, const std::string& name, Fd* out, struct stat* st);
// Reads exactly `size` bytes; fewer (the file shrank) is a failure, and nothing past them is read.
Status read_exact(int fd, std::size_t size, const std::string& path, std::string* out);

// Removes `name` from `dir` unless a process holds an flock on it (a live writer's temp file, a lock somebody is
// building under). Non-regular nodes at the name are removed as they are. Sets *busy and leaves the name alone
// when the file is held.
Status remove_unlocked(const Dir& dir, const std::string& name, bool* busy);

// A uniquely named file in a directory, holding an flock on itself for as long as it lives: a scan that can take
// the lock has proven its writer dead (remove_unlocked). Removed on destruction unless committed.
class TempFile {
public:
    TempFile() = default;
    ~TempFile();
    TempFile(TempFile&& o) noexcept;
    TempFile& operator=(TempFile&&) = delete;
    // Creates <prefix><6 random characters> with mode 0644 less the umask.
    static Status create(const Dir& dir, const std::string& prefix, TempFile* out);
    Status write(std::string_view data);     // writes all of it and fsyncs
    Status commit(const std::string& name);  // renames it over `name` in the same directory
    const std::string& path() const { return path_; }

private:
    Fd dir_fd_, fd_;
    std::string name_, path_;
    bool exists_ = false;
};

// An exclusive flock on a lock file, released on destruction (or when the process dies).
class LockFile {
public:
    struct Wait {
        std::chrono::milliseconds timeout{60000};  // give up after this long
        std::chrono::milliseconds warn_after{5000};
        // Called once when warn_after has passed, with who holds the lock ("pid 123 on host h", or "" if unknown).
        std::function<void(const std::string& holder)> on_slow;
    };
    LockFile() = default;
    // Opens (creating it when needed) and locks `name` in `dir`. A lock file that is replaced or removed while we
    // wait is opened again. The holder writes its pid into the file so that waiters can name it; on timeout the
    // Status has err ETIMEDOUT and names the holder.
    static Status acquire(const Dir& dir, const std::string& name, const Wait& wait, LockFile* out);
    bool held() const { return fd_.valid(); }

private:
    Fd fd_;
};

}  // namespace rtattn::cache::fsys
