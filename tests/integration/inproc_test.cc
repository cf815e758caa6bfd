// The deployment's real root, edge aggregators and clients in one process (inproc_federation.h):
// what a federation does, read from the objects (round records, the model, the clients'
// statistics), with time moved forward instead of waited out.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>

#include "client/secure_party.h"
#include "compression/registry.h"
#include "data/partition.h"
#include "integration/inproc_federation.h"
#include "model_diff.h"
#include "privacy/dp.h"
#include "privacy/secagg.h"
#include "server/inproc_fleet.h"
#include "server/secure_round.h"
#include "temp_dir.h"

using namespace starling;
using starling::testing::InprocFederation;
using starling::testing::SlowDevice;
using std::chrono::seconds;
namespace cz = starling::compression;

namespace {

// The first `n` examples of a Fashion-MNIST split (the data loaded once per test binary).
const data::Dataset& fashion(const std::string& split, size_t n) {
  static std::map<std::string, data::Dataset> cache;
  auto it = cache.find(split);
  if (it == cache.end()) {
    const auto first = [n](const std::vector<uint8_t>&, uint32_t) {
      std::vector<size_t> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = i;
      return v;
    };
    it = cache
             .emplace(split,
                      data::loadFashionMnistSubset(data::kDefaultFashionMnistDir, split, first))
             .first;
  }
  return it->second;
}

std::vector<std::vector<size_t>> iid(const data::Dataset& d, size_t clients) {
  return data::makePartitioner("iid")->split(d.labels, d.num_classes, clients, 7);
}

server::EngineConfig engineConfig(uint64_t rounds) {
  server::EngineConfig ec;
  ec.rounds = rounds;
  ec.scheme.compressor = "topk:density=0.1";
  ec.scheme.run_seed = 5;
  ec.fit = protocol::FitSettings{1, 16, 0.1f, 0.0f};
  ec.downlink = server::Downlink::kDelta;
  ec.round_deadline_ms = 600'000;
  return ec;
}

}  // namespace

