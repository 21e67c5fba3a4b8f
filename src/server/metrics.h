// Request counters for /metrics (Prometheus text format 0.0.4). Names follow
// affinity_<area>_<name>_<unit>.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "server/generation_queue.h"

namespace aff::server {

class Metrics {
 public:
  void count_request(const std::string& endpoint, int status);
  // Renders counters plus the queue's live numbers.
  std::string render(const QueueStats& queue) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
};

}  // namespace aff::server
