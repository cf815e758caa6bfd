#pragma once
// A deployed federation in one test process: the real root (server::ZmqFleet + RoundEngine), edge
// aggregators (ZmqFleet + server::EdgeAggregator) and clients (client::ClientRuntime with the
// Eigen trainer), each on its own thread, talking over ZeroMQ inproc:// sockets of one
// transport::Context (no CURVE: inproc has no handshake to secure), with one SkewClock that the
// test moves forward to pass a deadline or a silence at once. What a test reads is the objects
// themselves: the root's round records and model, each client's RuntimeStats and state; never a
// log (the logs are kept in memory for a failing test's output, logs()). The deployment tests in
// real processes keep what only processes show (kill -9, CURVE, arm64 under qemu, the programs'
// options).
//
// Every thread catches what it throws; error() returns the first message, and waitFor() stops
// waiting once there is one. The destructor stops every thread (their stop flags end any wait
// within about 100 ms) and joins them.
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/runtime.h"
#include "client/trainer.h"
#include "core/clock.h"
#include "data/idx.h"
#include "server/aggregator.h"
#include "server/async_root.h"
#include "server/engine.h"
#include "server/zmq_fleet.h"
#include "transport/context.h"
#include "wait_trainer.h"

namespace starling::testing {

// A trainer whose every fit takes `duration` of a test clock's time: it moves the clock forward in
// steps of at most 20 ms, a millisecond of real time apart, before the real fit (a device that
// trains for minutes, in a fraction of a second). 20 ms a step keeps the clock at about
// 20 times real time: the waiting loops poll every 5 to 50 ms of real time, and a silence of a
// second on this clock is then still tens of polls.
class SlowTrainer final : public WrappedTrainer {
 public:
  SlowTrainer(std::unique_ptr<client::Trainer> inner, SkewClock& clock,
              std::chrono::nanoseconds duration)
      : WrappedTrainer(std::move(inner)), clock_(clock), duration_(duration) {}
  client::FitResult fit(std::span<float> params, const client::DataView& data,
                        const client::FitConfig& cfg, RngStream& rng) override {
    const auto step = std::chrono::nanoseconds(std::chrono::milliseconds(20));
    for (auto left = duration_; left.count() > 0; left -= step) {
      clock_.advance(std::min(left, step));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return WrappedTrainer::fit(params, data, cfg, rng);
  }

 private:
  SkewClock& clock_;
  std::chrono::nanoseconds duration_;
};

// A trainer that shows each fit's starting model to `seen` first.
class FitRecorder final : public WrappedTrainer {
 public:
  FitRecorder(std::unique_ptr<client::Trainer> inner,
              std::function<void(std::span<const float>)> seen)
      : WrappedTrainer(std::move(inner)), seen_(std::move(seen)) {}
  client::FitResult fit(std::span<float> params, const client::DataView& data,
                        const client::FitConfig& cfg, RngStream& rng) override {
    seen_(params);
    return WrappedTrainer::fit(params, data, cfg, rng);
  }

 private:
  std::function<void(std::span<const float>)> seen_;
};

// A client on a slow device (WaitTrainer): each fit waits `wait` of the federation's clock.
struct SlowDevice {
  std::chrono::milliseconds wait{0};
  client::RuntimeConfig rc = {};
};

// Every node's log lines, in memory, readable while they write.
class StringSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string text() {
    std::lock_guard lock(mutex_);
    return text_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    text_.append(line.data(), line.size());
  }
  void flush_() override {}

 private:
  std::string text_;
};

class InprocFederation {
 public:
  // `train` / `test` hold every client's examples; `shards[i]` / `test_shards[i]` are client i's.
  InprocFederation(std::string model_spec, const data::Dataset& train,
                   std::vector<std::vector<size_t>> shards, const data::Dataset* test = nullptr,
                   std::vector<std::vector<size_t>> test_shards = {})
      : spec_(std::move(model_spec)),
        train_(train),
        test_(test),
        shards_(std::move(shards)),
        test_shards_(std::move(test_shards)),
        log_sink_(std::make_shared<StringSink>()) {}

  ~InprocFederation() {
    for (auto& [name, node] : nodes_) node->stop = true;
    for (auto& [name, node] : nodes_)
      if (node->thread.joinable()) node->thread.join();
  }

