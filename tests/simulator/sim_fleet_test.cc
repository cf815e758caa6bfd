// SimFleet in process (one worker, local collectives, the Eigen softmax trainer): SCAFFOLD, run by
// the round engine, keeps the server's control variate equal to the mean of every client's, with
// partial participation, across rounds and a checkpoint; SCAFFOLD simulated equals SCAFFOLD over
// the protocol (InProcFleet: every task and update through the real encoders and decoders); the
// fleet's checkpoint state refuses another run's.
#include "simulator/sim_fleet.h"

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>

#include "check_throws.h"
#include "client/algorithm.h"
#include "client/synthetic.h"
#include "data/partition.h"
#include "server/engine.h"
#include "server/inproc_fleet.h"
#include "temp_dir.h"

using namespace starling;
namespace sim = starling::simulator;
using Catch::Matchers::Contains;

namespace {

struct Federation {
  // The clients' shards by `spec`, held; with `drawn`, drawn whenever asked (a rule that draws
  // each client's shard on its own).
  explicit Federation(size_t n_clients, bool with_scaffold,
                      const std::string& spec = "dirichlet:alpha=0.3", bool drawn = false)
      : train(testing::gaussianData(400, 6, 3, 17)), scaffold(with_scaffold) {
    clients.train = &train;
    const std::shared_ptr<const data::Partitioner> rule = data::makePartitioner(spec);
    partition = rule->split(train.labels, train.num_classes, n_clients, 3);
    clients.shards =
        drawn ? data::ClientShards::make(rule, train.labels, train.num_classes, n_clients, 3)
              : data::ClientShards(partition);
    clients.devices = sim::DevicePopulation::sample(n_clients, sim::DeviceDistributions{}, 3);
    fleet = std::make_unique<sim::SimFleet>(sim::SimFleetConfig{}, clients, *trainer, store, *coll,
                                            nullptr);
  }
  server::EngineConfig engineConfig(size_t per_round) const {
    server::EngineConfig ec;
    ec.rounds = 4;
    ec.scheme.compressor = "none";
    ec.scheme.scaffold = scaffold;
    ec.scaffold_population = scaffold ? clients.shards.size() : 0;
    ec.sampling.fraction =
        static_cast<double>(per_round) / static_cast<double>(clients.shards.size());
    ec.fit = protocol::FitSettings{2, 16, 0.1f};
    return ec;
  }
  data::Dataset train;
  data::Partition partition;
  sim::SimClients clients;
  std::unique_ptr<client::Trainer> trainer = client::makeTrainer("softmax", 6, 3);
  sim::ClientStateStore store{sim::StateStoreOptions{}, trainer->layout().fingerprint()};
  std::unique_ptr<sim::Collectives> coll = sim::makeLocal();
  std::unique_ptr<sim::SimFleet> fleet;
  bool scaffold;
};

}  // namespace

TEST_CASE(
    "a pool whose shards are drawn whenever asked trains as the same pool held: the same clients, "
    "times and model, bit for bit, with every device available and with some offline",
    "[simulator]") {
  for (const double availability : {1.0, 0.6}) {
    INFO("availability " << availability);
    Federation held(60, false, "sampled:size=12"), drawn(60, false, "sampled:size=12", true);
    REQUIRE(drawn.clients.shards.drawn());
    REQUIRE_FALSE(held.clients.shards.drawn());
    sim::DeviceDistributions d;
    d.speed_sigma = 0.5;
    d.availability = availability;
    held.clients.devices = drawn.clients.devices = sim::DevicePopulation::sample(60, d, 3);
    const auto layout = std::make_shared<const ParamLayout>(held.trainer->layout());
    std::vector<float> init(layout->numel());
    held.trainer->initParameters(init, 1);
    server::EngineConfig ec = held.engineConfig(10);
    ec.sampling.clients_per_round = 10;  // of the clients online, whatever their number
    server::RoundEngine a(layout, ec, init), b(layout, ec, init);
    for (int r = 0; r < 3; ++r) {
      const server::RoundRecord ra = a.runRound(*held.fleet), rb = b.runRound(*drawn.fleet);
      REQUIRE(ra.applied);
      CHECK(ra.clients_completed == 10);
      CHECK(rb.clients_completed == ra.clients_completed);
      CHECK(rb.train_loss == ra.train_loss);
      CHECK(rb.sim_seconds == ra.sim_seconds);
      CHECK(rb.uplink_bytes == ra.uplink_bytes);
    }
    CHECK(std::equal(a.model().current().begin(), a.model().current().end(),
                     b.model().current().begin(), b.model().current().end(), [](float x, float y) {
                       return std::bit_cast<uint32_t>(x) == std::bit_cast<uint32_t>(y);
                     }));
    CHECK(held.fleet->clientsTrained() == 30);
  }
}

