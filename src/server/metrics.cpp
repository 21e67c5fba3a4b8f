#include "server/metrics.h"

#include <fmt/format.h>

namespace aff::server {

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

std::string Metrics::render(const QueueStats& q) const {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
  };
  out += "# HELP affinity_server_requests_total HTTP requests answered, by endpoint and status.\n";
  out += "# TYPE affinity_server_requests_total counter\n";
  {
    std::lock_guard lock(mu_);
    for (const auto& [key, n] : requests_) {
      out += fmt::format("affinity_server_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                         key.second, n);
    }
  }
  metric("affinity_server_requests_active", "gauge", "Generations running now.", q.active);
  metric("affinity_server_requests_queued", "gauge", "Generations waiting for a session.", q.queued);
  metric("affinity_server_sessions", "gauge", "Sessions (concurrent generations) configured.", q.sessions);
  metric("affinity_server_prompt_tokens_total", "counter", "Prompt tokens evaluated.", q.prompt_tokens);
  metric("affinity_server_prompt_cached_tokens_total", "counter", "Prompt tokens reused from a session's KV state.",
         q.cached_prompt_tokens);
  metric("affinity_server_generated_tokens_total", "counter", "Tokens generated.", q.generated_tokens);
  metric("affinity_server_cancelled_total", "counter", "Generations cancelled (client gone, stop string).",
         q.cancelled);
  metric("affinity_server_failed_total", "counter", "Generations that ended in an engine error.", q.failed);
  metric("affinity_server_prefill_seconds_total", "counter", "Time spent evaluating prompts.", q.prefill_seconds);
  metric("affinity_server_decode_seconds_total", "counter", "Time spent generating.", q.decode_seconds);
  return out;
}

}  // namespace aff::server
