// Shared helpers of the quantize tests: scratch directories, synthetic checkpoints,
// small tokenizer.json files, and reading files back.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/dsv4/synthetic_checkpoint.h"

namespace aff::quant::testing {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("aff-quantize-test-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string str(const std::string& child) const { return (path_ / child).string(); }

 private:
  fs::path path_;
};

inline std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline void write_file(const fs::path& p, const void* data, size_t n) {
  std::ofstream f(p, std::ios::binary);
  f.write(static_cast<const char*>(data), std::streamsize(n));
}

// The synthetic tiny config with hidden and expert widths of 256, so every routed
// expert row fits the 256-element K-quant super-blocks (the stock tiny config's odd
// widths exercise the fallback instead). Cut to 3 layers (SWA, SWA, CSA) + MTP and 4
// experts to keep the reference K-quant searches fast.
inline dsv4::ModelConfig k_quant_config() {
  dsv4::ModelConfig c = dsv4::synthetic_tiny_config();
  c.hidden_size = 256;
  c.moe_inter = 256;
  c.num_layers = 3;
  c.compress_ratios = {0, 0, 4, 0};
  c.n_routed_experts = 4;
  return c;
}

// A byte-level-BPE-shaped tokenizer.json: `n_base` vocab entries, two merges, and
// two added tokens (one special, one not) at the end.
inline std::string tiny_tokenizer_json(int n_base) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int i = 0; i < n_base; ++i) vocab[std::string(1, 't').append(std::to_string(i))] = i;
  nlohmann::json j;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array({"t1 t2", nlohmann::json::array({"t3", "t4"})})}};
  j["added_tokens"] = nlohmann::json::array(
      {{{"id", n_base}, {"content", "<｜begin▁of▁sentence｜>"}, {"special", true}},
       {{"id", n_base + 1}, {"content", "<｜User｜>"}, {"special", false}}});
  return j.dump();
}

}  // namespace aff::quant::testing
