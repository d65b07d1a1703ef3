// Runs the rtattn CLI as a user would, each test on its own temp cache dir (test_cli.cpp, test_cli_security.cpp).
// RTATTN_CLI_UNDER_TEST replaces the binary: the same tests can be run against another build (an older one, to
// show that a test reproduces what it guards against).
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "catch.hpp"
#include "testutil.hpp"

namespace rtattn::test {

inline std::string cli_path() {
    const char* other = std::getenv("RTATTN_CLI_UNDER_TEST");
    return other && *other ? other : RTATTN_CLI_PATH;
}

struct Result {
    int code = -1;
    std::string out, err;
    std::string all() const { return out + err; }
};

// A private cache dir plus a scratch dir; cli() runs the tool against the cache with stdout and stderr kept apart,
// so that --json output can be parsed while progress and errors go to stderr.
class Cli {
public:
    const TempDir cache{"rtattn-cli-cache"};
    const TempDir scratch{"rtattn-cli-scratch"};

    Result operator()(const std::string& args) const { return raw("--cache-dir '" + cache.str() + "' " + args); }

    // `args` as given (no --cache-dir); `prefix` goes before the command (environment, ulimit, timeout).
    Result raw(const std::string& args, const std::string& prefix = "") const {
        const std::string err_path = (scratch.path() / "stderr.txt").string();
        // The subshell keeps run_command's trailing 2>&1 from overriding our stderr redirect. The manifest dir
        // variable is dropped so that "default" always means the source tree's cache/default.json.
        const std::string cmd = "(" + prefix + " env -u RTATTN_MANIFEST_DIR '" + cli_path() + "' " + args + " 2>'" +
                                err_path + "')";
        Result r;
        r.code = rtattn::test::run_command(cmd, &r.out);
        r.err = rtattn::test::read_file(err_path);
        INFO("rtattn " << args << "\n--- stdout ---\n" << r.out << "\n--- stderr ---\n" << r.err);
        return r;
    }

    nlohmann::json json_of(const std::string& args, int expect_code = 0) const {
        const Result r = (*this)(args);
        INFO("rtattn " << args << "\n--- stdout ---\n" << r.out << "\n--- stderr ---\n" << r.err);
        REQUIRE(r.code == expect_code);
        const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
        REQUIRE_FALSE(j.is_discarded());
        return j;
    }

    std::string write_manifest(const std::string& name, const std::string& text) const {
        const std::filesystem::path p = scratch.path() / name;
        std::ofstream(p) << text;
        return p.string();
    }
};

}  // namespace rtattn::test
