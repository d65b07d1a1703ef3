// `rtattn bench`: forward or backward TFLOPS over a grid of shapes, and JIT latency figures.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/runtime.hpp"
#include "driver/driver.hpp"

namespace rtattn::cli {

struct BenchOptions {
    std::vector<int> head_dims = {64, 80, 96, 100, 128, 132, 160, 192, 256};
    std::vector<int> seqlens = {1024, 4096, 16384};
    std::vector<bool> causal = {false, true};
    std::vector<std::string> dtypes = {"bf16"};
    int gqa = 1;               // q heads per kv head
    int heads_kv = 0;          // kv heads as given (--heads-kv); 0: heads / gqa
    int tokens = 16384;        // batch * seqlen (FlashAttention's benchmark convention)
    int hidden = 2048;         // heads * head_dim, approximately
    int heads = 0;             // query heads; 0: hidden / head_dim (16 for d132, as the peers' script)
    int warmup = 5;
    int reps = 30;             // median of these
    bool json = false;         // results as JSON on stdout (the table goes to stderr)
    std::string json_out;      // write the JSON results to this file too
    RuntimeOptions runtime;    // cache dir, trust, log level: from the global flags
    bool latency = false;      // JIT latency mode instead of throughput
    bool interleave = false;   // launch the shapes round-robin instead of one after another
    bool backward = false;     // time the backward pass alone (FLOPs 2.5x the forward's)
    bool deterministic = false;  // backward: the deterministic dQ order
    std::string arch;          // pin the kernels' arch (e.g. sm_90 for the mma.sync path on Hopper); empty: the GPU's
    // --decode: GB/s of K/V read by the decode kernels, against the card's copy bandwidth measured in the same run.
    bool decode = false;
    std::vector<std::string> decode_shapes = {"64:4096", "8:32768", "1:131072"};  // batch:cached keys
    std::vector<int> page_sizes = {0};  // 0: a dense cache
    std::vector<int> decode_q = {1};    // query tokens per sequence
    std::vector<int> num_splits = {0};  // key splits (0: the library's choice)
    // --cache-prefill (with --decode): the prefill kernels on the same caches (a chunked prefill: --decode-q query
    // tokens against the cached keys, dense or paged), TFLOPS beside the bytes; page 0 is the plain dense forward.
    bool cache_prefill = false;
    // --varlen: a packed batch of `varlen_seqs` sequences with lengths uniform in varlen_lens (min:max), timed
    // interleaved against the dense kernel on the same total tokens (batch = sequences, seqlen = the mean length).
    bool varlen = false;
    int varlen_seqs = 64;
    std::string varlen_lens = "64:4096";
    // --vs-padded: each head dim that is not a multiple of 16 timed interleaved with the kernel at the next multiple
    // of 16 (same heads and tokens), and reported against that kernel's TFLOPS x d / pad16(d): what the head dim would
    // get if it cost only its padding (issue 26's ideal).
    bool vs_padded = false;
    // --window: sliding windows LEFT:RIGHT (-1: unbounded; FlashAttention's window_size), each a local kernel (its
    // bounds call arguments), or "off" (the plain mask); FLOPs count the (query, key) pairs each window keeps.
    std::vector<std::string> windows = {"off"};
    // --sinks: off and/or on; on times a sinks kernel (each head's sink logit a call argument; the backward writes
    // dsinks too).
    std::vector<std::string> sinks = {"off"};
    // --softcap: off and/or caps (> 0), each a softcap kernel (the cap a call argument).
    std::vector<std::string> softcaps = {"off"};
    // --alibi: off and/or on; on times an ALiBi kernel (BLOOM's slopes per head, a call argument).
    std::vector<std::string> alibi = {"off"};
};

// --head-dim-range "lo:hi:step" (e.g. 32:256:4): the head dims lo, lo+step, ..., up to hi, each 1..256.
std::vector<int> head_dim_range(const std::string& spec);

// Shared by the throughput and decode benchmarks.
std::vector<std::uint16_t> random_halves(std::size_t n, bool bf16, unsigned seed);
double median(std::vector<double> v);
// A --window value: nullopt for "off", else its bounds (Error naming --window otherwise).
std::optional<std::pair<int, int>> parse_window(const std::string& w);
// The score variants timed for each shape: every --window value with every --sinks and every --softcap value (Error
// naming the flag for a value it does not take).
struct Variant {
    std::string window;
    bool sinks = false;
    float softcap = 0;  // 0: off
    bool alibi = false;
};
std::vector<Variant> variants(const BenchOptions& o);
// A sinks variant's device float32 [heads] sink logits (the same every run).
driver::DeviceBuffer sink_logits(int heads);
// An ALiBi variant's device float32 [heads] slopes: BLOOM's, 2^(-8 (h + 1) / heads).
driver::DeviceBuffer alibi_slopes(int heads);
void write_results(const BenchOptions& o, const char* kind, nlohmann::ordered_json rows);
int run_decode_bench(const BenchOptions& o);

// Returns a process exit code; prints a table to stdout.
int run_bench(const BenchOptions& o);

}  // namespace rtattn::cli
