#include "cache/trust.hpp"

#include <unistd.h>

#include "util/format.hpp"

namespace rtattn::cache {

std::string distrust(const struct stat& st, const TrustPolicy& policy) {
    const auto mode = [&] { return util::format("mode {:04o}", st.st_mode & 07777); };
    if (st.st_mode & S_IWOTH) return util::format("is writable by every user ({})", mode());
    if (policy.shared) return "";
    const uid_t me = ::geteuid();
    if (st.st_uid != me && st.st_uid != 0)
        return util::format("is owned by uid {}, neither you (uid {}) nor root", st.st_uid, me);
    if (st.st_mode & S_IWGRP) return util::format("is writable by group {} ({})", st.st_gid, mode());
    return "";
}

std::string trust_advice(const std::string& path) {
    return util::format("make it yours and `chmod go-w {}`, or, if everyone who can write it is trusted, opt in to a "
                        "shared cache (RTATTN_SHARED_CACHE=1)",
                        path);
}

}  // namespace rtattn::cache
