// A V4 model ready to run: its configuration, its weight views, and the file
// mappings that keep those views alive. Produced by a loader (HF checkpoint
// directory now, GGUF later); consumed by the forward pass.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "affinity/status.h"
#include "model/dsv4/config.h"
#include "model/dsv4/weights.h"

namespace aff::dsv4 {

struct LoadedModel {
  std::string source;                       // directory or file it was loaded from
  ModelConfig config;
  ModelWeights weights;
  std::vector<std::shared_ptr<void>> keep_alive;  // mapped files backing the views
};

// Loads an HF checkpoint directory (config.json + model.safetensors.index.json
// + shards, or a single model.safetensors). Every tensor's presence, dtype and
// shape is validated; any problem is one Status naming the file and tensor.
Result<std::unique_ptr<LoadedModel>> load_checkpoint_dir(const std::string& dir);

}  // namespace aff::dsv4
