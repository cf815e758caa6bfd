#include "server/engine.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "check_throws.h"
#include "client/synthetic.h"
#include "core/file_io.h"
#include "core/framed_file.h"
#include "data/partition.h"
#include "data/sampling.h"
#include "pre_frame.h"
#include "privacy/crypto.h"
#include "server/async_server.h"
#include "server/inproc_fleet.h"
#include "temp_dir.h"
#include "test_util.h"

using namespace starling;
using namespace starling::testing;
namespace fs = std::filesystem;

namespace {

using TempDir = testing::TempDir;

struct World {
  // Softmax over `features` (4 classes): 52 values with the default 12.
  explicit World(size_t features = 12)
      : train(separableData(1200, features, 4, 5)),
        trainer(client::makeTrainer("softmax", features, 4)) {}
  data::Dataset train;
  std::unique_ptr<client::Trainer> trainer;
  std::shared_ptr<const ParamLayout> layout =
      std::make_shared<const ParamLayout>(trainer->layout());

  std::vector<std::vector<size_t>> shards(size_t n) const {
    return data::makePartitioner("iid")->split(train.labels, train.num_classes, n, 3);
  }
  std::vector<float> init() const {
    std::vector<float> p(layout->numel());
    trainer->initParameters(p, 1);
    return p;
  }
  server::EngineConfig config(const std::string& compressor, uint64_t rounds) const {
    server::EngineConfig c;
    c.rounds = rounds;
    c.scheme.compressor = compressor;
    c.scheme.run_seed = 11;
    c.fit = protocol::FitSettings{1, 16, 0.1f};
    c.sampling.fraction = 0.5;
    c.sampling.min_available = 1;
    return c;
  }
  double accuracy(std::span<const float> params) {
    const auto idx = allIndices(train);
    return trainer->evaluate(params, client::DataView{&train, idx}).accuracy;
  }
};

std::vector<float> modelOf(const server::RoundEngine& e) {
  return std::vector<float>(e.model().current().begin(), e.model().current().end());
}

// The server's model of version v for the downlink tests: n values in (-v/2, v/2), drawn from
// `seed`, so that x moves every version, each coordinate by its own amount (no two gaps tie).
std::vector<float> movingModel(size_t n, uint64_t v, uint64_t seed) {
  std::mt19937 gen(static_cast<uint32_t>(seed));
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(v) * (static_cast<float>(gen() >> 8) / 16777216.0f - 0.5f);
  return x;
}

// Four rounds with `cfg` (its checkpoint set), a crash in round 5, and the engine resumed from the
// checkpoint, to run on with the same fleet.
std::unique_ptr<server::RoundEngine> crashAfterFourRounds(const World& w,
                                                          const server::EngineConfig& cfg,
                                                          InProcFleet& fleet) {
  {
    server::RoundEngine first(w.layout, cfg, w.init());
    fleet.crash_at_round = 5;
    for (int r = 0; r < 4; ++r) first.runRound(fleet);
    CHECK_THROWS(first.runRound(fleet));
  }
  fleet.crash_at_round.reset();
  auto second = std::make_unique<server::RoundEngine>(w.layout, cfg, w.init());
  REQUIRE(second->resumed());
  return second;
}

}  // namespace

TEST_CASE("the engine trains through the real codecs, for one- and two-phase compressors",
          "[server]") {
  for (const std::string spec :
       {"none", "topk:density=0.2", "powersgd:rank=2", "acpsgd:rank=2", "qsgd:levels=16"}) {
    CAPTURE(spec);
    World w;
    InProcFleet fleet(*w.trainer, w.train, w.shards(8));
    server::RoundEngine engine(w.layout, w.config(spec, 8), w.init());
    const double before = w.accuracy(engine.model().current());
    std::vector<server::RoundRecord> recs;
    engine.run(fleet, [&](const server::RoundRecord& r) { recs.push_back(r); });
    REQUIRE(recs.size() == 8);
    CHECK(fleet.finished());
    for (const auto& r : recs) {
      CHECK(r.applied);
      CHECK(r.clients_selected == 4);  // half of 8
      CHECK(r.clients_completed == 4);
      CHECK(r.uplink_bytes > 0);
      CHECK(r.train_loss.has_value());
    }
    CHECK(engine.model().version() == 9);
    CHECK(w.accuracy(engine.model().current()) > before + 0.2);
  }
}

TEST_CASE("a resumed engine equals an uninterrupted one, also after a crash mid-round",
          "[server]") {
  for (const std::string spec : {"topk:density=0.2", "powersgd:rank=2"}) {
    CAPTURE(spec);
    World w;
    TempDir dir;
    // Uninterrupted: 6 rounds.
    InProcFleet ref_fleet(*w.trainer, w.train, w.shards(6));
    server::RoundEngine ref(w.layout, w.config(spec, 6), w.init());
    ref.run(ref_fleet);

    auto cfg = w.config(spec, 6);
    cfg.checkpoint = (dir.path / "ck.bin").string();
    cfg.metrics = (dir.path / "m.jsonl").string();
    InProcFleet fleet(*w.trainer, w.train, w.shards(6));
    {
      server::RoundEngine first(w.layout, cfg, w.init());
      CHECK_FALSE(first.resumed());
      fleet.crash_at_round = 4;
      first.runRound(fleet);
      first.runRound(fleet);
      first.runRound(fleet);
      CHECK_THROWS(first.runRound(fleet));  // round 4 never completes: the process "dies"
    }
    fleet.crash_at_round.reset();
    server::RoundEngine second(w.layout, cfg, std::vector<float>(w.layout->numel(), 0.0f));
    CHECK(second.resumed());
    CHECK(second.nextRound() == 4);
    CHECK(second.model().version() == 4);
    second.run(fleet);
    // Clients kept their error-feedback state in memory (as deployed clients keep it on disk).
    CHECK(sameBits(modelOf(second), modelOf(ref)));
    // One metrics line per completed round, each a JSON object with the documented fields.
    std::ifstream in(cfg.metrics);
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      ++lines;
      for (const char* key : {"\"round\":", "\"clients_selected\":", "\"clients_completed\":",
                              "\"clients_failed\":", "\"updates_rejected\":", "\"uplink_bytes\":",
                              "\"downlink_bytes\":", "\"train_loss\":", "\"wall_seconds\":"})
        CHECK(line.find(key) != std::string::npos);
      CHECK(line.front() == '{');
      CHECK(line.back() == '}');
    }
    CHECK(lines == 6);
  }
}

TEST_CASE("a corrupt or foreign checkpoint is an error, never a silent fresh start", "[server]") {
  World w;
  TempDir dir;
  auto cfg = w.config("none", 3);
  cfg.checkpoint = (dir.path / "ck.bin").string();
  {
    InProcFleet fleet(*w.trainer, w.train, w.shards(4));
    server::RoundEngine e(w.layout, cfg, w.init());
    e.runRound(fleet);
  }
  std::vector<uint8_t> bytes = readFile(cfg.checkpoint, 1 << 20);
  // A flipped byte inside the model's values would parse: the frame's checksum refuses it.
  auto corrupt = bytes;
  corrupt[bytes.size() / 2] ^= 0x01;
  writeFileAtomic(cfg.checkpoint, corrupt);
  CHECK_THROWS_MATCHING(server::RoundEngine(w.layout, cfg, w.init()), IoError,
                        Catch::Matchers::Contains("damaged"));
  corrupt = bytes;
  corrupt.resize(bytes.size() - 3);
  writeFileAtomic(cfg.checkpoint, corrupt);
  CHECK_THROWS_MATCHING(server::RoundEngine(w.layout, cfg, w.init()), IoError,
                        Catch::Matchers::Contains("truncated"));
  // Another model's checkpoint.
  writeFileAtomic(cfg.checkpoint, bytes);
  auto other = client::makeTrainer("mlp:hidden=8", 12, 4);
  auto other_layout = std::make_shared<const ParamLayout>(other->layout());
  CHECK_THROWS_AS(server::RoundEngine(other_layout, cfg, std::vector<float>(other_layout->numel())),
                  IoError);
  // An asynchronous run's checkpoint of the same model is named as such.
  server::AsyncServerConfig ac;
  ac.scheme.compressor = "none";
  server::AsyncServer(w.layout, ac, w.init()).saveCheckpoint(cfg.checkpoint);
  CHECK_THROWS_MATCHING(server::RoundEngine(w.layout, cfg, w.init()), IoError,
                        Catch::Matchers::Contains("a checkpoint of asynchronous rounds"));
}

