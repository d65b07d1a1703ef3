// Judging and running cases of the GPU harness (gpu_harness.hpp).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "gpu_harness.hpp"
#include "testutil.hpp"

namespace rtattn::test::gpu {

namespace {

bool is_poison(float x) { return std::bit_cast<std::uint32_t>(x) == kPoison32; }

}  // namespace

Outcome evaluate(const Problem& p, const DeviceResult& got, const test::ReferenceResult& ref) {
    Outcome r;
    const Dtype dt = p.c.dtype;

    // O: every element of the logical view, compared as a whole; everything else in the buffer must be untouched.
    std::vector<double> out(ref.o.size());
    std::vector<char> in_view(got.o_buffer.size(), 0);
    p.o.for_each([&](int b, int s, int h, int d, std::int64_t i) {
        const std::uint16_t bits = got.o_buffer[i];
        if (bits == kPoison16) ++r.o_unwritten;
        out[ref.o_index(b, s, h, d)] = test::from_bits(bits, dt);
        in_view[i] = 1;
    });
    for (std::size_t i = 0; i < got.o_buffer.size(); ++i)
        if (!in_view[i] && got.o_buffer[i] != kPoison16) ++r.o_stray;
    r.o_err = test::rel_frobenius(out, ref.o);

    // LSE: rows with keys are compared as a vector; rows without must be exactly +inf with an all-zero O row.
    std::vector<double> lse_out, lse_ref;
    for (int b = 0; b < p.c.batch; ++b)
        for (int h = 0; h < p.c.heads_q; ++h)
            for (int s = 0; s < p.c.seqlen_q; ++s) {
                const std::size_t i = ref.lse_index(b, h, s);
                const float g = got.lse[i];
                if (is_poison(g))
                    ++r.lse_unwritten;
                else
                    ++r.lse_written;
                if (std::isinf(ref.lse[i])) {
                    ++r.empty_rows;
                    bool zero_row = true;
                    for (int d = 0; d < p.c.d_v; ++d) zero_row = zero_row && out[ref.o_index(b, s, h, d)] == 0.0;
                    const bool lse_ok = !p.c.with_lse || (std::isinf(g) && g > 0);
                    if (!zero_row || !lse_ok) ++r.empty_row_errors;
                    continue;
                }
                lse_out.push_back(g);
                lse_ref.push_back(ref.lse[i]);
            }
    for (std::size_t i = p.lse_count(); i < got.lse.size(); ++i)
        if (!is_poison(got.lse[i])) ++r.lse_stray;
    if (p.c.with_lse) r.lse_err = test::rel_frobenius_floor1(lse_out, lse_ref);
    return r;
}

std::string judge(const Outcome& r, const Case& c) {
    std::vector<std::string> why;
    if (r.o_unwritten) why.push_back(util::format("{} O elements never written", r.o_unwritten));
    if (r.o_stray) why.push_back(util::format("{} O buffer elements outside the tensor overwritten", r.o_stray));
    if (!(r.o_err <= o_tolerance(c.dtype)))
        why.push_back(util::format("O rel error {:.3e} > {:.0e}", r.o_err, o_tolerance(c.dtype)));
    if (c.with_lse) {
        if (r.lse_unwritten) why.push_back(util::format("{} LSE elements never written", r.lse_unwritten));
        if (!(r.lse_err <= kLseTolerance))
            why.push_back(util::format("LSE rel error {:.3e} > {:.0e}", r.lse_err, kLseTolerance));
    } else if (r.lse_written) {
        why.push_back(util::format("lse == nullptr, yet {} LSE elements written", r.lse_written));
    }
    if (r.lse_stray) why.push_back(util::format("{} elements past the LSE array overwritten", r.lse_stray));
    if (r.empty_row_errors)
        why.push_back(util::format("{} of {} keyless rows not (O = 0, LSE = +inf)", r.empty_row_errors, r.empty_rows));
    std::string s;
    for (const auto& w : why) s += (s.empty() ? "" : "; ") + w;
    return s;
}

namespace {

struct SharedRuntime {
    test::TempDir dir{"rtattn-gpu-test"};
    Runtime runtime{options(dir)};