TEST_CASE(
    "a simulated round says where its time went: the clients' state loads, training, the rest of "
    "their turns, aggregation and state stores, within the workers' time",
    "[simulator]") {
  Federation f(12, false);
  const auto layout = std::make_shared<const ParamLayout>(f.trainer->layout());
  std::vector<float> init(layout->numel());
  f.trainer->initParameters(init, 1);
  server::EngineConfig ec = f.engineConfig(6);
  ec.scheme.compressor = "topk:density=0.1";  // stateful: a residual loaded and stored
  server::RoundEngine engine(layout, ec, init);
  for (int r = 0; r < 2; ++r) {
    const server::RoundRecord rec = engine.runRound(*f.fleet);
    REQUIRE(rec.applied);
    REQUIRE(rec.stage_seconds.size() == server::kStages);
    double sum = 0.0;
    for (double s : rec.stage_seconds) sum += s;
    CHECK(rec.stage_seconds[1] > 0.0);  // six clients trained
    // Laps within the one worker's training time (each rounded down to a microsecond).
    REQUIRE(rec.makespan_seconds);
    CHECK(sum <= *rec.makespan_seconds + 1e-6);
    // In the metrics line under their keys.
    const std::string line = rec.json();
    for (const char* key : server::kStageKeys)
      CHECK(line.find("\"" + std::string(key) + "\":") != std::string::npos);
  }
}

TEST_CASE("SCAFFOLD's server control variate stays the mean of every client's", "[simulator]") {
  const size_t n = 8;
  Federation f(n, true);
  const auto layout = std::make_shared<const ParamLayout>(f.trainer->layout());
  std::vector<float> init(layout->numel());
  f.trainer->initParameters(init, 1);
  server::RoundEngine engine(layout, f.engineConfig(3), init);  // 3 of 8 clients per round
  for (int r = 0; r < 4; ++r) {
    const server::RoundRecord rec = engine.runRound(*f.fleet);
    REQUIRE(rec.applied);
    CHECK(rec.clients_completed == 3);
  }
  const std::vector<float>& c = engine.control();
  REQUIRE(c.size() == layout->numel());
  std::vector<double> mean(c.size(), 0.0);
  size_t with_state = 0;
  for (uint64_t id = 0; id < n; ++id) {
    ClientState s(layout->fingerprint());
    f.store.load(id, s);
    const auto* ci = s.find<client::ControlVariateState>(client::kControlVariate);
    if (!ci) continue;  // never sampled: c_i = 0
    ++with_state;
    REQUIRE(ci->values.size() == c.size());
    for (size_t j = 0; j < c.size(); ++j) mean[j] += ci->values[j] / static_cast<double>(n);
  }
  CHECK(with_state > 3);  // several rounds reached different clients
  CHECK(with_state <= n);
  double scale = 0, diff = 0;
  for (size_t j = 0; j < c.size(); ++j) {
    scale = std::max(scale, std::fabs(mean[j]));
    diff = std::max(diff, std::fabs(mean[j] - c[j]));
  }
  CHECK(scale > 1e-3);  // the control variates moved
  CHECK(diff <= 1e-5 * scale);

  // The engine's checkpoint carries c and the acknowledgements: a resumed engine has them exactly;
  // a run without SCAFFOLD refuses the checkpoint (and a SCAFFOLD run one without c).
  testing::TempDir dir;
  const std::string ck = (dir.path / "ck.bin").string();
  {
    server::EngineConfig ec = f.engineConfig(3);
    ec.checkpoint = ck;
    ec.rounds = 2;
    server::RoundEngine a(layout, ec, init);
    a.runRound(*f.fleet);
    const std::vector<float> saved_c = a.control();
    REQUIRE_FALSE(saved_c.empty());
    // The round's three clients are acknowledged for round 1 (what their next tasks say).
    REQUIRE(a.controlAcks().size() == 3);
    for (const auto& [id, round] : a.controlAcks()) {
      CHECK(id < n);
      CHECK(round == 1);
    }
    server::RoundEngine resumed(layout, ec, init);
    CHECK(resumed.resumed());
    CHECK(resumed.control() == saved_c);
    CHECK(resumed.controlAcks() == a.controlAcks());  // kept with c: a restart acknowledges alike
    Federation plain(n, false);
    server::EngineConfig pc = plain.engineConfig(3);
    pc.checkpoint = ck;
    CHECK_THROWS_MATCHING(server::RoundEngine(layout, pc, init), IoError,
                          Contains("train.scaffold"));
  }
  // The fleet's own state (workers, held versions) refuses another world, and a SCAFFOLD state of
  // the older format (the simulator kept c itself then) is refused with the reason.
  const std::vector<uint8_t> saved = f.fleet->saveState();
  Federation again(n, true);
  again.fleet->restoreState(saved);
  std::vector<uint8_t> truncated(saved.begin(), saved.end() - 3);
  CHECK_THROWS_AS(again.fleet->restoreState(truncated), IoError);
  std::vector<uint8_t> other_world = saved;
  other_world[4] = 2;  // u32 workers, little-endian, after the u32 version
  CHECK_THROWS_MATCHING(again.fleet->restoreState(other_world), IoError,
                        Contains("as many workers"));
  const std::vector<uint8_t> old_scaffold{2, 0, 0, 0, 1,
                                          0, 0, 0, 1};  // version 2, 1 worker, SCAFFOLD
  CHECK_THROWS_MATCHING(again.fleet->restoreState(old_scaffold), IoError, Contains("older build"));
  // Another device population (slower devices here) is refused: the clock and the clients'
  // timing would not be the run's. A state of version 4 (no fingerprint, no copies' flag) still
  // restores, and so does one of version 5 (no copies' flag).
  Federation other_devices(n, true);
  sim::DeviceDistributions slower;
  slower.speed_median = 0.5;
  other_devices.clients.devices = sim::DevicePopulation::sample(n, slower, 3);
  CHECK_THROWS_MATCHING(other_devices.fleet->restoreState(saved), IoError,
                        Contains("another device population"));
  REQUIRE(saved.back() == 0);  // version 6's flag: no mirrored downlink's copies
  std::vector<uint8_t> v5(saved.begin(), saved.end() - 1);
  v5[0] = 5;
  again.fleet->restoreState(v5);
  std::vector<uint8_t> v4(saved.begin(), saved.end() - 9);
  v4[0] = 4;
  other_devices.fleet->restoreState(v4);
  std::vector<uint8_t> marked = saved;
  marked.back() = 2;
  CHECK_THROWS_MATCHING(again.fleet->restoreState(marked), IoError, Contains("marked 2"));
}