TEST_CASE("a checkpoint from before the files' frame (format 7) still resumes, to the same state",
          "[server]") {
  World w;
  TempDir dir;
  auto cfg = w.config("topk:density=0.2", 4);
  cfg.checkpoint = (dir.path / "ck.bin").string();
  {
    InProcFleet fleet(*w.trainer, w.train, w.shards(4));
    server::RoundEngine e(w.layout, cfg, w.init());
    e.runRound(fleet);
    e.runRound(fleet);
  }
  // Format 7's file: the magic, the version, then the fields the frame now carries.
  const std::vector<uint8_t> old =
      testing::asPreFrame(readFile(cfg.checkpoint, 1 << 20), 0x4b434c53 /* "SLCK" */, 7);
  InProcFleet fleet(*w.trainer, w.train, w.shards(4));
  server::RoundEngine now(w.layout, cfg, w.init());
  writeFileAtomic(cfg.checkpoint, old);
  server::RoundEngine before(w.layout, cfg, w.init());
  REQUIRE(before.resumed());
  CHECK(before.nextRound() == now.nextRound());
  CHECK(sameBits(modelOf(before), modelOf(now)));
  // Both go on alike, and the old file is written anew in the frame.
  InProcFleet fleet2(*w.trainer, w.train, w.shards(4));
  now.runRound(fleet);
  before.runRound(fleet2);
  CHECK(sameBits(modelOf(before), modelOf(now)));
  CHECK(unframe(FileFormat{0x4b434c53, "Starling checkpoint", 1, 8, 8},
                readFile(cfg.checkpoint, 1 << 20), "ck")
            .framed);
}

TEST_CASE("a round without enough results is not applied and the model stays", "[server]") {
  World w;
  InProcFleet fleet(*w.trainer, w.train, w.shards(4));
  auto cfg = w.config("topk:density=0.2", 2);
  cfg.sampling.fraction = 1.0;
  cfg.sampling.min_clients = 3;
  cfg.sampling.min_available = 3;
  cfg.completion.min_results = 3;
  server::RoundEngine e(w.layout, cfg, w.init());
  fleet.silent = {0, 1};
  const auto before = modelOf(e);
  const server::RoundRecord r = e.runRound(fleet);
  CHECK_FALSE(r.applied);
  CHECK(r.clients_failed == 2);
  CHECK(r.clients_completed == 2);
  CHECK_FALSE(r.reason.empty());
  CHECK(sameBits(modelOf(e), before));
  CHECK(e.nextRound() == 2);
  fleet.silent.clear();
  CHECK(e.runRound(fleet).applied);
}

TEST_CASE("over-commitment samples more clients and closes the phase at the target", "[server]") {
  World w;
  InProcFleet fleet(*w.trainer, w.train, w.shards(10));
  auto cfg = w.config("none", 1);
  cfg.sampling.fraction = 0.3;
  cfg.sampling.overcommit = 2.0;
  server::RoundEngine e(w.layout, cfg, w.init());
  const auto r = e.runRound(fleet);
  CHECK(r.clients_selected == 6);   // 2 x ceil(0.3 x 10)
  CHECK(r.clients_completed == 3);  // closed at the target
  CHECK(fleet.tasks_sent == 3);
}

TEST_CASE(
    "downlink encodings: fp16 halves the bytes, a delta is exact and smaller for sparse changes",
    "[server]") {
  World w;
  server::ModelStore store(w.layout, 4);
  std::vector<float> v1 = w.init();
  store.set(v1, 1);
  std::vector<float> v2 = v1;
  for (size_t i = 0; i < v2.size(); i += 10) v2[i] += 0.5f;  // 10% of the coordinates change
  store.set(v2, 2);
  const server::EncodedModel dense = store.encodeFor(0, server::Downlink::kDelta);
  CHECK(dense.base_version == 0);  // a client with nothing gets the whole model
  const server::EncodedModel delta = store.encodeFor(1, server::Downlink::kDelta);
  CHECK(delta.base_version == 1);
  std::vector<float> client = v1;
  protocol::applyModel(*w.layout, 1, delta.base_version, delta.tensors, client);
  CHECK(sameBits(client, v2));  // bit-exact
  auto bytesOf = [](const server::EncodedModel& m) {
    size_t n = 0;
    for (const auto& p : m.tensors) n += compression::payloadDataBytes(compression::view(p));
    return n;
  };
  CHECK(bytesOf(delta) * 4 < bytesOf(dense));
  const server::EncodedModel half = store.encodeFor(0, server::Downlink::kFp16);
  CHECK(bytesOf(half) * 2 == bytesOf(dense));
  // An unknown version, or one whose delta would not be smaller, gets the dense model.
  CHECK(store.encodeFor(99, server::Downlink::kDelta).base_version == 0);
  std::vector<float> v3 = v2;
  for (auto& x : v3) x += 1.0f;
  store.set(v3, 3);
  CHECK(store.encodeFor(2, server::Downlink::kDelta).base_version == 0);
}

TEST_CASE("engine configuration errors name the key", "[server]") {
  World w;
  auto cfg = w.config("none", 1);
  cfg.sampling.fraction = 1.5;
  CHECK_THROWS_WITH(server::RoundEngine(w.layout, cfg, w.init()),
                    Catch::Contains("sampling.fraction"));
  cfg = w.config("none", 1);
  cfg.sampling.min_available = 1;
  cfg.sampling.min_clients = 2;
  CHECK_THROWS_WITH(server::RoundEngine(w.layout, cfg, w.init()),
                    Catch::Contains("sampling.min_available"));
  cfg = w.config("none", 1);
  cfg.fit.lr = 0.0f;
  CHECK_THROWS_WITH(server::RoundEngine(w.layout, cfg, w.init()), Catch::Contains("fit.lr"));
  cfg = w.config("bogus", 1);
  CHECK_THROWS_AS(server::RoundEngine(w.layout, cfg, w.init()), ConfigError);
  CHECK_THROWS_AS(server::parseDownlink("zip"), ConfigError);
}

TEST_CASE("a delta downlink gives the clients the same models for fewer bytes", "[server]") {
  World w;
  std::vector<float> models[2];
  uint64_t down[2] = {0, 0};
  for (int delta = 0; delta < 2; ++delta) {
    InProcFleet fleet(*w.trainer, w.train, w.shards(4));
    auto cfg = w.config("topk:density=0.02", 6);
    cfg.sampling.fraction = 1.0;
    cfg.downlink = delta ? server::Downlink::kDelta : server::Downlink::kDense;
    server::RoundEngine e(w.layout, cfg, w.init());
    e.run(fleet, [&](const server::RoundRecord& r) { down[delta] += r.downlink_bytes; });
    models[delta] = modelOf(e);
  }
  CHECK(sameBits(models[0], models[1]));  // the deltas are exact
  CHECK(down[1] < down[0]);
}

TEST_CASE("every compressor and every aggregation rule runs through the engine and the codecs",
          "[server]") {
  // A model with a tensor worth factoring (low-rank compressors factor fc.weight [4 x 40]).
  data::Dataset train = separableData(1600, 40, 4, 8);
  auto trainer = client::makeTrainer("softmax", 40, 4);
  auto layout = std::make_shared<const ParamLayout>(trainer->layout());
  auto shards = data::makePartitioner("iid")->split(train.labels, train.num_classes, 11, 3);
  std::vector<float> init(layout->numel());
  trainer->initParameters(init, 1);
  auto run = [&](const std::string& compressor, const std::string& rule) {
    CAPTURE(compressor, rule);
    InProcFleet fleet(*trainer, train, shards);
    server::EngineConfig c;
    c.rounds = 3;
    c.scheme.compressor = compressor;
    c.scheme.rule = rule;
    c.scheme.run_seed = 5;
    c.fit = protocol::FitSettings{1, 16, 0.1f};
    server::RoundEngine e(layout, c, init);
    int applied = 0;
    e.run(fleet, [&](const server::RoundRecord& r) {
      applied += r.applied;
      CHECK(r.updates_rejected == 0);
    });
    CHECK(applied == 3);
    for (float x : e.model().current()) REQUIRE(std::isfinite(x));
    CHECK(!sameBits(std::vector<float>(e.model().current().begin(), e.model().current().end()),
                    init));
  };
  for (const auto& spec : allCompressorSpecs()) run(spec, "fedavg");
  for (const std::string rule :
       {"median", "trimmed_mean", "krum:f=1", "multikrum:f=1", "bulyan:f=1", "fedavg:clip=1"})
    run("topk:density=0.3", rule);
}

