// SHA-256 through OpenSSL's EVP interface (cache keys and entry checksums).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace rtattn::util {

using Digest = std::array<std::uint8_t, 32>;

class Sha256 {
public:
    Sha256();
    ~Sha256();
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;
    Sha256& update(const void* data, std::size_t size);
    Sha256& update(std::string_view s) { return update(s.data(), s.size()); }
    // Length-prefixed field: keeps ("ab","c") and ("a","bc") from hashing alike.
    Sha256& field(std::string_view s);
    Digest finish();
private:
    void* ctx_;
};

Digest sha256(const void* data, std::size_t size);
std::string to_hex(const Digest& d);

}  // namespace rtattn::util