    static RuntimeOptions options(const test::TempDir& d) {
        RuntimeOptions o;
        o.cache_dir = d.str();
        o.max_concurrent_compiles = int(std::max(1u, std::thread::hardware_concurrency()));
        return o;
    }
};

}  // namespace

Runtime& runtime() {
    static SharedRuntime shared;
    return shared.runtime;
}


// Compiles every kernel the tables need, in parallel, once. The cubin depends only on the head dims, dtype, causal,
// local, sinks, softcap, alibi and whether the kv heads make packed K/V rows 16-byte multiples (plan::kv_rows_16b;
// the other head counts, the scale, a window's bounds, the sinks' values, the cap and the slopes are launch
// parameters), so one get() per such tuple fills the Runtime's memory cache and the cases' own get() calls are hits.
// A compile failure here is not reported: the case that needs the kernel calls get() again and fails with the config
// in its message.
void warm(const std::vector<std::vector<Case>>& tables) {
    static std::once_flag once;
    std::call_once(once, [&] {
        std::set<std::tuple<int, int, Dtype, bool, bool, bool, bool, bool, bool>> seen;
        std::vector<AttentionConfig> configs;
        for (const auto& table : tables)
            for (const Case& c : table) {
                const bool rows_16b = c.heads_kv * c.d_qk % 8 == 0 && c.heads_kv * c.d_v % 8 == 0;
                if (seen.emplace(c.d_qk, c.d_v, c.dtype, c.causal, c.local, c.sinks, c.softcap > 0, c.alibi > 0,
                                 rows_16b)
                        .second) {
                    Case canonical = c;
                    canonical.heads_q = canonical.heads_kv = rows_16b ? 8 : 1;
                    canonical.scale.reset();
                    configs.push_back(canonical.config());
                }
            }
        Runtime& rt = runtime();
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::future<std::string>> jobs;  // empty string: ok, else the error
        for (const auto& cfg : configs)
            jobs.push_back(std::async(std::launch::async, [&rt, cfg]() -> std::string {
                try {
                    rt.get(cfg);
                    return "";
                } catch (const std::exception& e) {
                    return cfg.describe() + ": " + e.what();
                }
            }));
        std::vector<std::string> failures;
        for (auto& j : jobs)
            if (auto err = j.get(); !err.empty()) failures.push_back(std::move(err));
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const CacheStats st = rt.stats();
        std::printf("[gpu] warm-up: %zu kernels in %.1f s wall (%llu compiles, %.1f s summed over builds), %zu "
                    "failed%s%s\n",
                    configs.size(), secs, (unsigned long long)st.compiles, st.compile_seconds, failures.size(),
                    failures.empty() ? "" : "; first: ", failures.empty() ? "" : failures.front().c_str());
        std::fflush(stdout);
    });
}

Outcome run_case(const Case& c) {
    const Kernel kernel = runtime().get(c.config());  // also makes the context current on this thread
    const Problem p = make_problem(c);
    DeviceProblem dev(p);
    dev.upload_inputs(p);
    dev.poison_outputs(p);
    kernel.forward(dev.args(p));            // legacy stream: ordered after the copies and fills above
    const auto ref = reference_for(p);      // host work overlaps the kernel
    return evaluate(p, dev.download(p), ref);
}

struct TableSummary {
    int run = 0, failed = 0;
    double worst_o[2] = {0, 0};  // indexed by dtype: bf16, fp16
    std::string worst_o_case[2];
    double worst_lse = 0;
};

void run_table(const char* name, const std::vector<Case>& cases) {
    TableSummary sum;
    for (const Case& c : cases) {
        INFO("case: " << c.describe() << " (seed " << c.seed() << ")");
        ++sum.run;
        std::string failure;
        try {
            const Outcome r = run_case(c);
            failure = judge(r, c);
            const int di = c.dtype == Dtype::bf16 ? 0 : 1;
            if (r.o_err > sum.worst_o[di]) {
                sum.worst_o[di] = r.o_err;
                sum.worst_o_case[di] = c.describe();
            }
            sum.worst_lse = std::max(sum.worst_lse, r.lse_err);
        } catch (const std::exception& e) {
            failure = std::string("exception: ") + e.what();
        }
        if (!failure.empty()) ++sum.failed;
        CHECK(failure == "");
    }
    std::printf("[gpu] %s: %d cases, %d failed; worst O rel err bf16 %.2e (%s), fp16 %.2e (%s); worst LSE rel err "
                "%.2e\n",
                name, sum.run, sum.failed, sum.worst_o[0], sum.worst_o_case[0].c_str(), sum.worst_o[1],
                sum.worst_o_case[1].c_str(), sum.worst_lse);
    std::fflush(stdout);
}


}  // namespace rtattn::test::gpu
