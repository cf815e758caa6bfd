// The asynchronous server's checkpoint (server/async_server.h): saved with updates in its buffer
// and loaded into a new server, it takes the step the saved one takes, bit for bit; a checkpoint
// of another configuration, a synchronous one, or a damaged one is refused and changes nothing.
// The asynchronous root's journal (server/async_root.h) of the updates since its last checkpoint.
#include "server/async_server.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <random>

#include "check_throws.h"
#include "core/file_io.h"
#include "core/framed_file.h"
#include "protocol/codec.h"
#include "server/async_root.h"
#include "temp_dir.h"

using namespace starling;
using Catch::Matchers::Contains;

namespace {

// A fleet for the asynchronous root's engine (server/async_engine.h) that answers with the
// updates it is given, one per turn, and then stops (server::Stopped, as SIGTERM does): a root
// "killed" with exactly those taken. With stop_after_take the last one is taken (journaled) and
// the root stopped before the engine can step on it.
class ScriptFleet final : public server::AsyncFleet {
 public:
  std::vector<compression::Update> script;
  bool stop_after_take = false;
  size_t refused = 0;  // by the server (InputError)
  double now() const override { return 0.0; }
  size_t open() const override { return 0; }
  size_t start(size_t, server::AsyncIntake&) override { return 0; }
  server::AsyncEvent next(double, server::AsyncIntake& in) override {
    if (next_ == script.size()) throw server::Stopped("the script is done");
    const compression::Update& u = script[next_++];
    const std::vector<uint8_t> message = protocol::encodeUpdate(u);
    const compression::UpdateView v = compression::view(u);
    server::AsyncArrival a;
    a.client = u.header.client_id;
    a.update = &v;
    a.limits = aggregation::ClientLimits{10};
    a.message = message;
    a.bytes = message.size();
    try {
      in.take(a);
    } catch (const InputError&) {
      ++refused;
      in.failed(a.client);
    }
    if (stop_after_take && next_ == script.size()) throw server::Stopped("killed");
    return server::AsyncEvent::kTaken;
  }

 private:
  size_t next_ = 0;
};

// Runs `root` over `fleet` until the script is done; what it took is durable then.
void runScript(server::AsyncRoot& root, ScriptFleet& fleet) {
  try {
    root.run(static_cast<server::AsyncFleet&>(fleet));
  } catch (const server::Stopped&) {
  }
}

std::shared_ptr<const ParamLayout> smallLayout() {
  auto l = std::make_shared<ParamLayout>();
  l->add("w", {4, 5});
  l->add("b", {5});
  return l;
}

compression::Update randomUpdate(const ParamLayout& l, uint64_t client, uint64_t from, uint64_t n,
                                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  compression::Update u;
  u.header = {l.fingerprint(), from, 0, client, n};
  for (const auto& t : l.tensors()) {
    std::vector<float> v(t.numel);
    for (float& x : v) x = normal(rng);
    u.tensors.push_back(compression::DenseF32{std::move(v)});
  }
  u.metrics = {{"train_loss", 1.0 + static_cast<double>(seed % 7)}};
  return u;
}

server::AsyncServerConfig config(const std::string& opt) {
  server::AsyncServerConfig c;
  c.scheme.compressor = "none";
  c.scheme.run_seed = 3;
  c.server_opt = opt;
  c.async = aggregation::AsyncOptions{3, 4, "polynomial:a=0.5"};
  c.downlink = server::Downlink::kTopK;  // lossy: the broadcast model is kept too
  c.density = 0.25;
  return c;
}

std::vector<float> modelOf(const server::AsyncServer& s) {
  return {s.model().server().begin(), s.model().server().end()};
}

}  // namespace

