// AttentionConfig from an already parsed JSON value. Manifests expand their entries as JSON objects and hand each
// one over as it is: a dump and re-parse would turn NaN and infinities into null, i.e. silently into the default.
#pragma once
#include <nlohmann/json.hpp>

#include "core/config.hpp"

namespace rtattn::core {

AttentionConfig config_from_json(const nlohmann::json& j);

// A JSON value as a message shows it: ASCII only, cut after 64 characters with the full length noted.
std::string json_for_message(const nlohmann::json& v);

}  // namespace rtattn::core

namespace rtattn {
using core::config_from_json;
using core::json_for_message;
}  // namespace rtattn
