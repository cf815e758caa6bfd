#pragma once
// A slow device for the tests (the in-process federation, tests/integration/inproc_federation.h,
// and the deployment tests' starling-test-slow-client): a trainer that waits before it trains.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "client/trainer.h"
#include "core/clock.h"
#include "core/error.h"

namespace starling::testing {

// A trainer that is another one with something before each fit (the slow devices below and
// tests/integration/inproc_federation.h's SlowTrainer): everything else is the inner trainer's.
class WrappedTrainer : public client::Trainer {
 public:
  explicit WrappedTrainer(std::unique_ptr<client::Trainer> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  std::string spec() const override { return inner_->spec(); }
  double momentum() const override { return inner_->momentum(); }
  const ParamLayout& layout() const override { return inner_->layout(); }
  size_t features() const override { return inner_->features(); }
  uint32_t classes() const override { return inner_->classes(); }
  void initParameters(std::span<float> params, uint64_t seed) const override {
    inner_->initParameters(params, seed);
  }
  client::FitResult fit(std::span<float> params, const client::DataView& data,
                        const client::FitConfig& cfg, RngStream& rng) override {
    return inner_->fit(params, data, cfg, rng);
  }
  client::EvalResult evaluate(std::span<const float> params,
                              const client::DataView& data) override {
    return inner_->evaluate(params, data);
  }

 private:
  std::unique_ptr<client::Trainer> inner_;
};

// A slow device's trainer: every fit first waits `wait` of the federation's clock (which the
// test moves forward, or which runs at its own pace), as a device that takes that long would, then
// trains; a stop (FitConfig::stop) ends the wait as it ends training. Unlike SlowTrainer it never
// moves the clock itself.
class WaitTrainer final : public WrappedTrainer {
 public:
  WaitTrainer(std::unique_ptr<client::Trainer> inner, const Clock& clock,
              std::chrono::nanoseconds wait)
      : WrappedTrainer(std::move(inner)), clock_(clock), wait_(wait) {}
  client::FitResult fit(std::span<float> params, const client::DataView& data,
                        const client::FitConfig& cfg, RngStream& rng) override {
    const auto until = clock_.now() + wait_;
    while (clock_.now() < until) {
      if (cfg.stop && cfg.stop->load())
        throw client::TrainingStopped("a slow device stopped while it waited");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return WrappedTrainer::fit(params, data, cfg, rng);
  }

 private:
  const Clock& clock_;
  std::chrono::nanoseconds wait_;
};

// Fits that finish together, in waves of `width`: each fit trains, then waits until `width` fits
// have trained, and all of them return at once. A test whose server keeps `width` tasks in flight
// then sees its updates arrive wave by wave, whatever the threads' scheduling: no client can
// finish several fits while another's task waits for a core, so the staleness an asynchronous
// server sees follows from the configuration, not from the machine's load.
// What the test must keep: exactly `width` fits in flight whenever one waits (with fewer, they
// wait until a stop or open(); a server's Shutdown does not release them, as fit() does not read
// it), open() before it waits for the clients to end (their last fits wait for a wave that will
// not come), and the object alive until the clients' threads have ended.
class FitWaves {
 public:
  explicit FitWaves(size_t width) : width_(width) {
    STARLING_CHECK_ARG(width >= 1, "FitWaves: a wave of no fits");
  }
  // Waits for the wave `this` fit belongs to; a stop (FitConfig::stop) ends the wait.
  void arrive(const std::atomic<bool>* stop) {
    std::unique_lock lock(mu_);
    if (open_) return;
    const uint64_t wave = wave_;
    if (++waiting_ == width_) {
      waiting_ = 0;
      ++wave_;
      cv_.notify_all();
      return;
    }
    while (wave_ == wave && !open_) {
      if (stop && stop->load()) {
        --waiting_;
        throw client::TrainingStopped("a fit stopped while it waited for its wave");
      }
      cv_.wait_for(lock, std::chrono::milliseconds(10));
    }
  }
  // From now on every fit returns at once (the run is over: the clients' last fits end, and they
  // read the server's Shutdown).
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Waves completed.
  uint64_t waves() const {
    std::lock_guard lock(mu_);
    return wave_;
  }

 private:
  const size_t width_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  size_t waiting_ = 0;
  uint64_t wave_ = 0;
  bool open_ = false;
};

// A device whose fits finish in `waves` (above): it trains, then waits for its wave.
class WaveTrainer final : public WrappedTrainer {
 public:
  WaveTrainer(std::unique_ptr<client::Trainer> inner, FitWaves& waves)
      : WrappedTrainer(std::move(inner)), waves_(waves) {}
  client::FitResult fit(std::span<float> params, const client::DataView& data,
                        const client::FitConfig& cfg, RngStream& rng) override {
    client::FitResult r = WrappedTrainer::fit(params, data, cfg, rng);
    waves_.arrive(cfg.stop);
    return r;
  }

 private:
  FitWaves& waves_;
};

}  // namespace starling::testing
