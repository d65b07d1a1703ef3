#include "util/sha256.hpp"

#include <openssl/evp.h>

#include "core/errors.hpp"

namespace rtattn::util {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1)
        throw Error("OpenSSL: cannot initialise SHA-256");
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

Sha256& Sha256::update(const void* data, std::size_t size) {
    EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, size);
    return *this;
}

Sha256& Sha256::field(std::string_view s) {
    const std::uint64_t n = s.size();
    update(&n, sizeof n);
    return update(s);
}

Digest Sha256::finish() {
    Digest d{};
    unsigned int len = 0;
    EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), d.data(), &len);
    return d;
}

Digest sha256(const void* data, std::size_t size) { return Sha256().update(data, size).finish(); }

std::string to_hex(const Digest& d) {
    static const char* hex = "0123456789abcdef";
    std::string s;
    s.reserve(64);
    for (auto b : d) {
        s.push_back(hex[b >> 4]);
        s.push_back(hex[b & 15]);
    }
    return s;
}

}  // namespace rtattn::util
