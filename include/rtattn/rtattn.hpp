// librtattn: attention kernels for any head_dim, rendered from templates, compiled with NVRTC, cached on disk
// and launched through the CUDA Driver API.
#pragma once
#include "rtattn/config.hpp"
#include "rtattn/errors.hpp"
#include "rtattn/runtime.hpp"
