#pragma once
// Internal to transport/: a token bucket per peer (`rate` tokens per second, at most `burst`;
// a new peer starts full). Peers idle long enough for their bucket to refill are forgotten by
// expire() (forgetting one is the same as keeping it full), so the map stays bounded by the
// peers active within that window.
#include <array>
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
  // What a report is of: each kind has its own once-a-second allowance per peer (a rate limit's
  // report must not silence the report of another refusal).
  enum class Report : uint8_t { kRate = 0, kRoutingId = 1 };
  // True at most once per second per peer and kind: whether to report a refusal now.
  bool reportDue(const std::string& peer, Steady::time_point now, Report kind = Report::kRate);
  // Forgets peers idle for the bucket's refill time plus one second (runs at most once a second).
  void expire(Steady::time_point now);
  size_t peers() const { return buckets_.size(); }

 private:
  struct Bucket {
    double tokens;
    Steady::time_point last;
    std::array<Steady::time_point, 2> last_report{};
    std::array<bool, 2> reported{};
  };
  double rate_, burst_;
  Steady::time_point last_sweep_{};
  std::unordered_map<std::string, Bucket> buckets_;
};

}  // namespace starling::transport::detail
