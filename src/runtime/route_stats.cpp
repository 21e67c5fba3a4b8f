#include "runtime/route_stats.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "core/check.h"

namespace aff::runtime {

int reuse_bucket(int64_t distance) {
  AFF_CHECK(distance >= 1);
  if (distance >= 1024) return kReuseFar;
  return int(std::bit_width(uint64_t(distance))) - 1;  // floor(log2 d)
}

std::string reuse_bucket_label(int bucket) {
  if (bucket == kReuseNever) return "never";
  if (bucket == kReuseFar) return ">=1024";
  if (bucket == 0) return "1";
  return fmt::format("{}-{}", int64_t(1) << bucket, (int64_t(1) << (bucket + 1)) - 1);
}

double top_share(std::vector<int64_t> counts, double fraction) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0 || counts.empty()) return 0.0;
  std::sort(counts.begin(), counts.end(), std::greater<>());
  const double want = fraction * double(counts.size());
  const size_t whole = size_t(std::floor(want));
  double taken = 0.0;
  for (size_t i = 0; i < whole && i < counts.size(); ++i) taken += double(counts[i]);
  if (whole < counts.size()) taken += (want - double(whole)) * double(counts[whole]);
  return taken / double(total);
}

RouteStatsRecorder::RouteStatsRecorder(const dsv4::ModelConfig& cfg)
    : n_experts_(cfg.n_routed_experts), n_hash_layers_(cfg.num_hash_layers), n_layers_(cfg.num_layers) {
  observer_ = [this](int layer, int64_t pos0, const dsv4::Routing& r) { observe(layer, pos0, r); };
}

void RouteStatsRecorder::observe(int layer, int64_t pos0, const dsv4::Routing& routing) {
  AFF_CHECK(layer >= 0);
  if (size_t(layer) >= layers_.size()) layers_.resize(size_t(layer) + 1);
  Layer& L = layers_[size_t(layer)];
  if (L.last_use.empty()) {
    L.stats.layer = layer;
    L.stats.hash = layer < n_hash_layers_;
    L.stats.mtp = layer >= n_layers_;
    L.stats.expert_counts.assign(size_t(n_experts_), 0);
    L.last_use.assign(size_t(n_experts_), -1);
  }
  const int k = routing.k;
  const int64_t T = k > 0 ? int64_t(routing.experts.size()) / k : 0;
  AFF_CHECK(pos0 > L.last_pos);  // one stream: positions only grow
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = pos0 + t;
    for (int i = 0; i < k; ++i) {
      const int32_t e = routing.experts[size_t(t * k + i)];
      AFF_CHECK(e >= 0 && e < n_experts_);
      int64_t& last = L.last_use[size_t(e)];
      ++L.stats.reuse[size_t(last < 0 ? kReuseNever : reuse_bucket(pos - last))];
      last = pos;
      ++L.stats.expert_counts[size_t(e)];
    }
  }
  if (T > 0) L.last_pos = pos0 + T - 1;
  L.stats.tokens += T;
  L.stats.activations += T * k;
}

std::vector<LayerRouteStats> RouteStatsRecorder::layers() const {
  std::vector<LayerRouteStats> out;
  for (const Layer& L : layers_) {
    if (L.last_use.empty()) continue;
    out.push_back(L.stats);
    out.back().top10_share = top_share(L.stats.expert_counts, 0.10);
  }
  return out;
}

const char* router_name(const LayerRouteStats& l) { return l.hash ? "hash" : l.mtp ? "mtp" : "gate"; }

std::string route_stats_table(const std::vector<LayerRouteStats>& layers) {
  std::string out = "Expert routing per layer: top-10% share = activations taken by the busiest 10% of experts "
                    "(uniform = 10%);\nreuse distance = tokens since the expert was last chosen in the layer "
                    "(% of activations).\n";
  out += fmt::format("{:>5} {:>7} {:>9} {:>8} {:>8}", "layer", "router", "tokens", "experts", "top10%");
  for (int b = 0; b < kReuseBuckets; ++b) out += fmt::format(" {:>8}", reuse_bucket_label(b));
  out += '\n';
  for (const LayerRouteStats& l : layers) {
    const int64_t used = std::count_if(l.expert_counts.begin(), l.expert_counts.end(), [](int64_t c) { return c > 0; });
    out += fmt::format("{:>5} {:>7} {:>9} {:>8} {:>7.2f}%", l.layer, router_name(l), l.tokens,
                       fmt::format("{}/{}", used, l.expert_counts.size()), 100.0 * l.top10_share);
    for (int b = 0; b < kReuseBuckets; ++b)
      out += fmt::format(" {:>7.2f}%",
                         l.activations > 0 ? 100.0 * double(l.reuse[size_t(b)]) / double(l.activations) : 0.0);
    out += '\n';
  }
  return out;
}

nlohmann::json route_stats_json(const std::vector<LayerRouteStats>& layers) {
  nlohmann::json arr = nlohmann::json::array();
  for (const LayerRouteStats& l : layers) {
    nlohmann::json hist = nlohmann::json::object();
    for (int b = 0; b < kReuseBuckets; ++b) hist[reuse_bucket_label(b)] = l.reuse[size_t(b)];
    arr.push_back({{"layer", l.layer},
                   {"router", router_name(l)},
                   {"tokens", l.tokens},
                   {"activations", l.activations},
                   {"top10_share", l.top10_share},
                   {"expert_counts", l.expert_counts},
                   {"reuse_distance", hist}});
  }
  return arr;
}

}  // namespace aff::runtime
