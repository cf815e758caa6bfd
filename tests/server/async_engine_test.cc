// The buffered engine (server/async_engine.h) against a fleet of its own clock: clients that each
// take a fixed time, started when the engine asks. What is checked is the loop the root and the
// simulator share: FedBuff takes every arrival of one instant before it starts anyone, steps
// after K, semi-synchronous rounds close at their deadline with what arrived (one at the deadline
// itself included), a late update joins the next round with its staleness, an empty round is
// recorded and not applied, a root-like fleet's first round waits for its first task, and a
// fleet that stalls ends the run with the reason.
#include "server/async_engine.h"

#include <catch2/catch.hpp>
#include <map>
#include <random>

#include "check_throws.h"

using namespace starling;
using Catch::Matchers::Contains;

namespace {

std::shared_ptr<const ParamLayout> smallLayout() {
  auto l = std::make_shared<ParamLayout>();
  l->add("w", {3, 2});
  return l;
}

server::AsyncServerConfig serverConfig(uint64_t k) {
  server::AsyncServerConfig c;
  c.scheme.compressor = "none";
  c.scheme.run_seed = 5;
  c.async = aggregation::AsyncOptions{k, 4, "constant"};
  return c;
}

// Clients 0..durations.size()-1, client c taking durations[c] seconds from its start to its
// answer (an update from the version it started on), available from `open_at` on.
class TimedFleet final : public server::AsyncFleet {
 public:
  TimedFleet(const ParamLayout& layout, const server::AsyncServer& server,
             std::vector<double> durations)
      : layout_(layout), server_(server), durations_(std::move(durations)) {}

  struct Start {
    double at;
    size_t started;
    uint64_t steps, buffered;  // the server's, when start() was asked
  };
  std::vector<Start> starts;
  std::vector<double> step_times;
  double open_at = 0.0;

  double now() const override { return now_; }
  size_t open() const override { return flight_.size(); }
  size_t start(size_t n, server::AsyncIntake& in) override {
    size_t started = 0;
    if (now_ >= open_at) {
      for (uint64_t c = 0; c < durations_.size() && started < n; ++c) {
        if (busy(c) || !in.mayStart(c)) continue;
        flight_.emplace(std::pair{now_ + durations_[c], c}, server_.version());
        in.started(100);
        ++started;
      }
    }
    starts.push_back({now_, started, server_.steps(), server_.buffered()});
    return started;
  }
  server::AsyncEvent next(double until, server::AsyncIntake& in) override {
    if (until <= now_) {
      if (!flight_.empty() && flight_.begin()->first.first == now_) return deliver(in);
      return server::AsyncEvent::kNothing;
    }
    if (flight_.empty()) {
      if (until == kNever) return server::AsyncEvent::kStalled;
      now_ = until;
      return server::AsyncEvent::kNothing;
    }
    if (flight_.begin()->first.first > until) {
      now_ = until;
      return server::AsyncEvent::kNothing;
    }
    now_ = flight_.begin()->first.first;
    return deliver(in);
  }
  void record(server::RoundRecord& rec) override {
    rec.sim_seconds = now_;
    step_times.push_back(now_);
  }

 private:
  bool busy(uint64_t c) const {
    for (const auto& [key, v] : flight_)
      if (key.second == c) return true;
    return false;
  }
  server::AsyncEvent deliver(server::AsyncIntake& in) {
    auto node = flight_.extract(flight_.begin());
    compression::Update u;
    u.header = {layout_.fingerprint(), node.mapped(), 0, node.key().second, 10};
    u.tensors.push_back(compression::DenseF32{std::vector<float>(layout_.numel(), 0.5f)});
    const compression::UpdateView v = compression::view(u);
    server::AsyncArrival a;
    a.client = node.key().second;
    a.update = &v;
    a.limits = aggregation::ClientLimits{10};
    a.bytes = 7;
    try {
      in.take(a);
    } catch (const InputError&) {
    }
    return server::AsyncEvent::kTaken;
  }

  const ParamLayout& layout_;
  const server::AsyncServer& server_;
  std::vector<double> durations_;
  std::map<std::pair<double, uint64_t>, uint64_t> flight_;  // (finish, client) -> version
  double now_ = 0.0;
};

struct Run {
  std::vector<server::RoundRecord> records;
};

Run run(server::AsyncServer& s, TimedFleet& fleet, server::AsyncEngineConfig ec) {
  Run r;
  server::AsyncEngine engine(s, std::move(ec), nullptr);
  engine.run(fleet, [&](const server::RoundRecord& rec) { r.records.push_back(rec); });
  return r;
}

}  // namespace

