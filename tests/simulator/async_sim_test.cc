// FedBuff on the simulated clock (simulator/async_sim.h), in process with the Eigen softmax
// trainer: the clock (a step of identical clients lasts one client's time, and no update is stale),
// the concurrency (a fast device contributes more updates than a slow one), the staleness bound
// (refused, counted), the time against synchronous rounds that wait for their slowest client,
// learning, and a run that is a pure function of its seed.
#include "simulator/async_sim.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <numeric>
#include <set>
#include <sstream>

#include "check_throws.h"
#include "client/synthetic.h"
#include "core/bytes.h"
#include "core/file_io.h"
#include "core/framed_file.h"
#include "data/partition.h"
#include "pre_frame.h"
#include "server/engine.h"
#include "simulator/sim_fleet.h"
#include "temp_dir.h"

using namespace starling;
namespace sim = starling::simulator;
using starling::testing::TempDir;

namespace {

struct Setup {
  // n clients of `per_client` examples each (3 separable classes, 6 features); with
  // `empty_first`, client 0 has none.
  Setup(size_t n, size_t per_client, sim::DevicePopulation devices, bool empty_first = false,
        size_t features = 6)
      : train(testing::separableData(n * per_client, features, 3, 17)),
        trainer(client::makeTrainer("softmax", features, 3)) {
    clients.train = &train;
    data::Partition shards;
    for (size_t c = 0; c < n; ++c) {
      shards.emplace_back(empty_first && c == 0 ? 0 : per_client);
      std::iota(shards.back().begin(), shards.back().end(), c * per_client);
    }
    clients.shards = data::ClientShards(std::move(shards));
    clients.devices = std::move(devices);
  }
  server::AsyncServerConfig serverConfig(uint64_t k, uint64_t max_staleness,
                                         std::string compressor = "none") const {
    server::AsyncServerConfig sc;
    sc.scheme.compressor = std::move(compressor);
    sc.scheme.run_seed = 5;
    sc.async.buffer_size = k;
    sc.async.max_staleness = max_staleness;
    return sc;
  }
  sim::AsyncSimConfig simConfig(uint64_t steps, uint64_t concurrency) const {
    sim::AsyncSimConfig ac;
    ac.steps = steps;
    ac.concurrency = concurrency;
    ac.seed = 5;
    ac.fit = protocol::FitSettings{1, 16, 0.1f};
    return ac;
  }
  std::vector<float> init() const {
    std::vector<float> w(trainer->layout().numel());
    trainer->initParameters(w, 1);
    return w;
  }
  std::shared_ptr<const ParamLayout> layout() const {
    return std::make_shared<const ParamLayout>(trainer->layout());
  }
  data::Dataset train;
  sim::SimClients clients;
  std::unique_ptr<client::Trainer> trainer;
  sim::ClientStateStore store{sim::StateStoreOptions{}, trainer->layout().fingerprint()};
};

struct Run {
  std::vector<server::RoundRecord> steps;
  std::vector<float> model;
  std::vector<uint64_t> accepted;
  double now = 0.0;
};

// On `store` (s.store when null); `resumed`: whether the simulation resumed from its checkpoint.
Run runAsync(Setup& s, const server::AsyncServerConfig& sc, const sim::AsyncSimConfig& ac,
             const data::Dataset* test = nullptr, sim::ClientStateStore* store = nullptr,
             bool* resumed = nullptr) {
  server::AsyncServer server(s.layout(), sc, s.init());
  sim::AsyncSimulation simulation(ac, s.clients, *s.trainer, store ? *store : s.store, server,
                                  test);
  if (resumed) *resumed = simulation.resumed();
  Run r;
  simulation.run([&](const server::RoundRecord& rec) { r.steps.push_back(rec); });
  r.model.assign(server.model().current().begin(), server.model().current().end());
  r.accepted = simulation.accepted();
  r.now = simulation.now();
  return r;
}

// The synchronous simulator on the same clients: SimFleet and the round engine, dense FedAvg.
struct SyncRun {
  SyncRun(Setup& s, uint64_t rounds, size_t per_round, uint32_t eval_every = 0,
          const std::string& compressor = "none", sim::SimFleetConfig fleet_config = {})
      : store(sim::StateStoreOptions{}, s.trainer->layout().fingerprint()),
        fleet(fleet_config, s.clients, *s.trainer, store, *coll, nullptr),
        engine(s.layout(), config(rounds, per_round, eval_every, compressor), s.init()) {}
  static server::EngineConfig config(uint64_t rounds, size_t per_round, uint32_t eval_every,
                                     const std::string& compressor) {
    server::EngineConfig ec;
    ec.rounds = rounds;
    ec.scheme.compressor = compressor;
    ec.sampling.clients_per_round = per_round;
    ec.eval_every = eval_every;
    ec.fit = protocol::FitSettings{1, 16, 0.1f};
    return ec;
  }
  server::RoundRecord round() { return engine.runRound(fleet); }
  std::unique_ptr<sim::Collectives> coll = sim::makeLocal();
  sim::ClientStateStore store;
  sim::SimFleet fleet;
  server::RoundEngine engine;
};

// A trace of n clients: the first `fast` of them at speed `fast_speed`, the rest at 1.
sim::DevicePopulation twoSpeeds(const TempDir& dir, size_t n, size_t fast, double fast_speed) {
  const std::string path = (dir.path / "trace.csv").string();
  std::ofstream out(path);
  out << "client,speed,bandwidth,availability\n";
  for (size_t c = 0; c < n; ++c) out << c << ',' << (c < fast ? fast_speed : 1.0) << ",1e9,1\n";
  out.close();
  return sim::DevicePopulation::fromCsv(path, n);
}

}  // namespace

TEST_CASE("FedBuff's clock: a client's time is its compute plus its exact bytes over its link",
          "[simulator][async]") {
  const size_t n = 6, per_client = 40;
  Setup s(n, per_client, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3));
  // One client at a time, a step per update: each step lasts that client's time.
  const Run r = runAsync(s, s.serverConfig(1, 20), s.simConfig(8, 1));
  REQUIRE(r.steps.size() == 8);
  const sim::DeviceProfile d;  // DeviceDistributions{}'s device: speed 1, 1.25e6 bytes/s
  double total = 0.0;
  for (const auto& rec : r.steps) {
    CHECK(rec.applied);
    CHECK(rec.clients_completed == 1);
    CHECK(rec.metrics.at("staleness_max") == 0.0);
    CHECK(rec.downlink_bytes > 4 * 21);  // the task carries the 21-value model
    // 40 examples x 1 epoch x 1e-3 s, then the task and the update over the link.
    const double bytes = static_cast<double>(rec.downlink_bytes + rec.uplink_bytes);
    CHECK(*rec.sim_seconds == Approx(per_client * 1e-3 + bytes / d.bandwidth).epsilon(1e-12));
    total += *rec.sim_seconds;
  }
  CHECK(r.now == Approx(total).epsilon(1e-12));
  CHECK(r.steps.back().model_version == 9);
}

