#include "cache/entry_file.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cache/fsys.hpp"
#include "util/json_input.hpp"
#include "util/sha256.hpp"
#include "util/text.hpp"

namespace rtattn::cache {

namespace {

constexpr char kMagic[8] = {'R', 'T', 'A', 'T', 'T', 'N', 'C', '\0'};
constexpr std::size_t kKeyLen = 64;
constexpr std::size_t kMaxArchLen = 64;                 // longer is a corrupt header, not an arch name
constexpr std::size_t kHeadLen = 8 + 4 + 4 + kKeyLen;  // magic, format, arch_len, key: everything before the arch
constexpr std::size_t kSizesLen = 8 + 8;               // cubin_size, info_size: after the arch
constexpr std::size_t kSumLen = 32;
// Plausible payloads: our cubins are 0.1-3 MB and their info JSON about 1 KB. Anything far beyond is a corrupt or
// hostile header, refused before a byte of it is read.
constexpr std::uint64_t kMaxCubin = 256ull << 20;
constexpr std::uint64_t kMaxInfo = 1ull << 20;
constexpr std::string_view kEntrySuffix = ".rtc";
constexpr std::string_view kLockSuffix = ".lock";
constexpr std::string_view kTempPrefix = ".tmp-";

bool hex_digits(std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool arch_chars(std::string_view s) {
    return std::all_of(s.begin(), s.end(),
                       [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

void put_le(std::string& out, std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_le(std::string_view in, std::size_t pos, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t(static_cast<unsigned char>(in[pos + i])) << (8 * i);
    return v;
}

util::Digest digest(std::string_view bytes) { return util::sha256(bytes.data(), bytes.size()); }

// The header's fixed part and arch: "" and the total file size it declares, or what is wrong with it. `bytes`
// holds at least kHeadLen bytes.
std::string check_head(std::string_view bytes, const std::string& expect_key, Entry* out) {
    if (bytes.substr(0, sizeof kMagic) != std::string_view(kMagic, sizeof kMagic))
        return "bad magic (not an rtattn cache entry)";
    const std::uint64_t format = get_le(bytes, 8, 4);
    if (format != kFormatVersion)
        return "entry format version " + std::to_string(format) + ", expected " + std::to_string(kFormatVersion);
    const std::uint64_t arch_len = get_le(bytes, 12, 4);
    if (arch_len == 0 || arch_len > kMaxArchLen) return "corrupt header: arch length " + std::to_string(arch_len);
    const std::string_view key = bytes.substr(16, kKeyLen);
    if (key != expect_key) return "entry holds key " + util::quoted(key, kKeyLen) + " but is named " + expect_key;
    out->key = std::string(key);
    return "";
}

// With the sizes read: the total the header declares, or 0 with *problem set.
std::uint64_t declared_size(std::string_view head, std::uint64_t file_size, Entry* out, std::string* problem) {
    const std::size_t arch_len = std::size_t(get_le(head, 12, 4));
    if (head.size() < kHeadLen + arch_len + kSizesLen) {
        *problem = "truncated: " + std::to_string(file_size) + " bytes end inside the header";
        return 0;
    }
    const std::string_view arch = head.substr(kHeadLen, arch_len);
    if (!arch_chars(arch)) {
        *problem = "corrupt header: arch " + util::quoted(arch) + " is not an arch name";
        return 0;
    }
    out->arch = std::string(arch);
    const std::uint64_t cubin = get_le(head, kHeadLen + arch_len, 8), info = get_le(head, kHeadLen + arch_len + 8, 8);
    if (cubin > kMaxCubin || info > kMaxInfo) {
        *problem = "corrupt header: implausible sizes (cubin " + std::to_string(cubin) + ", info " +
                   std::to_string(info) + " bytes)";
        return 0;
    }
    const std::uint64_t total = kHeadLen + arch_len + kSizesLen + cubin + info + kSumLen;
    if (total != file_size) {
        *problem = std::string(file_size < total ? "truncated" : "trailing bytes") + ": header declares " +
                   std::to_string(total) + " bytes, file has " + std::to_string(file_size);
        return 0;
    }
    return total;
}

}  // namespace

bool is_key(std::string_view s) { return s.size() == kKeyLen && hex_digits(s); }
bool is_shard(std::string_view s) { return s.size() == 2 && hex_digits(s); }

std::optional<Kind> classify(std::string_view shard, std::string_view name) {
    const auto keyed = [&](std::string_view suffix) {
        if (name.size() != kKeyLen + suffix.size() || name.substr(kKeyLen) != suffix) return false;
        const std::string_view key = name.substr(0, kKeyLen);
        return is_key(key) && key.substr(0, 2) == shard;
    };
    if (keyed(kEntrySuffix)) return Kind::entry;
    if (keyed(kLockSuffix)) return Kind::lock;
    if (name.substr(0, kTempPrefix.size()) == kTempPrefix) {
        // .tmp-<key>-XXXXXX in the key's shard, .tmp-probe-XXXXXX in the version directory (shard ""), as
        // TempFile::create names them.
        std::string_view rest = name.substr(kTempPrefix.size());
        const std::size_t dash = rest.rfind('-');
        if (dash == std::string_view::npos || rest.size() - dash - 1 != 6) return std::nullopt;
        const std::string_view tag = rest.substr(0, dash), suffix = rest.substr(dash + 1);
        const bool alnum = std::all_of(suffix.begin(), suffix.end(), [](char c) {
            return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        });
        if (alnum && (shard.empty() ? tag == "probe" : is_key(tag) && tag.substr(0, 2) == shard)) return Kind::temp;
    }
    return std::nullopt;
}

std::string shard_of(const std::string& key) { return key.substr(0, 2); }
std::string entry_name(const std::string& key) { return key + std::string(kEntrySuffix); }
std::string lock_name(const std::string& key) { return key + std::string(kLockSuffix); }
std::string temp_prefix(const std::string& tag) { return std::string(kTempPrefix) + tag + "-"; }

std::string encode_entry(const Entry& e) {
    std::string out;
    out.reserve(kHeadLen + e.arch.size() + kSizesLen + e.cubin.size() + e.info_json.size() + kSumLen);
    out.append(kMagic, sizeof kMagic);
    put_le(out, kFormatVersion, 4);
    put_le(out, e.arch.size(), 4);
    out += e.key;
    out += e.arch;
    put_le(out, e.cubin.size(), 8);
    put_le(out, e.info_json.size(), 8);
    out += e.cubin;
    out += e.info_json;
    const util::Digest d = digest(out);
    out.append(reinterpret_cast<const char*>(d.data()), d.size());
    return out;
}

std::string decode_entry(std::string_view bytes, const std::string& expect_key, Entry* out) {
    if (bytes.size() < kHeadLen + 1 + kSizesLen + kSumLen)
        return "truncated: " + std::to_string(bytes.size()) + " bytes, an entry needs at least " +
               std::to_string(kHeadLen + 1 + kSizesLen + kSumLen);
    if (std::string p = check_head(bytes, expect_key, out); !p.empty()) return p;
    std::string problem;
    if (declared_size(bytes, bytes.size(), out, &problem) == 0) return problem;
    const std::size_t body = kHeadLen + out->arch.size() + kSizesLen;
    const std::uint64_t cubin_size = get_le(bytes, body - kSizesLen, 8);
    const std::string_view signed_part = bytes.substr(0, bytes.size() - kSumLen);
    const util::Digest want = digest(signed_part);
    if (bytes.substr(signed_part.size()) != std::string_view(reinterpret_cast<const char*>(want.data()), want.size()))
        return "checksum mismatch (header, cubin or info corrupted)";
    const std::string_view info = signed_part.substr(body + cubin_size);
    if (std::string p = info_problem(info); !p.empty()) return "bad info: " + p;
    out->cubin = std::string(signed_part.substr(body, cubin_size));
    out->info_json = std::string(info);
    return "";
}

std::string read_entry(int fd, std::uint64_t file_size, const std::string& path, const std::string& expect_key,
                       Entry* out) {
    const std::uint64_t min_size = kHeadLen + 1 + kSizesLen + kSumLen;
    if (file_size < min_size)
        return "truncated: " + std::to_string(file_size) + " bytes, an entry needs at least " +
               std::to_string(min_size);
    std::string head;
    if (auto s = fsys::read_exact(fd, kHeadLen, path, &head); !s.ok()) return s.message();
    if (std::string p = check_head(head, expect_key, out); !p.empty()) return p;
    std::string more;
    if (auto s = fsys::read_exact(fd, std::size_t(get_le(head, 12, 4)) + kSizesLen, path, &more); !s.ok())
        return s.message();
    head += more;
    std::string problem;
    const std::uint64_t total = declared_size(head, file_size, out, &problem);
    if (total == 0) return problem;
    if (auto s = fsys::read_exact(fd, std::size_t(total - head.size()), path, &more); !s.ok()) return s.message();
    return decode_entry(head + more, expect_key, out);
}

std::string info_problem(std::string_view info) {
    nlohmann::json j;
    if (std::string p = util::parse_json(info, &j); !p.empty()) return p;
    if (!j.is_object()) return "not a JSON object";
    const auto field = [&](const char* name, bool (nlohmann::json::*is)() const noexcept, const char* type) {
        return j.contains(name) && !(j[name].*is)() ? std::string(name) + " is not " + type : std::string();
    };
    for (const std::string& p : {field("config", &nlohmann::json::is_object, "an object"),
                                 field("plan", &nlohmann::json::is_object, "an object"),
                                 field("registers", &nlohmann::json::is_number_integer, "an integer"),
                                 field("spill_bytes", &nlohmann::json::is_number_integer, "an integer"),
                                 field("compile_seconds", &nlohmann::json::is_number, "a number"),
                                 field("nvrtc", &nlohmann::json::is_string, "a string"),
                                 field("library", &nlohmann::json::is_string, "a string")})
        if (!p.empty()) return p;
    return "";
}

}  // namespace rtattn::cache