TEST_CASE("SCAFFOLD simulated equals SCAFFOLD over the protocol", "[simulator][scaffold]") {
  // The same population, data, seed and engine: the simulator's fleet (ClientAlgorithm on the
  // global model in memory) against InProcFleet (every task and update encoded and decoded, the
  // client's side as client/runtime.cc does it). c travels in the task, c_i+ - c_i in the update,
  // and the round engine moves c: the models and c agree after every round.
  const size_t n = 6;
  Federation sim_side(n, true);
  const auto layout = std::make_shared<const ParamLayout>(sim_side.trainer->layout());
  std::vector<float> init(layout->numel());
  sim_side.trainer->initParameters(init, 1);
  std::unique_ptr<client::Trainer> deployed_trainer = client::makeTrainer("softmax", 6, 3);
  testing::InProcFleet deployed(*deployed_trainer, sim_side.train, sim_side.partition);
  server::EngineConfig ec = sim_side.engineConfig(3);
  server::RoundEngine simulated(layout, ec, init), over_protocol(layout, ec, init);
  for (int r = 0; r < 4; ++r) {
    INFO("round " << r + 1);
    const server::RoundRecord a = simulated.runRound(*sim_side.fleet);
    const server::RoundRecord b = over_protocol.runRound(deployed);
    REQUIRE(a.applied);
    REQUIRE(b.applied);
    CHECK(a.clients_completed == b.clients_completed);
    // Both fleets add their clients' updates in id order (a simulator worker sorts its share), so
    // the sums, the model and c are the same bits.
    const auto ma = simulated.model().server(), mb = over_protocol.model().server();
    CHECK(std::equal(ma.begin(), ma.end(), mb.begin(), mb.end()));
    CHECK(simulated.control() == over_protocol.control());
    // The uplink counts the control changes: 3 dense updates and 3 dense control vectors.
    CHECK(b.uplink_bytes > 6 * layout->numel() * sizeof(float));
    CHECK(a.uplink_bytes == b.uplink_bytes);
  }
  double moved = 0;
  for (float x : over_protocol.control())
    moved = std::max(moved, static_cast<double>(std::fabs(x)));
  CHECK(moved > 1e-3);
}
