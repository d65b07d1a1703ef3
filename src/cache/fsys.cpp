#include "cache/fsys.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <random>
#include <system_error>
#include <thread>
#include <utility>

#include "util/text.hpp"

namespace rtattn::cache::fsys {

namespace {

constexpr int kOpenDir = O_RDONLY | O_DIRECTORY | O_CLOEXEC;

bool same_file(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// Whether `fd` is still the file named `name` in `dir`: a name can be unlinked or replaced while we hold it open.
bool still_named(int dir_fd, const std::string& name, int fd) {
    struct stat held {}, named {};
    return ::fstat(fd, &held) == 0 && ::fstatat(dir_fd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) == 0 &&
           same_file(held, named);
}

std::string random_suffix() {
    static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    thread_local std::mt19937_64 rng{std::random_device{}() ^ (std::uint64_t(::getpid()) << 32)};
    std::string s(6, ' ');
    for (char& c : s) c = kChars[rng() % (sizeof kChars - 1)];
    return s;
}

// Who holds a lock, as its holder wrote it into the file (a short line; anything else is shown escaped).
std::string holder_of(int fd) {
    char buf[128];
    const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
    if (n <= 0) return "";
    std::string s(buf, std::size_t(n));
    while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
    return util::escaped(s);
}

void write_holder(int fd) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string line = "pid " + std::to_string(::getpid()) + " on host " + host + "\n";
    // Best effort: a lock file of another user may be open read-only; waiters then just cannot name us.
    if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, line.data(), line.size(), 0);
}

}  // namespace

Status Status::sys(int err, std::string_view what, const std::string& path) {
    return Status(err, "cannot " + std::string(what) + " " + path + ": " + errno_text(err));
}

// std::strerror is not thread-safe; the system category's message is.
std::string errno_text(int err) { return std::system_category().message(err); }

std::string node_type(mode_t mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISLNK(mode)) return "a symlink";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    return "an unknown kind of file";
}

// ---- Fd -------------------------------------------------------------------------------------------------------------

Fd& Fd::operator=(Fd&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = o.release();
    }
    return *this;
}

Fd::~Fd() {
    if (fd_ >= 0) ::close(fd_);
}

int Fd::release() { return std::exchange(fd_, -1); }

// ---- Dir ------------------------------------------------------------------------------------------------------------

Status Dir::open_path(const std::string& path, bool create, mode_t mode, Dir* out) {
    if (path.empty()) return Status::failure(ENOENT, "no directory given");
    if (create) {
        // Parents first, each with the same mode (XDG asks 0700 for a per-user cache tree it creates).
        for (std::size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
            if (::mkdir(path.substr(0, at).c_str(), mode) != 0 && errno != EEXIST)
                return Status::sys(errno, "create", path.substr(0, at));
        if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) return Status::sys(errno, "create", path);
    }
    Fd fd(::open(path.c_str(), kOpenDir));
    if (!fd.valid()) return Status::sys(errno, "open directory", path);
    out->fd_ = std::move(fd);
    out->path_ = path;
    return {};
}

Status Dir::open_child(const std::string& name, bool create, mode_t mode, Dir* out) const {
    const std::string path = child_path(name);
    if (create && ::mkdirat(fd(), name.c_str(), mode) != 0 && errno != EEXIST)
        return Status::sys(errno, "create", path);
    Fd fd_child(::openat(fd(), name.c_str(), kOpenDir | O_NOFOLLOW));
    if (!fd_child.valid()) {
        const int err = errno;
        struct stat st {};
        // O_NOFOLLOW on a symlink gives ELOOP (or ENOTDIR with O_DIRECTORY): say what is really there.
        if ((err == ELOOP || err == ENOTDIR) && stat_child(name, &st).ok())
            return Status::failure(err, path + " is " + node_type(st.st_mode) + ", not a directory; not followed");
        return Status::sys(err, "open directory", path);
    }
    out->fd_ = std::move(fd_child);
    out->path_ = path;
    return {};
}

Status Dir::stat(struct stat* st) const {
    return ::fstat(fd(), st) == 0 ? Status() : Status::sys(errno, "stat", path_);
}

