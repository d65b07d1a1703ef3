// The GPU architectures librtattn compiles for and what each offers: the one place these facts are stated. Config
// validation, planning, the driver's device-to-arch mapping and the "does this cubin run here" check all ask here.
#pragma once
#include <string>
#include <string_view>

namespace rtattn::arch {

struct Arch {
    const char* name;    // NVRTC's --gpu-architecture value, e.g. "sm_90a"
    int major, minor;    // the compute capability it targets
    bool specific;       // the 'a' suffix: runs on exactly this compute capability, and unlocks what it marks below
    int smem_optin;      // dynamic shared memory per block after cuFuncSetAttribute (bytes)
    bool wgmma;          // warpgroup MMA (Hopper, arch-specific)
    bool tma;            // the tensor memory accelerator with mbarrier transactions (cp.async.bulk.tensor)
    bool setmaxnreg;     // moving registers between warpgroups
    bool bulk;           // bulk copies and reductions between shared and global memory (cp.reduce.async.bulk)
    const char* gpus;    // for messages
};

// nullptr when `name` is not an arch the library knows.
const Arch* find(std::string_view name);
// Throws ConfigError("arch", ...) naming the known archs.
const Arch& get(std::string_view name);
// "sm_80, sm_86, sm_89, sm_90, sm_90a"
std::string known_names();
// The arch the library compiles for a device of compute capability major.minor (the arch-specific one where there
// is one: its cubins run only there, and they can use everything the chip has). May name an unknown arch.
std::string for_device(int major, int minor);
// Whether a cubin built for `a` runs on a device of compute capability major.minor.
bool runs_on(const Arch& a, int major, int minor);

}  // namespace rtattn::arch
