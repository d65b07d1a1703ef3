// Text that came from outside (file contents, manifests, flags, environment) made safe to put in a message: no
// control character reaches a terminal raw, a NUL cannot cut a C string short, and a huge value is not echoed whole.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace rtattn::util {

// Printable ASCII as is (backslash doubled); every other byte as \xNN, so escaped text is plain ASCII.
std::string escaped(std::string_view s);

// escaped(s) in single quotes, cut after `max_bytes` input bytes with the full length noted:
// 'abc', 'aaaa...' (1048576 bytes).
std::string quoted(std::string_view s, std::size_t max_bytes = 64);

}  // namespace rtattn::util
