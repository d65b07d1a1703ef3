#include "util/text.hpp"

namespace rtattn::util {

std::string escaped(std::string_view s) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(s.size());
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '\\') {
            out += "\\\\";
        } else if (c >= 0x20 && c < 0x7f) {
            out += ch;
        } else {
            out += "\\x";
            out += kHex[c >> 4];
            out += kHex[c & 15];
        }
    }
    return out;
}

std::string quoted(std::string_view s, std::size_t max_bytes) {
    std::string out = "'";
    out += escaped(s.substr(0, max_bytes));
    if (s.size() <= max_bytes) return out += "'";
    return out += "...' (" + std::to_string(s.size()) + " bytes)";
}

}  // namespace rtattn::util