TEST_CASE(
    "the buffered engine takes every arrival of one instant before it starts anyone, and steps "
    "after K",
    "[server][async]") {
  const auto l = smallLayout();
  server::AsyncServer s(l, serverConfig(2), std::vector<float>(l->numel(), 0.0f));
  TimedFleet fleet(*l, s, {1.0, 1.0, 1.0});  // three clients, all answering at t = 1
  server::AsyncEngineConfig ec;
  ec.steps = 2;
  ec.concurrency = 3;
  const Run r = run(s, fleet, ec);
  REQUIRE(r.records.size() == 2);
  // t = 0: three start. t = 1: the three answers, a step after the second, and only then the
  // next three start (the third answer is in the buffer, from version 1).
  REQUIRE(fleet.starts.size() >= 2);
  CHECK(fleet.starts[0].at == 0.0);
  CHECK(fleet.starts[0].started == 3);
  CHECK(fleet.starts[1].at == 1.0);
  CHECK(fleet.starts[1].started == 3);
  CHECK(fleet.starts[1].steps == 1);
  CHECK(fleet.starts[1].buffered == 1);
  CHECK(r.records[0].clients_completed == 2);
  CHECK(r.records[0].clients_selected == 3);
  CHECK(r.records[0].downlink_bytes == 300);
  CHECK(r.records[0].uplink_bytes == 14);
  // Step 2: the stale third answer and the first of t = 2.
  CHECK(r.records[1].clients_completed == 2);
  CHECK(r.records[1].metrics.at("staleness_max") == 1.0);
  CHECK(fleet.step_times == std::vector<double>{1.0, 2.0});
}

TEST_CASE(
    "semi-synchronous rounds in the buffered engine close at their deadline with what arrived up "
    "to it and a late update joins the next round and an empty round is not applied",
    "[server][async]") {
  const auto l = smallLayout();
  SECTION("an answer at the deadline is in the round; a late one joins the next") {
    server::AsyncServer s(l, serverConfig(10), std::vector<float>(l->numel(), 0.0f));
    TimedFleet fleet(*l, s, {0.5, 1.0, 1.0, 1.5});
    server::AsyncEngineConfig ec;
    ec.steps = 2;
    ec.concurrency = 4;
    ec.round_seconds = 1.0;
    const Run r = run(s, fleet, ec);
    REQUIRE(r.records.size() == 2);
    CHECK(fleet.step_times == std::vector<double>{1.0, 2.0});
    CHECK(r.records[0].applied);
    CHECK(r.records[0].clients_completed == 3);  // 0.5 and both at 1.0; client 3 still training
    // Round 2 starts clients 0 to 2 again (client 3 is busy): 0 at 1.5, 1 and 2 at 2.0, with
    // client 3's update of version 1 at 1.5.
    CHECK(r.records[1].clients_selected == 3);
    CHECK(r.records[1].clients_completed == 4);
    CHECK(r.records[1].metrics.at("staleness_max") == 1.0);
    // Each round hands tasks out once, at its start.
    REQUIRE(fleet.starts.size() == 2);
    CHECK(fleet.starts[1].at == 1.0);
  }
  SECTION("a round where nothing arrived is recorded, not applied") {
    server::AsyncServer s(l, serverConfig(10), std::vector<float>(l->numel(), 0.0f));
    TimedFleet fleet(*l, s, {1.5});
    server::AsyncEngineConfig ec;
    ec.steps = 2;
    ec.concurrency = 1;
    ec.round_seconds = 1.0;
    const Run r = run(s, fleet, ec);
    REQUIRE(r.records.size() == 2);
    CHECK_FALSE(r.records[0].applied);
    CHECK(r.records[0].reason == "no update arrived before the round's deadline");
    CHECK(r.records[0].model_version == 1);
    CHECK(r.records[1].applied);
    CHECK(r.records[1].model_version == 2);
  }
  SECTION("a fleet whose clients come later: the first round starts with its first task") {
    server::AsyncServer s(l, serverConfig(10), std::vector<float>(l->numel(), 0.0f));
    TimedFleet fleet(*l, s, {0.25});
    fleet.open_at = 3.0;
    server::AsyncEngineConfig ec;
    ec.steps = 1;
    ec.concurrency = 1;
    ec.round_seconds = 1.0;
    ec.wait_for_first_task = true;
    const Run r = run(s, fleet, ec);
    REQUIRE(r.records.size() == 1);
    CHECK(r.records[0].applied);  // no empty rounds while nobody could start
    REQUIRE(fleet.step_times.size() == 1);
    CHECK(fleet.step_times[0] >= 4.0);
    CHECK(fleet.step_times[0] < 4.2);
  }
}

TEST_CASE("the buffered engine ends a run that can never step, saying why", "[server][async]") {
  const auto l = smallLayout();
  server::AsyncServer s(l, serverConfig(2), std::vector<float>(l->numel(), 0.0f));
  TimedFleet fleet(*l, s, {1.0});  // K = 2, one client: one update per version
  server::AsyncEngineConfig ec;
  ec.steps = 1;
  ec.concurrency = 1;
  server::AsyncEngine engine(s, ec, nullptr);
  CHECK_THROWS_MATCHING(engine.run(fleet), Error,
                        Contains("cannot step at model version 1 (1 updates buffered, 2 needed)"));
}