Status Dir::stat_child(const std::string& name, struct stat* st) const {
    return ::fstatat(fd(), name.c_str(), st, AT_SYMLINK_NOFOLLOW) == 0 ? Status()
                                                                        : Status::sys(errno, "stat", child_path(name));
}

Status Dir::list(std::vector<std::string>* names) const {
    names->clear();
    // fdopendir takes over its descriptor, so it gets a copy of ours.
    const int copy = ::openat(fd(), ".", kOpenDir);
    if (copy < 0) return Status::sys(errno, "read directory", path_);
    DIR* d = ::fdopendir(copy);
    if (!d) {
        const int err = errno;
        ::close(copy);
        return Status::sys(err, "read directory", path_);
    }
    errno = 0;
    while (const dirent* e = ::readdir(d)) {
        const std::string_view n = e->d_name;
        if (n != "." && n != "..") names->emplace_back(n);
    }
    const int err = errno;
    ::closedir(d);
    return err ? Status::sys(err, "read directory", path_) : Status();
}

Status Dir::remove(const std::string& name) const {
    return ::unlinkat(fd(), name.c_str(), 0) == 0 ? Status() : Status::sys(errno, "remove", child_path(name));
}

Status Dir::sync() const { return ::fsync(fd()) == 0 ? Status() : Status::sys(errno, "fsync", path_); }

// ---- reading --------------------------------------------------------------------------------------------------------

