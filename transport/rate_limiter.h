#pragma once
// Internal to transport/: a token bucket per peer (`rate` tokens per second, at most `burst`;
// a new peer starts full). Peers idle long enough for their bucket to refill are forgotten by
// expire() (forgetting one is the same as keeping it full), so the map stays bounded by the
// peers active within that window.
#include <chrono>
#include <string>
#include <unordered_map>

namespace starling::transport::detail {

class RateLimiter {
 public:
  using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock
  RateLimiter(double rate, double burst) : rate_(rate), burst_(burst) {}

  // Takes one token from `peer`'s bucket; false (nothing taken) when it is empty.
  bool allow(const std::string& peer, Steady::time_point now);
  // True at most once per second per peer: whether to report a refusal now.
  bool reportDue(const std::string& peer, Steady::time_point now);
  // Forgets peers idle for the bucket's refill time plus one second (runs at most once a second).
  void expire(Steady::time_point now);
  size_t peers() const { return buckets_.size(); }

 private:
  struct Bucket {
    double tokens;
    Steady::time_point last, last_report;
    bool reported = false;
  };
  double rate_, burst_;
  Steady::time_point last_sweep_{};
  std::unordered_map<std::string, Bucket> buckets_;
};

}  // namespace starling::transport::detail
