// The one file that compiles fmt's engine (util/format.hpp says why).
#include "util/format.hpp"

namespace rtattn::util {

std::string vformatted(fmt::string_view format, fmt::format_args args) { return fmt::vformat(format, args); }

void vprinted(std::FILE* out, fmt::string_view format, fmt::format_args args) { fmt::vprint(out, format, args); }

}  // namespace rtattn::util
