#pragma once
// The time the deployment's waits are measured against: deadlines, silence, heartbeats,
// registration retries and back-offs of the root, the edge aggregators and the clients
// (server/zmq_fleet.h, server/aggregator.h, client/runtime.h). Programs use the steady clock;
// a test injects a SkewClock and moves time forward to pass a deadline or a silence at once,
// instead of sleeping through it. The loops that wait poll their sockets at most about 100 ms at a
// time, so a jump is noticed within that.
#include <atomic>
#include <chrono>

namespace starling {

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual time_point now() const = 0;
};

// The steady clock.
class SteadyClock final : public Clock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
};

// The process's steady clock, the default of every configuration that takes a clock.
inline const Clock& steadyClock() {
  static const SteadyClock c;
  return c;
}

// The steady clock plus an offset that only grows: advance() moves every reader's time forward at
// once (thread-safe), and time still passes as usual between jumps.
class SkewClock final : public Clock {
 public:
  time_point now() const override {
    return std::chrono::steady_clock::now() + std::chrono::nanoseconds(skew_ns_.load());
  }
  void advance(std::chrono::nanoseconds d) { skew_ns_.fetch_add(d.count()); }

 private:
  std::atomic<int64_t> skew_ns_{0};
};

}  // namespace starling
