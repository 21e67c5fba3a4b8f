// config.json <-> ModelConfig, with the official HF keys (v4-formats-and-api.md
// §1.3). Parsing validates the architecture's internal consistency; every error
// names the file and the offending field.
#pragma once

#include <string>
#include <string_view>

#include "affinity/status.h"
#include "model/dsv4/config.h"

namespace aff::dsv4 {

// Parses config.json text; `file` names it in errors. V4-Flash (and -Base) and
// V4-Flash-0731 are accepted; V4.1 is recognised and refused (kUnsupported).
Result<ModelConfig> parse_config_json(std::string_view text, const std::string& file);
// Reads and parses a config.json file.
Result<ModelConfig> load_config_json(const std::string& path);

// Checks the architecture's internal consistency (also run by the parsers);
// errors name `file` and the field.
Status validate_config(const ModelConfig& cfg, const std::string& file);

// Serialises with the official keys; parse_config_json(config_to_json(c)) == c.
std::string config_to_json(const ModelConfig& cfg);

}  // namespace aff::dsv4
