// JSON text from outside (a config handed to from_json, a manifest, a cache entry's info) parsed with two limits
// nlohmann does not set. Nesting deeper than kMaxJsonDepth is refused before any value is built: copying, printing
// and comparing a value recurse once per level, so a few hundred KB of '[' overflow the stack (configs, manifests
// and infos are 2 to 4 levels deep). An object key given twice is refused too: nlohmann would keep the last one
// silently, and a config with two different "causal" has no right answer. Every parse of outside JSON goes through
// here, so each input gets the same limits and messages.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace rtattn::util {

inline constexpr int kMaxJsonDepth = 64;

// "" with *out set, or what is wrong (ASCII, short: safe to put in a message). *out is untouched on failure.
std::string parse_json(std::string_view text, nlohmann::json* out);
std::string parse_json(std::string_view text, nlohmann::ordered_json* out);  // keeps the keys' order (CLI output)

}  // namespace rtattn::util