// The lossy downlink (model_store.h): top-k of x - x-hat with the server's error feedback.
TEST_CASE("a top-k downlink refreshes the k furthest coordinates and loses nothing, only delays",
          "[server]") {
  World w;
  const size_t n = w.layout->numel();
  server::ModelStore store(w.layout, 8, 0.1);
  const size_t k = compression::countForDensity(0.1, n);
  const std::vector<float> v1 = w.init();
  store.set(v1, 1);
  CHECK(sameBits(store.current(), v1));  // the first model is broadcast whole
  std::vector<float> x = v1;
  for (size_t i = 0; i < n; ++i)
    x[i] += 0.01f * static_cast<float>((i * 7919) % 101);  // every coordinate moves
  store.set(x, 2);
  CHECK(sameBits(store.server(), x));
  // Exactly k coordinates took x's values, and they are the k largest |x - v1|.
  std::vector<size_t> changed;
  double smallest_taken = 1e30, largest_left = 0;
  for (size_t i = 0; i < n; ++i) {
    const double gap = std::fabs(double(x[i]) - v1[i]);
    if (store.current()[i] != v1[i]) {
      changed.push_back(i);
      CHECK(store.current()[i] == x[i]);
      smallest_taken = std::min(smallest_taken, gap);
    } else {
      largest_left = std::max(largest_left, gap);
    }
  }
  CHECK(changed.size() == k);
  CHECK(smallest_taken >= largest_left);
  // A client holding version 1 gets a delta of those k coordinates; applied, it holds x-hat.
  const server::EncodedModel d = store.encodeFor(1, server::Downlink::kTopK);
  CHECK(d.base_version == 1);
  std::vector<float> client = v1;
  protocol::applyModel(*w.layout, 1, d.base_version, d.tensors, client);
  CHECK(sameBits(client, std::vector<float>(store.current().begin(), store.current().end())));
  size_t delta_bytes = 0;
  for (const auto& p : d.tensors)
    delta_bytes += compression::payloadDataBytes(compression::view(p));
  CHECK(delta_bytes == 8 * k);  // an index and a value per refreshed coordinate, against 4 n dense
  // The server's model standing still, x-hat reaches it after ceil(1 / density) versions.
  for (uint64_t v = 3; v <= 12; ++v) store.set(x, v);
  CHECK(sameBits(store.current(), x));
  // A client holding a version older than the history, or none, gets the whole broadcast model.
  CHECK(store.encodeFor(1, server::Downlink::kTopK).base_version == 0);
  CHECK(store.encodeFor(0, server::Downlink::kTopK).base_version == 0);
  CHECK_THROWS_AS(server::ModelStore(w.layout, 4, 1.5), InvalidArgument);
  CHECK(server::parseDownlink("topk") == server::Downlink::kTopK);
}

namespace {
// `m` as a fit task of `version` carries it: encoded, then decoded and validated as a client does.
protocol::TaskMsg throughCodec(const ParamLayout& layout, const server::EncodedModel& m,
                               uint64_t version) {
  protocol::TaskMsg h;
  h.round = version;
  h.model_version = version;
  h.base_version = m.base_version;
  h.nonce = 1;
  h.compressor = "none";
  h.fit = protocol::FitSettings{1, 16, 0.1f};
  std::vector<compression::PayloadView> views;
  for (const auto& p : m.tensors) views.push_back(compression::view(p));
  return protocol::decodeTask(protocol::encodeTask(h, views), layout);
}

// The quantised downlink's step for `values` with s levels: the smallest power of two u with
// u s >= max |v| (computed here by doubling and halving, not as the store does).
double pow2Step(std::span<const float> values, uint32_t s) {
  double m = 0;
  for (float v : values) m = std::max(m, std::fabs(double(v)));
  const double want = m / s;
  double u = 1.0;
  while (u < want) u *= 2;
  while (u / 2 >= want) u /= 2;
  return u;
}
}  // namespace

TEST_CASE(
    "a quantised downlink refreshes every coordinate in 8 or 4 bits with the server's error "
    "feedback, and every client's copy is within its stated error",
    "[server]") {
  World w;
  const size_t n = w.layout->numel();
  for (const auto mode : {server::Downlink::kQ8, server::Downlink::kQ4}) {
    const uint32_t s = server::downlinkLevels(mode);
    const size_t bits = mode == server::Downlink::kQ8 ? 8 : 4;
    INFO(server::downlinkName(mode));
    CHECK(server::parseDownlink(server::downlinkName(mode)) == mode);
    server::ModelStore store = server::ModelStore::forDownlink(w.layout, mode, 4, 0.01);
    const std::vector<float> v1 = w.init();
    store.set(v1, 1);
    CHECK(sameBits(store.current(), v1));
    std::vector<float> x = v1;
    for (size_t i = 0; i < n; ++i) x[i] += 0.013f * static_cast<float>(int((i * 7919) % 101) - 50);
    store.set(x, 2);
    CHECK(sameBits(store.server(), x));
    // Per tensor, x - x-hat is at most half the step of x - v1's largest value (the stated error).
    for (const auto& t : w.layout->tensors()) {
      std::vector<float> d(t.numel);
      for (size_t j = 0; j < t.numel; ++j) d[j] = x[t.offset + j] - v1[t.offset + j];
      const double u = pow2Step(d, s);
      for (size_t j = 0; j < t.numel; ++j)
        REQUIRE(std::fabs(double(x[t.offset + j]) - store.current()[t.offset + j]) <= u / 2);
    }
    // One version behind: the refresh, bits per value, applied bit for bit.
    const server::EncodedModel r = store.encodeFor(1, mode);
    CHECK(r.base_version == 1);
    std::vector<float> client = v1;
    protocol::applyModel(*w.layout, 1, r.base_version, r.tensors, client);
    CHECK(sameBits(client, std::vector<float>(store.current().begin(), store.current().end())));
    size_t packed = 0;
    for (const auto& p : r.tensors) packed += std::get<compression::Qsgd>(p).packed.size();
    CHECK(packed <= (n * bits + 7) / 8 + w.layout->size());
    // Through the codec as a task: decoded, validated, applied the same.
    {
      const protocol::TaskMsg t = throughCodec(*w.layout, r, 2);
      std::vector<float> via = v1;
      protocol::applyModel(*w.layout, 1, t.base_version, t.model, via);
      CHECK(sameBits(via, client));
    }
    // Up to date: an empty delta. Older or none: the whole broadcast model quantised, within
    // half a step of max |x-hat| per tensor; the simulator's clients train from the same copy.
    CHECK(store.encodeFor(2, mode).base_version == 2);
    server::ModelStore::WholeModelCache scratch;
    CHECK(store.clientModel(1, mode, scratch).data() == store.current().data());
    for (uint64_t held : {uint64_t{0}, uint64_t{77}}) {
      const server::EncodedModel whole = store.encodeFor(held, mode);
      CHECK(whole.base_version == 0);
      std::vector<float> copy(n, 123.0f);  // whatever it held is overwritten
      protocol::applyModel(*w.layout, held, 0, whole.tensors, copy);
      for (const auto& t : w.layout->tensors()) {
        const double u = pow2Step(store.current().subspan(t.offset, t.numel), s);
        for (size_t j = 0; j < t.numel; ++j)
          REQUIRE(std::fabs(double(copy[t.offset + j]) - store.current()[t.offset + j]) <= u / 2);
      }
      CHECK(sameBits(store.clientModel(held, mode, scratch), copy));
    }
    // The server's model standing still, the error feedback closes the gap version by version.
    double gap2 = 0, gap5 = 0;
    for (size_t i = 0; i < n; ++i)
      gap2 = std::max(gap2, std::fabs(double(x[i]) - store.current()[i]));
    for (uint64_t v = 3; v <= 5; ++v) store.set(x, v);
    for (size_t i = 0; i < n; ++i)
      gap5 = std::max(gap5, std::fabs(double(x[i]) - store.current()[i]));
    CHECK(gap2 > 0);
    CHECK(gap5 < gap2 / 40);
  }
}