TEST_CASE(
    "an asynchronous server saved with a buffer and loaded takes the same steps, bit for bit, "
    "and a checkpoint it cannot take is refused",
    "[server][async]") {
  const auto l = smallLayout();
  starling::testing::TempDir dir("async-server");
  const std::string ck = (dir.path / "async.ckpt").string();
  const std::vector<float> init(l->numel(), 0.05f);
  // FedAdam: the optimizer's moments are in the checkpoint too.
  const server::AsyncServerConfig cfg = config("fedadam:eta=0.01");
  server::AsyncServer a(l, cfg, init);
  uint64_t seed = 1;
  for (uint64_t c = 1; c <= 3; ++c)
    a.add(compression::view(randomUpdate(*l, c, 1, 10 + c, seed++)));
  REQUIRE(a.step().applied);
  a.add(compression::view(randomUpdate(*l, 4, 1, 7, seed++)));  // one version stale
  a.add(compression::view(randomUpdate(*l, 1, 2, 9, seed++)));
  CHECK_THROWS_AS(a.add(compression::view(randomUpdate(*l, 1, 2, 9, seed))), InputError);
  REQUIRE(a.buffered() == 2);
  a.saveCheckpoint(ck);

  // A file from before the files' frame (the server's state alone) is read as the framed one.
  {
    std::vector<uint8_t> bare;
    ByteWriter bw(bare);
    a.save(bw);
    const std::string old = (dir.path / "old.ckpt").string();
    writeFileAtomic(old, bare);
    server::AsyncServer o(l, cfg, std::vector<float>(l->numel(), 0.0f));
    o.loadCheckpoint(old);
    CHECK(o.steps() == 1);
    CHECK(o.buffered() == 2);
    CHECK(modelOf(o) == modelOf(a));
    CHECK(readFile(ck, 1 << 20) != bare);  // the framed file is another file
  }

  server::AsyncServer b(l, cfg, std::vector<float>(l->numel(), 0.0f));
  b.loadCheckpoint(ck);
  CHECK(b.steps() == 1);
  CHECK(b.version() == 2);
  CHECK(b.buffered() == 2);
  CHECK(b.hasUpdate(1, 2));
  CHECK(modelOf(b) == modelOf(a));
  CHECK(std::vector<float>(b.model().current().begin(), b.model().current().end()) ==
        std::vector<float>(a.model().current().begin(), a.model().current().end()));
  // The same updates to both from here: the same steps, the same records.
  for (uint64_t round = 0; round < 2; ++round) {
    const uint64_t from = a.version();
    for (uint64_t c = 5; a.buffered() < 3; ++c) {
      const auto u = randomUpdate(*l, c + 10 * round, from, 5 + c, seed++);
      a.add(compression::view(u));
      b.add(compression::view(u));
    }
    const server::RoundRecord ra = a.step(), rb = b.step();
    CHECK(rb.applied == ra.applied);
    CHECK(rb.round == ra.round);
    CHECK(rb.clients_completed == ra.clients_completed);
    CHECK(rb.updates_rejected == ra.updates_rejected);
    CHECK(rb.metrics == ra.metrics);
    CHECK(rb.train_loss == ra.train_loss);
    const auto ma = modelOf(a), mb = modelOf(b);
    REQUIRE(ma.size() == mb.size());
    CHECK(std::memcmp(ma.data(), mb.data(), ma.size() * sizeof(float)) == 0);
  }

  // Refused, naming why, and the server it was loaded into unchanged.
  const auto refused = [&](const server::AsyncServerConfig& c, const std::string& path,
                           const std::string& says) {
    INFO(says);
    server::AsyncServer s(l, c, init);
    CHECK_THROWS_MATCHING(s.loadCheckpoint(path), IoError, Contains(says));
    CHECK(s.version() == 1);
    CHECK(s.buffered() == 0);
    CHECK(modelOf(s) == init);
  };
  refused(config("fedavg"), ck, "aggregation.server_opt = 'fedadam:eta=0.01'");
  server::AsyncServerConfig other = cfg;
  other.async.staleness = "constant";
  refused(other, ck, "async.staleness");
  other = cfg;
  other.async.max_staleness = 9;
  refused(other, ck, "async.max_staleness = 4");
  other = cfg;
  other.downlink = server::Downlink::kDelta;
  refused(other, ck, "downlink.mode");
  std::vector<uint8_t> bytes = readFile(ck, 1 << 20);
  const std::string cut = (dir.path / "cut.ckpt").string();
  writeFileAtomic(cut, std::span<const uint8_t>(bytes).first(bytes.size() - 9));
  refused(cfg, cut, "truncated");
  auto flipped = bytes;
  flipped[bytes.size() - 5] ^= 0x10;
  const std::string damaged = (dir.path / "damaged.ckpt").string();
  writeFileAtomic(damaged, flipped);
  refused(cfg, damaged, "damaged");
  const std::string sync = (dir.path / "sync.ckpt").string();
  bytes[0] ^= 0xff;
  writeFileAtomic(sync, bytes);
  refused(cfg, sync, "not a checkpoint of asynchronous rounds");
  // A synchronous run's checkpoint is named as such.
  const std::string engine = (dir.path / "engine.ckpt").string();
  writeFramed(engine, FileFormat{0x4b434c53 /* the engine's */, "engine", 8, 8, 8}, bytes);
  refused(cfg, engine, "resumes only with round.mode = sync");
}