TEST_CASE("FedBuff with identical clients: those finishing together hand in before any starts",
          "[simulator][async]") {
  // Client 0 has no data, so it never starts, and every other client's task and update have the
  // same bytes (an id of 0 is left out of a message): they finish together.
  const size_t n = 13;
  Setup s(n, 40, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3), true);
  // C = K: the C clients finish together, the step comes after the last, and the next C start on
  // the new version: no update is stale.
  const Run r = runAsync(s, s.serverConfig(4, 20), s.simConfig(6, 4));
  REQUIRE(r.steps.size() == 6);
  for (const auto& rec : r.steps) {
    CHECK(rec.clients_completed == 4);
    CHECK(rec.clients_selected == 4);  // the step's clients started after the previous step
    CHECK(rec.metrics.at("staleness_max") == 0.0);
    CHECK(rec.updates_rejected == 0);
    CHECK(*rec.sim_seconds == Approx(*r.steps.front().sim_seconds).epsilon(1e-12));
  }
  CHECK(r.accepted[0] == 0);
}

TEST_CASE("FedBuff simulates concurrency: a fast device contributes more updates than a slow one",
          "[simulator][async]") {
  TempDir dir("asyncsim");
  const size_t n = 8;
  Setup s(n, 40, twoSpeeds(dir, n, 4, 8.0));
  // Six of the eight train at once, a step every two updates: a client finishing is replaced by an
  // idle one, so the fast ones come back eight times as often as the slow ones finish.
  const Run r = runAsync(s, s.serverConfig(2, 50), s.simConfig(40, 6));
  const uint64_t fast = r.accepted[0] + r.accepted[1] + r.accepted[2] + r.accepted[3];
  const uint64_t slow = r.accepted[4] + r.accepted[5] + r.accepted[6] + r.accepted[7];
  INFO("fast " << fast << " slow " << slow);
  CHECK(fast + slow == 80);
  CHECK(fast > 3 * slow);
  CHECK(slow > 0);  // the slow ones arrive, late, and count
  double worst = 0.0;
  for (const auto& rec : r.steps) worst = std::max(worst, rec.metrics.at("staleness_max"));
  CHECK(worst >= 2.0);  // a slow client's update is several versions old when it lands
  CHECK(worst <= 50.0);
}

TEST_CASE("FedBuff refuses an update beyond the staleness bound and counts it",
          "[simulator][async]") {
  TempDir dir("asyncstale");
  const size_t n = 8;
  Setup s(n, 40, twoSpeeds(dir, n, 4, 8.0));
  const Run r = runAsync(s, s.serverConfig(2, 0), s.simConfig(30, 6));
  uint64_t refused = 0;
  for (const auto& rec : r.steps) {
    CHECK(rec.metrics.at("staleness_max") == 0.0);  // only fresh updates were added
    CHECK(rec.clients_completed == 2);
    refused += rec.updates_rejected;
  }
  CHECK(refused > 0);
  // A slow client's update always finds a newer version: none of theirs counts.
  CHECK(r.accepted[4] + r.accepted[5] + r.accepted[6] + r.accepted[7] == 0);
}

TEST_CASE("FedBuff takes less simulated time than rounds that wait for their slowest client",
          "[simulator][async]") {
  const size_t n = 40, per_round = 8, rounds = 10;
  sim::DeviceDistributions dd;
  dd.speed_sigma = 1.0;
  dd.bandwidth_sigma = 1.0;
  Setup s(n, 30, sim::DevicePopulation::sample(n, dd, 9));
  // Synchronous: 10 rounds of 8 clients on the same devices.
  SyncRun sync(s, rounds, per_round);
  double sync_seconds = 0.0;
  uint64_t sync_updates = 0;
  while (!sync.engine.done()) {
    const server::RoundRecord rec = sync.round();
    sync_seconds += rec.sim_seconds.value_or(0.0);
    sync_updates += rec.clients_completed;
  }
  REQUIRE(sync_updates == rounds * per_round);
  // FedBuff with the same concurrency and as many updates.
  const Run r = runAsync(s, s.serverConfig(per_round, 100), s.simConfig(rounds, per_round));
  uint64_t async_updates = 0;
  for (const auto& rec : r.steps) async_updates += rec.clients_completed;
  REQUIRE(async_updates == sync_updates);
  INFO("sync " << sync_seconds << " s, async " << r.now << " s");
  CHECK(r.now * 1.5 < sync_seconds);
}

TEST_CASE("FedBuff learns, and a run is a pure function of its seed", "[simulator][async]") {
  sim::DeviceDistributions dd;
  dd.speed_sigma = 0.8;
  const size_t n = 20;
  Setup s(n, 30, sim::DevicePopulation::sample(n, dd, 4));
  sim::AsyncSimConfig ac = s.simConfig(20, 6);
  ac.eval_every = 20;
  // top-k with error feedback: the residuals live in the client-state store between a client's
  // turns.
  const auto sc = s.serverConfig(3, 10, "topk:density=0.3");
  server::AsyncServer untrained(s.layout(), sc, s.init());
  const client::EvalResult before = s.trainer->evaluate(
      untrained.model().current(), client::DataView{&s.train, [&] {
                                                      std::vector<size_t> all(s.train.size());
                                                      std::iota(all.begin(), all.end(), size_t{0});
                                                      return all;
                                                    }()});
  const Run a = runAsync(s, sc, ac, &s.train);
  REQUIRE(a.steps.back().test_accuracy.has_value());
  INFO("before " << before.accuracy << " after " << *a.steps.back().test_accuracy);
  CHECK(*a.steps.back().test_accuracy > before.accuracy + 0.2);
  // Again from fresh client states: the same clients, clock and model, bit for bit.
  Setup again(n, 30, sim::DevicePopulation::sample(n, dd, 4));
  const Run b = runAsync(again, sc, ac, &again.train);
  CHECK(b.now == a.now);
  CHECK(b.accepted == a.accepted);
  REQUIRE(b.steps.size() == a.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    CHECK(b.steps[i].uplink_bytes == a.steps[i].uplink_bytes);
    CHECK(b.steps[i].metrics == a.steps[i].metrics);
  }
  REQUIRE(b.model.size() == a.model.size());
  CHECK(std::memcmp(b.model.data(), a.model.data(), a.model.size() * sizeof(float)) == 0);
  // Another seed draws other clients.
  Setup other(n, 30, sim::DevicePopulation::sample(n, dd, 4));
  ac.seed = 6;
  const Run c = runAsync(other, sc, ac);
  CHECK(c.accepted != a.accepted);
}