TEST_CASE(
    "an stc downlink refreshes each tensor's k furthest coordinates by +-mu, sends a client the "
    "chain of refreshes since its version, and the whole model in 8 bits past the history or "
    "when that is smaller",
    "[server]") {
  auto layout = std::make_shared<ParamLayout>();
  layout->add("w", {40, 50});
  layout->add("b", {50});
  const size_t n = layout->numel();
  const double density = 0.05;
  const server::Downlink stc = server::Downlink::kStc;
  CHECK(server::parseDownlink("stc") == stc);
  CHECK(server::downlinkPerHeld(stc));
  CHECK(server::peerDecodes(stc, false, true, false));
  CHECK_FALSE(server::peerDecodes(stc, true, false, true));  // q8's capability is not stc's
  CHECK(server::peerDecodes(server::Downlink::kQ8, true, false, false));
  CHECK(server::peerDecodes(server::Downlink::kDelta, false, false, false));
  server::ModelStore store = server::ModelStore::forDownlink(layout, stc, 3, density);
  CHECK(store.lossy());
  // x moves every version, each coordinate by its own amount (no two gaps tie).
  const auto model = [&](uint64_t v) { return movingModel(n, v, v); };
  store.set(model(1), 1);
  CHECK(sameBits(store.current(), model(1)));          // the first model is broadcast whole
  std::vector<std::vector<float>> held{{}, model(1)};  // held[v]: x-hat of version v
  for (uint64_t v = 2; v <= 6; ++v) {
    const std::vector<float> before = held.back();
    const std::vector<float> x = model(v);
    store.set(x, v);
    CHECK(sameBits(store.server(), x));
    // Per tensor: exactly k coordinates moved, the k largest |x - x-hat|, each by +-mu toward x,
    // mu their mean gap (computed here from the gaps, not from the payload).
    for (const auto& t : layout->tensors()) {
      const size_t k = compression::countForDensity(density, t.numel);
      std::vector<double> gap(t.numel);
      for (size_t j = 0; j < t.numel; ++j) gap[j] = double(x[t.offset + j]) - before[t.offset + j];
      std::vector<size_t> order(t.numel);
      for (size_t j = 0; j < t.numel; ++j) order[j] = j;
      std::sort(order.begin(), order.end(),
                [&](size_t a, size_t b) { return std::fabs(gap[a]) > std::fabs(gap[b]); });
      double mu = 0;
      for (size_t r = 0; r < k; ++r) mu += std::fabs(gap[order[r]]);
      mu /= double(k);
      std::vector<bool> top(t.numel, false);
      for (size_t r = 0; r < k; ++r) top[order[r]] = true;
      size_t moved = 0;
      for (size_t j = 0; j < t.numel; ++j) {
        const double step = double(store.current()[t.offset + j]) - before[t.offset + j];
        if (!top[j]) {
          REQUIRE(step == 0.0);
          continue;
        }
        ++moved;
        REQUIRE(std::fabs(std::fabs(step) - mu) <= 1e-6 * (1 + mu));
        REQUIRE((step > 0) == (gap[j] > 0));
      }
      CHECK(moved == k);
    }
    held.push_back(std::vector<float>(store.current().begin(), store.current().end()));
  }
  const std::vector<float> current(store.current().begin(), store.current().end());
  // One version behind: the refresh alone, about a byte per refreshed coordinate (a sign bit and
  // its Rice-coded gap) against four dense.
  {
    const server::EncodedModel r = store.encodeFor(5, stc);
    CHECK(r.base_version == 5);
    REQUIRE(r.tensors.size() == layout->size());
    size_t bytes = 0;
    for (const auto& p : r.tensors) bytes += compression::payloadDataBytes(p);
    CHECK(bytes < compression::countForDensity(density, n) * 3 / 2 + 9 * layout->size());
  }
  // Held 3: the chain of the refreshes that made 4, 5 and 6, oldest first; applied in turn, the
  // copy is x-hat bit for bit, directly and through the task codec.
  const server::EncodedModel chain = store.encodeFor(3, stc);
  CHECK(chain.base_version == 3);
  REQUIRE(chain.tensors.size() == 3 * layout->size());
  for (const auto& p : chain.tensors) CHECK(std::holds_alternative<compression::Ternary>(p));
  CHECK(store.baseFor(3, stc) == 3);
  std::vector<float> copy = held[3];
  protocol::applyModel(*layout, 3, chain.base_version, chain.tensors, copy);
  CHECK(sameBits(copy, current));
  {
    const protocol::TaskMsg t = throughCodec(*layout, chain, 6);
    CHECK(t.model.size() == chain.tensors.size());
    std::vector<float> via = held[3];
    protocol::applyModel(*layout, 3, t.base_version, t.model, via);
    CHECK(sameBits(via, current));
  }
  // Held 2: its refresh (the one that made 3) is past the history of three: the whole model,
  // q8, within half a step of max |x-hat| per tensor; so is a client that holds nothing, or a
  // version the store never made. The simulator's clients train from the same copy.
  server::ModelStore::WholeModelCache scratch;
  for (uint64_t h : {uint64_t{0}, uint64_t{2}, uint64_t{77}}) {
    const server::EncodedModel whole = store.encodeFor(h, stc);
    CHECK(whole.base_version == 0);
    CHECK(store.baseFor(h, stc) == 0);
    REQUIRE(whole.tensors.size() == layout->size());
    std::vector<float> c(n, 123.0f);
    protocol::applyModel(*layout, h, 0, whole.tensors, c);
    for (const auto& t : layout->tensors()) {
      const double u = pow2Step(store.current().subspan(t.offset, t.numel), 127);
      for (size_t j = 0; j < t.numel; ++j)
        REQUIRE(std::fabs(double(c[t.offset + j]) - current[t.offset + j]) <= u / 2);
    }
    CHECK(sameBits(store.clientModel(h, stc, scratch), c));
  }
  CHECK(store.clientModel(3, stc, scratch).data() == store.current().data());
  // Up to date: an empty delta.
  const server::EncodedModel none = store.encodeFor(6, stc);
  CHECK(none.base_version == 6);
  size_t none_bytes = 0;
  for (const auto& p : none.tensors) none_bytes += compression::payloadDataBytes(p);
  CHECK(none_bytes == 0);
  // A chain is sent only while it is smaller than the whole model (a byte a value). Each
  // refresh's size is read from a twin store one version behind as it is made; at density 0.8
  // one refresh is well under the whole model and five are over it.
  server::ModelStore big = server::ModelStore::forDownlink(layout, stc, 8, 0.8);
  server::ModelStore twin = server::ModelStore::forDownlink(layout, stc, 8, 0.8);
  std::vector<size_t> made(7, 0);  // made[v]: the bytes of the refresh that made version v
  for (uint64_t v = 1; v <= 6; ++v) {
    big.set(model(v), v);
    twin.set(model(v), v);
    if (v == 1) continue;
    const server::EncodedModel one = twin.encodeFor(v - 1, stc);
    REQUIRE(one.base_version == v - 1);
    for (const auto& p : one.tensors)
      made[v] += compression::payloadDataBytes(p) + server::ModelStore::kTensorOverheadBytes;
  }
  // The whole model's cost: a byte a value, each tensor's norm and levels, the same overhead.
  const size_t whole = n + layout->size() * (8 + server::ModelStore::kTensorOverheadBytes);
  for (uint64_t h = 1; h <= 5; ++h) {
    size_t chain_bytes = 0;
    for (uint64_t v = h + 1; v <= 6; ++v) chain_bytes += made[v];
    INFO("held " << h << ": a chain of " << chain_bytes << " bytes, the whole model " << whole);
    CHECK(big.encodeFor(h, stc).base_version == (chain_bytes < whole ? h : 0));
    CHECK(big.baseFor(h, stc) == (chain_bytes < whole ? h : 0));
  }
  CHECK(big.encodeFor(5, stc).base_version == 5);
  CHECK(big.encodeFor(1, stc).base_version == 0);
  // The server's model standing still, the error feedback closes the gap version by version.
  const std::vector<float> x = model(6);
  double gap6 = 0, gap_late = 0;
  for (size_t i = 0; i < n; ++i) gap6 = std::max(gap6, std::fabs(double(x[i]) - current[i]));
  for (uint64_t v = 7; v <= 200; ++v) store.set(x, v);
  for (size_t i = 0; i < n; ++i)
    gap_late = std::max(gap_late, std::fabs(double(x[i]) - store.current()[i]));
  CHECK(gap6 > 0);
  CHECK(gap_late < gap6 / 4);
  CHECK_THROWS_AS(server::ModelStore::forDownlink(layout, stc, 0, density), InvalidArgument);
  CHECK_THROWS_AS(
      server::ModelStore::forDownlink(layout, stc, protocol::kMaxRefreshChain + 1, density),
      InvalidArgument);
  CHECK_THROWS_AS(server::ModelStore::forDownlink(layout, stc, 4, 0.0), InvalidArgument);
  CHECK_THROWS_AS(store.encodeFor(3, server::Downlink::kQ8), InvalidArgument);
}

namespace {
// The block-scaled downlinks' levels, computed apart from the store: the level of 2^bits spaced
// 2^e apart and centred on zero that is nearest v (the upper one halfway between two), found by
// trying each from the lowest up. The distances in long double, which tell -1e-20 nearer -1/64
// than +1/64 where double's cannot.
double nearestLevel(double v, uint32_t bits, int e) {
  const double top = std::ldexp(1.0, static_cast<int>(bits)) - 1, half = std::ldexp(1.0, e - 1);
  double best = 0;
  long double dist = std::numeric_limits<long double>::infinity();
  for (double c = 0; c <= top; ++c) {
    const double level = (2 * c - top) * half;
    const long double d = std::fabs(static_cast<long double>(v) - level);
    if (d <= dist) dist = d, best = level;
  }
  return best;
}
}  // namespace