TEST_CASE(
    "a step that is not applied lets its clients send again from the version, instead of "
    "shutting them out of it",
    "[server][async]") {
  const auto l = smallLayout();
  server::AsyncServerConfig cfg = config("fedavg");
  cfg.async.buffer_size = 2;
  // A server learning rate that overflows the step: the model would be non-finite.
  cfg.server_opt = "fedavg:eta=1e38";
  const auto big = [&](uint64_t client) {
    compression::Update u = randomUpdate(*l, client, 1, 10, client);
    for (auto& t : u.tensors)
      for (float& x : std::get<compression::DenseF32>(t).values) x = 100.0f;
    return u;
  };
  server::AsyncServer s(l, cfg, std::vector<float>(l->numel(), 1.0f));
  s.add(compression::view(big(1)));
  s.add(compression::view(big(2)));
  CHECK(s.hasUpdate(1, 1));
  const server::RoundRecord r = s.step();
  CHECK_FALSE(r.applied);
  CHECK(s.version() == 1);
  CHECK_FALSE(s.hasUpdate(1, 1));
  CHECK_FALSE(s.hasUpdate(2, 1));
  s.add(compression::view(randomUpdate(*l, 1, 1, 10, 3)));  // again, from version 1: taken
  CHECK(s.buffered() == 1);
}