  SkewClock& clock() { return clock_; }
  // The federation's ZeroMQ context (inproc names live in it): for a test's own scripted peer.
  transport::Context& context() { return ctx_; }

  // Timings short enough for tests (the fleet's, told to clients in the Welcome).
  static server::FleetConfig fleetConfig(const std::string& bind) {
    server::FleetConfig fc;
    fc.bind = bind;
    fc.security.insecure = true;
    fc.heartbeat_ms = 100;
    fc.silence_ms = 3000;
    return fc;
  }

  // The root on inproc://root (or `fc.bind`): runs `ec`'s rounds from the trainer's initial model
  // (seed ec.scheme.run_seed), or from ec.checkpoint, then tells everyone the federation is over.
  void root(server::EngineConfig ec, server::FleetConfig fc = fleetConfig("inproc://root")) {
    rootThread(fc, ec.scheme.run_seed, [this, ec](auto layout, server::ZmqFleet& fleet, auto init) {
      server::RoundEngine engine(layout, ec, std::move(init));
      while (!engine.done()) {
        server::RoundRecord r = engine.runRound(fleet);
        std::lock_guard lock(mu_);
        records_.push_back(std::move(r));
        const auto m = engine.model().current();
        model_.assign(m.begin(), m.end());
        if (const server::ClientCopies* copies = fleet.clientCopies()) {
          auto& kept = copies_.emplace_back();
          for (uint64_t id : copies->ids()) {
            const auto c = copies->copy(id);
            kept[id].assign(c.begin(), c.end());
          }
        }
        control_ = engine.control();
        cv_.notify_all();
      }
      fleet.finish("all rounds done");
      return engine.done();
    });
  }
  // The root in asynchronous rounds (server/async_root.h), FedBuff's steps as records().
  void asyncRoot(server::AsyncServerConfig sc, server::AsyncRootConfig rc,
                 server::FleetConfig fc = fleetConfig("inproc://root")) {
    rootThread(
        fc, sc.scheme.run_seed, [this, sc, rc](auto layout, server::ZmqFleet& fleet, auto init) {
          server::AsyncRoot root(layout, sc, rc, std::move(init));
          {
            std::lock_guard lock(mu_);
            resumed_buffered_ =
                root.resumed() ? std::optional<uint64_t>(root.server().buffered()) : std::nullopt;
          }
          root.run(
              fleet,
              [&](const server::RoundRecord& r) {
                std::lock_guard lock(mu_);
                records_.push_back(r);
                const auto m = root.server().model().current();
                model_.assign(m.begin(), m.end());
                cv_.notify_all();
              },
              [&] {
                std::lock_guard lock(mu_);
                buffered_ = root.server().buffered();
                cv_.notify_all();
              });
          return root.done();
        });
  }
  // A condition for waitFor: the asynchronous root's buffer, as of its last accepted update (and
  // checkpoint), holds `n` updates.
  std::function<bool()> buffered(uint64_t n) {
    return [this, n] { return buffered_ == n; };
  }
  // The asynchronous root's buffered updates when it resumed from its checkpoint (nullopt: it
  // started fresh).
  std::optional<uint64_t> resumedBuffered() {
    std::lock_guard lock(mu_);
    return resumed_buffered_;
  }
  // Stops the root (as SIGTERM does) and waits for its thread; its socket is closed.
  void stopRoot() {
    stopNode("root");
    std::lock_guard lock(mu_);
    root_endpoint_.clear();
  }
  // The endpoint the root bound (a tcp://127.0.0.1:* bind gets its port here), once it has.
  // A root that is restarted must listen on tcp: inproc connections are not made again to a
  // new socket bound to the same name, TCP ones are (as across a real restart).
  std::string rootEndpoint(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    if (!waitFor([&] { return !root_endpoint_.empty(); }, timeout))
      throw std::runtime_error("the root did not bind: " + error());
    std::lock_guard lock(mu_);
    return root_endpoint_;
  }

