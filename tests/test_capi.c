/* The C ABI from C99 (compiled with -std=c99 -pedantic -Werror): status codes, the thread's last error and its field,
 * struct_size rules, text outputs, the runtime's options and environment, precompile, plan and stats through the
 * shared library. No GPU needed; with one, get and a refused forward run too.
 * Usage: test_capi CACHE_DIR (a fresh directory of its own). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <rtattn/config_fields.h>
#include <rtattn/rtattn.h>

#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int failures = 0;
static int checks = 0;

#define CHECK(cond)                                                                                             \
    do {                                                                                                        \
        ++checks;                                                                                               \
        if (!(cond)) {                                                                                          \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %d %s)\n", __FILE__, __LINE__, #cond,         \
                    (int)rtattn_last_error(), rtattn_last_error_message());                                    \
            ++failures;                                                                                         \
        }                                                                                                       \
    } while (0)

/* A call that must fail with `status`, naming `field`. */
#define CHECK_FAILS(call, status, field)                                                                        \
    do {                                                                                                        \
        CHECK((call) == (status));                                                                              \
        CHECK(rtattn_last_error() == (status));                                                                 \
        CHECK(strcmp(rtattn_last_error_field(), (field)) == 0);                                                 \
        CHECK(strlen(rtattn_last_error_message()) > strlen(field));                                             \
    } while (0)

static const char* cache_dir;

static void test_versions(void) {
    CHECK(rtattn_abi_version() == RTATTN_ABI_VERSION);
    CHECK(strcmp(rtattn_version(), "") != 0);
    CHECK(strcmp(rtattn_nvrtc_version(), "unknown") != 0);
    CHECK(rtattn_is_known_arch("sm_90a") && rtattn_is_known_arch("sm_80") && !rtattn_is_known_arch("sm_70"));
    CHECK(!rtattn_is_known_arch(NULL));
    CHECK(strstr(rtattn_known_archs(), "sm_89") != NULL);
}

static void test_config(void) {
    rtattn_config c;
    rtattn_config_init(&c);
    CHECK(c.struct_size == sizeof c && c.head_dim_qk == 128 && c.dtype == RTATTN_BF16 && c.num_heads_q == 1);
    CHECK(rtattn_config_validate(&c) == RTATTN_OK);
    CHECK(rtattn_last_error() == RTATTN_OK && strcmp(rtattn_last_error_message(), "") == 0);

    c.head_dim_qk = 257;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "head_dim_qk");
    CHECK(strstr(rtattn_last_error_message(), "1..256") != NULL);
    c.head_dim_qk = 132;
    CHECK(rtattn_config_validate(&c) == RTATTN_OK);
    CHECK(rtattn_last_error() == RTATTN_OK); /* a successful call clears the last error */

    c.has_head_dim_v = 1, c.head_dim_v = 0;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "head_dim_v");
    c.has_head_dim_v = 2, c.head_dim_v = 64; /* presence flags are booleans too */
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "has_head_dim_v");
    c.has_head_dim_v = 0;
    c.has_softmax_scale = -1;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "has_softmax_scale");
    c.has_softmax_scale = 0;
    c.dtype = 7;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "dtype");
    c.dtype = RTATTN_FP16;
    c.causal = 2;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "causal");
    c.causal = 1;
    c.num_heads_q = 6, c.num_heads_kv = 4;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "num_heads_kv");
    c.num_heads_kv = 2;
    c.has_softmax_scale = 1, c.softmax_scale = NAN;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "softmax_scale");
    c.softmax_scale = 0.125;
    c.arch = "sm_70";
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "arch");
    c.arch = "sm_90a";
    CHECK(rtattn_config_validate(&c) == RTATTN_OK);
    CHECK_FAILS(rtattn_config_validate(NULL), RTATTN_ERROR_ARGUMENT, "config");

    /* struct_size: too small is an uninitialized struct; larger is a newer caller, whose extra fields are not read. */
    c.struct_size = 8;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_ARGUMENT, "config.struct_size");
    {
        struct {
            rtattn_config c;
            unsigned char newer_fields[24];
        } big;
        memset(&big, 0xff, sizeof big);
        rtattn_config_init(&big.c);
        big.c.struct_size = sizeof big;
        CHECK(rtattn_config_validate(&big.c) == RTATTN_OK);
    }
    {
        /* A struct_size that claims more than the caller has, at the end of a mapping: reading as far as it says
         * faulted. Only the library's own fields are read. */
        const long page = sysconf(_SC_PAGESIZE);
        unsigned char* map = mmap(NULL, (size_t)page * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(map != MAP_FAILED);
        if (map != MAP_FAILED) {
            CHECK(mprotect(map + page, (size_t)page, PROT_NONE) == 0);
            rtattn_config* at_end = (rtattn_config*)(map + page - sizeof(rtattn_config));
            rtattn_config_init(at_end);
            at_end->arch = "sm_90a";
            at_end->struct_size = (size_t)1 << 40;
            CHECK(rtattn_config_validate(at_end) == RTATTN_OK);
            rtattn_runtime_options* o = (rtattn_runtime_options*)(map + page - sizeof(rtattn_runtime_options));
            rtattn_runtime_options_init(o);
            o->struct_size = sizeof(rtattn_runtime_options) + 4096;
            o->cache_dir = cache_dir;
            rtattn_runtime* rt = NULL;
            CHECK(rtattn_runtime_create(o, &rt) == RTATTN_OK);
            munmap(map, (size_t)page * 2);
            rtattn_runtime_destroy(rt);
        }
    }
}