TEST_CASE("FedBuff trains a client at most once per model version", "[simulator][async]") {
  TempDir dir("asynconce");
  // Exactly K clients with data, the fast ones eight times faster: each version needs all of
  // them, so the fast ones wait for the slow ones instead of sending a second (duplicate) update.
  const size_t n = 4;
  Setup s(n, 40, twoSpeeds(dir, n, 2, 8.0));
  const Run r = runAsync(s, s.serverConfig(4, 20), s.simConfig(5, 4));
  REQUIRE(r.steps.size() == 5);
  for (const auto& rec : r.steps) {
    CHECK(rec.clients_completed == 4);
    CHECK(rec.updates_rejected == 0);
  }
  CHECK(r.accepted == std::vector<uint64_t>(n, 5));
}

TEST_CASE("FedBuff stops with an error when the server cannot reach K", "[simulator][async]") {
  const size_t n = 6;
  Setup s(n, 20, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3));
  // Every update is over the value bound: refused, so no version ever gets K.
  auto sc = s.serverConfig(2, 3);
  sc.scheme.bounds.max_abs_value = 1e-9;
  server::AsyncServer server(s.layout(), sc, s.init());
  sim::AsyncSimulation simulation(s.simConfig(4, 3), s.clients, *s.trainer, s.store, server,
                                  nullptr);
  CHECK_THROWS_WITH(simulation.run(), Catch::Matchers::Contains("cannot step at model version 1") &&
                                          Catch::Matchers::Contains("6 refused"));
  CHECK(server.steps() == 0);
  // K above the clients with data could never step: refused up front.
  const auto big = s.serverConfig(7, 3);
  server::AsyncServer server7(s.layout(), big, s.init());
  CHECK_THROWS_AS(
      sim::AsyncSimulation(s.simConfig(4, 3), s.clients, *s.trainer, s.store, server7, nullptr),
      ConfigError);
}

TEST_CASE("FedBuff's simulation refuses a bad configuration", "[simulator][async]") {
  const size_t n = 4;
  Setup s(n, 10, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3));
  server::AsyncServer server(s.layout(), s.serverConfig(2, 5), s.init());
  sim::AsyncSimConfig ac = s.simConfig(3, 0);
  CHECK_THROWS_AS(sim::AsyncSimulation(ac, s.clients, *s.trainer, s.store, server, nullptr),
                  ConfigError);
  ac = s.simConfig(0, 2);
  CHECK_THROWS_AS(sim::AsyncSimulation(ac, s.clients, *s.trainer, s.store, server, nullptr),
                  ConfigError);
  // Two-phase compressors and SCAFFOLD have no asynchronous step.
  auto sc = s.serverConfig(2, 5, "powersgd:rank=1");
  CHECK_THROWS_AS(server::AsyncServer(s.layout(), sc, s.init()), ConfigError);
  sc = s.serverConfig(2, 5);
  sc.scheme.scaffold = true;
  CHECK_THROWS_AS(server::AsyncServer(s.layout(), sc, s.init()), ConfigError);
}

TEST_CASE("semi-synchronous rounds with a deadline past every client are rounds without staleness",
          "[simulator][async]") {
  const size_t n = 12;
  Setup s(n, 40, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3));
  sim::AsyncSimConfig ac = s.simConfig(5, 4);
  ac.round_seconds = 10.0;                                // a client takes about 0.04 s
  const Run r = runAsync(s, s.serverConfig(10, 20), ac);  // K does not apply
  REQUIRE(r.steps.size() == 5);
  for (size_t i = 0; i < r.steps.size(); ++i) {
    const auto& rec = r.steps[i];
    CHECK(rec.applied);
    CHECK(rec.clients_selected == 4);
    CHECK(rec.clients_completed == 4);
    CHECK(rec.metrics.at("staleness_max") == 0.0);
    CHECK(*rec.sim_seconds == 10.0);
    CHECK(rec.model_version == i + 2);
  }
  CHECK(r.now == 50.0);
}

TEST_CASE("semi-synchronous rounds: a late update joins a later round with its staleness",
          "[simulator][async]") {
  TempDir dir("semisync");
  const size_t n = 8;
  // Fast clients take 40 x 1e-3 / 8 = 0.005 s, slow ones 0.04 s: four rounds of 0.01 s.
  Setup s(n, 40, twoSpeeds(dir, n, 4, 8.0));
  sim::AsyncSimConfig ac = s.simConfig(24, 4);
  ac.round_seconds = 0.01;
  const Run r = runAsync(s, s.serverConfig(10, 50), ac);
  REQUIRE(r.steps.size() == 24);
  double worst = 0.0;
  for (const auto& rec : r.steps) {
    CHECK(rec.updates_rejected == 0);  // nothing late is dropped inside the bound
    CHECK(*rec.sim_seconds == Approx(0.01).epsilon(1e-9));
    if (rec.applied) worst = std::max(worst, rec.metrics.at("staleness_max"));
  }
  CHECK(worst >= 3.0);  // a slow client's update lands three or four versions later
  CHECK(r.accepted[4] + r.accepted[5] + r.accepted[6] + r.accepted[7] > 0);
  CHECK(r.accepted[0] + r.accepted[1] + r.accepted[2] + r.accepted[3] >
        r.accepted[4] + r.accepted[5] + r.accepted[6] + r.accepted[7]);
}

TEST_CASE("a semi-synchronous round where nothing arrived is recorded, not applied",
          "[simulator][async]") {
  const size_t n = 6;
  Setup s(n, 40, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3));
  sim::AsyncSimConfig ac = s.simConfig(6, 3);
  ac.round_seconds = 0.015;  // every client takes about 0.04 s: rounds 1 and 2 get nothing
  const Run r = runAsync(s, s.serverConfig(10, 20), ac);
  REQUIRE(r.steps.size() == 6);
  CHECK_FALSE(r.steps[0].applied);
  CHECK_FALSE(r.steps[1].applied);
  CHECK(r.steps[0].reason.find("no update arrived") != std::string::npos);
  CHECK(r.steps[0].model_version == 1);
  CHECK(r.steps[2].applied);  // the first three land in round 3, trained from version 1
  CHECK(r.steps[2].clients_completed == 3);
  CHECK(r.steps[2].model_version == 2);
}