  // Edge aggregator `id` on inproc://agg-ID, below `upstream`; `silence_ms`: when it fails a
  // silent client (raise it where the clock runs fast).
  void aggregator(uint64_t id, const std::string& upstream, server::AggregatorConfig ac = {},
                  std::set<uint64_t> aggregator_ids = {}, uint32_t silence_ms = 3000) {
    const std::string name = "agg-" + std::to_string(id);
    Node& n = node(name);
    ac.upstream = upstream;
    ac.id = id;
    ac.security.insecure = true;
    ac.clock = &clock_;
    server::FleetConfig fc = fleetConfig(endpoint(name));
    fc.silence_ms = silence_ms;
    fc.aggregator_ids = std::move(aggregator_ids);
    fc.clock = &clock_;
    n.thread = std::thread([this, &n, ac, fc, name, id] {
      guard(name, [&] {
        auto trainer = makeTrainer();
        auto layout = std::make_shared<const ParamLayout>(trainer->layout());
        server::ZmqFleet fleet(ctx_, fc, layout, logger(name));
        fleet.setStopFlag(&n.stop);
        server::EdgeAggregator agg(ctx_, ac, fleet, layout, logger(name));
        try {
          agg.run(n.stop);
        } catch (const server::Stopped&) {
        }
        std::lock_guard lock(mu_);
        aggregator_stats_[id] = agg.upstreamStats();
        cv_.notify_all();
      });
    });
  }

  // Client `id` (shard id) connecting to `server`; every fit takes `fit_time` of the federation's
  // clock (SlowTrainer, which moves the clock) when it is not zero, and first waits `wait` of it
  // (WaitTrainer, which waits for others to move it) when that is not zero; with `waves`, its fits
  // finish in those waves (WaveTrainer).
  void client(uint64_t id, const std::string& server, client::RuntimeConfig rc = {},
              std::chrono::nanoseconds fit_time = {}, std::chrono::nanoseconds wait = {},
              FitWaves* waves = nullptr) {
    const std::string name = "client-" + std::to_string(id);
    Node& n = node(name);
    {
      // A client started again (after stopClient) is counted afresh: the conditions below read
      // the running one's statistics, not those of the one stopped.
      std::lock_guard lock(mu_);
      live_.erase(id);
      stats_.erase(id);
    }
    rc.server = server;
    rc.client_id = id;
    rc.security.insecure = true;
    rc.clock = &clock_;
    rc.on_sent = [this, id](const client::RuntimeStats& st) {
      std::lock_guard lock(mu_);
      live_[id] = st;
      cv_.notify_all();
    };
    n.thread = std::thread([this, &n, rc, id, name, fit_time, wait, waves] {
      guard(name, [&] {
        std::unique_ptr<client::Trainer> trainer = makeTrainer();
        if (fit_time.count() > 0)
          trainer = std::make_unique<SlowTrainer>(std::move(trainer), clock_, fit_time);
        if (wait.count() > 0)
          trainer = std::make_unique<WaitTrainer>(std::move(trainer), clock_, wait);
        if (waves) trainer = std::make_unique<WaveTrainer>(std::move(trainer), *waves);
        if (record_fits_)
          trainer = std::make_unique<FitRecorder>(std::move(trainer), [this, id](auto params) {
            std::lock_guard lock(mu_);
            fits_[id].emplace_back(params.begin(), params.end());
          });
        const client::DataView tv{&train_, shards_.at(id)};
        const client::DataView ev = test_ && id < test_shards_.size()
                                        ? client::DataView{test_, test_shards_[id]}
                                        : client::DataView{&train_, {}};
        client::ClientRuntime runtime(ctx_, rc, *trainer, tv, ev, logger(name));
        runtime.run(n.stop);
        std::vector<uint8_t> state;
        runtime.state().saveTo(state);
        std::lock_guard lock(mu_);
        stats_[id] = runtime.stats();
        states_[id] = std::move(state);
        cv_.notify_all();
      });
    });
  }
  void client(uint64_t id, const std::string& server, const SlowDevice& device) {
    client(id, server, device.rc, {}, device.wait);
  }
  // Stops client `id` and waits for its thread (its socket closed, as a device that went away).
  void stopClient(uint64_t id) { stopNode("client-" + std::to_string(id)); }

  static std::string endpoint(const std::string& name) { return "inproc://" + name; }