namespace {

// One federation of six clients over `rounds` rounds with `compressor`: flat (every client on the
// root) or a tree (two edge aggregators of three clients each, dense partials). Its records, the
// root's model and the clients' update bytes; every client sent an update every round.
struct TreeRun {
  std::vector<server::RoundRecord> records;
  std::vector<float> model, control;
  uint64_t update_bytes = 0;
};

struct TreeOptions {
  bool scaffold = false;          // SCAFFOLD, N = 6
  double resparsify_density = 0;  // the aggregators' partials (0: dense)
};

TreeRun runSixClients(const std::string& compressor, uint64_t rounds, bool tree,
                      TreeOptions o = {}) {
  const data::Dataset& train = fashion("train", 1200);
  const data::Dataset& test = fashion("t10k", 600);
  InprocFederation f("logreg", train, iid(train, 6), &test, iid(test, 6));
  server::EngineConfig ec = engineConfig(rounds);
  ec.scheme.compressor = compressor;
  ec.eval_every = 1;
  ec.sampling.min_clients = tree ? 2 : 6;
  ec.sampling.min_available = tree ? 2 : 6;
  ec.completion.min_results = ec.sampling.min_clients;
  ec.scheme.scaffold = o.scaffold;
  if (o.scaffold) ec.scaffold_population = 6;
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  if (tree) fc.aggregator_ids = {100, 101};
  f.root(ec, fc);
  server::AggregatorConfig ac;
  ac.min_clients = 3;
  ac.downlink = server::Downlink::kDelta;
  ac.resparsify_density = o.resparsify_density;
  if (tree) {
    f.aggregator(100, "inproc://root", ac);
    f.aggregator(101, "inproc://root", ac);
  }
  for (uint64_t id = 0; id < 6; ++id)
    f.client(id, tree ? (id < 3 ? "inproc://agg-100" : "inproc://agg-101") : "inproc://root");
  const bool done = f.waitRootDone(std::chrono::seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  TreeRun out;
  for (uint64_t id = 0; id < 6; ++id) {
    REQUIRE(f.waitClientEnded(id, std::chrono::seconds(30)));  // told by the Shutdown
    out.update_bytes += f.stats(id).update_bytes;
    CHECK(f.stats(id).updates_sent == rounds * cz::makeCompressor(compressor)->phases());
  }
  out.records = f.records();
  out.model = f.model();
  out.control = f.control();
  return out;
}

// The tree and the flat federation apply every round with all six clients, learn, send the same
// update bytes, and end with the same model up to the order of float summation (`tolerance`,
// relative to the model's largest value).
void checkTreeEqualsFlat(const TreeRun& tree, const TreeRun& flat, uint64_t rounds,
                         double min_accuracy, double tolerance) {
  REQUIRE(tree.records.size() == rounds);
  REQUIRE(flat.records.size() == rounds);
  for (const auto* records : {&tree.records, &flat.records}) {
    for (const auto& r : *records) {
      CHECK(r.applied);
      CHECK(r.clients_completed == 6);
      REQUIRE(r.test_accuracy);
    }
    CHECK(*records->back().test_accuracy > *records->front().test_accuracy);
    CHECK(*records->back().test_accuracy > min_accuracy);
  }
  REQUIRE(tree.model.size() == flat.model.size());
  const auto [diff, scale] = starling::testing::modelDiff(flat.model, tree.model);
  CHECK(scale > 0);
  CHECK(diff <= tolerance * scale);
  CHECK(tree.update_bytes == flat.update_bytes);
  CHECK(tree.records.back().train_loss.value() ==
        Approx(flat.records.back().train_loss.value()).epsilon(tolerance));
}

}  // namespace

TEST_CASE("in process: two edge aggregators give the flat federation's model, and the model learns",
          "[integration][inproc]") {
  checkTreeEqualsFlat(runSixClients("topk:density=0.1", 3, true),
                      runSixClients("topk:density=0.1", 3, false), 3, 0.6, 1e-5);
}

// SCAFFOLD with six clients through two edge aggregators: the model and c of the flat federation up
// to the order of float sums, and far from plain FedAvg's model (round 2 on trained with c).
// It replaces the process test of the same name.
TEST_CASE("in process: SCAFFOLD through edge aggregators equals SCAFFOLD flat",
          "[integration][inproc][scaffold]") {
  const TreeRun tree = runSixClients("topk:density=0.1", 3, true, {.scaffold = true});
  const TreeRun flat = runSixClients("topk:density=0.1", 3, false, {.scaffold = true});
  checkTreeEqualsFlat(tree, flat, 3, 0.6, 1e-5);
  const auto [cdiff, cscale] = starling::testing::modelDiff(flat.control, tree.control);
  CHECK(cscale > 0);
  CHECK(cdiff <= 1e-5 * cscale);
  const TreeRun plain = runSixClients("topk:density=0.1", 3, true);
  const auto [diff, scale] = starling::testing::modelDiff(flat.model, tree.model);
  CHECK(starling::testing::modelDiff(plain.model, tree.model).diff >
        100 * std::max(diff, 1e-7 * scale));
}

// gTop-k: each aggregator sends the top 4% of each tensor of its partial and keeps the rest as its
// residual, sent in later rounds. Well under half the dense partials' bytes reach the root, and
// the model still learns. It replaces the process test of the same name.
TEST_CASE("in process: aggregators re-sparsify their partials and keep the rest as residual",
          "[integration][inproc]") {
  const TreeRun dense = runSixClients("topk:density=0.02", 4, true);
  const TreeRun sparse = runSixClients("topk:density=0.02", 4, true, {.resparsify_density = 0.04});
  uint64_t up[2] = {0, 0};
  for (int s = 0; s < 2; ++s)
    for (const auto& r : (s ? sparse : dense).records) {
      CHECK(r.applied);
      CHECK(r.clients_completed == 6);
      up[s] += r.uplink_bytes;
    }
  CHECK(sparse.update_bytes == dense.update_bytes);  // the clients send the same
  CHECK(up[1] < 0.5 * up[0]);                        // the root receives far less
  REQUIRE(sparse.records.back().test_accuracy);
  CHECK(*sparse.records.back().test_accuracy > 0.4);
  CHECK(sparse.model != dense.model);
}

// Three levels: the root, aggregator 100 serving clients 0 and 1 and aggregator 200, which serves
// clients 2 and 3. Every round counts all four clients, the model is the flat federation's up to
// the order of float sums, and the Shutdown reaches the clients two levels down. It replaces the
// process test of the same name.
TEST_CASE("in process: an aggregator under an aggregator", "[integration][inproc]") {
  const data::Dataset& train = fashion("train", 800);
  std::vector<float> models[2];
  for (const bool deep : {false, true}) {
    INFO((deep ? "three levels" : "flat"));
    InprocFederation f("logreg", train, iid(train, 4));
    server::EngineConfig ec = engineConfig(2);
    ec.sampling.min_available = deep ? 1 : 4;
    ec.sampling.min_clients = deep ? 1 : 4;
    server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
    if (deep) fc.aggregator_ids = {100};
    f.root(ec, fc);
    if (deep) {
      server::AggregatorConfig top, below;
      top.min_clients = 3;  // clients 0, 1 and aggregator 200
      below.min_clients = 2;
      f.aggregator(100, "inproc://root", top, {200});
      f.aggregator(200, "inproc://agg-100", below);
    }
    for (uint64_t id = 0; id < 4; ++id)
      f.client(id, !deep ? "inproc://root" : id < 2 ? "inproc://agg-100" : "inproc://agg-200");
    const bool done = f.waitRootDone(seconds(120));
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(done);
    const auto records = f.records();
    REQUIRE(records.size() == 2);
    for (const auto& r : records) {
      CHECK(r.applied);
      CHECK(r.clients_completed == 4);  // two direct clients and two through aggregator 200
    }
    for (uint64_t id = 0; id < 4; ++id) {
      REQUIRE(f.waitClientEnded(id, seconds(30)));  // the Shutdown travelled down
      CHECK(f.stats(id).updates_sent == 2);
    }
    models[deep] = f.model();
  }
  const auto [diff, scale] = starling::testing::modelDiff(models[0], models[1]);
  CHECK(scale > 0);
  CHECK(diff <= 1e-5 * scale);
}

TEST_CASE(
    "in process: two-phase PowerSGD and ACP-SGD through two edge aggregators give the flat model",
    "[integration][inproc]") {
  // Low-rank phases relayed by each aggregator (PowerSGD: P, then Q, in every round; ACP-SGD:
  // one factor per round, alternating), the factors' sums and the orthogonalisation between them
  // the same as flat up to float rounding. Each client uploads in every phase
  // (runSixClients checks rounds x phases updates). It replaces an earlier test in real processes,
  // which compared with nothing.
  for (const std::string spec : {"powersgd:rank=2", "acpsgd:rank=2"}) {
    CAPTURE(spec);
    checkTreeEqualsFlat(runSixClients(spec, 6, true), runSixClients(spec, 6, false), 6, 0.4, 1e-5);
  }
}

TEST_CASE("in process: a client gone silent is failed at net.silence_ms, on the federation's clock",
          "[integration][inproc]") {
  const data::Dataset& train = fashion("train", 800);
  InprocFederation f("logreg", train, iid(train, 4));
  server::EngineConfig ec = engineConfig(2);
  ec.sampling.min_available = 4;  // round 1 waits for every client
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.silence_ms = 120'000;  // two minutes: the test would time out waiting for it in real time
  f.root(ec, fc);
  client::RuntimeConfig rc;
  rc.server_silence_ms = 3'600'000;  // the clients do not take the jump for a silent server
  for (uint64_t id = 0; id < 3; ++id) f.client(id, "inproc://root", rc);
  // Client 3's every fit first waits 100 ms of the clock's time. The test moves the clock 5 ms at
  // a time until round 1 ends, then no more until client 3 is stopped: its fit in round 2 (which
  // starts at once) cannot finish first, however the threads run. Without the wait it could, and
  // round 2 then completed with four clients.
  f.client(3, "inproc://root", rc, {}, std::chrono::milliseconds(100));
  REQUIRE(f.fastForward(f.roundsDone(1), std::chrono::milliseconds(5), seconds(60)));
  CHECK(f.records()[0].clients_completed == 4);
  f.stopClient(3);  // its socket closes while it holds round 2's task: the root hears no more
  // Just short of the silence: the others heartbeat every 100 ms and stay well inside it; client 3
  // crosses it within about half a second of real time, or at the next advance when a message of
  // its the root took after this one restarted its silence there.
  bool second = false;
  for (int i = 0; i < 6 && !second; ++i) {
    f.clock().advance(std::chrono::milliseconds(119'500));
    second = f.waitRounds(2, seconds(10));
  }
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(second);
  const server::RoundRecord r = f.records()[1];
  CHECK(r.applied);
  CHECK(r.clients_completed == 3);
  CHECK(r.clients_selected - r.clients_completed == r.clients_failed);
}

TEST_CASE(
    "in process: a root stopped mid-run and restarted from its checkpoint loses no round, and "
    "each client registers again once",
    "[integration][inproc]") {
  const data::Dataset& train = fashion("train", 900);
  starling::testing::TempDir dir("inproc-restart");
  InprocFederation f("logreg", train, iid(train, 3));
  server::EngineConfig ec = engineConfig(5);
  ec.sampling.min_available = 3;
  ec.sampling.min_clients = 3;
  ec.completion.min_results = 3;
  ec.checkpoint = (dir.path / "root.ckpt").string();
  // On loopback TCP: the clients reconnect to the restarted root as they would across machines.
  f.root(ec, InprocFederation::fleetConfig("tcp://127.0.0.1:*"));
  const std::string endpoint = f.rootEndpoint();
  for (uint64_t id = 0; id < 3; ++id) f.client(id, endpoint);
  REQUIRE(f.waitRounds(2, seconds(60)));
  f.stopRoot();
  const size_t before = f.records().size();
  // The outage: the root stays down while every client sends ten more heartbeats (a second of the
  // clock's time, moved on at 5x), which its socket queues for the root to come back to.
  std::vector<std::function<bool()>> queued;
  for (uint64_t id = 0; id < 3; ++id)
    queued.push_back(f.heartbeatsSent(id, f.liveStats(id).heartbeats + 10));
  const bool outage = f.fastForward(
      [&] { return std::all_of(queued.begin(), queued.end(), [](const auto& q) { return q(); }); },
      std::chrono::milliseconds(100), seconds(60));
  REQUIRE(outage);
  f.root(ec,
         InprocFederation::fleetConfig(endpoint));  // the same port; resumes from the checkpoint
  const bool done = f.waitRootDone(seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const auto records = f.records();
  REQUIRE(records.size() == 5);  // every round once: none lost, none run twice
  for (size_t i = 0; i < records.size(); ++i) {
    CHECK(records[i].round == i + 1);
    CHECK(records[i].applied);
  }
  CHECK(before >= 2);
  for (uint64_t id = 0; id < 3; ++id) {
    REQUIRE(f.waitClientEnded(id, seconds(30)));
    // Once at the start, once for the restarted root: the heartbeats queued during the outage
    // are answered NotRegistered together and draw one registration (no storm).
    CHECK(f.stats(id).registrations == 2);
  }
}

TEST_CASE(
    "in process: a straggler past the deadline is dropped from the round and its late update "
    "refused",
    "[integration][inproc]") {
  const data::Dataset& train = fashion("train", 600);
  InprocFederation f("logreg", train, iid(train, 3));
  server::EngineConfig ec = engineConfig(3);
  ec.sampling.min_available = 3;
  ec.sampling.min_clients = 2;
  ec.completion.min_results = 2;
  ec.round_deadline_ms = 60'000;  // a minute of the federation's clock
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.silence_ms = 36'000'000;  // nobody goes silent while the clock runs fast
  f.root(ec, fc);
  client::RuntimeConfig rc;
  rc.server_silence_ms = 36'000'000;
  f.client(0, "inproc://root", rc);
  f.client(1, "inproc://root", rc);
  // A minute and a half per task: past every deadline, into the next round.
  const SlowDevice slow{std::chrono::milliseconds(90'000), rc};
  f.client(2, "inproc://root", slow);
  // 50x: the deadline passes in about 1.2 s of real time, the prompt clients answer within a few
  // of the clock's seconds.
  const bool ended =
      f.fastForward(f.clientsEnded({0, 1, 2}), std::chrono::seconds(1), std::chrono::seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(ended);
  const auto records = f.records();
  REQUIRE(records.size() == 3);
  CHECK(records[0].applied);
  CHECK(records[0].clients_completed == 2);
  CHECK(records[0].clients_failed == 1);
  // Its round-1 update reached the root in a later round and was refused (as late: the root
  // remembers its last tasks' nonces); the straggler was told.
  uint64_t refused = 0;
  for (const auto& r : records) refused += r.updates_rejected;
  CHECK(refused >= 1);
  CHECK(f.stats(2).rejects >= 1);
  CHECK(f.stats(2).updates_sent >= 1);
  CHECK(f.stats(0).rejects == 0);
}

// SCAFFOLD's commit on acknowledgement: a straggler whose update is refused as late every round
// computes c_i+ each time and never commits it, so the root's c stays the mean of the clients'
// c_i (N = 3, the straggler's zeros included); the prompt clients commit each round's c_i+ when
// their next task acknowledges it, through an edge aggregator too. Without it the straggler's
// c_i would hold three uncounted changes.
TEST_CASE(
    "in process: SCAFFOLD keeps c the mean of the c_i when a client's update is refused as late",
    "[integration][inproc][scaffold]") {
  const data::Dataset& train = fashion("train", 600);
  for (const bool tree : {false, true}) {
    INFO((tree ? "behind an edge aggregator" : "flat"));
    InprocFederation f("logreg", train, iid(train, 3));
    server::EngineConfig ec = engineConfig(3);
    ec.scheme.scaffold = true;
    ec.scaffold_population = 3;
    ec.sampling.min_available = tree ? 1 : 3;
    ec.sampling.min_clients = tree ? 1 : 2;
    ec.completion.min_results = tree ? 1 : 2;
    ec.round_deadline_ms = 60'000;
    server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
    fc.silence_ms = 36'000'000;
    if (tree) fc.aggregator_ids = {100};
    f.root(ec, fc);
    if (tree) {
      server::AggregatorConfig ac;
      ac.upstream_silence_ms = 36'000'000;  // it waits out the straggler while the clock runs fast
      ac.min_clients = 3;                   // registers upstream with all three
      f.aggregator(100, "inproc://root", ac, {},
                   36'000'000);  // no one goes silent on the fast clock
    }
    const std::string at = tree ? "inproc://agg-100" : "inproc://root";
    client::RuntimeConfig rc;
    rc.server_silence_ms = 36'000'000;
    f.client(0, at, rc);
    f.client(1, at, rc);
    const SlowDevice slow{std::chrono::milliseconds(90'000),
                          rc};  // past every deadline (the aggregator's too)
    f.client(2, at, slow);
    const bool ended = f.fastForward(f.clientsEnded({0, 1, 2}), std::chrono::seconds(1),
                                     std::chrono::seconds(120));
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(ended);
    const auto records = f.records();
    REQUIRE(records.size() == 3);
    for (const auto& r : records) {
      CHECK(r.applied);
      CHECK(r.clients_completed ==
            2);  // the prompt two, every round: the premise of the mean below
    }
    const std::vector<float> c = f.control();
    REQUIRE(!c.empty());

    ClientState s2 = f.clientState(2);
    const auto* straggler = s2.find<client::ControlVariateState>(client::kControlVariate);
    REQUIRE(straggler != nullptr);
    CHECK(straggler->values.empty());    // nothing of its own was ever counted, nothing committed
    CHECK(!straggler->pending.empty());  // though it computed c_i+

    std::vector<double> mean(c.size(), 0.0);
    for (uint64_t id : {0, 1}) {
      ClientState s = f.clientState(id);
      const auto* cv = s.find<client::ControlVariateState>(client::kControlVariate);
      REQUIRE(cv != nullptr);
      CHECK(cv->pending_round == 3);  // the last round's, counted, its acknowledgement never sent
      CHECK(cv->values.size() == c.size());  // round 2's c_i+, committed on round 3's task
      REQUIRE(cv->pending.size() == c.size());
      for (size_t i = 0; i < c.size(); ++i) mean[i] += cv->pending[i] / 3.0;
    }
    double top = 0.0, diff = 0.0;
    for (size_t i = 0; i < c.size(); ++i) {
      top = std::max(top, std::abs(mean[i]));
      diff = std::max(diff, std::abs(mean[i] - c[i]));
    }
    CHECK(top > 0.0);
    CHECK(diff <= 1e-5 * top);
  }
}

namespace {

// A root played by the test, for an edge aggregator on inproc://scripted-root: it welcomes the
// aggregator and sends it the tasks the test writes.
struct ScriptedRoot {
  transport::ServerSocket socket;
  std::string peer;  // the aggregator's routing id, once it registered
  std::shared_ptr<const ParamLayout> layout;
  server::ModelStore model;

  ScriptedRoot(InprocFederation& f, const client::Trainer& trainer)
      : socket(f.context(), "inproc://scripted-root", insecure()),
        layout(std::make_shared<const ParamLayout>(trainer.layout())),
        model(layout, 0) {
    std::vector<float> init(layout->numel());
    trainer.initParameters(init, 5);
    model.set(init, 1);
  }
  static transport::SecurityConfig insecure() {
    transport::SecurityConfig s;
    s.insecure = true;
    return s;
  }
  // A fit task of `round` (SCAFFOLD's when `control` is given), with `nonce`; `secure`: a secure
  // round's (its update masked with the shares sent before it); `phase`: its phase (the model
  // travels with phase 0 only).
  std::vector<uint8_t> task(uint64_t round, uint64_t nonce, std::vector<float> control = {},
                            std::optional<uint64_t> ack = std::nullopt, bool secure = false,
                            uint32_t phase = 0) const {
    protocol::TaskMsg h;
    h.secure = secure;
    h.phase = phase;
    h.round = round;
    h.run_seed = 5;
    h.compressor = "none";
    h.model_version = 1;
    h.fit = protocol::FitSettings{1, 16, 0.1f, 0.0f};
    h.deadline_ms = 600'000;
    h.control = std::move(control);
    h.control_ack = ack;
    const compression::PhaseBroadcast b{5, round, phase, nullptr};
    return server::encodeTask(server::PhaseTask{b, h, model, server::Downlink::kDense}, 0, nonce);
  }
  // Sends `task` (once the aggregator registered) and returns the next partial (empty after a
  // minute without one).
  std::vector<uint8_t> exchange(const std::vector<uint8_t>& task) {
    const auto give_up = std::chrono::steady_clock::now() + seconds(60);
    bool sent = false;
    while (std::chrono::steady_clock::now() < give_up) {
      if (!sent && !peer.empty()) sent = socket.send(peer, task);
      auto r = socket.receive(std::chrono::milliseconds(50));
      if (!r || r->error) continue;
      const auto kind = protocol::peekKind(r->bytes());
      if (kind == protocol::MessageKind::kRegister) {
        peer = r->peer;
        socket.send(peer,
                    protocol::encode(protocol::WelcomeMsg{100, 77, 100, 64u << 20, 1u << 20}));
      } else if (kind == protocol::MessageKind::kPartial && sent) {
        return std::vector<uint8_t>(r->bytes().begin(), r->bytes().end());
      }
    }
    return {};
  }
  // The next message of `kind` from the peer (a registration is welcomed on the way); empty
  // after a minute without one.
  std::vector<uint8_t> next(protocol::MessageKind kind) {
    const auto give_up = std::chrono::steady_clock::now() + seconds(60);
    while (std::chrono::steady_clock::now() < give_up) {
      auto r = socket.receive(std::chrono::milliseconds(50));
      if (!r || r->error) continue;
      const auto k = protocol::peekKind(r->bytes());
      if (k == protocol::MessageKind::kRegister) {
        peer = r->peer;
        socket.send(peer,
                    protocol::encode(protocol::WelcomeMsg{100, 77, 100, 64u << 20, 1u << 20}));
      }
      if (k == kind) return std::vector<uint8_t>(r->bytes().begin(), r->bytes().end());
    }
    return {};
  }
  void shutdown() { socket.send(peer, protocol::encode(protocol::ShutdownMsg{0, "test over"})); }
  // Aggregator 100 below this root, and client 0 below it.
  static void aggregatorWithOneClient(InprocFederation& f) {
    server::AggregatorConfig ac;
    ac.min_clients = 1;
    f.aggregator(100, "inproc://scripted-root", ac);
    f.client(0, "inproc://agg-100");
  }
};

}  // namespace

// A secure round of two-phase PowerSGD has an exchange per phase; a client masks what its task's
// phase sends with the shares of that phase's exchange only. A root that sends a phase-1 task
// against the shares of a phase-0 setup is refused with kRoundMismatch: nothing trained or sent.
TEST_CASE(
    "in process: a client refuses a secure task of another phase than its shares' exchange, and "
    "trains nothing",
    "[integration][inproc][secagg]") {
  const data::Dataset& train = fashion("train", 400);
  InprocFederation f("logreg", train, iid(train, 1));
  auto trainer = client::makeTrainer("logreg", train);
  ScriptedRoot root(f, *trainer);
  f.client(0, "inproc://scripted-root");
  REQUIRE(!root.next(protocol::MessageKind::kRegister).empty());
  // Round 1's phase-0 exchange among client 0 and two clients the test plays.
  const std::vector<uint64_t> ids{0, 1, 2};
  server::SecureRound sr(server::SecAggConfig{true, 0, 0, 32, 1.0, {}}.paramsFor(
                             5, 1, ids.size(), root.layout->numel()),
                         ids);
  std::map<uint64_t, client::SecureParty> others;
  others.try_emplace(1, 1);
  others.try_emplace(2, 2);
  using server::SecureStage;
  for (const SecureStage st : {SecureStage::kAdvertise, SecureStage::kShareKeys}) {
    for (uint64_t c : ids) {
      const std::vector<uint8_t> req = sr.request(st, c);
      std::vector<uint8_t> ans;
      if (c == 0) {
        REQUIRE(root.socket.send(root.peer, req));
        ans = root.next(server::answerKind(st));
        INFO(f.error() << "\n" << f.logs());
        REQUIRE(!ans.empty());
      } else {
        ans = st == SecureStage::kAdvertise ? others.at(c).setup(req) : others.at(c).shareKeys(req);
      }
      sr.reply(st, c, ans);
    }
  }
  // Client 0's shares, then a secure task of phase 1.
  REQUIRE(root.socket.send(root.peer, sr.request(SecureStage::kMaskedInput, 0)));
  REQUIRE(root.socket.send(root.peer, root.task(1, 0x5eed, {}, std::nullopt, true, 1)));
  const std::vector<uint8_t> reject = root.next(protocol::MessageKind::kReject);
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(!reject.empty());
  const protocol::RejectMsg r = protocol::decodeReject(reject);
  CHECK(r.code == static_cast<uint32_t>(Errc::kRoundMismatch));
  CHECK(r.message.find("phase") != std::string::npos);
  root.shutdown();
  REQUIRE(f.waitClientEnded(0, seconds(30)));
  CHECK(f.stats(0).updates_sent == 0);
}

// A root resends a pending task when a registration crosses it (the aggregator's registration
// retry fired before the Welcome came). The aggregator answers the same task again with the same
// partial; running the phase again would cost it a whole deadline and the next round.
TEST_CASE("in process: an edge aggregator answers a task it already answered with the same partial",
          "[integration][inproc]") {
  const data::Dataset& train = fashion("train", 400);
  InprocFederation f("logreg", train, iid(train, 1));
  auto trainer = client::makeTrainer("logreg", train);
  ScriptedRoot root(f, *trainer);
  root.aggregatorWithOneClient(f);
  const std::vector<uint8_t> task = root.task(1, 0x5eed);
  const std::vector<uint8_t> first = root.exchange(task);
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(!first.empty());
  const std::vector<uint8_t> second = root.exchange(task);  // the same task again, the same nonce
  REQUIRE(!second.empty());
  CHECK(second == first);
  root.shutdown();
  REQUIRE(f.waitClientEnded(0, seconds(30)));
  CHECK(f.stats(0).tasks == 1);  // the phase ran once: the client trained once
  CHECK(f.stats(0).updates_sent == 1);
}

// The edge aggregator relays SCAFFOLD's acknowledgements: a partial the root did not count leaves
// its clients unacknowledged (they drop that round's c_i+), one it counted acknowledges them.
TEST_CASE(
    "in process: an edge aggregator acknowledges its clients' control changes as the root does",
    "[integration][inproc][scaffold]") {
  const data::Dataset& train = fashion("train", 400);
  InprocFederation f("logreg", train, iid(train, 1));
  auto trainer = client::makeTrainer("logreg", train);
  ScriptedRoot root(f, *trainer);
  root.aggregatorWithOneClient(f);
  const std::vector<float> c(root.layout->numel(), 0.01f);
  protocol::Decoder decoder(*root.layout);
  const auto control_of = [&](const std::vector<uint8_t>& partial) {
    REQUIRE(!partial.empty());
    const auto& v = decoder.decodePartial(partial);
    return std::vector<float>(v.control.begin(), v.control.end());
  };
  // Round 1; round 2 says round 1 was not counted; round 3 says round 2 was.
  const std::vector<float> d1 = control_of(root.exchange(root.task(1, 11, c, 0)));
  INFO(f.error() << "\n" << f.logs());
  const std::vector<float> d2 = control_of(root.exchange(root.task(2, 12, c, 0)));
  const std::vector<float> d3 = control_of(root.exchange(root.task(3, 13, c, 2)));
  root.shutdown();
  REQUIRE(f.waitClientEnded(0, seconds(30)));
  // Round 2 trained with c_i = 0 (round 1's dropped): c_i+ = d2. Round 3 committed it.
  ClientState s = f.clientState(0);
  const auto* cv = s.find<client::ControlVariateState>(client::kControlVariate);
  REQUIRE(cv != nullptr);
  CHECK(cv->values == d2);
  CHECK(cv->pending_round == 3);
  REQUIRE(cv->pending.size() == d3.size());
  for (size_t i = 0; i < d3.size(); ++i) CHECK(cv->pending[i] == d2[i] + d3[i]);
  CHECK(d1 != d2);  // c_i = 0 both times, other rounds' streams: another result
}

// SCAFFOLD deployed equals SCAFFOLD run by the engine over the codecs in process
// (tests/server/inproc_fleet.h, which the simulator's one-worker run equals bit for bit): the
// real client runtime, fleet and edge aggregator change no bit of the model or of c where no sum
// depends on arrival order, one client flat and one client behind an edge aggregator.
TEST_CASE(
    "in process: SCAFFOLD deployed gives the model and control variate of the engine over the "
    "codecs, bit for bit",
    "[integration][inproc][scaffold]") {
  const data::Dataset& train = fashion("train", 400);
  const std::vector<std::vector<size_t>> shards = iid(train, 1);
  server::EngineConfig ec = engineConfig(3);
  ec.scheme.compressor = "none";
  ec.scheme.scaffold = true;
  ec.downlink = server::Downlink::kDense;

  auto trainer = client::makeTrainer("logreg", train);
  const auto layout = std::make_shared<const ParamLayout>(trainer->layout());
  std::vector<float> init(layout->numel());
  trainer->initParameters(init, ec.scheme.run_seed);
  starling::testing::InProcFleet reference(*trainer, train, shards);
  server::RoundEngine engine(layout, ec, init);
  while (!engine.done()) REQUIRE(engine.runRound(reference).applied);
  const auto m = engine.model().current();
  const std::vector<float> ref_model(m.begin(), m.end()), ref_control = engine.control();
  REQUIRE(ref_control.size() == ref_model.size());
  CHECK(std::any_of(ref_control.begin(), ref_control.end(), [](float v) { return v != 0.0f; }));

  for (const bool tree : {false, true}) {
    INFO((tree ? "behind an edge aggregator" : "flat"));
    InprocFederation f("logreg", train, shards);
    server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
    server::EngineConfig e = ec;
    if (tree) {
      fc.aggregator_ids = {100};
      e.scaffold_population = 1;  // N counts clients, not the aggregator
    }
    f.root(e, fc);
    if (tree) f.aggregator(100, "inproc://root");
    f.client(0, tree ? "inproc://agg-100" : "inproc://root");
    const bool done = f.waitRootDone(seconds(60));
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(done);
    CHECK(f.model() == ref_model);
    CHECK(f.control() == ref_control);
  }
}

namespace {

// The root's asynchronous rounds (server/async_root.h) with top-k 10% and error feedback, the
// delta downlink, K updates per step.
server::AsyncServerConfig asyncServerConfig(uint64_t k, uint64_t max_staleness) {
  server::AsyncServerConfig sc;
  sc.scheme.compressor = "topk:density=0.1";
  sc.scheme.run_seed = 5;
  sc.async = aggregation::AsyncOptions{k, max_staleness, "polynomial:a=0.5"};
  sc.downlink = server::Downlink::kDelta;
  return sc;
}

server::AsyncRootConfig asyncRootConfig(uint64_t steps, size_t concurrency, size_t min_available) {
  server::AsyncRootConfig rc;
  rc.steps = steps;
  rc.fleet.concurrency = concurrency;
  rc.fleet.min_available = min_available;
  rc.fleet.task_deadline_ms = 600'000;
  rc.fit = protocol::FitSettings{1, 16, 0.1f, 0.0f};
  return rc;
}

double metricOf(const server::RoundRecord& r, const char* name) {
  const auto it = r.metrics.find(name);
  return it == r.metrics.end() ? -1.0 : it->second;
}

// A peer that speaks the protocol by hand to the root on inproc://root (a liar): registers as
// `id` with `role` and `examples`, heartbeats while it waits, and keeps the Rejects it gets.
struct ByHand {
  ByHand(InprocFederation& f, std::shared_ptr<const ParamLayout> layout, uint64_t id,
         uint64_t examples, protocol::Role role)
      : f_(f),
        layout_(std::move(layout)),
        id_(id),
        sock_(f.context(), "inproc://root", insecure(), transport::TransportLimits{}) {
    protocol::RegisterMsg reg;
    reg.client_id = id;
    reg.role = role;
    reg.layout_fingerprint = layout_->fingerprint();
    reg.num_examples = examples;
    REQUIRE(sock_.send(protocol::encode(reg)));
  }
  static transport::SecurityConfig insecure() {
    transport::SecurityConfig s;
    s.insecure = true;
    return s;
  }
  // The next secure-aggregation setup the root sends it (nullopt after `timeout`).
  std::optional<protocol::SecAggSetupMsg> awaitSetup(std::chrono::milliseconds timeout) {
    std::optional<protocol::SecAggSetupMsg> setup;
    pump(timeout, [&](protocol::MessageKind k, std::span<const uint8_t> b) {
      if (k != protocol::MessageKind::kSecAggSetup) return false;
      setup = protocol::decodeSecAggSetup(b);
      return true;
    });
    return setup;
  }
  // Receives (heartbeating) until `stop` says so or `timeout`; whether it stopped.
  bool pump(std::chrono::milliseconds timeout,
            const std::function<bool(protocol::MessageKind, std::span<const uint8_t>)>& stop) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    auto beat = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() < until) {
      if (session_ && std::chrono::steady_clock::now() >= beat) {
        sock_.send(protocol::encode(protocol::HeartbeatMsg{id_, session_, 0}));
        beat += std::chrono::milliseconds(100);
      }
      auto r = sock_.receive(std::chrono::milliseconds(20));
      if (!r || r->error) continue;
      const auto kind = protocol::peekKind(r->bytes());
      if (!kind) continue;
      if (*kind == protocol::MessageKind::kWelcome)
        session_ = protocol::decodeWelcome(r->bytes()).session;
      if (*kind == protocol::MessageKind::kReject)
        rejects_.push_back(protocol::decodeReject(r->bytes()));
      if (stop && stop(*kind, r->bytes())) return true;
    }
    return false;
  }
  protocol::TaskMsg nextTask() {
    protocol::TaskMsg t;
    const bool got = pump(seconds(30), [&](protocol::MessageKind k, std::span<const uint8_t> b) {
      if (k != protocol::MessageKind::kTask) return false;
      t = protocol::decodeTask(b, *layout_);
      return true;
    });
    INFO(f_.error() << "\n" << f_.logs());
    REQUIRE(got);
    return t;
  }
  // Sends `bytes` and reads nothing.
  void send(const std::vector<uint8_t>& bytes) { REQUIRE(sock_.send(bytes)); }
  // What the root answers to `bytes`: the Reject's code, or nullopt when none came in 500 ms.
  std::optional<Errc> answer(const std::vector<uint8_t>& bytes) {
    const size_t before = rejects_.size();
    sock_.send(bytes);
    pump(std::chrono::milliseconds(500),
         [&](protocol::MessageKind k, auto) { return k == protocol::MessageKind::kReject; });
    if (rejects_.size() == before) return std::nullopt;
    return static_cast<Errc>(rejects_.back().code);
  }
  // A dense update answering `t`, every value `value`, claiming `round` and client `id`.
  std::vector<uint8_t> update(const protocol::TaskMsg& t, uint64_t round, uint64_t id,
                              uint64_t examples, float value) const {
    return protocol::encodeUpdate(denseUpdate(t.nonce, round, id, examples, value));
  }
  // A partial aggregate answering `t` (compressor none), claiming `round`: `count` updates of
  // `examples` each, every value `value`.
  std::vector<uint8_t> partial(const protocol::TaskMsg& t, uint64_t round, uint64_t count,
                               uint64_t examples, float value) const {
    aggregation::RoundSchemeOptions o;
    o.compressor = "none";
    o.run_seed = 5;
    const aggregation::RoundScheme scheme(layout_, o);
    auto agg = scheme.phaseAggregator(compression::PhaseBroadcast{5, t.round, 0, nullptr});
    for (uint64_t c = 0; c < count; ++c)
      agg->add(compression::view(
          denseUpdate(0, t.round, 1000 + c, examples, std::isfinite(value) ? value : 0.0f)));
    compression::PartialMessage pm = agg->partial().exportDense();
    if (!std::isfinite(value)) std::get<compression::DenseF32>(pm.tensors[0]).values[0] = value;
    pm.header.nonce = t.nonce;
    pm.header.round = round;
    return protocol::encodePartial(pm);
  }

 private:
  compression::Update denseUpdate(uint64_t nonce, uint64_t round, uint64_t id, uint64_t examples,
                                  float value) const {
    compression::Update u;
    u.header = {layout_->fingerprint(), round, 0, id, examples};
    u.header.nonce = nonce;
    for (const auto& spec : layout_->tensors())
      u.tensors.push_back(compression::DenseF32{std::vector<float>(spec.numel, value)});
    return u;
  }
  InprocFederation& f_;
  std::shared_ptr<const ParamLayout> layout_;
  uint64_t id_;
  transport::ClientSocket sock_;
  uint64_t session_ = 0;
  std::vector<protocol::RejectMsg> rejects_;
};

// Starts the asynchronous root on a tcp port (a restarted root must listen on tcp) with clients 0
// and 1, which answer their version-1 tasks at once, and client 2, which trains for ever; stops
// the root once its buffer (and checkpoint) holds their two updates, and gives its endpoint. A
// FedBuff step needs K = 3 and a semi-synchronous round ends only on the federation's clock, which
// stands still here: the buffer holds exactly two until the stop, nothing races it.
std::string stopWithTwoBuffered(InprocFederation& f, const server::AsyncServerConfig& sc,
                                const server::AsyncRootConfig& rc, server::FleetConfig fc) {
  fc.bind = "tcp://127.0.0.1:*";
  f.asyncRoot(sc, rc, fc);
  const std::string endpoint = f.rootEndpoint();
  const SlowDevice stuck{std::chrono::milliseconds(1'000'000'000)};
  f.client(0, endpoint);
  f.client(1, endpoint);
  f.client(2, endpoint, stuck);
  const bool two = f.waitFor(f.buffered(2), seconds(60));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(two);
  f.stopRoot();
  return endpoint;
}

}  // namespace

TEST_CASE(
    "in process: the root's asynchronous rounds step every K updates from clients training at "
    "once, weigh the stale ones, and learn",
    "[integration][inproc][async]") {
  const data::Dataset& train = fashion("train", 1200);
  // Four clients train at once and a step takes three: the fourth update of each wave lands on a
  // newer version than it trained from. The four fits in flight finish together (FitWaves), so
  // that a client whose thread waits for a core under load cannot be overtaken by the others'
  // next fits and come back more stale than the bound. Declared first: it outlives the clients.
  starling::testing::FitWaves waves(4);
  InprocFederation f("logreg", train, iid(train, 6));
  f.asyncRoot(asyncServerConfig(3, 4), asyncRootConfig(8, 4, 6));
  for (uint64_t id = 0; id < 6; ++id) f.client(id, "inproc://root", {}, {}, {}, &waves);
  const bool done = f.waitRootDone(seconds(120));
  waves.open();
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const auto records = f.records();
  REQUIRE(records.size() == 8);
  double stale_steps = 0;
  uint64_t tasks = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(records[i].round == i + 1);
    CHECK(records[i].applied);
    CHECK(records[i].model_version == i + 2);
    CHECK(records[i].clients_completed == 3);
    CHECK(records[i].updates_rejected == 0);
    CHECK(metricOf(records[i], "staleness_max") <= 4);
    CHECK(records[i].uplink_bytes > 0);
    stale_steps += metricOf(records[i], "staleness_max") >= 1 ? 1 : 0;
    tasks += records[i].clients_selected;
  }
  CHECK(stale_steps >= 1);
  CHECK(waves.waves() >= 6);  // 24 updates, four a wave
  CHECK(tasks >= 8 * 3);
  CHECK(records.back().train_loss.value() < records.front().train_loss.value());
  uint64_t sent = 0;
  for (uint64_t id = 0; id < 6; ++id) {
    REQUIRE(f.waitClientEnded(id, seconds(30)));  // told by the Shutdown
    sent += f.stats(id).updates_sent;
  }
  CHECK(sent >= 8 * 3);
}

TEST_CASE(
    "in process: an asynchronous root stopped and restarted resumes with the updates it had "
    "buffered, and takes every step once",
    "[integration][inproc][async]") {
  const data::Dataset& train = fashion("train", 1200);
  starling::testing::TempDir dir("inproc-async-restart");
  InprocFederation f("logreg", train, iid(train, 4));
  const server::AsyncServerConfig sc = asyncServerConfig(3, 10);
  server::AsyncRootConfig rc = asyncRootConfig(4, 4, 3);
  rc.checkpoint = (dir.path / "root.ckpt").string();
  const std::string endpoint =
      stopWithTwoBuffered(f, sc, rc, InprocFederation::fleetConfig("inproc://root"));
  // The checkpoint is written at steps: it holds none of the two; they are in the journal beside
  // it, which the restarted root adds again.
  auto trainer = client::makeTrainer("logreg", train);
  auto layout = std::make_shared<const ParamLayout>(trainer->layout());
  server::AsyncServer saved(layout, sc, std::vector<float>(layout->numel()));
  saved.loadCheckpoint(rc.checkpoint);
  CHECK(saved.steps() == 0);
  CHECK(saved.buffered() == 0);
  CHECK(std::filesystem::file_size(rc.checkpoint + ".journal") > 2 * layout->numel() / 10);
  // Restarted from the checkpoint, with client 3 joining: its version-1 update is the third.
  f.asyncRoot(sc, rc, InprocFederation::fleetConfig(endpoint));
  f.client(3, endpoint);
  const bool done = f.waitRootDone(seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  REQUIRE(f.resumedBuffered().has_value());
  CHECK(*f.resumedBuffered() == 2);
  const auto records = f.records();
  REQUIRE(records.size() == 4);  // every step once: none lost, none taken twice
  for (size_t i = 0; i < records.size(); ++i) {
    CHECK(records[i].round == i + 1);
    CHECK(records[i].applied);
    CHECK(records[i].clients_completed == 3);
  }
  for (uint64_t id : {0, 1, 3}) REQUIRE(f.waitClientEnded(id, seconds(30)));
}

TEST_CASE(
    "in process: a client that lies to the asynchronous root about its version, its id, its "
    "weight or its values, or replays, is refused with the code of each lie, and the run goes on",
    "[integration][inproc][async][attack]") {
  const data::Dataset& train = fashion("train", 900);
  InprocFederation f("logreg", train, iid(train, 2));
  server::AsyncServerConfig sc = asyncServerConfig(2, 10);
  sc.scheme.compressor = "none";  // the liar's dense updates are the compressor's encoding
  f.asyncRoot(sc, asyncRootConfig(10, 3, 3));
  const SlowDevice slow{std::chrono::milliseconds(300)};
  for (uint64_t id = 0; id < 2; ++id) f.client(id, "inproc://root", slow);

  // The liar: client 9, registered with 100 examples, speaking the protocol by hand.
  const auto layout =
      std::make_shared<const ParamLayout>(client::makeTrainer("logreg", train)->layout());
  ByHand liar(f, layout, 9, 100, protocol::Role::kClient);
  const auto nextTask = [&] { return liar.nextTask(); };
  const auto answer = [&](const std::vector<uint8_t>& bytes) { return liar.answer(bytes); };
  const auto update = [&](const protocol::TaskMsg& t, uint64_t round, uint64_t id,
                          uint64_t examples,
                          float value) { return liar.update(t, round, id, examples, value); };

  // A newer version than its task's (less staleness discount): refused, the task closed.
  protocol::TaskMsg t = nextTask();
  CHECK(t.round == t.model_version);
  CHECK(answer(update(t, t.round + 1, 9, 100, 0.0f)) == Errc::kWrongRound);
  // Another client's id; then a NaN, which closes the task.
  t = nextTask();
  CHECK(answer(update(t, t.round, 0, 100, 0.0f)) == Errc::kWrongSender);
  CHECK(answer(update(t, t.round, 9, 100, std::numeric_limits<float>::quiet_NaN())) ==
        Errc::kNonFinite);
  // A partial aggregate from a client (the task stays open); then ten times the examples it
  // registered.
  t = nextTask();
  CHECK(answer(liar.partial(t, t.round, 1, 100, 0.0f)) == Errc::kWrongSender);
  CHECK(answer(update(t, t.round, 9, 1000, 0.0f)) == Errc::kBadWeight);
  // An honest update is taken; sent again, it is a duplicate (its own code: not "late", which
  // says the task's phase closed before it came).
  t = nextTask();
  const std::vector<uint8_t> honest = update(t, t.round, 9, 100, 0.0f);
  CHECK_FALSE(answer(honest).has_value());
  CHECK(answer(honest) == Errc::kDuplicate);

  const bool done = f.waitRootDone(seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const auto records = f.records();
  REQUIRE(records.size() == 10);
  uint64_t rejected = 0;
  for (const auto& r : records) {
    CHECK(r.applied);
    rejected += r.updates_rejected;
  }
  CHECK(rejected == 2);  // the NaN and the weight: the buffer's refusals (the rest, the fleet's)
  const std::vector<float> model = f.model();
  CHECK(std::all_of(model.begin(), model.end(), [](float x) { return std::isfinite(x); }));
}

namespace {

// FedBuff with K = 4 over four clients, three steps: flat (four tasks at once, each client on the
// root) or through one edge aggregator (one task at a time: the aggregator relays it to its four
// clients and answers with their partial). The records and the root's model.
std::pair<std::vector<server::RoundRecord>, std::vector<float>> fedBuffOfFour(bool tree) {
  const data::Dataset& train = fashion("train", 1200);
  InprocFederation f("logreg", train, iid(train, 4));
  server::AsyncRootConfig rc = asyncRootConfig(3, tree ? 1 : 4, tree ? 1 : 4);
  rc.aggregators = tree;
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  if (tree) fc.aggregator_ids = {100};
  f.asyncRoot(asyncServerConfig(4, 4), rc, fc);
  server::AggregatorConfig ac;
  ac.min_clients = 4;
  ac.downlink = server::Downlink::kDelta;
  if (tree) f.aggregator(100, "inproc://root", ac);
  for (uint64_t id = 0; id < 4; ++id) f.client(id, tree ? "inproc://agg-100" : "inproc://root");
  const bool done = f.waitRootDone(seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  for (uint64_t id = 0; id < 4; ++id) {
    REQUIRE(f.waitClientEnded(id, seconds(30)));  // the Shutdown relayed
    CHECK(f.stats(id).updates_sent == 3);
  }
  return {f.records(), f.model()};
}

}  // namespace

TEST_CASE(
    "in process: FedBuff through an edge aggregator gives the flat federation's model, and learns",
    "[integration][inproc][async]") {
  const auto [tree, tree_model] = fedBuffOfFour(true);
  const auto [flat, flat_model] = fedBuffOfFour(false);
  for (const auto* records : {&tree, &flat}) {
    REQUIRE(records->size() == 3);
    for (const auto& r : *records) {
      CHECK(r.applied);
      CHECK(r.clients_completed == 4);  // through one partial of four in the tree
      CHECK(metricOf(r, "staleness_max") == 0.0);
    }
    CHECK(records->back().train_loss.value() < records->front().train_loss.value());
  }
  CHECK(tree[0].clients_selected == 1);  // one task: the aggregator's
  CHECK(flat[0].clients_selected == 4);
  const auto [diff, scale] = starling::testing::modelDiff(flat_model, tree_model);
  CHECK(scale > 0);
  CHECK(diff <= 1e-5 * scale);
}

TEST_CASE(
    "in process: semi-synchronous rounds with an edge aggregator beside clients: its late partial "
    "joins the next round, counting its updates, weighed by its staleness",
    "[integration][inproc][async]") {
  // Rounds of 10 s on the federation's clock, run fast. Clients 3 and 4 answer in 1 s; the
  // aggregator's clients 0 to 2 take a round and a half, so its partial of version v lands in
  // the middle of the next round.
  const data::Dataset& train = fashion("train", 1000);
  InprocFederation f("logreg", train, iid(train, 5));
  server::AsyncRootConfig rc = asyncRootConfig(4, 3, 3);
  rc.round_ms = 10'000;
  rc.aggregators = true;
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.aggregator_ids = {100};
  fc.silence_ms = 600'000;  // heartbeats on a fast clock: no one is failed for silence
  f.asyncRoot(asyncServerConfig(3, 10), rc, fc);
  server::AggregatorConfig ac;
  ac.min_clients = 3;
  ac.upstream_silence_ms = 600'000;
  starling::testing::TempDir dir("inproc-semisync-agg");
  ac.metrics_file = (dir.path / "agg.jsonl").string();
  f.aggregator(100, "inproc://root", ac, {}, 600'000);
  const SlowDevice quick{std::chrono::milliseconds(1000)}, late{std::chrono::milliseconds(15'000)};
  for (uint64_t id = 0; id < 5; ++id)
    f.client(id, id < 3 ? "inproc://agg-100" : "inproc://root", id < 3 ? late : quick);
  const bool done = f.fastForward(f.rootDone(), std::chrono::milliseconds(100), seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const auto records = f.records();
  REQUIRE(records.size() == 4);
  for (size_t i = 0; i < records.size(); ++i) {
    INFO("round " << i + 1);
    CHECK(records[i].applied);
    CHECK(records[i].model_version == i + 2);
    // Odd rounds: clients 3 and 4; even ones: theirs and the aggregator's partial of three, one
    // version old.
    CHECK(records[i].clients_completed == (i % 2 == 0 ? 2u : 5u));
    CHECK(metricOf(records[i], "staleness_max") == (i % 2 == 0 ? 0.0 : 1.0));
    CHECK(metricOf(records[i], "staleness_mean") == Approx(i % 2 == 0 ? 0.0 : 3.0 / 5));
    CHECK(records[i].updates_rejected == 0);
  }
  CHECK(records.back().train_loss.value() < records.front().train_loss.value());
  // The aggregator's own record: every partial it sent held its three clients' updates.
  std::ifstream in(dir.path / "agg.jsonl");
  size_t sent = 0;
  for (std::string l; std::getline(in, l); ++sent) {
    INFO(l);
    CHECK(l.rfind(R"({"aggregator":100,)", 0) == 0);
    CHECK(l.find(R"("updates":3,)") != std::string::npos);
    CHECK(l.find(R"("refused":0,)") != std::string::npos);
    CHECK(l.find(R"("sent":true})") != std::string::npos);
  }
  CHECK(sent >= 2);
}

TEST_CASE(
    "in process: an edge aggregator that lies to the asynchronous root about its version, its "
    "weight or its values, or replays, is refused with the code of each lie",
    "[integration][inproc][async][attack]") {
  const data::Dataset& train = fashion("train", 900);
  InprocFederation f("logreg", train, iid(train, 2));
  server::AsyncServerConfig sc = asyncServerConfig(2, 10);
  sc.scheme.compressor = "none";  // the liar's dense partials are the compressor's encoding
  server::AsyncRootConfig rc = asyncRootConfig(8, 3, 3);
  rc.aggregators = true;
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.aggregator_ids = {100};
  f.asyncRoot(sc, rc, fc);
  const SlowDevice slow{std::chrono::milliseconds(300)};
  for (uint64_t id = 0; id < 2; ++id) f.client(id, "inproc://root", slow);
  // The liar: aggregator 100, registered with 100 examples below it.
  const auto layout =
      std::make_shared<const ParamLayout>(client::makeTrainer("logreg", train)->layout());
  ByHand liar(f, layout, 100, 100, protocol::Role::kAggregator);
  // A newer version than its task's: refused, the task closed.
  protocol::TaskMsg t = liar.nextTask();
  CHECK(liar.answer(liar.partial(t, t.round + 1, 2, 50, 0.0f)) == Errc::kWrongRound);
  // Ten updates of 100 examples, when 100 examples registered below it.
  t = liar.nextTask();
  CHECK(liar.answer(liar.partial(t, t.round, 10, 100, 0.0f)) == Errc::kBadWeight);
  // A NaN in its sum.
  t = liar.nextTask();
  CHECK(liar.answer(liar.partial(t, t.round, 2, 50, std::numeric_limits<float>::quiet_NaN())) ==
        Errc::kNonFinite);
  // An honest partial of two updates is taken; sent again, it is a duplicate.
  t = liar.nextTask();
  const std::vector<uint8_t> honest = liar.partial(t, t.round, 2, 50, 0.0f);
  CHECK_FALSE(liar.answer(honest).has_value());
  CHECK(liar.answer(honest) == Errc::kDuplicate);

  const bool done = f.waitRootDone(seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const auto records = f.records();
  REQUIRE(records.size() == 8);
  uint64_t rejected = 0;
  for (const auto& r : records) {
    CHECK(r.applied);
    rejected += r.updates_rejected;
  }
  CHECK(rejected == 1);  // the NaN: the buffer's refusal (the rest, the fleet's)
  // The tasks that failed: the two refused before the buffer (another version's, over its weight);
  // the NaN reached the buffer and is its refusal, not a failure.
  uint64_t failed = 0;
  for (const auto& r : records) failed += r.clients_failed;
  CHECK(failed == 2);
  const std::vector<float> model = f.model();
  CHECK(std::all_of(model.begin(), model.end(), [](float x) { return std::isfinite(x); }));
}

TEST_CASE(
    "in process: an asynchronous task unanswered at its deadline is failed, its client given a "
    "new one, and the steps go on with the others",
    "[integration][inproc][async]") {
  const data::Dataset& train = fashion("train", 900);
  InprocFederation f("logreg", train, iid(train, 3));
  server::AsyncRootConfig rc = asyncRootConfig(30, 3, 3);
  rc.fleet.task_deadline_ms = 5000;  // on the federation's clock, run 5x fast below
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.silence_ms = 600'000;  // heartbeats on a fast clock: no one is failed for silence
  f.asyncRoot(asyncServerConfig(2, 10), rc, fc);
  const SlowDevice quick{std::chrono::milliseconds(200)},
      stuck{std::chrono::milliseconds(8000)};  // stuck: past every deadline
  f.client(0, "inproc://root", quick);
  f.client(1, "inproc://root", quick);
  f.client(2, "inproc://root", stuck);
  const bool done = f.fastForward(f.rootDone(), std::chrono::milliseconds(100), seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const auto records = f.records();
  REQUIRE(records.size() == 30);
  uint64_t failed = 0;
  for (const auto& r : records) {
    CHECK(r.applied);
    CHECK(r.clients_completed == 2);
    failed += r.clients_failed;
  }
  // Each step waits for clients 0 and 1 (200 ms of the clock each, on one version), so 30 steps
  // take 6 s of the clock or more: client 2's first task, at least, passed its 5 s deadline.
  CHECK(failed >= 1);
  CHECK(f.logs().find("client 2 did not deliver its task of version") != std::string::npos);
  CHECK(f.logs().find("client 0 did not deliver") == std::string::npos);
}

TEST_CASE(
    "in process: semi-synchronous rounds at the root close on the clock with what arrived, a late "
    "update joins the next round with its staleness, a round with none is not applied",
    "[integration][inproc][async]") {
  // Rounds of 10 s on the federation's clock, run 5x fast below. K = 3 would need every client on
  // one version: a semi-synchronous round does not wait for it.
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.silence_ms = 600'000;  // heartbeats on a fast clock: no one is failed for silence
  // late: a round and a half, so that each update lands in the middle of a later round.
  const SlowDevice quick{std::chrono::milliseconds(1000)}, late{std::chrono::milliseconds(15'000)};
  const data::Dataset& train = fashion("train", 900);
  SECTION("a late update joins the next round") {
    InprocFederation f("logreg", train, iid(train, 3));
    server::AsyncRootConfig rc = asyncRootConfig(6, 3, 3);
    rc.round_ms = 10'000;
    // The root's own evaluation every second step, of the model the step made.
    std::vector<std::vector<float>> evaluated;
    rc.eval_every = 2;
    rc.evaluate = [&](std::span<const float> model) {
      evaluated.emplace_back(model.begin(), model.end());
      return std::optional<std::pair<double, double>>(
          std::pair(0.5, 0.25 * static_cast<double>(evaluated.size())));
    };
    f.asyncRoot(asyncServerConfig(3, 10), rc, fc);
    f.client(0, "inproc://root", quick);
    f.client(1, "inproc://root", quick);
    f.client(2, "inproc://root", late);
    const bool done = f.fastForward(f.rootDone(), std::chrono::milliseconds(100), seconds(120));
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(done);
    const auto records = f.records();
    REQUIRE(records.size() == 6);
    for (size_t i = 0; i < records.size(); ++i) {
      INFO("round " << i + 1);
      CHECK(records[i].applied);
      CHECK(records[i].model_version == i + 2);
      // Odd rounds: clients 0 and 1; even ones: theirs and client 2's, one version old.
      CHECK(records[i].clients_completed == (i % 2 == 0 ? 2u : 3u));
      CHECK(metricOf(records[i], "staleness_max") == (i % 2 == 0 ? 0.0 : 1.0));
      CHECK(records[i].test_accuracy.has_value() == (i % 2 == 1));
    }
    CHECK(records.back().train_loss.value() < records.front().train_loss.value());
    REQUIRE(evaluated.size() == 3);
    CHECK(*records[5].test_accuracy == 0.75);
    CHECK(*records[5].test_loss == 0.5);
    CHECK(evaluated.back() == f.model());  // the model after step 6, the run's last
  }
  SECTION("one task at a time, answered before the root's next turn: every round steps") {
    // The update is back before the root looks again with nothing open: the round's clock still
    // started with its task, and the round ends with the update.
    InprocFederation f("logreg", train, iid(train, 1));
    server::AsyncRootConfig rc = asyncRootConfig(3, 1, 1);
    rc.round_ms = 10'000;
    f.asyncRoot(asyncServerConfig(3, 10), rc, fc);
    f.client(0, "inproc://root");
    const bool done = f.fastForward(f.rootDone(), std::chrono::milliseconds(100), seconds(120));
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(done);
    const auto records = f.records();
    REQUIRE(records.size() == 3);
    for (size_t i = 0; i < records.size(); ++i) {
      CHECK(records[i].applied);
      CHECK(records[i].clients_completed == 1);
      CHECK(records[i].model_version == i + 2);
    }
  }
  SECTION("a round where nothing arrived is recorded, not applied, and the version stays") {
    InprocFederation f("logreg", train, iid(train, 1));
    server::AsyncRootConfig rc = asyncRootConfig(2, 1, 1);
    rc.round_ms = 10'000;
    f.asyncRoot(asyncServerConfig(3, 10), rc, fc);
    f.client(0, "inproc://root", late);
    const bool done = f.fastForward(f.rootDone(), std::chrono::milliseconds(100), seconds(120));
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(done);
    const auto records = f.records();
    REQUIRE(records.size() == 2);
    CHECK_FALSE(records[0].applied);
    CHECK(records[0].reason == "no update arrived before the round's deadline");
    CHECK(records[0].model_version == 1);
    // The update of version 1 arrives in round 2, on version 1 still: not stale.
    CHECK(records[1].applied);
    CHECK(records[1].clients_completed == 1);
    CHECK(records[1].model_version == 2);
    CHECK(metricOf(records[1], "staleness_max") == 0.0);
  }
}

TEST_CASE(
    "in process: a semi-synchronous root stopped mid-round resumes with its buffered updates and "
    "ends that round with them",
    "[integration][inproc][async]") {
  const data::Dataset& train = fashion("train", 900);
  starling::testing::TempDir dir("inproc-semisync-restart");
  InprocFederation f("logreg", train, iid(train, 3));
  const server::AsyncServerConfig sc = asyncServerConfig(3, 10);
  server::AsyncRootConfig rc = asyncRootConfig(2, 3, 3);
  rc.round_ms = 10'000;
  rc.checkpoint = (dir.path / "root.ckpt").string();
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.silence_ms = 600'000;  // heartbeats on a fast clock below: no one is failed for silence
  const std::string endpoint = stopWithTwoBuffered(f, sc, rc, fc);
  CHECK(f.records().empty());  // round 1 did not end: the clock stood still
  // Restarted: nothing is open (its tasks died with it) and clients 0 and 1 have their version-1
  // updates in the restored buffer, so no task may go out; the round runs on the updates it holds
  // and ends with them, and round 2 hands out tasks on version 2 (to clients 0 and 1: client 2,
  // still in its task, may not register again, so two are enough now).
  fc.bind = endpoint;
  rc.fleet.min_available = 2;
  f.asyncRoot(sc, rc, fc);
  const bool done = f.fastForward(f.rootDone(), std::chrono::milliseconds(100), seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  REQUIRE(f.resumedBuffered().has_value());
  CHECK(*f.resumedBuffered() == 2);
  const auto records = f.records();
  REQUIRE(records.size() == 2);
  CHECK(records[0].applied);
  CHECK(records[0].clients_completed == 2);
  CHECK(records[0].model_version == 2);
  CHECK(records[1].applied);
  CHECK(records[1].model_version == 3);
}

TEST_CASE(
    "in process: a fit of 1.5x and 10x the server-silence threshold loses no round and registers "
    "once, flat and through an edge aggregator",
    "[integration][inproc]") {
  // A fit longer than net.server_silence_ms once read nothing from the server while it ran;
  // the client then took the server for silent, registered again (which stopped its heartbeats)
  // and lost the next round. Here every fit takes 1.5 s or 10 s of the federation's clock, in a
  // fraction of a second of real time (SlowTrainer), against a silence of 1 s on both the client
  // and the aggregator; the root fails a peer silent for 3 s.
  const data::Dataset& train = fashion("train", 600);
  const auto fit_time =
      GENERATE(std::chrono::milliseconds(1500), std::chrono::milliseconds(10'000));
  const bool tree = GENERATE(false, true);
  INFO("a fit of " << fit_time.count() << " ms, " << (tree ? "through an aggregator" : "flat"));
  InprocFederation f("logreg", train, iid(train, 1));
  server::EngineConfig ec = engineConfig(3);
  ec.sampling.min_clients = 1;
  ec.sampling.min_available = 1;
  ec.completion.min_results = 1;
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  if (tree) fc.aggregator_ids = {100};
  f.root(ec, fc);
  if (tree) {
    server::AggregatorConfig ac;
    ac.upstream_silence_ms = 1000;
    f.aggregator(100, "inproc://root", ac);
  }
  client::RuntimeConfig rc;
  rc.server_silence_ms = 1000;
  f.client(0, tree ? "inproc://agg-100" : "inproc://root", rc, fit_time);
  const bool done = f.waitRootDone(seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const auto records = f.records();
  REQUIRE(records.size() == 3);
  for (const server::RoundRecord& r : records) {
    CHECK(r.applied);
    CHECK(r.clients_completed == 1);
    CHECK(r.clients_failed == 0);
  }
  REQUIRE(f.waitClientEnded(0, seconds(30)));
  CHECK(f.stats(0).updates_sent == 3);
  CHECK(f.stats(0).registrations == 1);
  CHECK(f.stats(0).heartbeats > 0);
  if (tree) {
    REQUIRE(f.waitAggregatorEnded(100, seconds(30)));
    CHECK(f.aggregatorStats(100).registrations == 1);
  }
}

namespace {

// The run of a federation of `clients` clients once its root is done: its records, model and the
// clients' update bytes, every client told to end by the Shutdown (but `gone`, which never ends
// its fit); with `masked_each`, each sent that many updates (a masked input a round).
TreeRun secureRun(InprocFederation& f, uint64_t clients, uint64_t masked_each,
                  std::optional<uint64_t> gone = std::nullopt) {
  const bool done = f.waitRootDone(seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  TreeRun out;
  for (uint64_t id = 0; id < clients; ++id) {
    if (gone && id == *gone) continue;
    REQUIRE(f.waitClientEnded(id, seconds(30)));
    if (masked_each) CHECK(f.stats(id).updates_sent == masked_each);
    out.update_bytes += f.stats(id).update_bytes;
  }
  out.records = f.records();
  out.model = f.model();
  return out;
}

// A root's rounds under secure aggregation: `rounds` of `clients` clients each (at least
// `min_clients` results), the dense compressor, uniform weights, clip 100.
server::EngineConfig secureEngine(uint64_t rounds, uint64_t clients, uint64_t min_clients) {
  server::EngineConfig ec = engineConfig(rounds);
  ec.scheme.compressor = "none";
  ec.scheme.rule = "fedavg:weight=uniform";
  ec.downlink = server::Downlink::kDense;
  ec.sampling.clients_per_round = clients;
  ec.sampling.min_available = clients;
  ec.sampling.min_clients = min_clients;
  ec.completion.min_results = min_clients;
  ec.secagg.enabled = true;
  ec.secagg.clip = 100;
  return ec;
}

// Six clients of the root over `rounds` rounds with `compressor` (dense by default) and uniform
// weights, under secure aggregation or not: the records and the root's model.
TreeRun runSecure(bool secure, uint64_t rounds, const std::string& compressor = "none") {
  const data::Dataset& train = fashion("train", 1200);
  InprocFederation f("logreg", train, iid(train, 6));
  server::EngineConfig ec = secureEngine(rounds, 6, 6);
  ec.scheme.metrics = {"train_loss"};
  ec.scheme.compressor = compressor;
  ec.secagg.enabled = secure;
  f.root(ec);
  for (uint64_t id = 0; id < 6; ++id) f.client(id, "inproc://root");
  // A masked input a phase (two-phase powersgd: P and Q).
  return secureRun(f, 6, rounds * compression::makeCompressor(compressor)->phases());
}

}  // namespace

TEST_CASE(
    "in process: secure aggregation at the root gives the plain uniform mean's model within the "
    "ring's rounding",
    "[integration][inproc][secagg]") {
  const TreeRun plain = runSecure(false, 2), secure = runSecure(true, 2);
  REQUIRE(secure.records.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(secure.records[i].applied);
    CHECK(secure.records[i].clients_completed == 6);
    CHECK(secure.records[i].clients_failed == 0);
    // Every masked input is the dense update's size (32-bit words); the keys and shares add
    // a little on top, both ways.
    CHECK(secure.records[i].uplink_bytes > plain.records[i].uplink_bytes);
    CHECK(secure.records[i].uplink_bytes < 1.1 * plain.records[i].uplink_bytes);
    CHECK(secure.records[i].downlink_bytes > plain.records[i].downlink_bytes);
    REQUIRE(secure.records[i].train_loss);
    CHECK(*secure.records[i].train_loss == Approx(*plain.records[i].train_loss).epsilon(1e-3));
  }
  const auto [diff, scale] = starling::testing::modelDiff(plain.model, secure.model);
  CHECK(scale > 0);
  CHECK(diff <= 1e-4 * scale);
  CHECK(diff > 0);  // the ring's rounding: the root never had the plain sum
}

TEST_CASE(
    "in process: under distributed DP each deployed client adds its share of the noise, and the "
    "model carries the sum's",
    "[integration][inproc][secagg][ddg]") {
  // The same six clients and round twice, clipped to 1 and weighing alike: under SecAgg+ alone,
  // and with distributed DP (every client sampled, min_clients 3, noise multiplier 1). The two
  // models differ by the six clients' discrete Gaussians, decoded and divided by q N = 6 (the
  // training is the same: the same model, data and seeds).
  const auto run = [](bool dp) {
    const data::Dataset& train = fashion("train", 1200);
    InprocFederation f("logreg", train, iid(train, 6));
    server::EngineConfig ec = secureEngine(1, 6, 6);
    ec.secagg.clip = 1;
    ec.scheme.rule = "fedavg:weight=uniform,clip=1";
    if (dp) {
      ec.sampling.clients_per_round = 0;
      ec.sampling.poisson_rate = 1.0;
      ec.dp.enabled = true;
      ec.dp.mechanism = privacy::DpMechanism::kDistributed;
      ec.dp.accountant = privacy::DpAccountant::kRdp;
      ec.dp.clip = 1;
      ec.dp.noise_multiplier = 1;
      ec.dp.population = 6;
      ec.dp.min_clients = 3;
      ec.scheme.metrics.clear();
    }
    f.root(ec);
    for (uint64_t id = 0; id < 6; ++id) f.client(id, "inproc://root");
    return secureRun(f, 6, 1);
  };
  const TreeRun plain = run(false), noisy = run(true);
  REQUIRE(noisy.records.size() == 1);
  CHECK(noisy.records[0].applied);
  CHECK(noisy.records[0].clients_completed == 6);
  REQUIRE(noisy.records[0].dp_epsilon.has_value());
  // The ring the root sized for 6 clients, and each client's noise in it.
  server::SecAggConfig sc{true, 0, 0, 32, 1.0, {}, privacy::RingNoise{1.0, 3}};
  const privacy::RingSpec ring = sc.paramsFor(5, 1, 6, plain.model.size()).ring;
  const double want = 6 * ring.noise * ring.noise / std::pow(ring.scale * 6, 2);
  double sq = 0;
  for (size_t i = 0; i < plain.model.size(); ++i) {
    const double dv = double(noisy.model[i]) - plain.model[i];
    sq += dv * dv;
  }
  const double var = sq / double(plain.model.size());
  INFO("variance " << var << ", the noise's " << want);
  CHECK(std::fabs(var / want - 1) < 5 * std::sqrt(2.0 / double(plain.model.size())) + 1e-3);
}

namespace {

// `rounds` secure rounds of six clients with compressor `spec` against the same rounds in the
// clear and a dense secure run: every round applied with all six, its uplink under `share` of
// the dense secure round's and under the plain round's plus `protocol` bytes a client (the keys
// and shares), and the model the plain run's within the ring's rounding (and not the dense one).
void checkSecureCompressed(const std::string& spec, uint64_t rounds, double share,
                           double protocol) {
  const TreeRun plain = runSecure(false, rounds, spec), secure = runSecure(true, rounds, spec),
                dense = runSecure(true, rounds);
  REQUIRE(secure.records.size() == rounds);
  REQUIRE(dense.records.size() == rounds);
  for (size_t i = 0; i < rounds; ++i) {
    INFO("round " << i + 1 << ": " << secure.records[i].reason);
    CHECK(secure.records[i].applied);
    CHECK(secure.records[i].clients_completed == 6);
    CHECK(secure.records[i].uplink_bytes < share * dense.records[i].uplink_bytes);
    CHECK(secure.records[i].uplink_bytes < plain.records[i].uplink_bytes + protocol * 6);
  }
  const auto [diff, scale] = starling::testing::modelDiff(plain.model, secure.model);
  CHECK(scale > 0);
  CHECK(diff <= 1e-4 * scale);
  CHECK(diff > 0);  // the ring's rounding: the root never had the plain sum
  CHECK(starling::testing::modelDiff(dense.model, secure.model).diff > 1e-2 * scale);
}

}  // namespace

TEST_CASE(
    "in process: secure aggregation of rand-k on the round's positions: the plain rand-k model "
    "from k words a client",
    "[integration][inproc][secagg]") {
  // Each client masks its k values (a tenth of the model's) where a dense secure round masks all
  // of them; the protocol's keys and shares come on top of either.
  checkSecureCompressed("randk:density=0.1,positions=shared", 2, 0.2, 1500);
}

TEST_CASE(
    "in process: secure aggregation of acpsgd at a deployed root: the plain acpsgd model from one "
    "masked factor a client and round",
    "[integration][inproc][secagg]") {
  // logreg's weight (10 x 784) at rank 2: P (10 x 2) in odd rounds, Q (784 x 2) in even ones,
  // the bias whole, every client's factor summed in the ring and the shared side formed from it:
  // 30 or 1,578 words where a dense secure round masks the model's 7,850; the keys and shares
  // (about 2 KB a client of six) on top of the plain round's factors.
  checkSecureCompressed("acpsgd:rank=2", 3, 0.3, 2500);
}

TEST_CASE(
    "in process: secure aggregation of two-phase powersgd at a deployed root: the plain powersgd "
    "model from a secure sum of P, then one of Q",
    "[integration][inproc][secagg]") {
  // logreg's weight (10 x 784) at rank 2: phase P masks P (10 x 2) and the bias whole (30 words),
  // phase Q masks Q (784 x 2, 1,568 words) against P-hat, each phase an exchange with keys and
  // shares of its own (about 2 KB a client of six each), where a dense secure round masks the
  // model's 7,850 words.
  checkSecureCompressed("powersgd:rank=2", 3, 0.4, 5000);
}

TEST_CASE(
    "in process: under secure aggregation a client gone silent drops out of the round, which the "
    "others finish",
    "[integration][inproc][secagg]") {
  const data::Dataset& train = fashion("train", 800);
  InprocFederation f("logreg", train, iid(train, 4));
  server::EngineConfig ec = secureEngine(2, 4, 3);
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.silence_ms = 120'000;
  f.root(ec, fc);
  client::RuntimeConfig rc;
  rc.server_silence_ms = 3'600'000;
  for (uint64_t id = 0; id < 3; ++id) f.client(id, "inproc://root", rc);
  // Client 3's fits wait 100 ms of the clock's time, which moves only until round 1 ends: it
  // cannot finish round 2 before it is stopped (the test above says why).
  f.client(3, "inproc://root", rc, {}, std::chrono::milliseconds(100));
  REQUIRE(f.fastForward(f.roundsDone(1), std::chrono::milliseconds(5), seconds(60)));
  CHECK(f.records()[0].clients_completed == 4);
  f.stopClient(3);  // still listed: round 2 samples it, and it answers no step
  // Its silence unlists it (120 s of the federation's clock): the clock moves 119.5 s at a time
  // (the others' heartbeats, every 100 ms, keep them listed), as often as it takes, because a
  // message of client 3's the root takes after an advance restarts its silence there.
  bool second = false;
  for (int i = 0; i < 6 && !second; ++i) {
    f.clock().advance(std::chrono::milliseconds(119'500));
    second = f.waitRounds(2, seconds(10));
  }
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(second);
  const server::RoundRecord r = f.records()[1];
  CHECK(r.applied);
  CHECK(r.clients_selected == 4);
  CHECK(r.clients_completed == 3);
  CHECK(r.clients_failed == 1);
}

TEST_CASE(
    "in process: under secure aggregation a client restarted after its masked input is unmasked "
    "by its neighbours, and the later steps do not wait for it",
    "[integration][inproc][secagg]") {
  const data::Dataset& train = fashion("train", 1200);
  InprocFederation f("logreg", train, iid(train, 6));
  server::EngineConfig ec = secureEngine(1, 6, 6);
  ec.round_deadline_ms = 600'000;  // the clock never gets there: no step may wait it out
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.silence_ms = 3'600'000;
  f.root(ec, fc);
  client::RuntimeConfig rc;
  rc.server_silence_ms = 3'600'000;
  for (uint64_t id = 0; id < 5; ++id) f.client(id, "inproc://root", rc);
  // Client 5's fit waits 1 s of the federation's clock: the masked-input step stays open while
  // client 3 restarts.
  f.client(5, "inproc://root", rc, {}, std::chrono::milliseconds(1000));
  {
    const bool masked = f.waitFor(f.updatesSent(3, 1), seconds(60));
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(masked);
  }
  // A device that crashes and comes back: a fresh runtime on a new connection, with no side of
  // the round. Once it heartbeats, the root has taken its registration.
  f.stopClient(3);
  f.client(3, "inproc://root", rc);
  {
    const bool back =
        f.fastForward(f.heartbeatsSent(3, 1), std::chrono::milliseconds(5), seconds(60));
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(back);
  }
  // Client 5 finishes, the masked inputs close, and the unmask step fails client 3 at once (it
  // could never answer) instead of waiting for the deadline; its neighbours' shares unmask it.
  const bool done = f.fastForward(f.roundsDone(1), std::chrono::milliseconds(5), seconds(60));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const server::RoundRecord r = f.records()[0];
  CHECK(r.applied);
  CHECK(r.clients_selected == 6);
  CHECK(r.clients_completed == 6);  // its masked input is in the sum
  CHECK(r.clients_failed == 0);
}

TEST_CASE(
    "in process: under secure aggregation a lying client's keys, its update in the clear and an "
    "answer of another step are refused, and the honest clients' round is applied",
    "[integration][inproc][secagg]") {
  const data::Dataset& train = fashion("train", 600);
  InprocFederation f("logreg", train, iid(train, 3));
  server::EngineConfig ec = secureEngine(1, 4, 3);
  ec.round_deadline_ms = 2'000;
  f.root(ec);
  for (uint64_t id = 0; id < 3; ++id) f.client(id, "inproc://root");
  auto layout = std::make_shared<const ParamLayout>(client::makeTrainer("logreg", train)->layout());
  ByHand liar(f, layout, 3, 200, protocol::Role::kClient);
  const std::optional<protocol::SecAggSetupMsg> got = liar.awaitSetup(seconds(30));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(got);
  const protocol::SecAggSetupMsg& setup = *got;
  CHECK(setup.clients == std::vector<uint64_t>{0, 1, 2, 3});
  // While its advertise step is open (the round waits for it: the federation's clock stands
  // still, so the deadline never comes), an update in the clear and an answer of another step.
  protocol::TaskMsg fake;
  fake.round = setup.params.round;
  fake.nonce = 1;
  CHECK(liar.answer(liar.update(fake, setup.params.round, 3, 200, 0.5f)) ==
        Errc::kUnexpectedMessage);
  protocol::SecAggRevealMsg reveal;
  reveal.nonce = setup.nonce;
  reveal.response.client = 3;
  reveal.response.round = setup.params.round;
  CHECK(liar.answer(protocol::encode(reveal)) == Errc::kUnexpectedMessage);
  // Keys claiming to be client 0's, from the liar's connection: refused, and its step is over.
  protocol::SecAggKeysMsg keys;
  keys.nonce = setup.nonce;
  keys.advert.client = 0;
  keys.advert.round = setup.params.round;
  keys.advert.cipher_pk = privacy::DhKeyPair::generate().public_key;
  keys.advert.mask_pk = privacy::DhKeyPair::generate().public_key;
  CHECK(liar.answer(protocol::encode(keys)) == Errc::kWrongSender);
  // The honest three finish the round without it (the liar keeps heartbeating: no silence).
  const bool done = liar.pump(seconds(60), [&](protocol::MessageKind k, auto) {
    return k == protocol::MessageKind::kShutdown;
  });
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const auto records = f.records();
  REQUIRE(records.size() == 1);
  CHECK(records[0].applied);
  CHECK(records[0].clients_completed == 3);
  CHECK(records[0].clients_failed == 1);
}

TEST_CASE(
    "in process: under secure aggregation a client that never sends its masked input is unmasked "
    "out of the round at the deadline, and the others' round is applied",
    "[integration][inproc][secagg]") {
  const data::Dataset& train = fashion("train", 800);
  InprocFederation f("logreg", train, iid(train, 4));
  server::EngineConfig ec = secureEngine(1, 4, 3);
  ec.round_deadline_ms = 60'000;
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.silence_ms = 600'000;  // no one is taken for silent when the clock jumps
  f.root(ec, fc);
  for (uint64_t id = 0; id < 3; ++id) f.client(id, "inproc://root");
  // Client 3 takes part in the first two steps, then trains for ever (its fit waits on the
  // federation's clock): it drops out after sharing its keys.
  f.client(3, "inproc://root", SlowDevice{std::chrono::milliseconds(1'000'000'000)});
  const bool masked = f.waitFor(f.updatesSent({0, 1, 2}, 1), seconds(60));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(masked);
  f.clock().advance(std::chrono::milliseconds(61'000));  // past the masked-input step's deadline
  const bool done = f.waitRounds(1, seconds(60));
  REQUIRE(done);
  const server::RoundRecord r = f.records()[0];
  CHECK(r.applied);
  CHECK(r.clients_selected == 4);
  CHECK(r.clients_completed == 3);
  CHECK(r.clients_failed == 1);
}

TEST_CASE(
    "in process: a client under the malicious-server threat model, or with a floor on its noise, "
    "trains nothing for a root that asks for its update in the clear",
    "[integration][inproc][secagg]") {
  // Client 3 requires signed secure rounds (a certified key, the authority's public key), or
  // distributed DP's noise (secagg.min_noise).
  for (const bool signed_rounds : {true, false}) {
    CAPTURE(signed_rounds);
    const data::Dataset& train = fashion("train", 800);
    InprocFederation f("logreg", train, iid(train, 4));
    server::EngineConfig ec = secureEngine(1, 4, 3);
    ec.secagg.enabled = false;  // the root skips secure aggregation: plain fit tasks
    ec.round_deadline_ms = 60'000;
    server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
    fc.silence_ms = 600'000;
    f.root(ec, fc);
    for (uint64_t id = 0; id < 3; ++id) f.client(id, "inproc://root");
    client::RuntimeConfig rc;
    if (signed_rounds) {
      const privacy::SigningKeyPair authority = privacy::SigningKeyPair::generate();
      rc.secagg_trust.require_signed = true;
      rc.secagg_trust.authority = authority.public_key;
      rc.secagg_trust.signer = privacy::SecAggSigner::certified(authority, 3, privacy::randomKey());
    } else {
      rc.secagg_trust.min_noise = 0.3;
    }
    f.client(3, "inproc://root", rc);
    // It declines the task (a Reject with its code), so the root does not wait for the fit
    // phase's deadline: the federation's clock stands still, and the round ends.
    const bool done = f.waitRounds(1, seconds(60));
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(done);
    const server::RoundRecord r = f.records()[0];
    CHECK(r.applied);
    CHECK(r.clients_completed == 3);
    CHECK(r.clients_failed == 1);
    CHECK(f.liveStats(3).updates_sent == 0);
    CHECK(f.logs().find(signed_rounds
                            ? "which this client refuses (secagg.threat = malicious-server"
                            : "which this client refuses (secagg.min_noise") != std::string::npos);
  }
}

TEST_CASE(
    "in process: a peer's Reject fails only its own open step, only for the round it names, and "
    "is never answered",
    "[integration][inproc][secagg]") {
  const data::Dataset& train = fashion("train", 800);
  InprocFederation f("logreg", train, iid(train, 3));
  server::EngineConfig ec = secureEngine(1, 4, 3);
  ec.round_deadline_ms = 600'000;  // the clock stands still: only the Reject can end its wait
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.silence_ms = 3'600'000;
  f.root(ec, fc);
  client::RuntimeConfig rc;
  rc.server_silence_ms = 3'600'000;
  for (uint64_t id = 0; id < 3; ++id) f.client(id, "inproc://root", rc);
  auto layout = std::make_shared<const ParamLayout>(client::makeTrainer("logreg", train)->layout());
  ByHand peer(f, layout, 3, 200, protocol::Role::kClient);
  const std::optional<protocol::SecAggSetupMsg> got = peer.awaitSetup(seconds(30));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(got);
  const protocol::SecAggSetupMsg& setup = *got;
  const auto reject = [](uint64_t round) {
    return protocol::encode(protocol::RejectMsg{protocol::RejectKind::kRefused,
                                                static_cast<uint32_t>(Errc::kTooLittleNoise), round,
                                                0, "a floor of its own"});
  };
  // Another round's: dropped unanswered, and its advertise step still waits for it.
  CHECK_FALSE(peer.answer(reject(setup.params.round + 7)).has_value());
  CHECK_FALSE(f.waitRounds(1, seconds(1)));
  // Its round's: unanswered, and the round goes on at once with the other three.
  CHECK_FALSE(peer.answer(reject(setup.params.round)).has_value());
  REQUIRE(f.waitRounds(1, seconds(60)));
  const server::RoundRecord r = f.records()[0];
  CHECK(r.applied);
  CHECK(r.clients_selected == 4);
  CHECK(r.clients_completed == 3);
  CHECK(r.clients_failed == 1);
}

TEST_CASE(
    "in process: a client whose secagg.min_clients the round cannot meet declines the setup, and "
    "the signed round goes on without waiting for it",
    "[integration][inproc][secagg]") {
  const data::Dataset& train = fashion("train", 800);
  InprocFederation f("logreg", train, iid(train, 4));
  const privacy::SigningKeyPair authority = privacy::SigningKeyPair::generate();
  server::EngineConfig ec = secureEngine(1, 4, 3);
  ec.secagg.authority = authority.public_key;  // secagg.threat = malicious-server
  ec.round_deadline_ms = 600'000;              // the clock stands still: no step may wait it out
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.silence_ms = 3'600'000;
  f.root(ec, fc);
  for (uint64_t id = 0; id < 4; ++id) {
    client::RuntimeConfig rc;
    rc.secagg_trust.require_signed = true;
    rc.secagg_trust.authority = authority.public_key;
    rc.secagg_trust.signer = privacy::SecAggSigner::certified(authority, id, privacy::randomKey());
    if (id == 3) rc.secagg_trust.min_clients = 5;  // a round of 4 cannot meet it
    f.client(id, "inproc://root", rc);
  }
  const bool done = f.waitRounds(1, seconds(60));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const server::RoundRecord r = f.records()[0];
  CHECK(r.applied);
  CHECK(r.clients_selected == 4);
  CHECK(r.clients_completed == 3);
  CHECK(r.clients_failed == 1);
  CHECK(f.liveStats(3).updates_sent == 0);
}

namespace {

// Six clients under secure aggregation for `rounds` rounds, flat (all on the root) or through two
// edge aggregators of three each, the clients' roundings into the ring fixed by the round
// (RuntimeConfig::secagg_rounding). `silent`: a client (behind aggregator 100 in the tree) that
// trains for ever in round 1, so it drops out after sharing its keys. `dp`: under central or
// distributed DP (noise multiplier 1, clip 1, N = 6), each client sampled by Poisson at
// kSixDpRate, the noise drawn from the run seed (seeded_noise). `compressor`: the round's (dense
// by default).
constexpr double kSixDpRate = 0.6;
TreeRun runSecureSix(bool tree, uint64_t rounds, std::optional<uint64_t> silent = std::nullopt,
                     std::optional<privacy::DpMechanism> dp = std::nullopt,
                     const std::string& compressor = "none") {
  const data::Dataset& train = fashion("train", 1200);
  InprocFederation f("logreg", train, iid(train, 6));
  server::EngineConfig ec = secureEngine(rounds, tree ? 2 : 6, tree ? 2 : 6);
  ec.scheme.compressor = compressor;
  ec.scheme.metrics = {"train_loss"};
  ec.completion.min_results = 1;
  if (dp) {
    ec.sampling.clients_per_round = 0;
    ec.sampling.min_clients = 1;
    ec.sampling.poisson_rate = kSixDpRate;
    ec.secagg.clip = 1;
    ec.scheme.rule = "fedavg:weight=uniform,clip=1";
    ec.scheme.metrics.clear();  // distributed DP's clients send no metric in the clear
    ec.dp.enabled = true;
    ec.dp.mechanism = *dp;
    ec.dp.accountant = privacy::DpAccountant::kRdp;
    ec.dp.clip = 1;
    ec.dp.noise_multiplier = 1;
    ec.dp.population = 6;
    ec.dp.seeded_noise = true;
    if (*dp == privacy::DpMechanism::kDistributed) ec.dp.min_clients = 3;
  }
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  if (silent) {
    ec.round_deadline_ms = 600'000;
    fc.silence_ms = 3'600'000;  // no one is taken for silent when the clock jumps
  }
  if (tree) fc.aggregator_ids = {100, 101};
  f.root(ec, fc);
  server::AggregatorConfig ac;
  ac.min_clients = 3;
  // Where the clock jumps, no one is taken for silent: clients by their aggregator, an aggregator
  // by the root, the root by an aggregator.
  if (silent) ac.upstream_silence_ms = 3'600'000;
  if (tree) {
    f.aggregator(100, "inproc://root", ac, {}, silent ? 3'600'000 : 3000);
    f.aggregator(101, "inproc://root", ac, {}, silent ? 3'600'000 : 3000);
  }
  client::RuntimeConfig rc;
  if (silent) rc.server_silence_ms = 3'600'000;
  for (uint64_t id = 0; id < 6; ++id) {
    // Each client's own key a round (distributed DP's noise draws from it too: one key for all
    // would give every client the same noise, which then adds up n times, not sqrt(n) times).
    rc.secagg_rounding = [id](uint64_t round, uint32_t /*phase: no two-phase run here*/) {
      return privacy::publicKey("inproc test rounding", id, round);
    };
    const std::string to =
        tree ? (id < 3 ? "inproc://agg-100" : "inproc://agg-101") : "inproc://root";
    if (silent && id == *silent)
      f.client(id, to, rc, std::chrono::nanoseconds{}, std::chrono::milliseconds(1'000'000'000));
    else
      f.client(id, to, rc);
  }
  if (silent) {
    std::vector<uint64_t> others;
    for (uint64_t id = 0; id < 6; ++id)
      if (id != *silent) others.push_back(id);
    const bool masked = f.waitFor(f.updatesSent(others, 1), seconds(60));
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(masked);
    // Past the deadline of the masked-input step where the client is waited for: the flat
    // root's, or its aggregator's (deadline_share of it), a second after it and long before the
    // root's, which then has both aggregators' sums and needs no deadline.
    const auto waited = tree ? static_cast<int64_t>(ac.deadline_share * ec.round_deadline_ms)
                             : static_cast<int64_t>(ec.round_deadline_ms);
    f.clock().advance(std::chrono::milliseconds(waited + 1'000));
  }
  return secureRun(f, 6, 0, silent);
}

}  // namespace

TEST_CASE(
    "in process: secure aggregation through two edge aggregators gives the flat federation's "
    "model bit for bit",
    "[integration][inproc][secagg]") {
  const TreeRun tree = runSecureSix(true, 2), flat = runSecureSix(false, 2);
  REQUIRE(tree.records.size() == 2);
  REQUIRE(flat.records.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    INFO("round " << i + 1 << ": " << tree.records[i].reason);
    CHECK(tree.records[i].applied);
    CHECK(flat.records[i].applied);
    CHECK(tree.records[i].clients_selected == 6);
    CHECK(tree.records[i].clients_completed == 6);
    CHECK(tree.records[i].clients_failed == 0);
    CHECK(flat.records[i].clients_completed == 6);
    // The aggregators send the root one ring sum each where the flat root takes six inputs.
    CHECK(tree.records[i].uplink_bytes < flat.records[i].uplink_bytes);
    REQUIRE(tree.records[i].train_loss);
    CHECK(*tree.records[i].train_loss == Approx(*flat.records[i].train_loss).epsilon(1e-12));
  }
  // The ring sum is exact: grouped by aggregator or not, the same integers, the same model.
  CHECK(tree.model == flat.model);
  // And not a model that did not move: the rounds were applied from the clients' updates.
  CHECK(std::any_of(tree.model.begin(), tree.model.end(), [](float v) { return v != 0.0f; }));
}

TEST_CASE(
    "in process: secure aggregation of acpsgd and two-phase powersgd through two edge aggregators "
    "gives the flat federation's model bit for bit",
    "[integration][inproc][secagg]") {
  // The aggregators add the clients' masked factors in the ring as they add any masked input:
  // the same integers, the same factor sums, the same shared side and model, round after round
  // (two-phase powersgd: two exchanges a round, each relayed as any).
  const std::string spec = GENERATE(std::string("acpsgd:rank=2"), std::string("powersgd:rank=2"));
  INFO(spec);
  const TreeRun tree = runSecureSix(true, 3, std::nullopt, std::nullopt, spec),
                flat = runSecureSix(false, 3, std::nullopt, std::nullopt, spec);
  REQUIRE(tree.records.size() == 3);
  REQUIRE(flat.records.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    INFO("round " << i + 1 << ": " << tree.records[i].reason);
    CHECK(tree.records[i].applied);
    CHECK(tree.records[i].clients_completed == 6);
    CHECK(flat.records[i].clients_completed == 6);
  }
  CHECK(tree.model == flat.model);
  CHECK(std::any_of(tree.model.begin(), tree.model.end(), [](float v) { return v != 0.0f; }));
}

TEST_CASE(
    "in process: central and distributed DP through two edge aggregators sample each client by "
    "its own Poisson draw and give the flat federation's model bit for bit",
    "[integration][inproc][secagg][ddg]") {
  const auto mechanism =
      GENERATE(privacy::DpMechanism::kCentral, privacy::DpMechanism::kDistributed);
  const bool central = mechanism == privacy::DpMechanism::kCentral;
  INFO((central ? "central" : "distributed"));
  const uint64_t rounds = 4;
  const TreeRun tree = runSecureSix(true, rounds, std::nullopt, mechanism),
                flat = runSecureSix(false, rounds, std::nullopt, mechanism);
  REQUIRE(tree.records.size() == rounds);
  REQUIRE(flat.records.size() == rounds);
  // Each round's sample computed here from the run seed's key: client c is in round r when its
  // keyed draw is below the rate, whether it connects to the root or to an aggregator.
  const privacy::Key32 key = privacy::publicKey("starling central dp noise", 5, 0);
  size_t partial_rounds = 0;
  for (uint64_t r = 1; r <= rounds; ++r) {
    uint64_t sampled = 0;
    for (uint64_t c = 0; c < 6; ++c)
      if (privacy::keyedUniform(key, r, privacy::MaskStream::kSampling, c) < kSixDpRate) ++sampled;
    const server::RoundRecord &t = tree.records[r - 1], &fl = flat.records[r - 1];
    INFO("round " << r << ": " << t.reason << " / flat: " << fl.reason);
    CHECK(t.clients_selected == sampled);
    CHECK(fl.clients_selected == sampled);
    CHECK(t.applied == (sampled >= 3));  // a secure sum needs 3 (and min_clients 3)
    CHECK(fl.applied == t.applied);
    if (t.applied) CHECK(t.clients_completed == sampled);
    if (t.applied && sampled < 6) ++partial_rounds;
    REQUIRE(t.dp_epsilon.has_value());
    CHECK(*t.dp_epsilon == *fl.dp_epsilon);
  }
  CHECK(partial_rounds > 0);  // the sample left clients out of an applied round
  // The same sampled clients, the same noise, the same integers summed in another grouping.
  CHECK(tree.model == flat.model);
  CHECK(std::any_of(tree.model.begin(), tree.model.end(), [](float v) { return v != 0.0f; }));
}

TEST_CASE(
    "in process: through an edge aggregator, a client that drops after sharing its keys is "
    "unmasked out of the sum, as flat",
    "[integration][inproc][secagg]") {
  const TreeRun tree = runSecureSix(true, 1, 1), flat = runSecureSix(false, 1, 1);
  REQUIRE(tree.records.size() == 1);
  REQUIRE(flat.records.size() == 1);
  // The records count the round's clients, not its peers, through the aggregators as flat.
  for (const TreeRun* run : {&tree, &flat}) {
    CHECK(run->records[0].applied);
    CHECK(run->records[0].clients_selected == 6);
    CHECK(run->records[0].clients_completed == 5);
    CHECK(run->records[0].clients_failed == 1);
  }
  CHECK(tree.model == flat.model);
}

TEST_CASE(
    "in process: under secure aggregation a lying edge aggregator's claims are refused (a client "
    "of the root, answers for clients it does not relay, keys of its own), and the round is "
    "applied",
    "[integration][inproc][secagg]") {
  // Six honest clients: with the two the liar invents (which never answer), each still has
  // enough neighbours that advertised for its threshold.
  const data::Dataset& train = fashion("train", 1200);
  InprocFederation f("logreg", train, iid(train, 6));
  server::EngineConfig ec = secureEngine(1, 7, 6);
  ec.round_deadline_ms = 60'000;  // nothing waits for it: the liar answers at once
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.aggregator_ids = {200};
  f.root(ec, fc);
  for (uint64_t id = 0; id < 6; ++id) f.client(id, "inproc://root");
  auto layout = std::make_shared<const ParamLayout>(client::makeTrainer("logreg", train)->layout());
  ByHand liar(f, layout, 200, 300, protocol::Role::kAggregator);
  const auto relayOf = [&](protocol::RelayStage stage) {
    protocol::SecAggRelayMsg m;
    const bool got =
        liar.pump(seconds(30), [&](protocol::MessageKind k, std::span<const uint8_t> b) {
          if (k != protocol::MessageKind::kSecAggRelay) return false;
          m = protocol::decodeSecAggRelay(b);
          return m.stage == stage;
        });
    INFO(f.error() << "\n" << f.logs());
    REQUIRE(got);
    return m;
  };
  // It claims client 0, the root's own, besides two clients of its own: the roster is refused
  // (its step stays open), and one of its own two is taken.
  const protocol::SecAggRelayMsg ask = relayOf(protocol::RelayStage::kRoster);
  protocol::SecAggRelayMsg roster{200, ask.round, ask.nonce, protocol::RelayStage::kRoster,
                                  0,   {},        {}};
  for (uint64_t c : {0, 10, 11}) roster.items.push_back({c, {}});
  CHECK(liar.answer(protocol::encode(roster)) == Errc::kWrongSender);
  roster.items.erase(roster.items.begin());
  liar.send(protocol::encode(roster));
  // The round's setup names its two.
  const protocol::SecAggRelayMsg adv = relayOf(protocol::RelayStage::kAdvertise);
  REQUIRE(adv.items.size() == 2);
  CHECK(adv.items[0].client == 10);
  CHECK(adv.items[1].client == 11);
  const protocol::SecAggSetupMsg setup = protocol::decodeSecAggSetup(adv.common);
  CHECK(setup.clients == std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 10, 11});
  // Keys for client 0, which it does not relay, inside its relayed answer: refused.
  protocol::SecAggKeysMsg keys;
  keys.nonce = setup.nonce;
  keys.advert.client = 0;
  keys.advert.round = setup.params.round;
  keys.advert.cipher_pk = privacy::DhKeyPair::generate().public_key;
  keys.advert.mask_pk = privacy::DhKeyPair::generate().public_key;
  protocol::SecAggRelayMsg answer{
      200, adv.round, adv.nonce, protocol::RelayStage::kAdvertise, 0, {{0, protocol::encode(keys)}},
      {}};
  CHECK(liar.answer(protocol::encode(answer)) == Errc::kWrongSender);
  // Its own keys, as if it were a client: refused, whatever step is open (an aggregator sends
  // none).
  keys.advert.client = 200;
  CHECK(liar.answer(protocol::encode(keys)) == Errc::kUnexpectedMessage);
  // The six honest clients finish the round; the aggregator's two never advertised.
  const bool done = liar.pump(seconds(60), [&](protocol::MessageKind k, auto) {
    return k == protocol::MessageKind::kShutdown;
  });
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const auto records = f.records();
  REQUIRE(records.size() == 1);
  CHECK(records[0].applied);
  CHECK(records[0].clients_completed == 6);
}

TEST_CASE(
    "in process: a mirrored downlink's clients train from the root's copies of their models, bit "
    "for bit, at under a twelfth of the dense downlink",
    "[integration][inproc]") {
  const data::Dataset& train = fashion("train", 1200);
  const auto mode = GENERATE(server::Downlink::kQ2Mirror, server::Downlink::kStcMirror);
  CAPTURE(server::downlinkName(mode));
  InprocFederation f("logreg", train, iid(train, 6));
  server::EngineConfig ec = engineConfig(6);
  ec.scheme.compressor = "none";
  ec.downlink = mode;
  ec.downlink_density = 0.05;  // stc-mirror's
  ec.sampling.fraction = 0.5;  // three of six a round: clients one or more versions behind
  ec.sampling.min_clients = 3;
  ec.sampling.min_available = 6;
  ec.completion.min_results = 3;
  server::FleetConfig fc = InprocFederation::fleetConfig("inproc://root");
  fc.downlink_density = ec.downlink_density;
  f.root(ec, fc);
  f.recordFits();
  for (uint64_t id = 0; id < 6; ++id) f.client(id, "inproc://root");
  const bool done = f.waitRootDone(std::chrono::seconds(120));
  INFO(f.error() << "\n" << f.logs());
  REQUIRE(done);
  const auto records = f.records();
  const auto copies = f.copies();
  REQUIRE(records.size() == 6);
  REQUIRE(copies.size() == 6);
  uint64_t down = 0;
  for (const auto& r : records) {
    CHECK(r.applied);
    CHECK(r.clients_completed == 3);
    down += r.downlink_bytes;
  }
  // Each client's fits began from the root's copy of its model as it stood after the rounds it
  // was sent a task in (a copy changes only then), in order, bit for bit.
  size_t fits = 0, again = 0;
  for (uint64_t id = 0; id < 6; ++id) {
    REQUIRE(f.waitClientEnded(id, std::chrono::seconds(30)));
    std::vector<std::vector<float>> sent;
    for (const auto& round : copies) {
      const auto it = round.find(id);
      if (it != round.end() && (sent.empty() || it->second != sent.back()))
        sent.push_back(it->second);
    }
    const auto trained = f.fits(id);
    CAPTURE(id);
    REQUIRE(trained.size() == sent.size());
    for (size_t k = 0; k < sent.size(); ++k)
      CHECK(std::memcmp(trained[k].data(), sent[k].data(), sent[k].size() * sizeof(float)) == 0);
    fits += trained.size();
    again += trained.size() > 1;
  }
  CHECK(fits == 18);
  CHECK(again > 0);  // some copies were sent a difference, not only the whole model
  // 2.125 bits a value and the tasks' framing, against 32 bits (stc-mirror: the whole model in
  // 3.125 bits to each client once, then 5% of the values, a few bits each).
  const size_t numel = f.model().size();
  CAPTURE(down, numel);
  CHECK(down * 12 < fits * 4 * numel);
}
