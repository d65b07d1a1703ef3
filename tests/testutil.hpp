// Helpers shared by the test programs.
#pragma once
#include <filesystem>
#include <string>

namespace rtattn::test {

// A fresh, empty directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
public:
    explicit TempDir(const std::string& tag = "rtattn-test");
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::filesystem::path& path() const { return path_; }
    std::string str() const { return path_.string(); }
private:
    std::filesystem::path path_;
};

// Runs a shell command, captures stdout+stderr; returns the exit status (-1 if it could not run).
int run_command(const std::string& cmd, std::string* output = nullptr);

std::string read_file(const std::filesystem::path& p);

}  // namespace rtattn::test
