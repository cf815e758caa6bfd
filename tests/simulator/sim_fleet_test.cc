// SimFleet in process (one worker, local collectives, the Eigen softmax trainer): SCAFFOLD keeps
// the server's control variate equal to the mean of every client's, with partial participation,
// across rounds; and the fleet's checkpoint state refuses another run's.
#include <catch2/catch.hpp>

#include "check_throws.h"
#include "client/algorithm.h"
#include "client/synthetic.h"
#include "data/partition.h"
#include "server/engine.h"
#include "simulator/sim_fleet.h"

using namespace starling;
namespace sim = starling::simulator;
using Catch::Matchers::Contains;

namespace {

struct Federation {
  explicit Federation(size_t n_clients, bool scaffold) : train(testing::gaussianData(400, 6, 3, 17)) {
    clients.train = &train;
    clients.shards = data::makePartitioner("dirichlet:alpha=0.3")->split(train.labels, train.num_classes, n_clients, 3);
    clients.devices = sim::DevicePopulation::sample(n_clients, sim::DeviceDistributions{}, 3);
    sim::SimFleetConfig fc;
    fc.scaffold = scaffold;
    fleet = std::make_unique<sim::SimFleet>(fc, clients, *trainer, store, *coll, nullptr);
  }
  server::EngineConfig engineConfig(size_t per_round) const {
    server::EngineConfig ec;
    ec.rounds = 4;
    ec.scheme.compressor = "none";
    ec.sampling.fraction = static_cast<double>(per_round) / static_cast<double>(clients.shards.size());
    ec.fit = protocol::FitSettings{2, 16, 0.1f};
    return ec;
  }
  data::Dataset train;
  sim::SimClients clients;
  std::unique_ptr<client::Trainer> trainer = client::makeTrainer("softmax", 6, 3);
  sim::ClientStateStore store{sim::StateStoreOptions{}, trainer->layout().fingerprint()};
  std::unique_ptr<sim::Collectives> coll = sim::makeLocal();
  std::unique_ptr<sim::SimFleet> fleet;
};

}  // namespace

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
  const std::vector<float>& c = f.fleet->serverControl();
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
  CHECK(with_state > 3);       // several rounds reached different clients
  CHECK(with_state <= n);
  double scale = 0, diff = 0;
  for (size_t j = 0; j < c.size(); ++j) {
    scale = std::max(scale, std::fabs(mean[j]));
    diff = std::max(diff, std::fabs(mean[j] - c[j]));
  }
  CHECK(scale > 1e-3);  // the control variates moved
  CHECK(diff <= 1e-5 * scale);

  // The checkpointed fleet state carries SCAFFOLD's c and the worker count; a non-SCAFFOLD fleet
  // refuses it, a SCAFFOLD fleet restores c exactly.
  const std::vector<uint8_t> saved = f.fleet->saveState();
  Federation plain(n, false);
  CHECK_THROWS_MATCHING(plain.fleet->restoreState(saved), IoError, Contains("train.scaffold"));
  Federation again(n, true);
  again.fleet->restoreState(saved);
  CHECK(again.fleet->serverControl() == c);
  std::vector<uint8_t> truncated(saved.begin(), saved.end() - 3);
  CHECK_THROWS_AS(again.fleet->restoreState(truncated), IoError);
  std::vector<uint8_t> other_world = saved;
  other_world[4] = 2;  // u32 workers, little-endian, after the u32 version
  CHECK_THROWS_MATCHING(again.fleet->restoreState(other_world), IoError, Contains("as many workers"));
}