TEST_CASE(
    "semi-synchronous rounds whose updates are all refused record why, then stop with an error",
    "[simulator][async]") {
  const size_t n = 4;
  Setup s(n, 20, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3));
  auto sc = s.serverConfig(10, 3);
  sc.scheme.bounds.max_abs_value = 1e-9;  // every update is over the bound
  server::AsyncServer server(s.layout(), sc, s.init());
  sim::AsyncSimConfig ac = s.simConfig(10, 2);
  ac.round_seconds = 1.0;  // every client lands in its round
  sim::AsyncSimulation simulation(ac, s.clients, *s.trainer, s.store, server, nullptr);
  std::vector<server::RoundRecord> records;
  // Two rounds of two clients each, all refused; then no client can train on version 1 again.
  CHECK_THROWS_WITH(simulation.run([&](const server::RoundRecord& r) { records.push_back(r); }),
                    Catch::Matchers::Contains("cannot step at model version 1"));
  REQUIRE(records.size() == 2);
  for (const auto& r : records) {
    CHECK_FALSE(r.applied);
    CHECK(r.updates_rejected == 2);  // each round's own refusals
    CHECK(r.reason.find("2 refused") != std::string::npos);
  }
}

namespace {
sim::DevicePopulation withWindows(const TempDir& dir, size_t n, const std::string& rows) {
  sim::DevicePopulation p = sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3);
  const std::string path = (dir.path / "windows.csv").string();
  std::ofstream(path) << "client,period,start,end\n" << rows;
  p.loadWindows(path);
  return p;
}
}  // namespace

TEST_CASE(
    "FedBuff follows windows of time: offline clients wait, and one offline at its finish fails",
    "[simulator][async]") {
  TempDir dir("asyncwindows");
  // Client 0 is online from 0.5 s to 0.9 s of every 10 s, client 1 only for the first 0.01 s, less
  // than the 0.04 s its training takes.
  Setup s(2, 40, withWindows(dir, 2, "0,10,0.5,0.9\n1,10,0,0.01\n"));
  const Run r = runAsync(s, s.serverConfig(1, 20), s.simConfig(3, 2));
  REQUIRE(r.steps.size() == 3);
  // Client 1 starts at 0 and is gone before it finishes; the clock waits until client 0 comes
  // online at 0.5 s, and then client 0 alone makes every step.
  CHECK(r.steps[0].clients_selected == 2);
  CHECK(r.steps[0].clients_failed == 1);
  const double one = *r.steps[1].sim_seconds;  // client 0's time
  CHECK(one == Approx(40 * 1e-3).epsilon(0.05));
  CHECK(*r.steps[0].sim_seconds == Approx(0.5 + one).epsilon(1e-12));
  CHECK(*r.steps[2].sim_seconds == Approx(one).epsilon(1e-12));
  CHECK(r.accepted == std::vector<uint64_t>{3, 0});
}

TEST_CASE(
    "synchronous rounds follow windows of time: offline clients are not sampled, dropouts fail",
    "[simulator][async]") {
  TempDir dir("syncwindows");
  // Clients 0 and 1 always online; client 2 only for the first 0.01 s of every 1000 s (it drops out
  // of round 1); client 3 only from 100 s on.
  Setup s(4, 40,
          withWindows(dir, 4, "0,1000,0,1000\n1,1000,0,1000\n2,1000,0,0.01\n3,1000,100,1000\n"));
  SyncRun sync(s, 2, 4);
  const server::RoundRecord r1 = sync.round();
  CHECK(r1.clients_selected == 3);  // client 3 is offline at 0
  CHECK(r1.clients_failed == 1);    // client 2 went offline before it finished
  CHECK(r1.clients_completed == 2);
  const server::RoundRecord r2 = sync.round();
  CHECK(r2.clients_selected == 2);  // client 2 offline, client 3 not yet
  CHECK(sync.fleet.clock() == Approx(*r1.sim_seconds + *r2.sim_seconds).epsilon(1e-12));
  // The clock is part of the fleet's checkpoint state.
  sim::SimFleet resumed(sim::SimFleetConfig{}, s.clients, *s.trainer, sync.store, *sync.coll,
                        nullptr);
  resumed.restoreState(sync.fleet.saveState());
  CHECK(resumed.clock() == sync.fleet.clock());
}

TEST_CASE("FedBuff starts a client that comes online between arrivals at once",
          "[simulator][async]") {
  TempDir dir("asynconline");
  // Client 0 always online, client 1 from 0.1 s, client 2 from 5 s; each takes about 0.04 s.
  Setup s(3, 40, withWindows(dir, 3, "0,10,0,10\n1,10,0.1,10\n2,10,5,10\n"));
  const Run r = runAsync(s, s.serverConfig(1, 20), s.simConfig(4, 2));
  REQUIRE(r.steps.size() == 4);
  // Client 0 steps at T, 2T and 3T; client 1 starts at 0.1 s on version 3 (not at the arrival at
  // 3T) and lands at 0.1 + T, one version stale.
  const double t = *r.steps[0].sim_seconds;
  CHECK(*r.steps[1].sim_seconds == Approx(t).margin(1e-5));
  CHECK(*r.steps[2].sim_seconds == Approx(t).margin(1e-5));
  CHECK(*r.steps[3].sim_seconds == Approx(0.1 + t - 3 * t).margin(1e-5));
  CHECK(r.steps[3].metrics.at("staleness_max") == 1.0);
  CHECK(r.accepted == std::vector<uint64_t>{3, 1, 0});
}