TEST_CASE(
    "the block-scaled downlinks (q3, q2): each block on the best of four power-of-two steps, "
    "exact copies through the codec, the server's error feedback, 15x fewer bytes in q2",
    "[server][downlink]") {
  auto layout = std::make_shared<ParamLayout>();
  layout->add("w", {40, 50});  // 31 blocks of 64 and one of 16
  layout->add("b", {50});
  layout->add("z", {100});  // stays zero: blocks of zeros
  const size_t n = layout->numel();
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // v1: normal values of a scale that differs by block (so that the steps differ), an outlier.
  std::vector<float> v1(n, 0.0f);
  for (size_t i = 0; i < 2050; ++i)
    v1[i] = normal(gen) * 0.01f * static_cast<float>(1 + (i / 64) % 5);
  v1[100] = 0.9f;
  // Ties: a block of values on the boundaries between levels of one step (k / 32: for q2, at
  // e = -4 the boundaries are the multiples of 1/16, 0 among them; for q3 at e = -4 the same and
  // finer), and a tiny negative value, whose nearest level is the negative one.
  for (size_t i = 1024; i < 1088; ++i) v1[i] = static_cast<float>(int(i % 9) - 4) / 32.0f;
  v1[1030] = -1e-20f;
  std::vector<float> x = v1;
  for (size_t i = 0; i < 2050; ++i) x[i] += 0.002f * normal(gen);

  for (const auto mode : {server::Downlink::kQ3, server::Downlink::kQ2}) {
    const uint32_t bits = server::downlinkBlockBits(mode);
    INFO(server::downlinkName(mode));
    CHECK(server::parseDownlink(server::downlinkName(mode)) == mode);
    CHECK(server::downlinkPerHeld(mode));
    CHECK(server::wholeModelQuantised(mode));
    CHECK(server::peerDecodes(mode, false, false, true));
    CHECK_FALSE(server::peerDecodes(mode, true, true, false));  // q8's and stc's are not this one

    // The quantiser against the independent computation: per block, the step is one of the
    // four candidates (the smallest power of two whose top level covers max |v|, and 2, 4, 8
    // times finer) with the least squared error; each decoded value is the nearest level on it,
    // exactly; a block of zeros is zeros.
    for (const auto& t : layout->tensors()) {
      const std::span<const float> vals = std::span<const float>(v1).subspan(t.offset, t.numel);
      const compression::BlockQ q = server::quantizeBlocks(vals, bits, server::kDownlinkBlock);
      REQUIRE(q.exps.size() == (t.numel + 63) / 64);
      compression::validatePayload(compression::view(compression::Payload(q)), t);
      std::vector<float> dec(t.numel, 0.0f);
      compression::accumulatePayload(compression::view(compression::Payload(q)), t, dec, 1.0f);
      const double top = std::ldexp(1.0, static_cast<int>(bits)) - 1;
      for (size_t b = 0; b < q.exps.size(); ++b) {
        const size_t lo = b * 64, hi = std::min<size_t>(t.numel, lo + 64);
        double m = 0;
        for (size_t j = lo; j < hi; ++j) m = std::max(m, std::fabs(double(vals[j])));
        if (m == 0) {
          CHECK(q.exps[b] == compression::kBlockQZero);
          for (size_t j = lo; j < hi; ++j) REQUIRE(dec[j] == 0.0f);
          continue;
        }
        int e0 = -130;
        while (top * std::ldexp(1.0, e0 - 1) < m) ++e0;
        const auto sse = [&](int e) {
          double s = 0;
          for (size_t j = lo; j < hi; ++j) {
            const double d = vals[j] - nearestLevel(vals[j], bits, e);
            s += d * d;
          }
          return s;
        };
        const int e = q.exps[b];
        CHECK((e <= e0 && e >= e0 - 3));
        for (int c = e0 - 3; c <= e0; ++c) CHECK(sse(e) <= sse(c));
        for (int c = e + 1; c <= e0; ++c) CHECK(sse(c) > sse(e));  // the coarsest on a tie
        for (size_t j = lo; j < hi; ++j) REQUIRE(double(dec[j]) == nearestLevel(vals[j], bits, e));
      }
    }

    server::ModelStore store = server::ModelStore::forDownlink(layout, mode, 4, 0.01);
    CHECK(store.lossy());
    store.set(v1, 1);
    CHECK(sameBits(store.current(), v1));
    store.set(x, 2);
    CHECK(sameBits(store.server(), x));
    // One version behind: the refresh of x - v1, applied bit for bit, directly and as a task.
    const server::EncodedModel r = store.encodeFor(1, mode);
    CHECK(r.base_version == 1);
    CHECK(store.baseFor(1, mode) == 1);
    std::vector<float> client = v1;
    protocol::applyModel(*layout, 1, r.base_version, r.tensors, client);
    const std::vector<float> xhat(store.current().begin(), store.current().end());
    CHECK(sameBits(client, xhat));
    CHECK(!sameBits(xhat, x));  // lossy: x - x-hat is the server's error feedback
    {
      const protocol::TaskMsg t = throughCodec(*layout, r, 2);
      std::vector<float> via = v1;
      protocol::applyModel(*layout, 1, t.base_version, t.model, via);
      CHECK(sameBits(via, xhat));
    }
    // Older or none: the whole of x-hat, block by block, what the simulator's clients train from.
    CHECK(store.encodeFor(2, mode).base_version == 2);
    server::ModelStore::WholeModelCache scratch;
    for (uint64_t held : {uint64_t{0}, uint64_t{77}}) {
      CHECK(store.baseFor(held, mode) == 0);
      const server::EncodedModel whole = store.encodeFor(held, mode);
      CHECK(whole.base_version == 0);
      const protocol::TaskMsg t = throughCodec(*layout, whole, 2);
      std::vector<float> copy(n, 123.0f);  // whatever it held is overwritten
      protocol::applyModel(*layout, held, 0, t.model, copy);
      for (size_t i = 0; i < whole.tensors.size(); ++i) {
        const TensorSpec& spec = layout->tensors()[i];
        CHECK(samePayload(whole.tensors[i],
                          server::quantizeBlocks(store.current().subspan(spec.offset, spec.numel),
                                                 bits, server::kDownlinkBlock)));
      }
      CHECK(sameBits(store.clientModel(held, mode, scratch), copy));
      // The bytes: 5 + a byte a block + bits a value per tensor: q2 over 14x fewer than f32.
      size_t bytes = 0;
      for (const auto& p : whole.tensors) bytes += compression::payloadDataBytes(p);
      size_t want = 0;
      for (const auto& spec : layout->tensors())
        want += 5 + (spec.numel + 63) / 64 + (spec.numel * bits + 7) / 8;
      CHECK(bytes == want);
      if (bits == 2) CHECK(4.0 * n / bytes > 14.0);
    }
    // The server's model standing still, the error feedback closes the gap version by version.
    const auto gap = [&] {
      double s = 0;
      for (size_t i = 0; i < n; ++i) s += std::pow(double(x[i]) - store.current()[i], 2);
      return s;
    };
    // q3 by more than 4x a version here, q2 by about 2x (its four levels, none at zero, on a
    // power-of-two step: a block whose residual is far from uniform closes more slowly).
    const double first = gap();
    double before = first;
    CHECK(before > 0);
    for (uint64_t v = 3; v <= 8; ++v) {
      store.set(x, v);
      const double now = gap();
      CHECK(now < before / (bits == 3 ? 4 : 1.5));
      before = now;
    }
    CHECK(before < first / (bits == 3 ? 4096 : 20));
    // A checkpoint's refreshes: a resumed store sends the refresh the uninterrupted one sends,
    // and refuses another downlink's.
    server::ModelStore resumed = server::ModelStore::forDownlink(layout, mode, 4, 0.01);
    resumed.reset(x, 8, std::vector<float>(store.current().begin(), store.current().end()));
    resumed.loadRefreshes(store.saveRefreshes(), "test");
    const server::EncodedModel a = store.encodeFor(7, mode), b = resumed.encodeFor(7, mode);
    REQUIRE(a.tensors.size() == b.tensors.size());
    CHECK(a.base_version == 7);
    for (size_t i = 0; i < a.tensors.size(); ++i) CHECK(samePayload(a.tensors[i], b.tensors[i]));
    const auto other =
        mode == server::Downlink::kQ2 ? server::Downlink::kQ3 : server::Downlink::kQ4;
    server::ModelStore wrong = server::ModelStore::forDownlink(layout, other, 4, 0.01);
    wrong.reset(x, 8, std::vector<float>(store.current().begin(), store.current().end()));
    CHECK_THROWS_AS(wrong.loadRefreshes(store.saveRefreshes(), "test"), IoError);
  }
}

TEST_CASE(
    "an engine with a quantised, block-scaled or stc downlink learns with fewer task bytes, and "
    "resumes exactly",
    "[server]") {
  World w;
  uint64_t down[6] = {0, 0, 0, 0, 0, 0};
  double acc[6] = {0, 0, 0, 0, 0, 0};
  const server::Downlink modes[6] = {server::Downlink::kDense, server::Downlink::kQ8,
                                     server::Downlink::kQ4,    server::Downlink::kStc,
                                     server::Downlink::kQ3,    server::Downlink::kQ2};
  const auto config = [&](server::Downlink mode) {
    auto cfg = w.config("none", 8);
    cfg.sampling.fraction =
        0.5;  // clients one version behind and further: refreshes and whole models
    cfg.downlink = mode;
    cfg.downlink_density = 0.25;  // stc: a quarter of each tensor a version (k = 12 and 1 here)
    cfg.delta_history = 8;
    return cfg;
  };
  for (int m = 0; m < 6; ++m) {
    InProcFleet fleet(*w.trainer, w.train, w.shards(4));
    server::RoundEngine e(w.layout, config(modes[m]), w.init());
    e.run(fleet, [&](const server::RoundRecord& r) { down[m] += r.downlink_bytes; });
    acc[m] = w.accuracy(e.model().current());
  }
  // Crash after round 4 and resume: the refreshes come back with the checkpoint, so the clients
  // get the tasks, and the model, of the uninterrupted run. A model of 804 values and 2% a
  // refresh, so that chains of several refreshes are smaller than the whole model.
  World big(200);
  for (int m : {1, 3, 5}) {
    INFO(server::downlinkName(modes[m]) << " resumed");
    auto cfg = config(modes[m]);
    cfg.downlink_density = 0.02;
    std::vector<uint64_t> ref_down;
    std::vector<float> ref_model;
    {
      InProcFleet fleet(*big.trainer, big.train, big.shards(8));
      server::RoundEngine e(big.layout, cfg, big.init());
      e.run(fleet, [&](const server::RoundRecord& r) { ref_down.push_back(r.downlink_bytes); });
      ref_model = modelOf(e);
    }
    REQUIRE(ref_down.size() == 8);
    TempDir dir;
    cfg.checkpoint = (dir.path / "ck.bin").string();
    InProcFleet fleet(*big.trainer, big.train, big.shards(8));
    const auto second = crashAfterFourRounds(big, cfg, fleet);
    std::vector<uint64_t> resumed_down;
    second->run(fleet,
                [&](const server::RoundRecord& r) { resumed_down.push_back(r.downlink_bytes); });
    CHECK(resumed_down == std::vector<uint64_t>(ref_down.begin() + 4, ref_down.end()));
    CHECK(sameBits(modelOf(*second), ref_model));
  }
  CAPTURE(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], down[0], down[1], down[2], down[3],
          down[4], down[5]);
  CHECK(down[1] < down[0]);
  CHECK(down[2] < down[1]);
  CHECK(down[3] < down[1]);
  // (On this 52-value model a block's exponent and its vectors' framing outweigh the levels saved
  // against q4; the block test above measures q2 on a model of 2,150 values.)
  CHECK(down[4] < down[0]);
  CHECK(down[5] < down[4]);
  CHECK(acc[4] > acc[0] - 0.1);
  CHECK(acc[5] > acc[0] - 0.1);
  CHECK(acc[1] > w.accuracy(w.init()) + 0.2);
  CHECK(acc[1] > acc[0] - 0.05);
  CHECK(acc[2] > acc[0] - 0.1);
  CHECK(acc[3] > acc[0] - 0.1);
}

