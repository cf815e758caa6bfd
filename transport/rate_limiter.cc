#include "transport/rate_limiter.h"

#include <algorithm>

namespace starling::transport::detail {

bool RateLimiter::allow(const std::string& peer, Steady::time_point now) {
  auto [it, fresh] = buckets_.try_emplace(peer, Bucket{burst_, now});
  Bucket& b = it->second;
  if (!fresh) {
    const double dt = std::chrono::duration<double>(now - b.last).count();
    b.tokens = std::min(burst_, b.tokens + dt * rate_);
    b.last = now;
  }
  if (b.tokens < 1.0) return false;
  b.tokens -= 1.0;
  return true;
}

bool RateLimiter::reportDue(const std::string& peer, Steady::time_point now, Report kind) {
  auto it = buckets_.find(peer);
  if (it == buckets_.end()) return true;
  Bucket& b = it->second;
  const size_t k = static_cast<size_t>(kind);
  if (b.reported[k] && now - b.last_report[k] < std::chrono::seconds(1)) return false;
  b.reported[k] = true;
  b.last_report[k] = now;
  return true;
}

void RateLimiter::expire(Steady::time_point now) {
  if (now - last_sweep_ < std::chrono::seconds(1)) return;
  last_sweep_ = now;
  const auto idle = std::chrono::duration<double>(burst_ / rate_ + 1.0);
  std::erase_if(buckets_, [&](const auto& kv) { return now - kv.second.last > idle; });
}

}  // namespace starling::transport::detail
