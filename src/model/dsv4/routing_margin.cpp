#include "model/dsv4/routing_margin.h"

#include <cmath>
#include <string>
#include <vector>

#include "model/dsv4/forward.h"

namespace aff::dsv4 {

void RoutingMargin::observe(int l, int64_t pos0, const Routing& routing) {
  const int k = routing.k;
  for (size_t t = 0; t < routing.gap.size(); ++t) {
    ++decisions;
    // A NaN score leaves the selection arbitrary: no margin at all.
    const float g = std::isnan(routing.gap[t]) ? -std::numeric_limits<float>::infinity() : routing.gap[t];
    if (g < gap || layer < 0) {
      gap = g;
      layer = l;
      position = pos0 + int64_t(t);
      last_selected = k > 0 ? routing.experts[t * size_t(k) + size_t(k - 1)] : -1;
      runner_up = routing.runner_up[t];
    }
  }
}

Result<RoutingMargin> routing_margin(const LoadedModel& model, std::span<const int32_t> tokens,
                                     int64_t prefill, int max_layers) {
  const int64_t total = int64_t(tokens.size());
  if (prefill < 1 || prefill > total)
    return invalid_argument("routing_margin: prefill " + std::to_string(prefill) + " outside [1, " +
                            std::to_string(total) + "]");
  RoutingMargin m;
  const RouteObserver obs = [&m](int l, int64_t pos0, const Routing& r) { m.observe(l, pos0, r); };
  ForwardOptions fo;
  fo.max_layers = max_layers;
  fo.route_observer = &obs;
  auto state = make_state(model, total);
  std::vector<float> logits;
  AFF_RETURN_IF_ERROR(forward(model, *state, tokens.first(size_t(prefill)), false, logits, fo));
  for (int64_t p = prefill; p < total; ++p)
    AFF_RETURN_IF_ERROR(forward(model, *state, tokens.subspan(size_t(p), 1), false, logits, fo));
  return m;
}

}  // namespace aff::dsv4