TEST_CASE("FedBuff: a client that drops out tries again in a window long enough, else never",
          "[simulator][async]") {
  TempDir dir("asyncretry");
  {
    // K = 2 of 2 clients: version 1 needs client 1, whose first window (0.01 s) is too short for
    // its 0.04 s of training and whose second, from 0.5 s, is long enough.
    Setup s(2, 40, withWindows(dir, 2, "0,10,0,10\n1,10,0,0.01\n1,10,0.5,0.9\n"));
    const Run r = runAsync(s, s.serverConfig(2, 20), s.simConfig(1, 2));
    REQUIRE(r.steps.size() == 1);
    CHECK(r.steps[0].clients_failed == 1);  // the dropout at about 0.04 s
    CHECK(r.steps[0].clients_selected == 3);
    CHECK(*r.steps[0].sim_seconds == Approx(0.5 + 0.04).margin(1e-3));
    CHECK(r.accepted == std::vector<uint64_t>{1, 1});
  }
  {
    // Never online long enough: the server cannot reach K, and says why.
    Setup s(2, 40, withWindows(dir, 2, "0,10,0,10\n1,10,0,0.01\n1,10,0.5,0.51\n"));
    server::AsyncServer server(s.layout(), s.serverConfig(2, 20), s.init());
    sim::AsyncSimulation simulation(s.simConfig(1, 2), s.clients, *s.trainer, s.store, server,
                                    nullptr);
    CHECK_THROWS_WITH(simulation.run(),
                      Catch::Matchers::Contains("cannot step at model version 1") &&
                          Catch::Matchers::Contains("availability_trace"));
  }
}

TEST_CASE("FedBuff with STC judges a client's window by its own update's bytes",
          "[simulator][async]") {
  TempDir dir("asyncstcwindow");
  const size_t per_client = 40;
  const std::string stc = "stc:density=0.3";
  // The client alone, always online: its time with its own update, and with an empty one (what
  // its start can know).
  Setup probe(1, per_client, sim::DevicePopulation::sample(1, sim::DeviceDistributions{}, 3), false,
              40);
  const Run free = runAsync(probe, probe.serverConfig(1, 20, stc), probe.simConfig(1, 1));
  REQUIRE(free.steps.size() == 1);
  const double took = *free.steps[0].sim_seconds;
  const server::AsyncServer server(probe.layout(), probe.serverConfig(1, 20, stc), probe.init());
  // The estimate a start could make (phaseZeroUpdateBytes, as for any client but 0: the larger).
  const uint64_t empty =
      sim::phaseZeroUpdateBytes(probe.trainer->layout(), server.scheme().compressor(),
                                server.broadcast(1), server.scheme().options().metrics, false);
  const sim::DeviceProfile d;
  const double estimate =
      per_client * 1e-3 + static_cast<double>(free.steps[0].downlink_bytes + empty) / d.bandwidth;
  REQUIRE(estimate < took);
  // Online from 0 until between the two, every 100 s: the estimate fits, the client's own update
  // does not, and no window is long enough to try again. It drops out: the server never steps.
  REQUIRE(took - estimate > 1e-5);
  std::ostringstream window;
  window << std::setprecision(17) << "0,100,0," << (estimate + took) / 2 << "\n";
  Setup s(1, per_client, withWindows(dir, 1, window.str()), false, 40);
  server::AsyncServer stepped(s.layout(), s.serverConfig(1, 20, stc), s.init());
  sim::AsyncSimulation simulation(s.simConfig(1, 1), s.clients, *s.trainer, s.store, stepped,
                                  nullptr);
  CHECK_THROWS_WITH(simulation.run(), Catch::Matchers::Contains("cannot step at model version 1"));
  // It failed when its own update would have finished: trained, judged, dropped.
  CHECK(simulation.now() == Approx(took).epsilon(1e-12));
  CHECK(simulation.clientsTrained() == 1);
  CHECK(simulation.accepted() == std::vector<uint64_t>{0});
  CHECK(s.store.stats().clients == 0);  // trained, dropped out: its state as it was (none)
}

TEST_CASE("a synchronous round that waits for its clients to come online counts the wait",
          "[simulator]") {
  TempDir dir("syncwait");
  Setup s(2, 40, withWindows(dir, 2, "0,10,5,10\n1,10,5,10\n"));
  SyncRun sync(s, 2, 2, 1);  // evaluating every round: the evaluation's call moves nothing
  const server::RoundRecord r1 = sync.round();
  const server::RoundRecord r2 = sync.round();
  CHECK(r1.clients_completed == 2);
  CHECK(*r1.sim_seconds == Approx(5 + *r2.sim_seconds).margin(1e-6));  // the wait, then a round
  CHECK(*r2.sim_seconds == Approx(0.04).margin(1e-3));
  CHECK(sync.fleet.clock() == Approx(*r1.sim_seconds + *r2.sim_seconds).epsilon(1e-12));
}

TEST_CASE("the synchronous clock times each client with its own update's bytes", "[simulator]") {
  // STC leaves zeros out and Rice-codes its positions, so its size depends on the values: a round
  // timed with a zero update's bytes (as every other compressor's) ended too early. Sign's and
  // QSGD's zero update left its scales out, and every zero metric: 4 to 8 bytes short each.
  const size_t per_client = 40;
  for (const char* spec : {"stc:density=0.3", "sign", "qsgd", "topk:density=0.3", "none"}) {
    INFO(spec);
    Setup s(3, per_client, sim::DevicePopulation::sample(3, sim::DeviceDistributions{}, 3), false,
            40);
    SyncRun sync(s, 4, 1, 0, spec);
    const sim::DeviceProfile d;  // every device: speed 1, 1.25e6 bytes/s
    std::set<uint64_t> sizes;
    for (int i = 0; i < 4; ++i) {
      const server::RoundRecord rec = sync.round();
      REQUIRE(rec.clients_completed == 1);
      sizes.insert(rec.uplink_bytes);
      const double bytes = static_cast<double>(rec.downlink_bytes + rec.uplink_bytes);
      CHECK(*rec.sim_seconds == Approx(per_client * 1e-3 + bytes / d.bandwidth).epsilon(1e-12));
    }
    // STC's sizes vary: the check above sees each client's own. (The others' differ only by the
    // client id's bytes: id 0 is left out.)
    if (std::string(spec).starts_with("stc")) CHECK(sizes.size() > 1);
  }
}

TEST_CASE("STC's synchronous deadline drops a client by its own update's bytes, its state kept",
          "[simulator]") {
  const size_t per_client = 40;
  Setup s(2, per_client, sim::DevicePopulation::sample(2, sim::DeviceDistributions{}, 3), false,
          40);
  const std::string stc = "stc:density=0.3";
  // Round 1 without a deadline: the client's time with its update.
  SyncRun free(s, 1, 1, 0, stc);
  const server::RoundRecord first = free.round();
  REQUIRE(first.clients_completed == 1);
  CHECK(free.store.stats().clients == 1);  // its residual (error feedback) kept
  // A deadline just short of its time with its update's bytes: an empty update would have made
  // it, this client's does not.
  const sim::DeviceProfile d;
  const double took = per_client * 1e-3 +
                      static_cast<double>(first.downlink_bytes + first.uplink_bytes) / d.bandwidth;
  CHECK(*first.sim_seconds == Approx(took).epsilon(1e-12));
  sim::SimFleetConfig fc;
  fc.deadline_seconds = took - 1e-9;
  SyncRun late(s, 1, 1, 0, stc, fc);
  const server::RoundRecord dropped = late.round();
  CHECK(dropped.clients_completed == 0);
  CHECK(dropped.clients_failed == 1);
  CHECK(dropped.uplink_bytes == 0);
  CHECK_FALSE(dropped.applied);
  CHECK(late.store.stats().clients == 0);  // trained, not accepted: its state as it was (none)
  CHECK(*dropped.sim_seconds == Approx(fc.deadline_seconds).epsilon(1e-12));
}

