// Host cost of one forward call through the public C++ API (header-only over the C ABI, linked to librtattn.so), and
// the kernel's device time, for comparison with tools/bench/py_overhead.py (the same through Python and the torch
// op). Prints JSON lines. Needs a GPU.
//   host: a tiny problem (batch 1, 128 tokens, 8 heads, d128) launched `calls` times back to back; wall time per
//         call, median of `rounds` rounds (the launch queue never fills: 256 < its depth).
//   device: batch 4 x 4096 tokens x 32 heads, d128, random data; 10 launches between two CUDA events (so host
//           cost never shows on the device clock), median of `rounds`.
#include <cuda_runtime.h>
#include <rtattn/rtattn.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <vector>

namespace {

struct Problem {
    rtattn::Kernel kernel;
    rtattn::ForwardArgs args;
    std::vector<void*> buffers;
    Problem(rtattn::Runtime& rt, int batch, int seqlen, int heads, int d, bool causal) {
        rtattn::AttentionConfig c;
        c.head_dim_qk = d;
        c.causal = causal;
        c.num_heads_q = c.num_heads_kv = heads;
        kernel = rt.get(c);
        // Random values, as the Python side uses: zeros would draw less power and clock higher.
        const size_t elems = size_t(batch) * seqlen * heads * d;
        std::vector<std::uint16_t> host(elems);
        std::uint32_t state = 12345;
        for (auto& x : host) {
            state = state * 1664525u + 1013904223u;
            const float f = float(state >> 8) / float(1 << 24) * 2.f - 1.f;
            std::uint32_t u;
            std::memcpy(&u, &f, 4);
            x = std::uint16_t(u >> 16);  // bf16 by truncation: fine for timing
        }
        for (rtattn::TensorArg* t : {&args.q, &args.k, &args.v, &args.o}) {
            void* p = nullptr;
            cudaMalloc(&p, elems * 2);
            cudaMemcpy(p, host.data(), elems * 2, cudaMemcpyHostToDevice);
            buffers.push_back(p);
            *t = rtattn::ForwardArgs::contiguous(p, seqlen, heads, d);
        }
        args.batch = batch;
        args.seqlen_q = args.seqlen_k = seqlen;
    }
    ~Problem() {
        for (void* p : buffers) cudaFree(p);
    }
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::puts("call_overhead: no GPU");
        return 77;
    }
    cudaFree(nullptr);
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    rtattn::Runtime rt;
    const int calls = 256, rounds = 30;
    const int per_event = 10;  // launches between two events: the host's launch cost stays off the device clock
    {
        Problem tiny(rt, 1, 128, 8, 128, false);
        std::vector<double> per_call;
        for (int r = 0; r < rounds + 3; ++r) {
            cudaStreamSynchronize(stream);
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < calls; ++i) tiny.kernel.forward(tiny.args, stream);
            const auto t1 = std::chrono::steady_clock::now();
            if (r >= 3) per_call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / calls);
        }
        std::printf("{\"api\": \"c++\", \"what\": \"host_us_per_call\", \"value\": %.3f}\n", median(per_call));
    }
    for (const bool causal : {false, true}) {
        Problem big(rt, 4, 4096, 32, 128, causal);
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        std::vector<double> ms;
        for (int r = 0; r < rounds + 3; ++r) {
            cudaEventRecord(a, stream);
            for (int i = 0; i < per_event; ++i) big.kernel.forward(big.args, stream);
            cudaEventRecord(b, stream);
            cudaEventSynchronize(b);
            float t = 0;
            cudaEventElapsedTime(&t, a, b);
            if (r >= 3) ms.push_back(t / per_event);
        }
        const double flops = 4.0 * 4 * 32 * 4096.0 * 4096 * 128 / (causal ? 2 : 1);
        std::printf("{\"api\": \"c++\", \"what\": \"device_ms\", \"causal\": %s, \"value\": %.4f, \"tflops\": %.1f}\n",
                    causal ? "true" : "false", median(ms), flops / median(ms) / 1e9);
    }
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
