// Whole-model logits against the transformers float32 oracle: every fixture
// under tests/data/golden/<name>/ (a checkpoint in the official layout,
// tokens.json, logits.npy [T, vocab] float32 from DeepseekV4ForCausalLM) runs
// one-shot prefill, chunked prefill (chunk 64) and token-by-token decode.
// Acceptance (issue 2): relative RMS error <= 5e-3 and top-1 agreement >= 99%
// over all positions, for each of the three.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/dsv4/forward.h"
#include "model/dsv4/loaded_model.h"

namespace aff::dsv4 {
namespace {

namespace fs = std::filesystem;

constexpr double kMaxRelRms = 5e-3;
constexpr double kMinTop1 = 0.99;
// The CPU reference computes the oracle's float32 graph, so beyond the issue's
// acceptance bound it should agree to float32 rounding (measured ~7e-7, the
// same as the oracle's own float32-vs-float64 gap). A semantic slip that still
// passes 5e-3 (say a wrong eps or one mis-selected compressed entry) fails here.
constexpr double kFloat32RelRms = 1e-5;

fs::path golden_root() { return fs::path(AFFINITY_TEST_DATA) / "golden"; }

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::is_directory(golden_root(), ec)) return names;
  for (const auto& e : fs::directory_iterator(golden_root(), ec))
    if (e.is_directory() && fs::exists(e.path() / "logits.npy")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// Minimal .npy (v1/v2) reader for little-endian float32 C-order arrays.
bool read_npy_f32(const fs::path& path, std::vector<int64_t>& shape, std::vector<float>& data,
                  std::string& err) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return err = "cannot open " + path.string(), false;
  char magic[8];
  f.read(magic, 8);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) return err = "not an npy file", false;
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    uint16_t h16;
    f.read(reinterpret_cast<char*>(&h16), 2);
    hlen = h16;
  } else {
    f.read(reinterpret_cast<char*>(&hlen), 4);
  }
  std::string header(hlen, '\0');
  f.read(header.data(), hlen);
  if (header.find("'<f4'") == std::string::npos) return err = "dtype is not <f4: " + header, false;
  if (header.find("'fortran_order': False") == std::string::npos) return err = "fortran order", false;
  const size_t lp = header.find('(', header.find("'shape'")), rp = header.find(')', lp);
  shape.clear();
  std::string dims = header.substr(lp + 1, rp - lp - 1);
  for (size_t p = 0; p < dims.size();) {
    const size_t c = dims.find(',', p);
    const std::string tok = dims.substr(p, c == std::string::npos ? std::string::npos : c - p);
    if (tok.find_first_of("0123456789") != std::string::npos) shape.push_back(std::stoll(tok));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  data.resize(size_t(n));
  f.read(reinterpret_cast<char*>(data.data()), std::streamsize(n * 4));
  if (!f) return err = "truncated data", false;
  return true;
}

struct Agreement {
  double rel_rms = 0.0;
  double top1 = 0.0;
};

// got, want: [T, V].
Agreement compare(const std::vector<float>& got, const std::vector<float>& want, int64_t T,
                  int64_t V) {
  double num = 0.0, den = 0.0;
  int64_t same = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* g = got.data() + t * V;
    const float* w = want.data() + t * V;
    for (int64_t v = 0; v < V; ++v) {
      num += double(g[v] - w[v]) * double(g[v] - w[v]);
      den += double(w[v]) * double(w[v]);
    }
    same += (std::max_element(g, g + V) - g) == (std::max_element(w, w + V) - w);
  }
  return {std::sqrt(num / den), double(same) / double(T)};
}

// Runs the tokens in chunks of `chunk` (0 = all at once) and returns [T, V] logits.
std::vector<float> run_chunked(const LoadedModel& model, const std::vector<int32_t>& tokens,
                               size_t chunk) {
  auto state = make_state(model, int64_t(tokens.size()));
  std::vector<float> all, part;
  if (chunk == 0) chunk = tokens.size();
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    const size_t n = std::min(chunk, tokens.size() - i);
    const Status s = forward(model, *state, std::span(tokens).subspan(i, n), true, part);
    EXPECT_TRUE(s.is_ok()) << s.message();
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesTransformersOneShotChunkedAndDecode) {
  const fs::path dir = golden_root() / GetParam();
  auto loaded = load_checkpoint_dir(dir.string());
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  const LoadedModel& model = **loaded;

  std::ifstream tf(dir / "tokens.json");
  ASSERT_TRUE(tf) << "missing tokens.json in " << dir;
  const std::vector<int32_t> tokens = nlohmann::json::parse(tf).get<std::vector<int32_t>>();
  std::vector<int64_t> shape;
  std::vector<float> want;
  std::string err;
  ASSERT_TRUE(read_npy_f32(dir / "logits.npy", shape, want, err)) << err;
  ASSERT_EQ(shape.size(), 2u);
  const int64_t T = shape[0], V = shape[1];
  ASSERT_EQ(T, int64_t(tokens.size()));
  ASSERT_EQ(V, model.config.vocab_size);

  const struct {
    const char* name;
    size_t chunk;
  } modes[] = {{"one-shot", 0}, {"chunk 64", 64}, {"token-by-token", 1}};
  for (const auto& m : modes) {
    const std::vector<float> got = run_chunked(model, tokens, m.chunk);
    ASSERT_EQ(got.size(), want.size()) << m.name;
    const Agreement a = compare(got, want, T, V);
    std::printf("[golden] %s %-15s rel_rms %.3e top1 %.4f\n", GetParam().c_str(), m.name,
                a.rel_rms, a.top1);
    EXPECT_LE(a.rel_rms, kMaxRelRms) << GetParam() << " " << m.name;
    EXPECT_LE(a.rel_rms, kFloat32RelRms) << GetParam() << " " << m.name << ": within the "
                                         << "acceptance bound but not float32-exact";
    EXPECT_GE(a.top1, kMinTop1) << GetParam() << " " << m.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

// Once fixtures are committed, an empty golden directory is a failure, not a skip.
TEST(Golden, FixturesPresent) {
  std::error_code ec;
  if (!fs::is_directory(golden_root(), ec)) GTEST_SKIP() << "no tests/data/golden yet";
  EXPECT_FALSE(fixture_names().empty()) << "tests/data/golden holds no fixture";
}

}  // namespace
}  // namespace aff::dsv4
