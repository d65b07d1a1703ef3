// The only code that touches the CUDA Driver API. libcuda is dlopen'ed on first use, so the library, the CLI and
// precompile work on machines with no driver; every failure becomes a CudaError naming the call and result.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace rtattn::driver {

// Typed entry points, resolved through cuGetProcAddress for the API version we were built against.
struct Api {
#define RTATTN_DRIVER_FUNCTIONS(X)                                                                             \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)                       \
    X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice) \
    X(cuCtxSynchronize) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute)      \
    X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuGetErrorName) X(cuGetErrorString) X(cuMemAlloc) X(cuMemFree)    \
    X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemsetD16) X(cuMemsetD32) X(cuStreamCreate) X(cuStreamDestroy)          \
    X(cuStreamSynchronize) X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphLaunch) \
    X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)                 \
    X(cuEventSynchronize) X(cuEventElapsedTime) X(cuMemGetInfo) X(cuTensorMapEncodeTiled) X(cuMemcpyDtoDAsync) \
    X(cuLaunchKernelEx)
#define RTATTN_DECLARE(name) decltype(&::name) name = nullptr;
    RTATTN_DRIVER_FUNCTIONS(RTATTN_DECLARE)
#undef RTATTN_DECLARE
};

// Loads libcuda.so.1 once; throws CudaError when it is missing or too old.
const Api& api();

// Throws CudaError("call", result) unless r == CUDA_SUCCESS.
void check(CUresult r, const char* call);

// True when a driver loads and reports at least one device. Never throws.
bool gpu_available();

struct DeviceInfo {
    CUdevice device = 0;
    CUcontext context = nullptr;
    std::string name;
    int cc_major = 0, cc_minor = 0;
    int sms = 0;
    int smem_optin = 0;      // max dynamic shared memory per block (bytes)
    int driver_version = 0;  // e.g. 13000
    std::string arch() const;  // the arch name rtattn compiles for this device, e.g. "sm_90a"
};

// Makes sure a context is current (retaining device 0's primary context when none is) and describes its device.
DeviceInfo current_device();

// A loaded module and its entry points, unloaded when the last Kernel using it goes away.
struct Module {
    CUmodule module = nullptr;
    std::vector<CUfunction> functions;  // in the order the entries were named
    CUcontext context = nullptr;
    ~Module();
};

// cuModuleLoadData + cuModuleGetFunction for each entry; raises the dynamic shared-memory limit of each when
// smem_bytes > 48 KB.
std::shared_ptr<Module> load(const std::string& cubin, const std::vector<std::string>& entries, int smem_bytes);

// Test and tool helpers: RAII device memory, stream, graph.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(std::size_t bytes);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = 0; o.bytes_ = 0; }
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
    void* get() const { return reinterpret_cast<void*>(ptr_); }
    std::size_t bytes() const { return bytes_; }
    void upload(const void* host, std::size_t bytes, std::size_t offset = 0);
    void download(void* host, std::size_t bytes, std::size_t offset = 0) const;
    void fill_u16(unsigned short value);  // poisoning outputs
    void fill_u32(unsigned value);
private:
    CUdeviceptr ptr_ = 0;
    std::size_t bytes_ = 0;
};

class Stream {
public:
    Stream();
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    CUstream get() const { return s_; }
    void sync() const;
private:
    CUstream s_ = nullptr;
};

}  // namespace rtattn::driver
