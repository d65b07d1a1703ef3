#include "util/json_input.hpp"

#include <unordered_set>
#include <vector>

#include "util/text.hpp"
#include "util/format.hpp"

namespace rtattn::util {

namespace {

// Where the text first nests deeper than kMaxJsonDepth, counting brackets outside strings as the parser's lexer
// does (a string ends at an unescaped quote). A loop, not a parser: it cannot itself run out of stack. On text
// that is not JSON the count may differ from what the parser would have seen, but only after the parser would
// have stopped with an error anyway.
std::string depth_problem(std::string_view text) {
    int depth = 0;
    bool in_string = false, escape = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (escape)
                escape = false;
            else if (c == '\\')
                escape = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > kMaxJsonDepth)
                return util::format("nested deeper than {} levels (at byte {}); allowed: at most {} levels of "
                                    "arrays and objects",
                                    kMaxJsonDepth, i, kMaxJsonDepth);
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return "";
}

struct DuplicateKey {
    std::string key;
};

template <class Json>
std::string parse(std::string_view text, Json* out) {
    if (std::string p = depth_problem(text); !p.empty()) return p;
    // The keys seen so far in each object being read, innermost last.
    std::vector<std::unordered_set<std::string>> open;
    const typename Json::parser_callback_t check_keys = [&open](int, typename Json::parse_event_t event,
                                                                Json& parsed) {
        using Event = typename Json::parse_event_t;
        if (event == Event::object_start) {
            open.emplace_back();
        } else if (event == Event::object_end) {
            open.pop_back();
        } else if (event == Event::key && !open.back().insert(parsed.template get<std::string>()).second) {
            throw DuplicateKey{parsed.template get<std::string>()};
        }
        return true;
    };
    try {
        *out = Json::parse(text.begin(), text.end(), check_keys);
    } catch (const DuplicateKey& d) {
        return "key " + util::quoted(d.key) + " appears twice in one object; give each key once";
    } catch (const nlohmann::json::exception& e) {
        // The parser's message quotes the last token read, which may be long or hold any byte.
        const std::string_view what = e.what();
        return "not valid JSON: " + util::escaped(what.substr(0, 240)) + (what.size() > 240 ? "..." : "");
    }
    return "";
}

}  // namespace

std::string parse_json(std::string_view text, nlohmann::json* out) { return parse(text, out); }
std::string parse_json(std::string_view text, nlohmann::ordered_json* out) { return parse(text, out); }

}  // namespace rtattn::util