TEST_CASE(
    "the asynchronous root journals each accepted update: restarted, it adds them again and steps "
    "as the root that never stopped, a cut record is dropped, an earlier checkpoint's journal "
    "ignored",
    "[server][async]") {
  starling::testing::TempDir dir("async-journal");
  const auto l = smallLayout();
  std::vector<float> init(l->numel(), 0.1f);
  server::AsyncRootConfig rc;
  rc.steps = 5;
  rc.fleet.min_available = 3;
  const auto rootAt = [&](const std::string& ck) {
    server::AsyncRootConfig c = rc;
    c.checkpoint = (dir.path / ck).string();
    return std::make_unique<server::AsyncRoot>(l, config("fedavg"), c, init);
  };
  const auto give = [&](server::AsyncRoot& root, uint64_t client, uint64_t seed) {
    ScriptFleet f;
    f.script.push_back(randomUpdate(*l, client, root.server().version(), 4, seed));
    runScript(root, f);
  };
  // K = 3: four updates give a step and one buffered; the reference never stops.
  auto ref = rootAt("ref.ckpt");
  for (uint64_t c = 0; c < 4; ++c) give(*ref, c, 10 + c);
  REQUIRE(ref->server().steps() == 1);
  REQUIRE(ref->server().buffered() == 1);
  const std::string ck = (dir.path / "cut.ckpt").string();
  {
    auto cut = rootAt("cut.ckpt");
    CHECK_FALSE(cut->resumed());
    const auto size = std::filesystem::file_size(ck);
    for (uint64_t c = 0; c < 2; ++c) give(*cut, c, 10 + c);
    // Accepted updates go to the journal, not into a new checkpoint.
    CHECK(std::filesystem::file_size(ck + ".journal") > 2 * l->numel() * sizeof(float));
    CHECK(std::filesystem::file_size(ck) == size);
  }
  {
    // Killed with two accepted: both come back from the journal; then the same two updates as
    // the reference's: the same step, bit for bit.
    auto again = rootAt("cut.ckpt");
    CHECK(again->resumed());
    CHECK(again->replayed() == 2);
    CHECK(again->tornBytes() == 0);
    CHECK(again->server().buffered() == 2);
    for (uint64_t c = 2; c < 4; ++c) give(*again, c, 10 + c);
    CHECK(again->server().steps() == 1);
    CHECK(modelOf(again->server()) == modelOf(ref->server()));
  }
  // The journal now follows step 1's checkpoint and holds update 3. Cut its record short (a kill
  // in the middle of the append): dropped, the file cut back, the root at step 1 with none.
  const auto journal = ck + ".journal";
  std::filesystem::resize_file(journal, std::filesystem::file_size(journal) - 5);
  {
    auto torn = rootAt("cut.ckpt");
    CHECK(torn->replayed() == 0);
    CHECK(torn->tornBytes() > 0);
    CHECK(torn->server().buffered() == 0);
    CHECK(torn->server().steps() == 1);
    give(*torn, 3, 13);  // appended after the cut: read back next time
  }
  {
    auto whole = rootAt("cut.ckpt");
    CHECK(whole->replayed() == 1);
    CHECK(whole->tornBytes() == 0);
    CHECK(whole->server().buffered() == 1);
  }
  // A journal of an earlier checkpoint (killed between a step's checkpoint and its new journal)
  // holds updates the step already took: started over, not added twice.
  const std::vector<uint8_t> step1 = readFile(journal, 1 << 20);
  {
    auto more = rootAt("cut.ckpt");
    for (uint64_t c = 4; c < 6; ++c) give(*more, c, 20 + c);  // 1 + 2: step 2
    REQUIRE(more->server().steps() == 2);
  }
  writeFileAtomic(journal, step1);
  {
    auto stale = rootAt("cut.ckpt");
    CHECK(stale->replayed() == 0);
    CHECK(stale->server().steps() == 2);
    CHECK(stale->server().buffered() == 0);
  }
  // A journal that is not one, one of another step, one damaged before its last record, or one
  // without its checkpoint stops the root, the files left as they are.
  writeFileAtomic(journal, std::vector<uint8_t>(40, 7));
  CHECK_THROWS_MATCHING(rootAt("cut.ckpt"), IoError, Contains("not a journal"));
  std::vector<uint8_t> ahead = step1;
  ahead[8] = 9;  // the header's step
  writeFileAtomic(journal, ahead);
  CHECK_THROWS_MATCHING(rootAt("cut.ckpt"), IoError, Contains("not of one run"));
  {
    auto two = rootAt("two.ckpt");
    give(*two, 0, 30);
    give(*two, 1, 31);
  }
  std::vector<uint8_t> damaged = readFile(dir.path / "two.ckpt.journal", 1 << 20);
  damaged[24 + 16 + 20] ^= 0xff;  // inside the first record's payload
  writeFileAtomic(dir.path / "two.ckpt.journal", damaged);
  CHECK_THROWS_MATCHING(rootAt("two.ckpt"), IoError, Contains("damaged and more follow"));
  CHECK(readFile(dir.path / "two.ckpt.journal", 1 << 20) == damaged);
  std::filesystem::remove(dir.path / "two.ckpt");
  CHECK_THROWS_MATCHING(rootAt("two.ckpt"), IoError, Contains("has no checkpoint"));

  // Killed after journaling the K-th update, before its step: the resumed root steps at its first
  // turn, to the model the reference's step made.
  {
    auto full = rootAt("full.ckpt");
    for (uint64_t c = 0; c < 2; ++c) give(*full, c, 10 + c);
    ScriptFleet f;
    f.script.push_back(randomUpdate(*l, 2, 1, 4, 12));
    f.stop_after_take = true;
    runScript(*full, f);
    REQUIRE(full->server().ready());
  }
  auto full = rootAt("full.ckpt");
  CHECK(full->server().buffered() == 3);
  ScriptFleet none;
  runScript(*full, none);
  CHECK(full->server().steps() == 1);
  CHECK(full->server().buffered() == 0);
  auto ref1 = rootAt("ref1.ckpt");
  for (uint64_t c = 0; c < 3; ++c) give(*ref1, c, 10 + c);
  CHECK(modelOf(full->server()) == modelOf(ref1->server()));
}

