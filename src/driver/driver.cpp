#include "driver/driver.hpp"

#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>

#include "arch/arch.hpp"
#include "core/errors.hpp"
#include "util/format.hpp"

namespace rtattn::driver {

namespace {

Api load_api() {
    // dlopen only: linking libcuda would make the library unloadable on driverless build and CI machines.
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char* why = dlerror();
        throw CudaError("dlopen(libcuda.so.1)", CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE",
                        util::format("no CUDA driver on this machine ({}); a GPU is needed to run kernels, but "
                                     "`rtattn precompile` works without one",
                                     why ? why : "not found"));
    }
    Api api;
    // Each entry is looked up by the exact symbol its cuda.h prototype names (cuMemAlloc -> cuMemAlloc_v2 through
    // the header's macros). cuGetProcAddress with our CUDA_VERSION would instead hand back the newest variant,
    // whose signature can differ from the declaration (cuCtxGetDevice -> cuCtxGetDevice_v2 takes a context).
    auto resolve = [&](const char* symbol, void** slot) {
        *slot = dlsym(lib, symbol);
        if (!*slot)
            throw CudaError(util::format("dlsym({})", symbol), CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND",
                            util::format("the CUDA driver lacks {}; rtattn needs a driver for CUDA {}.{} or newer",
                                         symbol, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10));
    };
#define RTATTN_SYMBOL_NAME(name) #name
#define RTATTN_RESOLVE(name) resolve(RTATTN_SYMBOL_NAME(name), reinterpret_cast<void**>(&api.name));
    RTATTN_DRIVER_FUNCTIONS(RTATTN_RESOLVE)
#undef RTATTN_RESOLVE
#undef RTATTN_SYMBOL_NAME
    return api;
}

}  // namespace

const Api& api() {
    // A failed load is retried on the next call (the error is rethrown each time, never cached as success).
    static std::mutex mu;
    static std::unique_ptr<Api> table;
    std::lock_guard<std::mutex> lock(mu);
    if (!table) {
        Api loaded = load_api();
        const CUresult r = loaded.cuInit(0);
        if (r != CUDA_SUCCESS) {
            const char* name = nullptr;
            loaded.cuGetErrorName(r, &name);
            throw CudaError("cuInit", int(r), name ? name : "?",
                            r == CUDA_ERROR_NO_DEVICE ? "the driver found no GPU" : "the driver failed to start");
        }
        table = std::make_unique<Api>(loaded);
    }
    return *table;
}

void check(CUresult r, const char* call) {
    if (r == CUDA_SUCCESS) return;
    const Api& a = api();
    const char* name = nullptr;
    const char* msg = nullptr;
    a.cuGetErrorName(r, &name);
    a.cuGetErrorString(r, &msg);
    throw CudaError(call, int(r), name ? name : "unknown", msg ? msg : "no description");
}

bool gpu_available() {
    try {
        int n = 0;
        return api().cuDeviceGetCount(&n) == CUDA_SUCCESS && n > 0;
    } catch (const Error&) {
        return false;
    }
}

std::string DeviceInfo::arch() const { return arch::for_device(cc_major, cc_minor); }

DeviceInfo current_device() {
    const Api& a = api();
    DeviceInfo d;
    check(a.cuCtxGetCurrent(&d.context), "cuCtxGetCurrent");
    if (!d.context) {
        int count = 0;
        check(a.cuDeviceGetCount(&count), "cuDeviceGetCount");
        if (count == 0) throw CudaError("cuDeviceGetCount", CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no GPU");
        CUdevice dev;
        check(a.cuDeviceGet(&dev, 0), "cuDeviceGet");
        check(a.cuDevicePrimaryCtxRetain(&d.context, dev), "cuDevicePrimaryCtxRetain");
        check(a.cuCtxSetCurrent(d.context), "cuCtxSetCurrent");
    }
    // Device facts never change for a context; get() asks on every call, so answer repeats from a table.
    static std::mutex mu;
    static std::map<CUcontext, DeviceInfo> known;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (auto it = known.find(d.context); it != known.end()) return it->second;
    }
    check(a.cuCtxGetDevice(&d.device), "cuCtxGetDevice");
    char name[256] = {};
    check(a.cuDeviceGetName(name, sizeof name, d.device), "cuDeviceGetName");
    d.name = name;
    auto attr = [&](CUdevice_attribute at) {
        int v = 0;
        check(a.cuDeviceGetAttribute(&v, at, d.device), "cuDeviceGetAttribute");
        return v;
    };
    d.cc_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    d.cc_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    d.sms = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    d.smem_optin = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    check(a.cuDriverGetVersion(&d.driver_version), "cuDriverGetVersion");
    std::lock_guard<std::mutex> lock(mu);
    known[d.context] = d;
    return d;
}

Module::~Module() {
    if (module) api().cuModuleUnload(module);  // errors ignored: the context may already be gone at exit
}

std::shared_ptr<Module> load(const std::string& cubin, const std::vector<std::string>& entries, int smem_bytes) {
    const Api& a = api();
    auto m = std::make_shared<Module>();
    check(a.cuCtxGetCurrent(&m->context), "cuCtxGetCurrent");
    check(a.cuModuleLoadData(&m->module, cubin.data()), "cuModuleLoadData");
    for (const auto& entry : entries) {
        CUfunction f = nullptr;
        check(a.cuModuleGetFunction(&f, m->module, entry.c_str()), "cuModuleGetFunction");
        if (smem_bytes > 48 * 1024)
            check(a.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes),
                  "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
        m->functions.push_back(f);
    }
    return m;
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    check(api().cuMemAlloc(&ptr_, bytes ? bytes : 1), "cuMemAlloc");
}

DeviceBuffer::~DeviceBuffer() {
    if (ptr_) api().cuMemFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
        if (ptr_) api().cuMemFree(ptr_);
        ptr_ = o.ptr_;
        bytes_ = o.bytes_;
        o.ptr_ = 0;
        o.bytes_ = 0;
    }
    return *this;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes, std::size_t offset) {
    check(api().cuMemcpyHtoD(ptr_ + offset, host, bytes), "cuMemcpyHtoD");
}

void DeviceBuffer::download(void* host, std::size_t bytes, std::size_t offset) const {
    check(api().cuMemcpyDtoH(host, ptr_ + offset, bytes), "cuMemcpyDtoH");
}

void DeviceBuffer::fill_u16(unsigned short value) { check(api().cuMemsetD16(ptr_, value, bytes_ / 2), "cuMemsetD16"); }
void DeviceBuffer::fill_u32(unsigned value) { check(api().cuMemsetD32(ptr_, value, bytes_ / 4), "cuMemsetD32"); }

Stream::Stream() {
    // Blocking with respect to the legacy stream, where DeviceBuffer copies run: work on it sees their results.
    check(api().cuStreamCreate(&s_, CU_STREAM_DEFAULT), "cuStreamCreate");
}
Stream::~Stream() {
    if (s_) api().cuStreamDestroy(s_);
}
void Stream::sync() const { check(api().cuStreamSynchronize(s_), "cuStreamSynchronize"); }

}  // namespace rtattn::driver