  // Waits until `pred` (called under the federation's lock: it may read the federation's state,
  // never call its methods) holds, a thread failed, or `timeout`
  // passed; true if `pred` holds.
  bool waitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return pred() || !error_.empty(); });
    return pred();
  }
  // Runs the federation's clock fast: `step` ahead every 20 ms of real time until `pred` holds
  // (the waitFor above). Every node's timings then pass that much faster: give silences that
  // outlast the run (a heartbeat every 100 ms of the clock's time is not one per 100 ms here).
  bool fastForward(const std::function<bool()>& pred, std::chrono::nanoseconds step,
                   std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!waitFor(pred, std::chrono::milliseconds(20))) {
      if (!error().empty() || std::chrono::steady_clock::now() >= until) return false;
      clock_.advance(step);
    }
    return true;
  }
  bool waitRounds(size_t n, std::chrono::milliseconds timeout) {
    return waitFor(roundsDone(n), timeout);
  }
  // A condition for waitFor and fastForward: the root has recorded `n` rounds.
  std::function<bool()> roundsDone(size_t n) {
    return [this, n] { return records_.size() >= n; };
  }
  // A condition for waitFor and fastForward: the root has finished its rounds or steps.
  std::function<bool()> rootDone() {
    return [this] { return root_done_; };
  }
  bool waitRootDone(std::chrono::milliseconds timeout) {
    return waitFor([&] { return root_done_; }, timeout);
  }
  // A condition for waitFor and fastForward (which call it under the federation's lock): every
  // client of `ids` has ended.
  std::function<bool()> clientsEnded(std::vector<uint64_t> ids) {
    return [this, ids] {
      for (uint64_t id : ids)
        if (!stats_.count(id)) return false;
      return true;
    };
  }
  // A condition: client `id` has sent at least `n` heartbeats.
  std::function<bool()> heartbeatsSent(uint64_t id, uint64_t n) {
    return [this, id, n] {
      const auto it = live_.find(id);
      return it != live_.end() && it->second.heartbeats >= n;
    };
  }
  // A condition: client `id` has sent at least `n` updates (masked inputs under secure
  // aggregation).
  std::function<bool()> updatesSent(uint64_t id, uint64_t n) {
    return [this, id, n] {
      const auto it = live_.find(id);
      return it != live_.end() && it->second.updates_sent >= n;
    };
  }
  // A condition for waitFor: every client of `ids` sent at least `n` updates.
  std::function<bool()> updatesSent(const std::vector<uint64_t>& ids, uint64_t n) {
    std::vector<std::function<bool()>> each;
    for (uint64_t id : ids) each.push_back(updatesSent(id, n));
    return
        [each] { return std::all_of(each.begin(), each.end(), [](const auto& c) { return c(); }); };
  }
  // A client's statistics as of the last message it sent.
  client::RuntimeStats liveStats(uint64_t id) {
    std::lock_guard lock(mu_);
    const auto it = live_.find(id);
    return it == live_.end() ? client::RuntimeStats{} : it->second;
  }
  // A client's statistics once its thread ended (after Shutdown or stopClient).
  bool waitClientEnded(uint64_t id, std::chrono::milliseconds timeout) {
    return waitFor([&] { return stats_.count(id) > 0; }, timeout);
  }

  // An edge aggregator's connection upstream, once its thread ended (after the Shutdown).
  bool waitAggregatorEnded(uint64_t id, std::chrono::milliseconds timeout) {
    return waitFor([&] { return aggregator_stats_.count(id) > 0; }, timeout);
  }
  client::UpstreamStats aggregatorStats(uint64_t id) {
    std::lock_guard lock(mu_);
    return aggregator_stats_.at(id);
  }

  std::vector<server::RoundRecord> records() {
    std::lock_guard lock(mu_);
    return records_;
  }
  // A mirrored downlink's: the root's copy of each client's model after each round.
  std::vector<std::map<uint64_t, std::vector<float>>> copies() {
    std::lock_guard lock(mu_);
    return copies_;
  }
  // Every client started after this keeps the model each of its fits began from (fits()).
  void recordFits() { record_fits_ = true; }
  std::vector<std::vector<float>> fits(uint64_t id) {
    std::lock_guard lock(mu_);
    return fits_[id];
  }
  std::vector<float> model() {
    std::lock_guard lock(mu_);
    return model_;
  }
  // SCAFFOLD's c after the last round (empty without SCAFFOLD).
  std::vector<float> control() {
    std::lock_guard lock(mu_);
    return control_;
  }
  client::RuntimeStats stats(uint64_t id) {
    std::lock_guard lock(mu_);
    return stats_.at(id);
  }
  // A client's state (residuals, SCAFFOLD's c_i) once its thread ended.
  ClientState clientState(uint64_t id) {
    std::lock_guard lock(mu_);
    ClientState s;
    s.loadFrom(states_.at(id));
    return s;
  }
  std::string error() {
    std::lock_guard lock(mu_);
    return error_;
  }
  std::string logs() { return log_sink_->text(); }

 private:
  struct Node {
    std::thread thread;
    std::atomic<bool> stop{false};
  };

  Node& node(const std::string& name) {
    auto& slot = nodes_[name];
    if (slot && slot->thread.joinable()) throw std::logic_error(name + " is already running");
    slot = std::make_unique<Node>();
    return *slot;
  }
  void stopNode(const std::string& name) {
    Node& n = *nodes_.at(name);
    n.stop = true;
    if (n.thread.joinable()) n.thread.join();
  }

  // The root's thread: its fleet (on `fc.bind`) and initial model, then `run` (which returns
  // whether every round or step is done).
  template <class Run>
  void rootThread(server::FleetConfig fc, uint64_t seed, Run run) {
    Node& n = node("root");
    fc.clock = &clock_;
    n.thread = std::thread([this, &n, fc, seed, run] {
      guard("root", [&] {
        // A root on TCP has a context of its own: destroying a context waits until its sockets
        // are closed, so the port is free for a restarted root when this thread has ended. An
        // inproc root needs the shared one (inproc names are per context) and cannot restart.
        std::optional<transport::Context> own;
        if (fc.bind.rfind("inproc://", 0) != 0) own.emplace();
        auto trainer = makeTrainer();
        auto layout = std::make_shared<const ParamLayout>(trainer->layout());
        auto fleet =
            std::make_unique<server::ZmqFleet>(own ? *own : ctx_, fc, layout, logger("root"));
        fleet->setStopFlag(&n.stop);
        {
          std::lock_guard lock(mu_);
          root_endpoint_ = fleet->endpoint();
          cv_.notify_all();
        }
        std::vector<float> init(layout->numel());
        trainer->initParameters(init, seed);
        bool done = false;
        try {
          done = run(layout, *fleet, std::move(init));
        } catch (const server::Stopped&) {
          // stopped by the test (restartRoot): the round in flight is left for the next root
        }
        std::lock_guard lock(mu_);
        root_done_ = done;
        cv_.notify_all();
      });
    });
  }

  std::unique_ptr<client::Trainer> makeTrainer() const {
    return client::makeTrainer(spec_, train_);
  }

  std::shared_ptr<spdlog::logger> logger(const std::string& name) {
    auto l = std::make_shared<spdlog::logger>(name, log_sink_);
    l->set_level(spdlog::level::debug);
    return l;
  }

  void guard(const std::string& name, const std::function<void()>& body) {
    try {
      body();
    } catch (const std::exception& e) {
      std::lock_guard lock(mu_);
      if (error_.empty()) error_ = name + ": " + e.what();
      cv_.notify_all();
    }
  }

  std::string spec_;
  const data::Dataset& train_;
  const data::Dataset* test_;
  std::vector<std::vector<size_t>> shards_, test_shards_;
  std::shared_ptr<StringSink> log_sink_;
  transport::Context ctx_;
  SkewClock clock_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<server::RoundRecord> records_;
  std::vector<std::map<uint64_t, std::vector<float>>> copies_;
  bool record_fits_ = false;
  std::map<uint64_t, std::vector<std::vector<float>>> fits_;
  std::vector<float> model_, control_;
  bool root_done_ = false;
  std::optional<uint64_t> resumed_buffered_;
  uint64_t buffered_ = 0;
  std::string root_endpoint_;
  std::map<uint64_t, client::RuntimeStats> stats_, live_;
  std::map<uint64_t, client::UpstreamStats> aggregator_stats_;
  std::map<uint64_t, std::vector<uint8_t>> states_;  // each ended client's ClientState, saved
  std::string error_;
  std::map<std::string, std::unique_ptr<Node>> nodes_;
};

}  // namespace starling::testing
