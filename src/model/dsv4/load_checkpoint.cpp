#include <filesystem>

#include <fmt/format.h>

#include "format/tensor_index.h"
#include "model/dsv4/config_json.h"
#include "model/dsv4/loaded_model.h"
#include "model/dsv4/weights_bind.h"

namespace aff::dsv4 {

Result<std::unique_ptr<LoadedModel>> load_checkpoint_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return not_found(fmt::format("{}: not a checkpoint directory (expected config.json and safetensors)", dir));
  }
  AFF_ASSIGN_OR_RETURN(ModelConfig cfg, load_config_json((fs::path(dir) / "config.json").string()));
  AFF_ASSIGN_OR_RETURN(format::TensorIndex index, format::TensorIndex::open_dir(dir));
  AFF_ASSIGN_OR_RETURN(ModelWeights weights, bind_weights(cfg, index));

  auto model = std::make_unique<LoadedModel>();
  model->source = dir;
  model->config = std::move(cfg);
  model->weights = std::move(weights);
  model->keep_alive = index.keep_alive();
  return model;
}

}  // namespace aff::dsv4
