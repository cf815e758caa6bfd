#pragma once
// A slow device for the tests (the in-process federation, tests/integration/inproc_federation.h,
// and the deployment tests' starling-test-slow-client): a trainer that waits before it trains.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "client/trainer.h"
#include "core/clock.h"

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

}  // namespace starling::testing