TEST_CASE("an engine with a top-k downlink learns with fewer downlink bytes and resumes exactly",
          "[server]") {
  World w;
  TempDir dir;
  uint64_t down[2] = {0, 0};
  double acc[2] = {0, 0};
  std::vector<float> models[2];
  for (int lossy = 0; lossy < 2; ++lossy) {
    InProcFleet fleet(*w.trainer, w.train, w.shards(4));
    // Dense updates: the model changes everywhere each round, so only a lossy downlink is small.
    auto cfg = w.config("none", 8);
    cfg.sampling.fraction = 1.0;
    cfg.downlink = lossy ? server::Downlink::kTopK : server::Downlink::kDelta;
    cfg.downlink_density = 0.05;
    server::RoundEngine e(w.layout, cfg, w.init());
    e.run(fleet, [&](const server::RoundRecord& r) { down[lossy] += r.downlink_bytes; });
    acc[lossy] = w.accuracy(e.model().current());
    models[lossy] = modelOf(e);
    if (lossy) CHECK_FALSE(sameBits(e.model().current(), e.model().server()));  // x-hat lags x
  }
  CAPTURE(acc[0], acc[1], down[0], down[1]);
  CHECK(down[1] <
        down[0]);  // tasks of this 52-value model are mostly header: the payloads are checked above
  CHECK(acc[1] > w.accuracy(w.init()) + 0.2);  // the broadcast model learns
  CHECK(acc[1] > acc[0] - 0.1);

  // Crash after round 4 and resume: the broadcast model comes back from the checkpoint.
  auto cfg = w.config("none", 8);
  cfg.sampling.fraction = 1.0;
  cfg.downlink = server::Downlink::kTopK;
  cfg.downlink_density = 0.05;
  cfg.checkpoint = (dir.path / "ck.bin").string();
  InProcFleet fleet(*w.trainer, w.train, w.shards(4));
  const auto second = crashAfterFourRounds(w, cfg, fleet);
  second->run(fleet);
  CHECK(sameBits(modelOf(*second), models[1]));
  // A lossless run refuses a checkpoint that holds a broadcast model.
  auto plain = cfg;
  plain.downlink = server::Downlink::kDelta;
  CHECK_THROWS_WITH(server::RoundEngine(w.layout, plain, w.init()),
                    Catch::Contains("broadcast model"));
}

TEST_CASE("declared metrics beyond train_loss reach the round record and its JSON line",
          "[server]") {
  World w;
  InProcFleet fleet(*w.trainer, w.train, w.shards(4));
  auto cfg = w.config("randblock:density=0.25,ef_preview=0", 3);
  cfg.sampling.fraction = 1.0;
  cfg.scheme.metrics = {"train_loss", "ef_gain", "ef_residual_age"};
  server::RoundEngine e(w.layout, cfg, w.init());
  std::vector<server::RoundRecord> recs;
  e.run(fleet, [&](const server::RoundRecord& r) { recs.push_back(r); });
  REQUIRE(recs.size() == 3);
  CHECK(recs[0].metrics.at("ef_gain") == Approx(1.0));  // nothing waited in round 1
  CHECK(recs[0].metrics.at("ef_residual_age") == 0.0);
  CHECK(recs[1].metrics.at("ef_residual_age") == 1.0);  // every client took part in round 1
  CHECK(recs[2].metrics.at("ef_gain") > 1.0);  // plain EF: waiting coordinates arrive at once
  CHECK(recs[2].metrics.count("ef_residual_ratio") == 0);  // not declared
  CHECK(recs[2].json().find("\"ef_gain\":") != std::string::npos);
  CHECK(recs[2].json().find("ef_residual_ratio") == std::string::npos);
}

// Found by review: a checkpoint at model version 1 (round 1 not applied) must resume, and a
// lossless checkpoint resumed with a top-k downlink starts x-hat at the server's model.
TEST_CASE("resume from a checkpoint at version 1 and a lossless checkpoint resumed as top-k",
          "[server]") {
  World w;
  TempDir dir;
  auto cfg = w.config("none", 3);
  cfg.checkpoint = (dir.path / "ck.bin").string();
  cfg.sampling.min_available = 50;  // more than the fleet: round 1 waits, then is not applied
  cfg.sampling.wait_ms = 20;
  {
    InProcFleet fleet(*w.trainer, w.train, w.shards(4));
    server::RoundEngine e(w.layout, cfg, w.init());
    const auto rec = e.runRound(fleet);
    CHECK_FALSE(rec.applied);
    CHECK(e.model().version() == 1);
  }
  REQUIRE(fs::exists(cfg.checkpoint));
  cfg.sampling.min_available = 1;
  std::vector<float> resumed_model;
  {
    server::RoundEngine again(w.layout, cfg, std::vector<float>(w.layout->numel(), 0.0f));
    REQUIRE(again.resumed());
    CHECK(again.model().version() == 1);
    CHECK(sameBits(modelOf(again), w.init()));
  }
  // Two lossless rounds, then the same checkpoint resumed with a top-k downlink.
  {
    InProcFleet fleet(*w.trainer, w.train, w.shards(4));
    server::RoundEngine e(w.layout, cfg, w.init());
    e.runRound(fleet);
    e.runRound(fleet);
    resumed_model = modelOf(e);
  }
  auto lossy = cfg;
  lossy.downlink = server::Downlink::kTopK;
  lossy.downlink_density = 0.05;
  server::RoundEngine e(w.layout, lossy, w.init());
  REQUIRE(e.resumed());
  CHECK(sameBits(std::vector<float>(e.model().current().begin(), e.model().current().end()),
                 resumed_model));
  CHECK(sameBits(std::vector<float>(e.model().server().begin(), e.model().server().end()),
                 resumed_model));
}

TEST_CASE("a client holding the current version gets an empty delta, so evaluation costs no model",
          "[server]") {
  World w;
  server::ModelStore store(w.layout, 4, 0.1);
  store.set(w.init(), 1);
  auto x = w.init();
  for (auto& v : x) v += 0.25f;
  store.set(x, 2);
  for (const auto mode : {server::Downlink::kTopK, server::Downlink::kDelta}) {
    const server::EncodedModel same = store.encodeFor(2, mode);
    CHECK(same.base_version == 2);
    size_t coords = 0;
    for (const auto& p : same.tensors) coords += std::get<compression::Sparse>(p).indices.size();
    CHECK(coords == 0);
  }
  // Through the engine: what federated evaluation every round adds to the downlink is less with
  // top-k (an empty delta per task) than with the dense downlink (the whole model per task).
  uint64_t down[2][2] = {{0, 0}, {0, 0}};  // [topk][eval]
  for (int topk = 0; topk < 2; ++topk)
    for (int eval = 0; eval < 2; ++eval) {
      InProcFleet fleet(*w.trainer, w.train, w.shards(4));
      auto cfg = w.config("none", 4);
      cfg.sampling.fraction = 1.0;
      cfg.downlink = topk ? server::Downlink::kTopK : server::Downlink::kDense;
      cfg.downlink_density = 0.05;
      cfg.eval_every = eval ? 1 : 0;
      server::RoundEngine e(w.layout, cfg, w.init());
      e.run(fleet, [&](const server::RoundRecord& r) { down[topk][eval] += r.downlink_bytes; });
    }
  const uint64_t eval_dense = down[0][1] - down[0][0], eval_topk = down[1][1] - down[1][0];
  CAPTURE(eval_dense, eval_topk);
  // 16 evaluation tasks: each saves the model's 4 x 52 bytes, less two empty sparse tensors.
  CHECK(eval_topk + 16 * 100 < eval_dense);
}