/* rtattn_config as rtattn/config_fields.h lists it: a struct built from the list has the same size and each member
 * (and presence flag) at the same offset, and the canonical JSON names every field in the list's order. */
#define MIRROR_INT(n) int32_t n;
#define MIRROR_OPT_INT(n) int32_t has_##n; int32_t n;
#define MIRROR_DTYPE(n) int32_t n;
#define MIRROR_FLAG(n) int32_t n;
#define MIRROR_OPT_DOUBLE(n) int32_t has_##n; double n;
#define MIRROR_STRING(n) const char* n;
#define MIRROR(n, kind) MIRROR_##kind(n)
struct config_from_list {
    size_t struct_size;
    RTATTN_CONFIG_FIELDS(MIRROR)
};

static void test_config_fields(void) {
    rtattn_config c;
    char json[1024];
    size_t needed = 0;
    const char* at;
    CHECK(sizeof(struct config_from_list) == sizeof(rtattn_config));
#define SAME_OFFSET(n) CHECK(offsetof(struct config_from_list, n) == offsetof(rtattn_config, n));
#define SAME_INT(n) SAME_OFFSET(n)
#define SAME_OPT_INT(n) SAME_OFFSET(has_##n) SAME_OFFSET(n)
#define SAME_DTYPE(n) SAME_OFFSET(n)
#define SAME_FLAG(n) SAME_OFFSET(n)
#define SAME_OPT_DOUBLE(n) SAME_OFFSET(has_##n) SAME_OFFSET(n)
#define SAME_STRING(n) SAME_OFFSET(n)
#define SAME(n, kind) SAME_##kind(n)
    RTATTN_CONFIG_FIELDS(SAME)
    rtattn_config_init(&c);
    CHECK(rtattn_config_to_json(&c, json, sizeof json, &needed) == RTATTN_OK);
    at = json;
#define IN_JSON(n, kind)                       \
    at = at ? strstr(at, "\"" #n "\":") : NULL; \
    CHECK(at != NULL);
    RTATTN_CONFIG_FIELDS(IN_JSON)
}

static void test_text(void) {
    rtattn_config c, back;
    char json[1024], small[5], arch[16], tiny_arch[3];
    size_t needed = 0, needed2 = 0;
    int32_t dtype = -1;
    rtattn_config_init(&c);
    c.head_dim_qk = 132, c.causal = 1, c.num_heads_q = 32, c.num_heads_kv = 8, c.arch = "sm_90a";
    CHECK(rtattn_config_to_json(&c, NULL, 0, &needed) == RTATTN_OK && needed > 10);
    CHECK(rtattn_config_to_json(&c, json, sizeof json, &needed2) == RTATTN_OK && needed2 == needed);
    CHECK(strlen(json) + 1 == needed && strstr(json, "\"head_dim_qk\":132") != NULL);
    CHECK(rtattn_config_to_json(&c, small, sizeof small, &needed2) == RTATTN_OK);
    CHECK(strlen(small) == sizeof small - 1 && strncmp(small, json, sizeof small - 1) == 0);
    CHECK(rtattn_config_describe(&c, json + 512, 512, NULL) == RTATTN_OK);
    CHECK(strcmp(json + 512, "d132 bf16 causal h32:8 sm_90a") == 0);

    rtattn_config_init(&back);
    CHECK(rtattn_config_from_json(json, &back, arch, sizeof arch) == RTATTN_OK);
    CHECK(back.head_dim_qk == 132 && back.causal == 1 && back.num_heads_q == 32 && back.num_heads_kv == 8);
    CHECK(back.dtype == RTATTN_BF16 && back.arch == arch && strcmp(arch, "sm_90a") == 0);
    CHECK_FAILS(rtattn_config_from_json(json, &back, tiny_arch, sizeof tiny_arch), RTATTN_ERROR_ARGUMENT,
                "arch_buf");
    CHECK_FAILS(rtattn_config_from_json("{\"head_dim\": 300}", &back, arch, sizeof arch), RTATTN_ERROR_CONFIG,
                "head_dim");
    CHECK_FAILS(rtattn_config_from_json("{\"head_dim\": 64, \"colour\": 1}", &back, arch, sizeof arch),
                RTATTN_ERROR_CONFIG, "colour");
    CHECK_FAILS(rtattn_config_from_json(NULL, &back, arch, sizeof arch), RTATTN_ERROR_ARGUMENT, "json");

    CHECK(rtattn_dtype_from_string("float16", &dtype) == RTATTN_OK && dtype == RTATTN_FP16);
    CHECK(rtattn_dtype_from_string("bfloat16", &dtype) == RTATTN_OK && dtype == RTATTN_BF16);
    CHECK_FAILS(rtattn_dtype_from_string("fp8", &dtype), RTATTN_ERROR_CONFIG, "dtype");
}

struct log_record {
    int lines, compiling;
};

static void on_log(void* user, int32_t level, const char* message) {
    struct log_record* r = (struct log_record*)user;
    ++r->lines;
    if (level == RTATTN_LOG_INFO && strstr(message, "compiling d100") != NULL) ++r->compiling;
}

static void test_runtime(void) {
    rtattn_runtime_options o, got;
    rtattn_runtime* rt = NULL;
    rtattn_runtime* only = NULL;
    rtattn_kernel_info info;
    rtattn_cache_stats stats;
    rtattn_config c;
    struct log_record log = {0, 0};

    rtattn_runtime_options_init(&o);
    CHECK(o.struct_size == sizeof o && o.log_level == RTATTN_LOG_WARN && o.lock_timeout_seconds == 60);
    o.cache_dir = cache_dir;
    o.cache_mode = 9;
    CHECK_FAILS(rtattn_runtime_create(&o, &rt), RTATTN_ERROR_CONFIG, "cache_mode");
    CHECK(rt == NULL);
    o.cache_mode = RTATTN_CACHE_JIT;
    o.lock_timeout_seconds = -1;
    CHECK_FAILS(rtattn_runtime_create(&o, &rt), RTATTN_ERROR_CONFIG, "lock_timeout_seconds");
    o.lock_timeout_seconds = 30;
    CHECK_FAILS(rtattn_runtime_create(&o, NULL), RTATTN_ERROR_ARGUMENT, "out");

    /* The environment overrides what the program set, and is read strictly. */
    setenv("RTATTN_LOG_LEVEL", "loud", 1);
    CHECK_FAILS(rtattn_runtime_create(&o, &rt), RTATTN_ERROR_CONFIG, "RTATTN_LOG_LEVEL");
    setenv("RTATTN_LOG_LEVEL", "debug", 1);
    setenv("RTATTN_CACHE_ONLY", "1", 1);
    CHECK(rtattn_runtime_create(&o, &only) == RTATTN_OK);
    unsetenv("RTATTN_LOG_LEVEL");
    unsetenv("RTATTN_CACHE_ONLY");
    rtattn_runtime_options_init(&got);
    CHECK(rtattn_runtime_options_get(only, &got) == RTATTN_OK);
    CHECK(got.cache_mode == RTATTN_CACHE_ONLY && got.log_level == RTATTN_LOG_DEBUG);
    CHECK(got.max_concurrent_compiles >= 1 && strcmp(got.cache_dir, cache_dir) == 0 && got.tile_override == NULL);

    o.log_level = RTATTN_LOG_INFO;
    o.log_callback = on_log;
    o.log_user_data = &log;
    CHECK(rtattn_runtime_create(&o, &rt) == RTATTN_OK && rt != NULL);

    rtattn_config_init(&c);
    c.head_dim_qk = 100, c.arch = "sm_80";
    rtattn_kernel_info_init(&info);
    CHECK_FAILS(rtattn_runtime_precompile(only, &c, &info), RTATTN_ERROR_CACHE_MISS, "");
    CHECK(strstr(rtattn_last_error_message(), "d100") != NULL);
    CHECK(rtattn_runtime_precompile(rt, &c, &info) == RTATTN_OK);
    CHECK(strlen(info.key) == 64 && strcmp(info.arch, "sm_80") == 0 && info.padded_qk == 112 && info.padded_v == 104);
    CHECK(info.registers > 0 && info.spill_bytes == 0 && info.from_cache == 0 && info.vec_qk == 4);
    CHECK(info.useful_flop_fraction > 0.9 && info.useful_flop_fraction < 1 && strlen(info.reason) > 0);
    CHECK(log.compiling == 1); /* the callback got the compile, with its user data */
    CHECK(rtattn_runtime_precompile(only, &c, NULL) == RTATTN_OK); /* now cached: the cache-only runtime has it */

    CHECK(rtattn_runtime_plan(rt, &c, &info) == RTATTN_OK && info.registers == -1 && info.padded_qk == 112);
    {
        /* A second call for the same config must not free the strings the first one handed out (they live as long
         * as the runtime): the freed blocks would be the next ones malloc hands out, filled here. */
        rtattn_kernel_info again;
        char key[65];
        char* reuse[8];
        int i;
        snprintf(key, sizeof key, "%s", info.key);
        rtattn_kernel_info_init(&again);
        CHECK(rtattn_runtime_plan(rt, &c, &again) == RTATTN_OK);
        CHECK(rtattn_runtime_precompile(rt, &c, &again) == RTATTN_OK);
        for (i = 0; i < 8; ++i) reuse[i] = malloc(65), memset(reuse[i], 'X', 64), reuse[i][64] = 0;
        CHECK(strcmp(info.key, key) == 0 && strlen(info.reason) > 0 && strcmp(info.arch, "sm_80") == 0);
        for (i = 0; i < 8; ++i) free(reuse[i]);
    }
    rtattn_cache_stats_init(&stats);
    CHECK(rtattn_runtime_stats(rt, &stats) == RTATTN_OK);
    CHECK(stats.compiles == 1 && stats.disk_enabled == 1 && strncmp(stats.dir, cache_dir, strlen(cache_dir)) == 0);
    CHECK(stats.bytes_written > 0);

    {
        /* A scale is checked before the runtime's memo is asked: NaN printed as null in the memo's key and was served
         * the entry of the same config without a scale (the default scale ran). */
        const double bad[] = {NAN, INFINITY, 1e300, 3.5e38, 1e-46};
        int i;
        c.has_softmax_scale = 0;
        CHECK(rtattn_runtime_plan(rt, &c, &info) == RTATTN_OK);
        c.has_softmax_scale = 1;
        for (i = 0; i < 5; ++i) {
            c.softmax_scale = bad[i];
            CHECK_FAILS(rtattn_runtime_plan(rt, &c, &info), RTATTN_ERROR_CONFIG, "softmax_scale");
            CHECK_FAILS(rtattn_runtime_plan_backward(rt, &c, &info), RTATTN_ERROR_CONFIG, "softmax_scale");
        }
        c.softmax_scale = 0.1;
        CHECK(rtattn_runtime_plan(rt, &c, &info) == RTATTN_OK);
        c.has_softmax_scale = 0;
    }
    CHECK_FAILS(rtattn_runtime_precompile(NULL, &c, &info), RTATTN_ERROR_ARGUMENT, "runtime");
    c.head_dim_qk = 0;
    CHECK_FAILS(rtattn_runtime_precompile(rt, &c, &info), RTATTN_ERROR_CONFIG, "head_dim_qk");

    {
        /* get: with no driver or GPU a CUDA error naming the call; with a GPU a kernel that refuses bad arguments. */
        rtattn_kernel* k = NULL;
        rtattn_status s;
        c.head_dim_qk = 64, c.arch = NULL;
        s = rtattn_runtime_get(rt, &c, &k);
        if (s == RTATTN_OK) {
            rtattn_forward_args args;
            rtattn_config kc;
            rtattn_forward_args_init(&args);
            CHECK_FAILS(rtattn_kernel_forward(k, &args, NULL), RTATTN_ERROR_ARGUMENT, "batch");
            rtattn_config_init(&kc);
            CHECK(rtattn_kernel_get_config(k, &kc) == RTATTN_OK && kc.head_dim_qk == 64 && strlen(kc.arch) > 0);
            rtattn_kernel_retain(k);
            rtattn_kernel_release(k);
            rtattn_kernel_release(k);
            printf("test_capi: a GPU is present; get and a refused forward ran\n");
        } else {
            /* No GPU: an empty arch cannot be resolved (config error); an explicit one fails at the driver. */
            CHECK(s == RTATTN_ERROR_CONFIG && strcmp(rtattn_last_error_field(), "arch") == 0);
            c.arch = "sm_80";
            CHECK(rtattn_runtime_get(rt, &c, &k) == RTATTN_ERROR_CUDA && k == NULL);
            CHECK(strlen(rtattn_last_error_cuda_call()) > 0);
        }
    }
    CHECK_FAILS(rtattn_kernel_forward(NULL, NULL, NULL), RTATTN_ERROR_ARGUMENT, "kernel");
    rtattn_kernel_release(NULL);

    {
        rtattn_tensor t = rtattn_tensor_contiguous((const void*)256, 10, 4, 132);
        CHECK(t.head_stride == 132 && t.seq_stride == 4 * 132 && t.batch_stride == 10 * 4 * 132);
    }
    rtattn_runtime_destroy(only);
    rtattn_runtime_destroy(rt);
    rtattn_runtime_destroy(NULL);
}

/* The backward pass: plan and precompile without a GPU, struct_size and NULL checks, and with a GPU a kernel set whose
 * workspace size grows with the sequence and that refuses a missing LSE. */
static void test_backward(void) {
    rtattn_runtime_options o;
    rtattn_runtime* rt = NULL;
    rtattn_kernel_info info;
    rtattn_config c;
    rtattn_backward_args args;
    rtattn_backward_kernel* k = NULL;
    rtattn_status s;

    rtattn_runtime_options_init(&o);
    o.cache_dir = cache_dir;
    CHECK(rtattn_runtime_create(&o, &rt) == RTATTN_OK);
    rtattn_config_init(&c);
    c.head_dim_qk = 132, c.causal = 1, c.num_heads_q = 8, c.num_heads_kv = 2, c.arch = "sm_80";
    rtattn_kernel_info_init(&info);
    CHECK(rtattn_runtime_plan_backward(rt, &c, &info) == RTATTN_OK);
    CHECK(info.padded_qk == 144 && info.padded_v == 144 && info.registers == -1 && strlen(info.reason) > 0);
    CHECK(strstr(info.kernel, "backward") != NULL);
    CHECK(rtattn_runtime_precompile_backward(rt, &c, &info) == RTATTN_OK);
    CHECK(info.registers > 0 && info.spill_bytes == 0 && strlen(info.key) == 64);
    {
        /* The forward's entry is a different one. */
        rtattn_kernel_info fwd;
        rtattn_kernel_info_init(&fwd);
        CHECK(rtattn_runtime_plan(rt, &c, &fwd) == RTATTN_OK && strcmp(fwd.key, info.key) != 0);
    }
    {
        /* Softcap: a backward kernel of its own (the cap's slope in dS), built without spills. */
        char plain_key[65];
        CHECK(strlen(info.key) == 64);
        memcpy(plain_key, info.key, 65);
        c.softcap = 1;
        CHECK(rtattn_runtime_precompile_backward(rt, &c, &info) == RTATTN_OK);
        CHECK(info.registers > 0 && info.spill_bytes == 0 && strcmp(info.key, plain_key) != 0);
        c.softcap = 0;
    }
    c.head_dim_qk = 257;
    CHECK_FAILS(rtattn_runtime_precompile_backward(rt, &c, &info), RTATTN_ERROR_CONFIG, "head_dim_qk");
    CHECK_FAILS(rtattn_runtime_get_backward(rt, &c, NULL), RTATTN_ERROR_ARGUMENT, "out");

    rtattn_backward_args_init(&args);
    CHECK(args.struct_size == sizeof args && args.deterministic == 0 && args.workspace == NULL);
    CHECK_FAILS(rtattn_kernel_backward(NULL, &args, NULL), RTATTN_ERROR_ARGUMENT, "kernel");
    rtattn_backward_kernel_release(NULL);

    c.head_dim_qk = 128, c.arch = NULL;
    s = rtattn_runtime_get_backward(rt, &c, &k);
    if (s == RTATTN_OK) {
        size_t small = 0, large = 0;
        rtattn_config kc;
        CHECK(rtattn_backward_kernel_workspace_bytes(k, 1, 128, 128, &small) == RTATTN_OK);
        CHECK(rtattn_backward_kernel_workspace_bytes(k, 2, 4096, 4096, &large) == RTATTN_OK);
        CHECK(small > 0 && large > 32 * small);
        CHECK_FAILS(rtattn_backward_kernel_workspace_bytes(k, 0, 1, 1, &small), RTATTN_ERROR_ARGUMENT, "batch");
        CHECK_FAILS(rtattn_kernel_backward(k, &args, NULL), RTATTN_ERROR_ARGUMENT, "batch");
        args.batch = 1, args.seqlen_q = args.seqlen_k = 128;
        args.softcap = 30.f; /* a cap on a kernel without softcap */
        CHECK_FAILS(rtattn_kernel_backward(k, &args, NULL), RTATTN_ERROR_ARGUMENT, "softcap");
        args.softcap = 0.f;
        args.struct_size = 8;
        CHECK_FAILS(rtattn_kernel_backward(k, &args, NULL), RTATTN_ERROR_ARGUMENT, "args.struct_size");
        rtattn_config_init(&kc);
        CHECK(rtattn_backward_kernel_get_config(k, &kc) == RTATTN_OK && kc.head_dim_qk == 128 && kc.causal == 1);
        rtattn_backward_kernel_retain(k);
        rtattn_backward_kernel_release(k);
        rtattn_backward_kernel_release(k);
        printf("test_capi: a GPU is present; get_backward and refused backward calls ran\n");
    } else {
        CHECK(s == RTATTN_ERROR_CONFIG && strcmp(rtattn_last_error_field(), "arch") == 0);
    }
    rtattn_runtime_destroy(rt);
}

/* The last error is per thread: a failure in one thread is not seen by another. */
static void* fail_in_thread(void* arg) {
    rtattn_config c;
    (void)arg;
    rtattn_config_init(&c);
    c.num_heads_q = 0;
    return (void*)(size_t)(rtattn_config_validate(&c) == RTATTN_ERROR_CONFIG &&
                           strcmp(rtattn_last_error_field(), "num_heads_q") == 0);
}

static void test_thread_local(void) {
    pthread_t t;
    void* ok = NULL;
    rtattn_config c;
    rtattn_config_init(&c);
    c.head_dim_qk = 999;
    CHECK(rtattn_config_validate(&c) == RTATTN_ERROR_CONFIG);
    CHECK(pthread_create(&t, NULL, fail_in_thread, NULL) == 0 && pthread_join(t, &ok) == 0);
    CHECK(ok != NULL);
    CHECK(strcmp(rtattn_last_error_field(), "head_dim_qk") == 0);
}

/* Decode: config fields, the plan without a GPU, and with a GPU the split count, the workspace and refused calls
 * (every call below fails validation before a launch, so the pointers are never dereferenced). */
static void test_decode(void) {
    rtattn_runtime_options o;
    rtattn_runtime* rt = NULL;
    rtattn_kernel_info info;
    rtattn_config c;
    rtattn_kernel* k = NULL;
    rtattn_status s;

    rtattn_config_init(&c);
    CHECK(c.decode == 0 && c.paged_kv == 0);
    c.decode = 2;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "decode");
    c.decode = 0, c.varlen = 2;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "varlen");
    c.decode = 1, c.varlen = 1;
    CHECK_FAILS(rtattn_config_validate(&c), RTATTN_ERROR_CONFIG, "varlen");
    c.varlen = 0;
    c.decode = 0, c.paged_kv = 1;
    CHECK(rtattn_config_validate(&c) == RTATTN_OK); /* a prefill against a paged cache */
    c.decode = 1, c.num_heads_q = 32, c.num_heads_kv = 8, c.arch = "sm_80";
    rtattn_runtime_options_init(&o);
    o.cache_dir = cache_dir;
    CHECK(rtattn_runtime_create(&o, &rt) == RTATTN_OK);
    rtattn_kernel_info_init(&info);
    CHECK(rtattn_runtime_plan(rt, &c, &info) == RTATTN_OK && strstr(info.kernel, "paged") != NULL);
    CHECK_FAILS(rtattn_runtime_plan_backward(rt, &c, &info), RTATTN_ERROR_CONFIG, "decode");

    c.arch = NULL;
    s = rtattn_runtime_get(rt, &c, &k);
    if (s == RTATTN_OK) {
        rtattn_forward_args a;
        size_t ws = 1;
        int32_t splits = 0;
        static int32_t fake[64] __attribute__((aligned(256)));
        CHECK(rtattn_kernel_num_splits(k, 64, 1, 4096, 0, &splits) == RTATTN_OK && splits == 1);
        CHECK(rtattn_kernel_workspace_bytes(k, 64, 1, 4096, 0, &ws) == RTATTN_OK && ws == 0);
        CHECK(rtattn_kernel_num_splits(k, 1, 1, 131072, 0, &splits) == RTATTN_OK && splits > 8);
        CHECK(rtattn_kernel_workspace_bytes(k, 1, 1, 131072, 0, &ws) == RTATTN_OK && ws > 0);
        CHECK(rtattn_kernel_num_splits(k, 1, 1, 131072, 5, &splits) == RTATTN_OK && splits == 5);

        rtattn_forward_args_init(&a);
        a.q = rtattn_tensor_contiguous(fake, 1, 32, 128);
        a.o = rtattn_tensor_contiguous(fake, 1, 32, 128);
        a.k = a.v = rtattn_tensor_contiguous(fake, 16, 8, 128);
        a.batch = 2, a.seqlen_q = 17, a.seqlen_k = 100;
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "seqlen_q");
        a.seqlen_q = 1, a.page_size = 3;
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "page_size");
        a.page_size = 16;
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "num_pages");
        /* A caller built before num_pages existed (its struct ends before it) reads it as 0: refused, not guessed. */
        a.num_pages = 8;
        a.struct_size = offsetof(rtattn_forward_args, num_pages);
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "num_pages");
        a.struct_size = sizeof a;
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "block_table");
        a.block_table = fake, a.pages_per_seq = 4, a.block_table_stride = 4;  /* 64 tokens < seqlen_k 100 */
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "seqlen_k");
        a.pages_per_seq = 7, a.block_table_stride = 8, a.num_splits = 129;
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "num_splits");
        a.num_splits = 2;  /* two splits need a workspace */
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "workspace");
        rtattn_kernel_release(k);
        /* A prefill kernel refuses the decode-only fields instead of ignoring them. */
        c.decode = 0, c.paged_kv = 0;
        CHECK(rtattn_runtime_get(rt, &c, &k) == RTATTN_OK);
        a.seqlen_q = 16, a.seqlen_k = 16, a.page_size = 0, a.pages_per_seq = 0, a.num_splits = 0, a.num_pages = 0;
        a.q = a.o = rtattn_tensor_contiguous(fake, 16, 32, 128);
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "block_table");
        /* A window: given without has_window it is refused, not dropped; has_window is 0 or 1; a kernel without
         * local refuses any window but (-1, -1). */
        a.block_table = NULL, a.block_table_stride = 0;
        a.window_size_left = 128;
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "window_size_left");
        a.has_window = 2;
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "has_window");
        a.has_window = 1;
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "window_size_left");
        a.has_window = 0, a.window_size_left = -1;
        /* Sinks on a kernel without them: refused, naming the field. */
        a.sinks = (const float*)fake;
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "sinks");
        a.sinks = NULL;
        a.softcap = 30.f; /* a cap on a kernel without softcap */
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "softcap");
        a.softcap = 0.f;
        a.alibi_slopes = (const float*)fake; /* slopes on a kernel without ALiBi */
        CHECK_FAILS(rtattn_kernel_forward(k, &a, NULL), RTATTN_ERROR_ARGUMENT, "alibi_slopes");
        a.alibi_slopes = NULL;
        {
            rtattn_merge_args m;
            rtattn_merge_args_init(&m);
            m.o_a = m.o_b = m.o = rtattn_tensor_contiguous(fake, 1, 32, 128);
            m.batch = 1, m.seqlen = 1, m.lse_a = (const float*)fake;
            CHECK_FAILS(rtattn_kernel_merge(k, &m, NULL), RTATTN_ERROR_ARGUMENT, "lse_b");
        }
        rtattn_kernel_release(k);
        printf("test_capi: a GPU is present; decode splits, workspace and refused calls ran\n");
    } else {
        CHECK(s == RTATTN_ERROR_CONFIG && strcmp(rtattn_last_error_field(), "arch") == 0);
    }
    rtattn_runtime_destroy(rt);
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_capi CACHE_DIR\n");
        return 2;
    }
    cache_dir = argv[1];
    test_versions();
    test_config();
    test_config_fields();
    test_text();
    test_runtime();
    test_backward();
    test_decode();
    test_thread_local();
    printf("test_capi: %d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
