// The disk cache's names and entry file format.
//
// Layout: <root>/v<format>/<key[0:2]>/ holds <key>.rtc (entries), <key>.lock (per-key lock files) and
// .tmp-<key>-<6 characters> (files being written); <root>/v<format>/ itself holds .tmp-probe-<6 characters> (the
// write test on opening). These are the only names the cache creates, and the only ones it ever removes.
//
// Entry file, format 2 (little-endian):
//   magic "RTATTNC\0" (8) | format u32 | arch_len u32 | key (64 hex) | arch (arch_len) | cubin_size u64
//   | info_size u64 | cubin | info (a JSON object: config, plan, ptxas figures) | SHA-256 of all bytes before it (32)
// The checksum covers the header too, so an edited arch or size fails verification like a flipped cubin byte.
// It is an integrity check, not a trust check: whoever can write the file can recompute it (see trust.hpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rtattn::cache {

inline constexpr std::uint32_t kFormatVersion = 2;

struct Entry {
    std::string key;        // 64 lowercase hex chars (SHA-256)
    std::string arch;       // e.g. "sm_90a"
    std::string cubin;      // raw bytes
    std::string info_json;  // {"config":{...},"plan":{...},"registers":..,"spill_bytes":..,"compile_seconds":..}
};

enum class Kind { entry, lock, temp };

bool is_key(std::string_view s);         // 64 lowercase hex digits
bool is_shard(std::string_view s);       // 2 lowercase hex digits
// What a name in shard directory `shard` is, if the cache could have created it there. Shard "" is the version
// directory itself, where the cache creates only the temp files that probe whether it can write.
std::optional<Kind> classify(std::string_view shard, std::string_view name);
std::string shard_of(const std::string& key);
std::string entry_name(const std::string& key);
std::string lock_name(const std::string& key);
std::string temp_prefix(const std::string& tag);  // tag: a key, or "probe"

std::string encode_entry(const Entry& e);

// Checks a whole entry file's bytes, named for `expect_key`. Returns "" when it is sound, else what is wrong;
// fields are filled as far as they could be read (a listing still shows the arch of an entry with a bad checksum).
// Strings taken from the bytes appear in the problem escaped.
std::string decode_entry(std::string_view bytes, const std::string& expect_key, Entry* out);

// Reads the entry file open on `fd` (a regular file of `file_size` bytes at `path`) and decodes it. The header
// states the sizes: a file of any other size is refused before its payload is read, so nothing past what the
// header declares (and no implausible size) is ever read.
std::string read_entry(int fd, std::uint64_t file_size, const std::string& path, const std::string& expect_key,
                       Entry* out);

// "" when `info` is a JSON object whose known fields have their types (what `rtattn ls` and KernelInfo read).
std::string info_problem(std::string_view info);

}  // namespace rtattn::cache