TEST_CASE("metric names that would break or repeat a key of the metrics file are refused",
          "[server]") {
  World w;
  for (const char* bad : {"round", "wall_seconds", "time_train_s", "a\"b", "x y", "tab\t"}) {
    auto cfg = w.config("none", 1);
    cfg.scheme.metrics = {"train_loss", bad};
    CHECK_THROWS_AS(server::RoundEngine(w.layout, cfg, w.init()), ConfigError);
  }
  auto cfg = w.config("none", 1);
  cfg.scheme.metrics = {"train_loss", "ef_gain", "my.metric-2"};
  CHECK_NOTHROW(server::RoundEngine(w.layout, cfg, w.init()));
}

TEST_CASE("the evaluation's weighted mean stays finite at the largest losses and weights",
          "[server]") {
  // The mean was once summed as loss x examples, which overflowed for a loss near the double
  // range. At the bounds the server enforces (loss <= 1e9, examples <= 1e7 per client, many
  // clients) the mean is finite and exact enough; and an honest mix is the plain weighted mean.
  server::EvalReport big;
  for (int i = 0; i < 1000; ++i) big.add(10'000'000, 1e9, 1.0);
  CHECK(std::isfinite(big.loss));
  CHECK(big.loss == Approx(1e9).epsilon(1e-12));
  CHECK(big.accuracy == Approx(1.0));
  CHECK(big.clients == 1000);
  CHECK(big.examples == 10'000'000'000ull);
  server::EvalReport mix;
  mix.add(100, 2.0, 0.5);
  mix.add(300, 1.0, 0.9);
  CHECK(mix.loss == Approx((100 * 2.0 + 300 * 1.0) / 400));
  CHECK(mix.accuracy == Approx((100 * 0.5 + 300 * 0.9) / 400));
  // Examples saturate instead of wrapping around.
  server::EvalReport sat;
  sat.add(UINT64_MAX - 1, 1.0, 0.5);
  sat.add(5, 3.0, 0.5);
  CHECK(sat.examples == UINT64_MAX);
  CHECK(std::isfinite(sat.loss));
}

namespace {

// Forwards to an in-process fleet, or throws server::Stopped where told (as ZmqFleet does on
// SIGTERM).
class StoppingFleet final : public server::Fleet {
 public:
  enum class At { kNowhere, kWait, kPhase, kEvaluate };
  explicit StoppingFleet(server::Fleet& inner) : inner_(inner) {}
  At at = At::kNowhere;
  server::ClientPool waitForClients(size_t m, std::chrono::milliseconds t, uint64_t r) override {
    if (at == At::kWait) STARLING_THROW(server::Stopped, "asked to stop");
    return inner_.waitForClients(m, t, r);
  }
  server::PhaseReport runPhase(const server::PhaseTask& task, std::span<const server::ClientInfo> p,
                               size_t target, aggregation::PhaseAggregator& agg) override {
    if (at == At::kPhase) STARLING_THROW(server::Stopped, "asked to stop");
    return inner_.runPhase(task, p, target, agg);
  }
  server::EvalReport evaluate(const server::PhaseTask& task, const server::ClientPool& p) override {
    if (at == At::kEvaluate) STARLING_THROW(server::Stopped, "asked to stop");
    return inner_.evaluate(task, p);
  }
  void finish(const std::string& reason) override { inner_.finish(reason); }

 private:
  server::Fleet& inner_;
};

}  // namespace

TEST_CASE(
    "a stop before a round is applied records nothing, during its evaluation it keeps the round",
    "[server]") {
  // A graceful stop must cost no configured round, and must not lose one already applied.
  World w;
  TempDir dir;
  server::EngineConfig cfg = w.config("topk:density=0.2", 4);
  cfg.checkpoint = (dir.path / "ck.bin").string();
  cfg.metrics = (dir.path / "metrics.jsonl").string();
  cfg.eval_every = 1;
  InProcFleet inner(*w.trainer, w.train, w.shards(6));
  StoppingFleet fleet(inner);
  server::RoundEngine engine(w.layout, cfg, w.init());
  REQUIRE(engine.runRound(fleet).applied);
  const auto lines = [&] {
    std::ifstream f(cfg.metrics);
    size_t n = 0;
    for (std::string l; std::getline(f, l);) ++n;
    return n;
  };
  const std::vector<uint8_t> ck1 = readFile(cfg.checkpoint, 1 << 24);
  const auto model1 = modelOf(engine);
  for (const auto at : {StoppingFleet::At::kWait, StoppingFleet::At::kPhase}) {
    fleet.at = at;
    CHECK_THROWS_AS(engine.runRound(fleet), server::Stopped);
    CHECK(engine.nextRound() == 2);                   // round 2 not used up
    CHECK(lines() == 1);                              // nothing recorded
    CHECK(readFile(cfg.checkpoint, 1 << 24) == ck1);  // the checkpoint as it was
    CHECK(modelOf(engine) == model1);
  }
  // Stopped in round 2's evaluation, after its update was applied: round 2 is recorded and kept.
  fleet.at = StoppingFleet::At::kEvaluate;
  CHECK_THROWS_AS(engine.runRound(fleet), server::Stopped);
  CHECK(engine.nextRound() == 3);
  CHECK(lines() == 2);
  CHECK(modelOf(engine) != model1);
  // A restart from the checkpoint goes on at round 3 with round 2's model.
  server::RoundEngine resumed(w.layout, cfg, w.init());
  CHECK(resumed.resumed());
  CHECK(resumed.nextRound() == 3);
  CHECK(modelOf(resumed) == modelOf(engine));
}

namespace {

// Two encodings the same, payload by payload, field by field.
bool sameTask(const server::EncodedModel& a, const server::EncodedModel& b) {
  if (a.base_version != b.base_version || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& p = a.tensors[i];
    const auto& q = b.tensors[i];
    if (p.index() != q.index()) return false;
    if (const auto* t = std::get_if<compression::Ternary>(&p)) {
      const auto& y = std::get<compression::Ternary>(q);
      if (t->count != y.count || std::memcmp(&t->mu, &y.mu, 4) != 0 || t->rice != y.rice ||
          t->positions != y.positions || t->signs != y.signs)
        return false;
    } else if (const auto* g = std::get_if<compression::Qsgd>(&p)) {
      const auto& y = std::get<compression::Qsgd>(q);
      if (g->s != y.s || std::memcmp(&g->norm, &y.norm, 4) != 0 || g->packed != y.packed)
        return false;
    } else if (const auto* e = std::get_if<compression::Sparse>(&p)) {
      const auto& y = std::get<compression::Sparse>(q);
      if (e->indices != y.indices || !sameBits(e->values, y.values)) return false;
    } else {
      return false;  // no other payload in these stores' tasks
    }
  }
  return true;
}

}  // namespace

TEST_CASE(
    "the quantised and stc downlinks' refreshes survive a checkpoint: the store reset from it "
    "sends the same tasks, and refreshes that do not fit are refused",
    "[server]") {
  auto layout = std::make_shared<ParamLayout>();
  layout->add("w", {30, 20});
  layout->add("b", {20});
  const size_t n = layout->numel();
  const auto model = [&](uint64_t v) { return movingModel(n, v, v + 100); };
  using server::Downlink;
  const auto build = [&](Downlink mode) {
    server::ModelStore s = server::ModelStore::forDownlink(layout, mode, 3, 0.05);
    for (uint64_t v = 1; v <= 6; ++v) s.set(model(v), v);
    return s;
  };
  // The store a checkpoint restores: the server's model, its version and x-hat, then the bytes.
  const auto restore = [&](const server::ModelStore& from, Downlink mode) {
    server::ModelStore s = server::ModelStore::forDownlink(layout, mode, 3, 0.05);
    s.reset(std::vector<float>(from.server().begin(), from.server().end()), from.version(),
            std::vector<float>(from.current().begin(), from.current().end()));
    return s;
  };
  std::vector<uint8_t> stc_bytes, q8_bytes;
  for (const Downlink mode : {Downlink::kStc, Downlink::kQ8, Downlink::kQ4}) {
    INFO(server::downlinkName(mode));
    const server::ModelStore store = build(mode);
    const std::vector<uint8_t> bytes = store.saveRefreshes();
    REQUIRE_FALSE(bytes.empty());
    if (mode == Downlink::kStc) stc_bytes = bytes;
    if (mode == Downlink::kQ8) q8_bytes = bytes;
    server::ModelStore back = restore(store, mode);
    // Without the refreshes (a checkpoint of an older format) a client one version behind gets
    // the whole model.
    CHECK(back.baseFor(5, mode) == 0);
    back.loadRefreshes(bytes, "test");
    for (uint64_t held = 0; held <= 8; ++held) {
      INFO("held " << held);
      CHECK(back.baseFor(held, mode) == store.baseFor(held, mode));
      CHECK(sameTask(back.encodeFor(held, mode), store.encodeFor(held, mode)));
    }
    CHECK(back.baseFor(5, mode) == 5);
    if (mode == Downlink::kStc) CHECK(back.baseFor(3, mode) == 3);  // a chain of three
    CHECK(back.saveRefreshes() == bytes);
    // And the next version is made the same way from there.
    server::ModelStore next = build(mode);
    next.set(model(7), 7);
    back.set(model(7), 7);
    CHECK(sameBits(back.current(), next.current()));
    CHECK(sameTask(back.encodeFor(5, mode), next.encodeFor(5, mode)));
  }
  // Lossless and top-k stores keep no refreshes, and take none.
  for (const Downlink mode : {Downlink::kDense, Downlink::kDelta, Downlink::kTopK}) {
    INFO(server::downlinkName(mode));
    server::ModelStore store = build(mode);
    CHECK(store.saveRefreshes().empty());
    store.loadRefreshes({}, "test");
    CHECK_THROWS_MATCHING(store.loadRefreshes(q8_bytes, "test"), IoError,
                          Catch::Matchers::Contains("keeps 0"));
  }
  // The attacker's checkpoint: another downlink's refreshes, bytes cut or added, versions out of
  // order, a payload that does not fit its tensor. Each is refused, the store left as reset.
  const server::ModelStore stc = build(Downlink::kStc);
  const auto refused = [&](Downlink mode, const std::vector<uint8_t>& bytes, const char* why) {
    INFO(why);
    server::ModelStore s = restore(stc, mode);
    CHECK_THROWS_MATCHING(
        s.loadRefreshes(bytes, "checkpoint x"), IoError,
        Catch::Matchers::Contains("checkpoint x") && Catch::Matchers::Contains(why));
    CHECK(s.saveRefreshes().empty());
    CHECK(s.baseFor(5, mode) == 0);
  };
  refused(Downlink::kQ8, stc_bytes, "keeps 1");  // three refreshes for q8's one
  refused(Downlink::kStc, q8_bytes, "kind 1");   // q8's payloads for stc
  {
    // q4's levels are not q8's: q8's refresh into a q4 store.
    server::ModelStore s = restore(build(Downlink::kQ4), Downlink::kQ4);
    CHECK_THROWS_MATCHING(s.loadRefreshes(q8_bytes, "test"), IoError,
                          Catch::Matchers::Contains("127 levels"));
  }
  std::vector<uint8_t> cut(stc_bytes.begin(), stc_bytes.end() - 1);
  refused(Downlink::kStc, cut, "truncated");
  std::vector<uint8_t> more = stc_bytes;
  more.push_back(0);
  refused(Downlink::kStc, more, "trailing");
  // The first refresh's base version (after the count): 6, the model's own version, then 0.
  std::vector<uint8_t> late = stc_bytes;
  late[8] = 6;
  refused(Downlink::kStc, late, "from version 6");
  late[8] = 0;
  refused(Downlink::kStc, late, "from version 0");
  // The first tensor's entry count (after the base version and the kind): past the tensor.
  std::vector<uint8_t> wide = stc_bytes;
  for (size_t i = 17; i < 21; ++i) wide[i] = 0xff;
  refused(Downlink::kStc, wide, "tensor 'w'");
}

TEST_CASE("the metrics file: one line per record, completed once after a kill", "[server]") {
  TempDir dir;
  const std::string path = (dir.path / "m.jsonl").string();
  const auto text = [&] {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  server::RoundRecord r1, r2;
  r1.round = 1;
  r2.round = 2;
  r2.applied = true;
  const server::MetricsLog log(path);
  log.append(r1);
  CHECK(text() == r1.json() + "\n");
  // A kill in the middle of round 2's line: the partial line is cut, the record appended once.
  { std::ofstream(path, std::ios::app) << r2.json().substr(0, 9); }
  log.complete(2, r2.json());
  CHECK(text() == r1.json() + "\n" + r2.json() + "\n");
  log.complete(2, r2.json());  // the file already ends with it
  log.complete(1, r1.json());  // an older one
  CHECK(text() == r1.json() + "\n" + r2.json() + "\n");
  // No path: nothing written, nothing thrown.
  server::MetricsLog().append(r1);
  server::MetricsLog().complete(3, r1.json());
  // A file that cannot be appended to is an IoError naming it.
  const std::string folder = (dir.path / "sub").string();
  std::filesystem::create_directory(folder);
  CHECK_THROWS_MATCHING(server::MetricsLog(folder).append(r1), IoError,
                        Catch::Matchers::Contains(folder));
}

TEST_CASE(
    "sampling takes the same clients from a listed pool and from a generated one, those a shuffle "
    "of the whole pool puts first, and samples a pool of ten million without holding it",
    "[server]") {
  using server::ClientInfo;
  using server::ClientPool;
  // 5,000 clients with ids 3i + 1 (a generated pool of listed ids), the list given backwards.
  const auto make = [](uint64_t id) {
    const uint64_t e = 10 + (id / 3) % 7;
    return ClientInfo{id, protocol::Role::kClient, e, e, 0, false, false};
  };
  std::vector<ClientInfo> list;
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 5000; ++i) ids.push_back(3 * i + 1);
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) list.push_back(make(*it));
  const ClientPool listed(list), generated = ClientPool::generated(ids, make);
  REQUIRE(listed.size() == 5000);
  REQUIRE(generated.size() == 5000);
  CHECK(listed[0].id == 1);  // sorted by id
  const auto idsOf = [](const std::vector<ClientInfo>& v) {
    std::vector<uint64_t> out;
    for (const auto& c : v) out.push_back(c.id);
    return out;
  };
  const privacy::Key32 key = privacy::publicKey("test sampling", 9, 0);
  server::SamplingConfig s;
  s.clients_per_round = 50;
  s.overcommit = 1.3;
  for (uint64_t round = 1; round <= 4; ++round) {
    INFO("round " << round);
    size_t ta = 0, tb = 0;
    const auto a = server::sampleClients(listed, s, 9, key, round, &ta);
    const auto b = server::sampleClients(generated, s, 9, key, round, &tb);
    CHECK(ta == 50);
    CHECK(tb == 50);
    REQUIRE(a.size() == 65);
    CHECK(idsOf(a) == idsOf(b));
    for (const auto& c : b) CHECK(c.num_examples == make(c.id).num_examples);
    // What sampling is defined as: the pool, by id, shuffled on the stream (seed, round), its
    // first 65.
    std::vector<ClientInfo> ref(list.rbegin(), list.rend());
    RngStream rng(StreamKey{9, round, kAnyClient, StreamPurpose::kClientSampling, 0});
    data::shuffleInPlace(std::span<ClientInfo>(ref), rng);
    ref.resize(65);
    std::sort(ref.begin(), ref.end(),
              [](const ClientInfo& x, const ClientInfo& y) { return x.id < y.id; });
    CHECK(idsOf(a) == idsOf(ref));
  }
  // Poisson sampling keeps the same clients of either form.
  server::SamplingConfig p;
  p.poisson_rate = 0.01;
  size_t ta = 0, tb = 0;
  const auto pa = server::sampleClients(listed, p, 9, key, 3, &ta);
  CHECK(idsOf(pa) == idsOf(server::sampleClients(generated, p, 9, key, 3, &tb)));
  CHECK(pa.size() > 15);  // Binomial(5000, 0.01): 50 expected, sd 7
  CHECK(pa.size() < 100);
  // A generated pool of ten million clients: a thousand distinct ones, ascending, the same each
  // time, others in another round.
  const ClientPool huge = ClientPool::generated(10'000'000, make);
  server::SamplingConfig t;
  t.clients_per_round = 1000;
  size_t th = 0;
  const auto h1 = idsOf(server::sampleClients(huge, t, 9, key, 1, &th));
  REQUIRE(h1.size() == 1000);
  CHECK(th == 1000);
  CHECK(std::adjacent_find(h1.begin(), h1.end(), std::greater_equal<>()) == h1.end());
  CHECK(h1.back() < 10'000'000);
  CHECK(h1 == idsOf(server::sampleClients(huge, t, 9, key, 1, &th)));
  CHECK(h1 != idsOf(server::sampleClients(huge, t, 9, key, 2, &th)));
  // A list's clients and evaluators leave out edge aggregators and clients without test data; a
  // generated pool's are all of it.
  const ClientPool mixed(
      std::vector<ClientInfo>{ClientInfo{5, protocol::Role::kClient, 10, 0, 0, false, false},
                              ClientInfo{2, protocol::Role::kAggregator, 40, 40, 0, false, false},
                              ClientInfo{7, protocol::Role::kClient, 10, 10, 0, false, false}});
  CHECK(idsOf(mixed.clients().list()) == std::vector<uint64_t>{5, 7});
  CHECK(idsOf(mixed.evaluators().list()) == std::vector<uint64_t>{2, 7});
  CHECK(generated.clients().size() == 5000);
  CHECK(generated.evaluators().size() == 5000);
  CHECK_THROWS_AS(generated[5000], InvalidArgument);
  CHECK_THROWS_AS(ClientPool::generated(std::vector<uint32_t>{4, 2}, make), InvalidArgument);
}