TEST_CASE("FedBuff with the lossy top-k downlink sends a fraction of the model and still learns",
          "[simulator][async]") {
  // 200 features: a 603-value model; a step refreshes 2% of the broadcast model, so a client that
  // holds a recent version downloads a few coordinates instead of all of them.
  const size_t n = 12;
  const auto all = [](const data::Dataset& d) {
    std::vector<size_t> idx(d.size());
    std::iota(idx.begin(), idx.end(), size_t{0});
    return idx;
  };
  sim::AsyncSimConfig ac;
  ac.steps = 60;
  ac.concurrency = 4;
  ac.seed = 5;
  ac.fit = protocol::FitSettings{1, 16, 0.1f};
  ac.eval_every = 60;
  double per_start[2] = {0, 0}, accuracy[2] = {0, 0}, before = 0;
  for (int lossy = 0; lossy < 2; ++lossy) {
    Setup s(n, 30, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3), false, 200);
    auto sc = s.serverConfig(2, 20);
    if (lossy) {
      sc.downlink = server::Downlink::kTopK;
      sc.density = 0.02;
      sc.history = 64;
    }
    before = s.trainer->evaluate(s.init(), client::DataView{&s.train, all(s.train)}).accuracy;
    const Run r = runAsync(s, sc, ac, &s.train);
    uint64_t down = 0, started = 0;
    for (const auto& rec : r.steps) {
      down += rec.downlink_bytes;
      started += rec.clients_selected;
    }
    per_start[lossy] = static_cast<double>(down) / static_cast<double>(started);
    accuracy[lossy] = *r.steps.back().test_accuracy;
  }
  INFO("bytes per task: dense " << per_start[0] << ", top-k " << per_start[1]
                                << "; accuracy before " << before << ", dense " << accuracy[0]
                                << ", top-k " << accuracy[1]);
  CHECK(per_start[1] < 0.6 * per_start[0]);
  CHECK(accuracy[1] > before + 0.2);
}

TEST_CASE(
    "FedBuff with the quantised downlinks: a task costs about a quarter (q8) or an eighth (q4) of "
    "a dense one, and the run learns as the dense one does",
    "[simulator][async]") {
  // The 603-value model of the top-k test: 2,412 bytes of values dense, 603 at 8 bits, 302 at 4,
  // plus each task's header (the same in every mode: what a dense task has beyond its 2,412
  // bytes) and the quantised tensors' norms. The simulated clients train from the model their
  // task decodes to, whole or refreshed (server/model_store.h).
  const size_t n = 12;
  const server::Downlink modes[] = {server::Downlink::kDense, server::Downlink::kQ8,
                                    server::Downlink::kQ4, server::Downlink::kQ2Mirror,
                                    server::Downlink::kStcMirror};
  double per_start[5] = {}, accuracy[5] = {}, before = 0, numel = 0;
  for (int m = 0; m < 5; ++m) {
    Setup s(n, 30, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3), false, 200);
    auto sc = s.serverConfig(2, 20);
    sc.downlink = modes[m];
    sc.density = 0.1;  // stc-mirror's
    sim::AsyncSimConfig ac = s.simConfig(60, 4);
    ac.eval_every = 60;
    std::vector<size_t> all(s.train.size());
    std::iota(all.begin(), all.end(), size_t{0});
    before = s.trainer->evaluate(s.init(), client::DataView{&s.train, all}).accuracy;
    numel = static_cast<double>(s.trainer->layout().numel());
    const Run r = runAsync(s, sc, ac, &s.train);
    uint64_t down = 0, started = 0;
    for (const auto& rec : r.steps) {
      down += rec.downlink_bytes;
      started += rec.clients_selected;
    }
    REQUIRE(started > 0);
    per_start[m] = static_cast<double>(down) / static_cast<double>(started);
    accuracy[m] = *r.steps.back().test_accuracy;
  }
  INFO("bytes per task: dense " << per_start[0] << ", q8 " << per_start[1] << ", q4 "
                                << per_start[2] << ", q2-mirror " << per_start[3] << ", stc-mirror "
                                << per_start[4] << "; accuracy before " << before << ", dense "
                                << accuracy[0] << ", q8 " << accuracy[1] << ", q4 " << accuracy[2]
                                << ", q2-mirror " << accuracy[3] << ", stc-mirror " << accuracy[4]);
  const double header = per_start[0] - 4 * numel;  // every task's bytes beyond its values
  REQUIRE(header > 0);
  INFO("header " << header << " bytes");
  // At most 8 (4) bits per value and a few bytes of norms.
  CHECK(per_start[1] - header < 1.05 * numel);
  CHECK(per_start[1] - header > 0.95 * numel);
  CHECK(per_start[2] - header < 0.55 * numel);
  CHECK(per_start[2] - header > 0.45 * numel);
  // q2-mirror: 2 bits a value, a byte a block of 64 and the block payload's framing: under q4.
  CHECK(per_start[3] < per_start[2]);
  // stc-mirror: a tenth of the values, a few bits each, after each client's first task (q3's
  // blocks): under q2-mirror.
  CHECK(per_start[4] < per_start[3]);
  for (int m = 1; m < 5; ++m) {
    CHECK(accuracy[m] > before + 0.2);
    CHECK(accuracy[m] > accuracy[0] - 0.05);
  }
}

namespace {

// A run of `ac.steps` steps on a client-state store kept in `dir` (nothing held in memory, so
// every state goes through LMDB), checkpointed to dir/ck.bin when `checkpoint`; a store that
// resumes reopens the folder as of its last flush.
Run runStored(Setup& s, const server::AsyncServerConfig& sc, sim::AsyncSimConfig ac,
              const std::filesystem::path& dir, bool checkpoint, bool resume,
              bool* resumed = nullptr) {
  sim::StateStoreOptions so;
  so.memory_bytes = 0;
  so.spill_dir = (dir / "states").string();
  so.resume = resume;
  sim::ClientStateStore store(so, s.trainer->layout().fingerprint());
  if (checkpoint) ac.checkpoint = (dir / "ck.bin").string();
  return runAsync(s, sc, ac, nullptr, &store, resumed);
}

}  // namespace

