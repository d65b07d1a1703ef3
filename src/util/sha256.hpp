// SHA-256 (FIPS 180-4) for cache keys and entry checksums, written here so that the library needs no libcrypto: a
// wheel built on one machine then runs on another.
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
    Sha256& update(const void* data, std::size_t size);
    Sha256& update(std::string_view s) { return update(s.data(), s.size()); }
    // Length-prefixed field: keeps ("ab","c") and ("a","bc") from hashing alike.
    Sha256& field(std::string_view s);
    Digest finish();  // once; the object is spent after it
private:
    void compress(const std::uint8_t* block);
    std::array<std::uint32_t, 8> h_;
    std::array<std::uint8_t, 64> buf_{};
    std::size_t buffered_ = 0;
    std::uint64_t bytes_ = 0;
};

Digest sha256(const void* data, std::size_t size);
std::string to_hex(const Digest& d);

}  // namespace rtattn::util
