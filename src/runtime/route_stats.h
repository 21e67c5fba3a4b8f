// Expert-routing statistics of a text, per MoE layer: how concentrated expert
// use is (the share of all activations taken by the busiest 10% of experts)
// and how soon an expert is used again (reuse-distance histogram). These decide
// what a tiered expert cache can win: a skewed, temporally local routing keeps
// few experts hot.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/dsv4/config.h"
#include "model/dsv4/moe.h"

namespace aff::runtime {

// Reuse distance d = tokens since the expert was last selected in the same
// layer (d >= 1). Buckets: [1], [2,3], [4,7], ..., [512,1023], [1024, inf),
// and "never" (first use).
inline constexpr int kReuseBuckets = 12;
inline constexpr int kReuseNever = kReuseBuckets - 1;
inline constexpr int kReuseFar = kReuseBuckets - 2;  // d >= 1024
int reuse_bucket(int64_t distance);                   // 0 .. kReuseFar
std::string reuse_bucket_label(int bucket);           // "1", "2-3", ..., ">=1024", "never"

struct LayerRouteStats {
  int layer = 0;
  bool hash = false;                   // routed by tid2eid (token id) instead of the learned gate
  bool mtp = false;                    // an MTP block (layer ids from num_layers on)
  int64_t tokens = 0;
  int64_t activations = 0;             // tokens x experts per token
  std::vector<int64_t> expert_counts;  // [n_routed_experts]
  // Share of activations taken by the top 10% of experts: the busiest
  // floor(E/10) counts plus the fractional part of E/10 times the next one, so
  // uniform use gives exactly 0.10 for any E.
  double top10_share = 0.0;
  std::array<int64_t, kReuseBuckets> reuse{};
};

// Collects routings for one stream of positions (increasing per layer; a
// position may not repeat). observer() is what ForwardOptions and
// PerplexityOptions take; it must not outlive the recorder.
class RouteStatsRecorder {
 public:
  explicit RouteStatsRecorder(const dsv4::ModelConfig& cfg);
  void observe(int layer, int64_t pos0, const dsv4::Routing& routing);
  const dsv4::RouteObserver& observer() const { return observer_; }
  // Layers seen so far, in layer order, with top10_share filled in.
  std::vector<LayerRouteStats> layers() const;

 private:
  struct Layer {
    LayerRouteStats stats;
    std::vector<int64_t> last_use;  // [E]: position of the last selection, -1 = never
    int64_t last_pos = -1;
  };
  int n_experts_ = 0;
  int n_hash_layers_ = 0;
  int n_layers_ = 0;
  std::vector<Layer> layers_;  // indexed by layer id (main layers, then MTP blocks)
  dsv4::RouteObserver observer_;
};

double top_share(std::vector<int64_t> counts, double fraction);
const char* router_name(const LayerRouteStats& l);  // "hash", "gate" or "mtp"
std::string route_stats_table(const std::vector<LayerRouteStats>& layers);
nlohmann::json route_stats_json(const std::vector<LayerRouteStats>& layers);

}  // namespace aff::runtime