TEST_CASE(
    "the asynchronous root journals the server's refusals: a resumed step counts those since its "
    "checkpoint, as the root that never stopped does",
    "[server][async]") {
  starling::testing::TempDir dir("async-refusals");
  const auto l = smallLayout();
  const std::vector<float> init(l->numel(), 0.1f);
  const auto rootAt = [&](const std::string& tag) {
    server::AsyncRootConfig c;
    c.steps = 5;
    c.fleet.min_available = 3;
    c.checkpoint = (dir.path / (tag + ".ckpt")).string();
    c.metrics = (dir.path / (tag + ".jsonl")).string();
    return std::make_unique<server::AsyncRoot>(l, config("fedavg"), c, init);
  };
  // true: accepted; false: refused by the server (a second update from a client and version).
  const auto give = [&](server::AsyncRoot& root, uint64_t client) {
    ScriptFleet f;
    f.script.push_back(randomUpdate(*l, client, root.server().version(), 4, client));
    runScript(root, f);
    return f.refused == 0;
  };
  const auto rejected = [&](const std::string& tag) {
    const std::vector<uint8_t> b = readFile(dir.path / (tag + ".jsonl"), 1 << 20);
    const std::string text(b.begin(), b.end());
    const size_t at = text.find("\"updates_rejected\":");
    REQUIRE(at != std::string::npos);
    return std::stoull(text.substr(at + 19));
  };
  // K = 3; clients 0 and 1 each send twice: the step counts two refusals.
  auto ref = rootAt("ref");
  for (uint64_t c : {0, 0, 1, 1, 2}) give(*ref, c);
  REQUIRE(ref->server().steps() == 1);
  CHECK(rejected("ref") == 2);
  {
    auto cut = rootAt("cut");
    CHECK(give(*cut, 0));
    CHECK_FALSE(give(*cut, 0));
    CHECK(give(*cut, 1));
  }  // killed: two updates and a refusal since the checkpoint
  {
    auto again = rootAt("cut");
    CHECK(again->replayed() == 2);
    CHECK(again->refusalsReplayed() == 1);
    CHECK_FALSE(give(*again, 1));  // still a duplicate: the journal brought client 1's update back
    CHECK(give(*again, 2));
    REQUIRE(again->server().steps() == 1);
    CHECK(rejected("cut") == 2);
    CHECK(modelOf(again->server()) == modelOf(ref->server()));
  }
  // A journal of format 1 (before refusals were journaled) still reads: its updates come back.
  {
    auto old = rootAt("old");
    CHECK(give(*old, 0));
  }
  const std::string journal = (dir.path / "old.ckpt.journal").string();
  std::vector<uint8_t> bytes = readFile(journal, 1 << 20);
  const uint32_t one = 1;
  std::memcpy(bytes.data() + 4, &one, sizeof one);  // the header's format, after the magic
  writeFileAtomic(journal, bytes);
  CHECK(rootAt("old")->replayed() == 1);
  // A format this build does not know is refused, naming the ones it reads.
  const uint32_t three = 3;
  std::memcpy(bytes.data() + 4, &three, sizeof three);
  writeFileAtomic(journal, bytes);
  CHECK_THROWS_MATCHING(rootAt("old"), IoError, Contains("format version 3 is not 1 or 2"));
}
