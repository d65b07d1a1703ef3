// Whom the disk cache trusts. A cache entry is code that will run on the GPU in the loading process, so, like ssh's
// StrictModes, an entry is loaded only if it and every directory from the cache root down are owned by the current
// user or root and nobody else can write them. A team cache that is group-writable on purpose is opted into
// (RuntimeOptions::shared_cache, RTATTN_SHARED_CACHE=1): then anyone who can write it is trusted, owners of other
// entries included. Nothing writable by every user is ever trusted.
#pragma once
#include <sys/stat.h>

#include <string>

namespace rtattn::cache {

struct TrustPolicy {
    bool shared = false;  // accept group-writable files and directories of any owner
};

// "" when a file or directory with this status may be trusted, else why not ("is writable by group (mode 0775)").
std::string distrust(const struct stat& st, const TrustPolicy& policy);

// How a refused path can be made trusted again, for the warning.
std::string trust_advice(const std::string& path);

}  // namespace rtattn::cache