Status open_regular(const Dir& dir, const std::string& name, Fd* out, struct stat* st) {
    const std::string path = dir.child_path(name);
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
    Fd fd(::openat(dir.fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
    if (!fd.valid()) {
        const int err = errno;
        struct stat lst {};
        if (err == ELOOP && dir.stat_child(name, &lst).ok())
            return Status::failure(0, path + " is " + node_type(lst.st_mode) + ", not a regular file; not followed");
        return Status::sys(err, "open", path);
    }
    if (::fstat(fd.get(), st) != 0) return Status::sys(errno, "stat", path);
    if (!S_ISREG(st->st_mode))
        return Status::failure(0, path + " is " + node_type(st->st_mode) + ", not a regular file");
    *out = std::move(fd);
    return {};
}

Status read_exact(int fd, std::size_t size, const std::string& path, std::string* out) {
    out->resize(size);
    std::size_t got = 0;
    while (got < size) {
        const ssize_t n = ::read(fd, out->data() + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Status::sys(errno, "read", path);
        if (n == 0) return Status::failure(0, path + " ended after " + std::to_string(got) + " of " +
                                                  std::to_string(size) + " bytes");
        got += std::size_t(n);
    }
    return {};
}

Status remove_unlocked(const Dir& dir, const std::string& name, bool* busy) {
    *busy = false;
    Fd fd;
    struct stat st {};
    if (const Status s = open_regular(dir, name, &fd, &st); !s.ok()) {
        if (s.err() == ENOENT) return {};
        // A link, FIFO or other node at a name the cache owns: nobody can be writing through it; remove it itself.
        return s.err() == 0 ? dir.remove(name) : s;
    }
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            *busy = true;
            return {};
        }
        return Status::sys(errno, "lock", dir.child_path(name));
    }
    // Lock waiters that opened this inode will find the name gone once they get the lock, and open it again.
    if (!still_named(dir.fd(), name, fd.get())) return {};
    const Status s = dir.remove(name);
    return s.err() == ENOENT ? Status() : s;
}

// ---- TempFile -------------------------------------------------------------------------------------------------------

TempFile::TempFile(TempFile&& o) noexcept
    : dir_fd_(std::move(o.dir_fd_)), fd_(std::move(o.fd_)), name_(std::move(o.name_)), path_(std::move(o.path_)),
      exists_(std::exchange(o.exists_, false)) {}

TempFile::~TempFile() {
    if (exists_) ::unlinkat(dir_fd_.get(), name_.c_str(), 0);
}

Status TempFile::create(const Dir& dir, const std::string& prefix, TempFile* out) {
    Fd dir_fd(::fcntl(dir.fd(), F_DUPFD_CLOEXEC, 0));
    if (!dir_fd.valid()) return Status::sys(errno, "duplicate the descriptor of", dir.path());
    for (int attempt = 0; attempt < 100; ++attempt) {
        const std::string name = prefix + random_suffix();
        Fd fd(::openat(dir.fd(), name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
        if (!fd.valid()) {
            if (errno == EEXIST) continue;
            return Status::sys(errno, "create temp file", dir.child_path(name));
        }
        // A scan (remove_unlocked) may take the lock or remove the name between the create and our flock: then
        // this name is lost to us; try another. A file system without flock cannot keep live writers apart.
        if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
            const int err = errno;
            if (err != EWOULDBLOCK) {
                ::unlinkat(dir.fd(), name.c_str(), 0);
                return Status::sys(err, "lock temp file", dir.child_path(name));
            }
            continue;
        }
        if (!still_named(dir.fd(), name, fd.get())) continue;
        out->dir_fd_ = std::move(dir_fd);
        out->fd_ = std::move(fd);
        out->name_ = name;
        out->path_ = dir.child_path(name);
        out->exists_ = true;
        return {};
    }
    return Status::failure(0, "cannot create a temp file in " + dir.path() + ": every name tried was taken");
}

Status TempFile::write(std::string_view data) {
    while (!data.empty()) {
        const ssize_t n = ::write(fd_.get(), data.data(), data.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Status::sys(errno, "write", path_);
        data.remove_prefix(std::size_t(n));
    }
    return ::fsync(fd_.get()) == 0 ? Status() : Status::sys(errno, "fsync", path_);
}

Status TempFile::commit(const std::string& name) {
    if (::renameat(dir_fd_.get(), name_.c_str(), dir_fd_.get(), name.c_str()) != 0) {
        const int err = errno;
        return Status::failure(err, "cannot rename " + path_ + " to " + name + ": " + errno_text(err));
    }
    exists_ = false;
    return {};
}

// ---- LockFile -------------------------------------------------------------------------------------------------------

Status LockFile::acquire(const Dir& dir, const std::string& name, const Wait& wait, LockFile* out) {
    using Clock = std::chrono::steady_clock;
    const std::string path = dir.child_path(name);
    const auto start = Clock::now();
    bool warned = false;
    for (int attempt = 0; attempt < 100; ++attempt) {
        constexpr int kFlags = O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
        Fd fd(::openat(dir.fd(), name.c_str(), O_RDWR | O_CREAT | kFlags, 0644));
        // Another user's lock file in a shared cache: reading is enough to lock it.
        if (!fd.valid() && errno == EACCES) fd = Fd(::openat(dir.fd(), name.c_str(), O_RDONLY | kFlags));
        if (!fd.valid()) {
            const int err = errno;
            struct stat lst {};
            if (err == ELOOP && dir.stat_child(name, &lst).ok())
                return Status::failure(err, path + " is " + node_type(lst.st_mode) + ", not a lock file; not followed");
            return Status::sys(err, "open lock file", path);
        }
        struct stat st {};
        if (::fstat(fd.get(), &st) != 0) return Status::sys(errno, "stat", path);
        if (!S_ISREG(st.st_mode))
            return Status::failure(0, path + " is " + node_type(st.st_mode) + ", not a lock file");

        auto pause = std::chrono::milliseconds(1);
        while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
            if (errno != EWOULDBLOCK && errno != EINTR) return Status::sys(errno, "lock", path);
            const auto waited = Clock::now() - start;
            if (!warned && waited >= wait.warn_after) {
                warned = true;
                if (wait.on_slow) wait.on_slow(holder_of(fd.get()));
            }
            if (waited >= wait.timeout) {
                const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
                const std::string holder = holder_of(fd.get());
                return Status::failure(ETIMEDOUT, "gave up waiting for " + path + " after " + std::to_string(ms) +
                                                      " ms; it is held by " +
                                                      (holder.empty() ? "an unknown process" : holder));
            }
            std::this_thread::sleep_for(pause);
            pause = std::min(pause * 2, std::chrono::milliseconds(50));
        }
        if (!still_named(dir.fd(), name, fd.get())) continue;  // removed or replaced while we waited
        write_holder(fd.get());
        out->fd_ = std::move(fd);
        return {};
    }
    return Status::failure(0, "cannot lock " + path + ": the lock file keeps being replaced");
}

}  // namespace rtattn::cache::fsys
