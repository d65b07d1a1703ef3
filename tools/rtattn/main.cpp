// rtattn: the librtattn command-line tool. Precompiles configs into the disk cache, lists, verifies and trims the
// cache, shows what the library renders and plans for a config, and benchmarks kernels. It needs no GPU except to
// default --arch and to run kernels. This file only wires the command groups (cmd_*.cpp, bench.cpp) together.
//
// Every rtattn::Error (and anything else thrown) is caught here and printed as "rtattn: error: ..."; nothing calls
// exit(). Exit codes are in kFooter.
#include "util/format.hpp"

#include <CLI/CLI.hpp>
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>

#include "common.hpp"

namespace util = rtattn::util;

namespace {

using namespace rtattn::cli;

constexpr const char* kFooter =
    "Exit codes:\n"
    "  0  success\n"
    "  1  some work failed (a config did not compile, or compiled but was not stored, or is missing with\n"
    "     --cache-only; verify found bad entries)\n"
    "  2  usage or config error (a bad flag, value or manifest field; the message names it)\n"
    "  3  cache error (the cache directory cannot be used, or is not trusted)";

int report_error(const char* what, int code) {
    std::fflush(stdout);
    util::print(stderr, "rtattn: error: {}\n", what);
    return code;
}

// Parse errors from CLI11: help and --version are successes, anything else is a usage error.
int parse_error_exit(const CLI::App& app, const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    report_error(e.what(), kUsage);
    util::print(stderr, "run `rtattn --help` (or `rtattn <command> --help`) for usage\n");
    return kUsage;
}

}  // namespace

int main(int argc, char** argv) {
    // With a driver present, NVRTC serves repeat compiles from the driver's JIT cache and then prints no ptxas
    // report; the CLI shows registers and spills, so it opts out (rtattn's own cache makes NVRTC's redundant).
    setenv("CUDA_CACHE_DISABLE", "1", /*overwrite=*/0);
    CLI::App app{"rtattn: precompile, inspect and maintain librtattn's attention kernel cache"};
    app.footer(kFooter);
    app.require_subcommand(0, 1);
    app.fallthrough();  // global options may also follow the subcommand
    app.set_version_flag("--version", std::string(rtattn::version()));

    GlobalOptions g;
    app.add_option("--cache-dir", g.cache_dir, "cache directory (default: $RTATTN_CACHE_DIR, else "
                                               "$XDG_CACHE_HOME/rtattn, else ~/.cache/rtattn)")
        ->type_name("DIR");
    app.add_option("--log-level", g.log_level, "how much the library logs to stderr (default: $RTATTN_LOG_LEVEL, else warn)")
        ->check(CLI::IsMember({"quiet", "warn", "info", "debug"}))
        ->type_name("LEVEL");
    app.add_flag("--shared-cache", g.shared_cache,
                 "trust a cache dir that others can write (a team cache; also RTATTN_SHARED_CACHE=1): anyone who can "
                 "write it can run code in this process");
    app.add_option("--lock-timeout", g.lock_timeout,
                   "seconds to wait for another process building the same kernel, then compile without storing "
                   "(default 60)")
        ->check(CLI::Range(0.0, 86400.0))
        ->type_name("SECONDS");

    Action action;
    add_precompile(app, g, action);
    add_cache_commands(app, g, action);
    add_inspect_commands(app, g, action);
    add_bench(app, g, action);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return parse_error_exit(app, e);
    }
    // The flag wins over the environment, for the library's Runtime too (which reads RTATTN_LOG_LEVEL itself).
    if (!g.log_level.empty()) setenv("RTATTN_LOG_LEVEL", g.log_level.c_str(), /*overwrite=*/1);
    if (!action) {  // no command: say what there is
        util::print("{}", app.help());
        return kOk;
    }

    try {
        return action();
    } catch (const rtattn::ConfigError& e) {
        return report_error(e.what(), kUsage);
    } catch (const rtattn::ArgumentError& e) {
        return report_error(e.what(), kUsage);
    } catch (const rtattn::CacheError& e) {
        return report_error(e.what(), kCacheFailure);
    } catch (const rtattn::Error& e) {
        return report_error(e.what(), kWorkFailed);
    } catch (const std::exception& e) {
        return report_error(e.what(), kWorkFailed);
    } catch (...) {
        return report_error("unknown exception", kWorkFailed);
    }
}
