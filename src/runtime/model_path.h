// Where a model comes from when the user names none: the embedded default
// model committed under models/ in the source tree (or next to an installed
// binary, <bin>/../../models/).
#pragma once

#include <string>
#include <vector>

#include "affinity/status.h"

namespace aff::runtime {

// The model directory preferred among several under a models/ root.
inline constexpr const char* kDefaultModelName = "tiny-v4";

// models/ roots searched in order: <source tree>/models, then
// <directory of the running binary>/../../models.
std::vector<std::string> default_model_roots();

// In each root: <root>/kDefaultModelName if it holds a config.json, else the
// first subdirectory (by name) that does. not_found names the roots searched.
Result<std::string> find_default_model(const std::vector<std::string>& roots);

}  // namespace aff::runtime