TEST_CASE(
    "FedBuff and semi-synchronous simulations resumed from the checkpoint of a step take the "
    "uninterrupted run's steps, bit for bit",
    "[simulator][async]") {
  TempDir dir("async-resume");
  const size_t n = 12;
  // Top-k with error feedback: the residuals are in the store, flushed with each checkpoint.
  struct Case {
    const char* name;
    sim::DevicePopulation devices;
    uint64_t k, concurrency;
    double round_seconds;
    bool empty_first;
    server::Downlink downlink = server::Downlink::kDense;
    size_t features = 6;
    bool format3 = false;  // the checkpoint rewritten as before the files' frame
  };
  std::vector<Case> cases;
  // Identical clients (client 0 without data, so that every other task and update has the same
  // bytes): five finish at one instant, and steps fall among them.
  cases.push_back({"fedbuff", sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3), 3, 5,
                   0.0, true});
  cases.push_back({"fedbuff-format3",
                   sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3), 3, 5, 0.0, true,
                   server::Downlink::kDense, 6, true});
  sim::DeviceDistributions dd;
  dd.speed_sigma = 0.8;
  cases.push_back({"semisync", sim::DevicePopulation::sample(n, dd, 4), 3, 5, 0.02, false});
  // The stc downlink: clients holding older versions get chains of refreshes, which the checkpoint
  // keeps (the bytes, and the models they train from, as in the uninterrupted run); a model of 603
  // values, so that a chain is smaller than the whole model.
  cases.push_back({"fedbuff-stc", sim::DevicePopulation::sample(n, dd, 5), 2, 4, 0.0, false,
                   server::Downlink::kStc, 200});
  // A mirrored downlink: each client's copy is in the checkpoint, so the tasks after the resume,
  // and the models their clients train from, are the uninterrupted run's.
  cases.push_back({"fedbuff-q2-mirror", sim::DevicePopulation::sample(n, dd, 5), 2, 4, 0.0, false,
                   server::Downlink::kQ2Mirror, 200});
  // stc-mirror: the copies, with their ternary refreshes' density (sc.density), likewise.
  cases.push_back({"fedbuff-stc-mirror", sim::DevicePopulation::sample(n, dd, 5), 2, 4, 0.0, false,
                   server::Downlink::kStcMirror, 200});
  for (Case& c : cases) {
    INFO(c.name);
    Setup s(n, 30, c.devices, c.empty_first, c.features);
    auto sc = s.serverConfig(c.k, 10, "topk:density=0.2");
    sc.downlink = c.downlink;
    sc.history = 6;
    sc.density = 0.02;
    sim::AsyncSimConfig ac = s.simConfig(9, c.concurrency);
    ac.round_seconds = c.round_seconds;
    const std::filesystem::path ref = dir.path / (std::string(c.name) + "-ref"),
                                cut = dir.path / (std::string(c.name) + "-cut");
    std::filesystem::create_directories(ref);
    std::filesystem::create_directories(cut);
    const Run whole = runStored(s, sc, ac, ref, false, false);
    // Four steps and a stop (the run goes on past its last checkpoint: it starts clients, which
    // train and store their states), then the same configuration with nine steps.
    ac.steps = 4;
    bool resumed = true;
    const Run first = runStored(s, sc, ac, cut, true, false, &resumed);
    CHECK_FALSE(resumed);
    REQUIRE(first.steps.size() == 4);
    if (c.format3) {
      // Format 3: the magic, the version, then the fields the frame now carries, but format 5's
      // last (the flag of a mirrored downlink's copies: none here).
      const std::filesystem::path ck = cut / "ck.bin";
      std::vector<uint8_t> old =
          testing::asPreFrame(readFile(ck, 1 << 24), 0x4d495341 /* "ASIM" */, 3);
      REQUIRE(old.back() == 0);
      old.pop_back();
      writeFileAtomic(ck, old);
    }
    ac.steps = 9;
    const Run rest = runStored(s, sc, ac, cut, true, true, &resumed);
    CHECK(resumed);
    REQUIRE(whole.steps.size() == 9);
    REQUIRE(rest.steps.size() == 5);
    for (size_t i = 0; i < 5; ++i) {
      INFO("step " << i + 5);
      const server::RoundRecord &a = whole.steps[i + 4], &b = rest.steps[i];
      CHECK(b.round == a.round);
      CHECK(b.model_version == a.model_version);
      CHECK(b.clients_completed == a.clients_completed);
      CHECK(b.clients_selected == a.clients_selected);
      CHECK(b.uplink_bytes == a.uplink_bytes);
      CHECK(b.downlink_bytes == a.downlink_bytes);
      CHECK(b.sim_seconds == a.sim_seconds);
      CHECK(b.metrics == a.metrics);
    }
    CHECK(rest.now == whole.now);
    CHECK(rest.accepted == whole.accepted);
    REQUIRE(rest.model.size() == whole.model.size());
    CHECK(std::memcmp(rest.model.data(), whole.model.data(), whole.model.size() * 4) == 0);
    // The staleness the run meant to test happened.
    double worst = 0.0;
    for (const auto& rec : whole.steps)
      if (rec.applied) worst = std::max(worst, rec.metrics.at("staleness_max"));
    CHECK(worst >= 1.0);
  }
  // Another configuration, or another file, is refused naming what differs: never a fresh start.
  Setup s(n, 30, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3), true);
  const auto sc = s.serverConfig(3, 10, "topk:density=0.2");
  const std::filesystem::path cut = dir.path / "fedbuff-cut";
  sim::AsyncSimConfig other = s.simConfig(9, 6);
  CHECK_THROWS_MATCHING(runStored(s, sc, other, cut, true, true), IoError,
                        Catch::Matchers::Contains("async.concurrency = 5, this run has 6"));
  // The same configuration on other devices (their speeds): refused too.
  Setup elsewhere(n, 30, sim::DevicePopulation::sample(n, dd, 3), true);
  CHECK_THROWS_MATCHING(runStored(elsewhere, sc, elsewhere.simConfig(9, 5), cut, true, true),
                        IoError, Catch::Matchers::Contains("another device population"));
  std::ofstream(cut / "ck.bin", std::ios::binary | std::ios::trunc) << "not a checkpoint";
  CHECK_THROWS_MATCHING(
      runStored(s, sc, s.simConfig(9, 5), cut, true, true), IoError,
      Catch::Matchers::Contains("not a checkpoint of an asynchronous simulation"));
}

TEST_CASE(
    "an asynchronous simulation killed anywhere around its checkpoint resumes as the "
    "uninterrupted run, and a checkpoint that is not its client states' is refused",
    "[simulator][async]") {
  TempDir dir("async-kill");
  namespace fs = std::filesystem;
  const size_t n = 12;
  Setup s(n, 30, sim::DevicePopulation::sample(n, sim::DeviceDistributions{}, 3), true);
  const auto sc = s.serverConfig(3, 10, "topk:density=0.2");
  sim::AsyncSimConfig ac = s.simConfig(7, 5);
  fs::create_directories(dir.path / "ref");
  const Run whole = runStored(s, sc, ac, dir.path / "ref", false, false);
  REQUIRE(whole.steps.size() == 7);
  // Step 3's checkpoint and states, then step 4's: the two sides of one checkpoint's phases.
  const fs::path run = dir.path / "run";
  fs::create_directories(run);
  ac.steps = 3;
  runStored(s, sc, ac, run, true, false);
  fs::copy(run / "ck.bin", dir.path / "ck3");
  fs::copy(run / "states", dir.path / "states3", fs::copy_options::recursive);
  ac.steps = 4;
  runStored(s, sc, ac, run, true, true);
  fs::copy(run / "ck.bin", dir.path / "ck4");
  fs::copy(run / "states", dir.path / "states4", fs::copy_options::recursive);
  ac.steps = 7;
  // The folder as a kill left it: `ck` as the checkpoint, `next` beside it (or none), `states`.
  const auto leave = [&](const char* ck, const char* next, const char* states) {
    fs::remove_all(run);
    fs::create_directories(run);
    if (ck) fs::copy(dir.path / ck, run / "ck.bin");
    if (next) fs::copy(dir.path / next, run / "ck.bin.next");
    if (states) fs::copy(dir.path / states, run / "states", fs::copy_options::recursive);
  };
  const auto sameAsWhole = [&](const Run& r, size_t from) {
    REQUIRE(r.steps.size() == 7 - from);
    for (size_t i = 0; i < r.steps.size(); ++i) {
      CHECK(r.steps[i].round == whole.steps[from + i].round);
      CHECK(r.steps[i].metrics == whole.steps[from + i].metrics);
      CHECK(r.steps[i].uplink_bytes == whole.steps[from + i].uplink_bytes);
    }
    CHECK(r.now == whole.now);
    CHECK(r.model == whole.model);
  };
  bool resumed = false;
  SECTION("killed after step 4's states were flushed, before its checkpoint's rename") {
    leave("ck3", "ck4", "states4");
    sameAsWhole(runStored(s, sc, ac, run, true, true, &resumed), 4);
    CHECK(resumed);
    CHECK_FALSE(fs::exists(run / "ck.bin.next"));
  }
  SECTION("a damaged checkpoint beside its flushed states is refused as damaged, and kept") {
    leave("ck3", "ck4", "states4");
    std::vector<uint8_t> bytes = readFile(run / "ck.bin.next", 1 << 24);
    bytes[bytes.size() - 9] ^= 0x04;
    writeFileAtomic(run / "ck.bin.next", bytes);
    CHECK_THROWS_MATCHING(runStored(s, sc, ac, run, true, true), IoError,
                          Catch::Matchers::Contains("damaged"));
    CHECK(readFile(run / "ck.bin", 1 << 24) == bytes);  // step 4's, renamed as its states are
  }
  SECTION("killed after step 4's checkpoint was written beside, before the states' flush") {
    leave("ck3", "ck4", "states3");
    sameAsWhole(runStored(s, sc, ac, run, true, true, &resumed), 3);
    CHECK(resumed);
    CHECK_FALSE(fs::exists(run / "ck.bin.next"));
  }
  SECTION(
      "killed in the middle of step 3's metrics line: the line is made whole from the checkpoint") {
    leave("ck3", nullptr, "states3");
    {
      std::ofstream m(run / "m.jsonl", std::ios::binary);
      m << "{\"round\":1}\n{\"round\":2}\n{\"round\":3,\"appl";
    }
    sim::AsyncSimConfig with_metrics = ac;
    with_metrics.metrics_file = (run / "m.jsonl").string();
    sameAsWhole(runStored(s, sc, with_metrics, run, true, true, &resumed), 3);
    std::vector<std::string> lines;
    std::ifstream in(run / "m.jsonl");
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    REQUIRE(lines.size() == 7);
    for (size_t i = 0; i < lines.size(); ++i)
      CHECK(lines[i].rfind("{\"round\":" + std::to_string(i + 1) + (i < 2 ? "}" : ","), 0) == 0);
  }
  SECTION("killed before the first checkpoint: the store reopens empty and the run starts over") {
    leave(nullptr, nullptr, nullptr);
    {
      sim::StateStoreOptions so;
      so.spill_dir = (run / "states").string();
      sim::ClientStateStore never_flushed(so, s.trainer->layout().fingerprint());
      ClientState st(s.trainer->layout().fingerprint());
      st.get<compression::ResidualState>(compression::kResidualComponent)
          .values.assign(s.trainer->layout().numel(), 1.0f);
      never_flushed.store(1, st);  // a residual no run made, never flushed: not seen again
    }
    sameAsWhole(runStored(s, sc, ac, run, true, true, &resumed), 0);
    CHECK_FALSE(resumed);
  }
  SECTION("a checkpoint of another step than its states, or without them, is refused") {
    // From the left folder on each call: the macro may evaluate its expression twice.
    const auto attempt = [&](const char* ck, const char* states) {
      leave(ck, nullptr, states);
      runStored(s, sc, ac, run, true, states != nullptr);
    };
    CHECK_THROWS_MATCHING(attempt("ck3", "states4"), IoError,
                          Catch::Matchers::Contains("written at step 3") &&
                              Catch::Matchers::Contains("holds the states of step 4"));
    CHECK_THROWS_MATCHING(attempt("ck3", nullptr), IoError,
                          Catch::Matchers::Contains("holds the states of no step"));
    CHECK_THROWS_MATCHING(
        attempt(nullptr, "states4"), IoError,
        Catch::Matchers::Contains("the checkpoint") && Catch::Matchers::Contains("is missing"));
  }
}
