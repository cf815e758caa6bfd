// split/net.h: split fine-tuning over ZeroMQ on 127.0.0.1. One networked edge computes what the
// in-process mode computes; the cloud refuses every lie and changes nothing; a vanished edge's
// session is closed while another edge carries on; a restarted cloud goes on from its checkpoint
// and the edge opens a new session by itself; CURVE admits only listed keys under their own ids.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "client/synthetic.h"
#include "core/input_error.h"
#include "protocol/control.h"
#include "split/net.h"
#include "split/split_data.h"
#include "test_util.h"
#include "transport/keys.h"

using namespace starling;
using namespace starling::split;
using starling::testing::quadrants;
using namespace std::chrono_literals;
namespace pr = starling::protocol;

namespace {

constexpr const char* kCut = "conv2";

SplitModel model() { return SplitModel("cnn", kCut, 8, 8, 4); }

// A cloud serving in its own thread (which creates, polls and destroys the server socket), with
// its own SplitModel. stop() joins it; then the stats and the top part may be read.
class CloudThread {
 public:
  CloudThread(std::vector<float> top, CloudServerConfig cfg, std::string down, double lr = 0.05)
      : sm_(model()), cloud_(sm_, std::move(top), down, lr) {
    std::promise<std::string> bound;
    auto ep = bound.get_future();
    thread_ = std::thread([this, cfg, &bound]() mutable {
      transport::Context ctx;
      std::unique_ptr<SplitCloudServer> server;
      try {
        server = std::make_unique<SplitCloudServer>(ctx, cloud_, cfg);
      } catch (...) {
        bound.set_exception(std::current_exception());
        return;
      }
      bound.set_value(server->endpoint());  // `bound` is gone after this
      while (!stop_.load()) {
        server->poll(20ms);
        {
          const std::lock_guard<std::mutex> lock(live_mutex_);
          live_ = server->stats();
        }
        live_changed_.notify_all();
      }
      try {
        server->saveCheckpoint();
      } catch (const Error&) {
        checkpoint_failed_ = true;
      }
      stats_ = server->stats();
      sessions_ = server->sessions();
    });
    try {
      endpoint_ = ep.get();
    } catch (...) {
      thread_.join();
      throw;
    }
  }
  ~CloudThread() { stop(); }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  const CloudStats& stats() const { return stats_; }
  // Waits until `pred` holds of the running server's statistics (published after each poll), at
  // most `timeout`: what a test waits on instead of a pause.
  bool waitStats(const std::function<bool(const CloudStats&)>& pred,
                 std::chrono::milliseconds timeout = 20000ms) const {
    std::unique_lock<std::mutex> lock(live_mutex_);
    return live_changed_.wait_for(lock, timeout, [&] { return pred(live_); });
  }
  size_t sessions() const { return sessions_; }
  bool checkpointFailed() const { return checkpoint_failed_; }
  std::vector<float> top() const { return {cloud_.top().begin(), cloud_.top().end()}; }

 private:
  SplitModel sm_;
  SplitCloud cloud_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::string endpoint_;
  CloudStats stats_;
  mutable std::mutex live_mutex_;
  mutable std::condition_variable live_changed_;
  CloudStats live_;
  size_t sessions_ = 0;
  bool checkpoint_failed_ = false;
};

transport::SecurityConfig insecure() {
  transport::SecurityConfig s;
  s.insecure = true;
  return s;
}

CloudServerConfig cloudConfig(const SplitModel& sm, const std::string& up,
                              const std::string& down) {
  CloudServerConfig c;
  c.bind = "tcp://127.0.0.1:*";
  c.security = insecure();
  c.fingerprint = sessionFingerprint(sm, up, down);
  c.up = up;
  c.down = down;
  return c;
}

EdgeClientConfig edgeConfig(const SplitModel& sm, const std::string& endpoint, uint64_t id,
                            const std::string& up, const std::string& down) {
  EdgeClientConfig c;
  c.cloud = endpoint;
  c.security = insecure();
  c.edge_id = id;
  c.fingerprint = sessionFingerprint(sm, up, down);
  c.up = up;
  c.down = down;
  c.step_timeout = 10000ms;  // generous: the first test asserts that nothing was sent twice
  c.tries = 5;
  return c;
}

// A raw peer speaking the protocol by hand (the attacker).
struct RawPeer {
  RawPeer(transport::Context& ctx, const std::string& endpoint)
      : socket(ctx, endpoint, insecure(), transport::TransportLimits{}) {}
  // The answer to `bytes`: a Reject's code, "reply" for a SplitReply, "none" without an answer.
  std::string ask(const std::vector<uint8_t>& bytes, pr::SplitReplyMsg* reply = nullptr) {
    socket.send(bytes);
    const auto r = socket.receive(3000ms);
    if (!r || !r->ok()) return "none";
    const auto kind = pr::peekKind(r->bytes());
    if (kind == pr::MessageKind::kReject)
      return errcName(static_cast<Errc>(pr::decodeReject(r->bytes()).code));
    if (kind == pr::MessageKind::kSplitReply) {
      if (reply) *reply = pr::decodeSplitReply(r->bytes());
      return "reply";
    }
    return "other";
  }
  transport::ClientSocket socket;
};

std::filesystem::path tempDir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() /
           ("starling-split-net-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace

TEST_CASE("one networked edge computes what the in-process mode computes", "[split][net]") {
  const data::Dataset d = quadrants(64, 5);
  const std::vector<size_t> idx = testing::allIndices(d);
  SplitModel sm = model();
  const std::vector<float> params = sm.initParameters(4);
  SplitTrainConfig cfg;
  cfg.batch_size = 16;
  cfg.up = "int8";
  cfg.down = "lowrank:rank=2";  // a codec with state on the cloud, per edge
  InProcessSplit local(sm, cfg, params);
  const auto [bottom, top] = sm.cutParameters(params);
  CloudThread cloud(top, cloudConfig(sm, cfg.up, cfg.down), cfg.down);
  SplitModel edge_model = model();
  SplitEdge edge(edge_model, bottom, cfg.up, cfg.lr);
  transport::Context ctx;
  {
    SplitEdgeClient client(ctx, edge, edgeConfig(sm, cloud.endpoint(), 3, cfg.up, cfg.down));
    client.connect();
    for (uint32_t e = 1; e <= 2; ++e) {
      INFO("epoch " << e);
      const EpochRecord a = local.runEpoch(d, idx, &d, idx);
      const EpochRecord b = runEdgeEpoch(client, cfg, e, 0, d, idx, d, idx);
      CHECK(b.steps == a.steps);
      CHECK(b.uplink_bytes == a.uplink_bytes);
      CHECK(b.downlink_bytes == a.downlink_bytes);
      CHECK(b.train_loss == Approx(a.train_loss).epsilon(1e-5));
      CHECK(b.train_accuracy == a.train_accuracy);
      CHECK(b.test_loss == Approx(a.test_loss).epsilon(1e-5));
      CHECK(b.test_accuracy == a.test_accuracy);
      CHECK(b.eval_bytes > 0);  // uncompressed activations of the 64 test examples
      CHECK(b.cloud_seconds > 0);
    }
    CHECK(client.stats().sessions == 1);
    CHECK(client.stats().resent == 0);
    client.bye();
    REQUIRE(cloud.waitStats([](const CloudStats& st) { return st.goodbyes == 1; }));
  }
  cloud.stop();
  CHECK(cloud.stats().steps == 8);
  CHECK(cloud.stats().evaluations == 2);
  CHECK(cloud.stats().goodbyes == 1);
  CHECK(cloud.sessions() == 0);
  const std::vector<float> want(local.top().begin(), local.top().end());
  CHECK(testing::maxAbsDiff(cloud.top(), want) < 1e-5);
  const std::vector<float> want_bottom(local.bottom().begin(), local.bottom().end());
  CHECK(testing::maxAbsDiff({edge.bottom().begin(), edge.bottom().end()}, want_bottom) < 1e-5);
}

TEST_CASE("the split cloud refuses every lie, changes nothing, and answers a repeated step once",
          "[split][net]") {
  SplitModel sm = model();
  const auto [bottom, top] = sm.cutParameters(sm.initParameters(2));
  CloudThread cloud(top, cloudConfig(sm, "none", "none"), "none");
  transport::Context ctx;
  RawPeer peer(ctx, cloud.endpoint());
  const data::Dataset d = quadrants(8, 1);
  SplitModel edge_model = model();
  SplitEdge edge(edge_model, bottom, "none", 0.05);
  const std::vector<uint8_t> acts = edge.forward(d.images, 8);
  const uint64_t fp = sessionFingerprint(sm, "none", "none");
  auto stepMsg = [&](uint64_t session, uint64_t step, std::vector<uint8_t> labels,
                     std::vector<uint8_t> a) {
    pr::SplitStepMsg m;
    m.session = session;
    m.step = step;
    m.examples = static_cast<uint32_t>(labels.size());
    m.labels = std::move(labels);
    m.activations = std::move(a);
    return pr::encode(m);
  };
  // No session yet.
  CHECK(peer.ask(stepMsg(1, 1, d.labels, acts)) == errcName(Errc::kNotRegistered));
  // Another model or other codecs.
  CHECK(peer.ask(pr::encode(pr::SplitHelloMsg{5, fp ^ 1, "none", "none"})) ==
        errcName(Errc::kFingerprintMismatch));
  CHECK(peer.ask(pr::encode(pr::SplitHelloMsg{5, fp, "int8", "none"})) ==
        errcName(Errc::kFingerprintMismatch));
  // Not a Starling message; a message a cloud does not take.
  CHECK(peer.ask(std::vector<uint8_t>(64, 0x5a)) == errcName(Errc::kMalformed));
  CHECK(peer.ask(pr::encode(pr::HeartbeatMsg{5, 1, 1})) == errcName(Errc::kUnexpectedMessage));
  pr::SplitReplyMsg hello;
  REQUIRE(peer.ask(pr::encode(pr::SplitHelloMsg{5, fp, "none", "none"}), &hello) == "reply");
  CHECK(hello.step == 0);
  const uint64_t s = hello.session;
  CHECK(peer.ask(stepMsg(s + 1, 1, d.labels, acts)) ==
        errcName(Errc::kNotRegistered));  // someone else's session
  // Activations that lie about their shape or size, labels out of range, values out of bounds.
  CHECK(
      peer.ask(stepMsg(s, 1, std::vector<uint8_t>(d.labels.begin(), d.labels.begin() + 7), acts)) ==
      errcName(Errc::kShapeMismatch));  // 8 rows of activations for 7 examples
  auto truncated = acts;
  truncated.resize(truncated.size() - 4);
  CHECK(peer.ask(stepMsg(s, 1, d.labels, truncated)) != "reply");
  auto bad_labels = d.labels;
  bad_labels[0] = 4;
  CHECK(peer.ask(stepMsg(s, 1, bad_labels, acts)) == errcName(Errc::kIndexOutOfRange));
  auto huge = acts;
  const float big = 1e30f;
  for (size_t i = 10; i + 4 <= huge.size(); i += 4) std::memcpy(huge.data() + i, &big, 4);
  CHECK(peer.ask(stepMsg(s, 1, d.labels, huge)) == errcName(Errc::kValueTooLarge));
  // One honest step; the same step again gets the same answer and no second update; an older one is
  // late.
  pr::SplitReplyMsg first, again;
  REQUIRE(peer.ask(stepMsg(s, 1, d.labels, acts), &first) == "reply");
  REQUIRE(peer.ask(stepMsg(s, 1, d.labels, acts), &again) == "reply");
  CHECK(again.step == 1);
  CHECK(again.gradient == first.gradient);
  CHECK(again.loss == first.loss);
  pr::SplitReplyMsg second;
  REQUIRE(peer.ask(stepMsg(s, 3, d.labels, acts), &second) == "reply");
  CHECK(peer.ask(stepMsg(s, 2, d.labels, acts)) == errcName(Errc::kLate));
  cloud.stop();
  CHECK(cloud.stats().steps == 2);  // steps 1 and 3; the repeat of 1 and the late 2 changed nothing
  CHECK(cloud.stats().duplicates == 1);
  CHECK(cloud.stats().refused == 11);
  // The top part is what two honest steps make of it: replay them on a fresh cloud.
  SplitModel ref_model = model();
  SplitCloud ref(ref_model, top, "none", 0.05);
  ref.step(5, acts, d.labels, 8);
  ref.step(5, acts, d.labels, 8);
  const std::vector<float> want(ref.top().begin(), ref.top().end());
  CHECK(testing::maxAbsDiff(cloud.top(), want) == 0);
}

TEST_CASE("a vanished edge's session is closed and another edge carries on", "[split][net]") {
  SplitModel sm = model();
  const auto [bottom, top] = sm.cutParameters(sm.initParameters(2));
  CloudServerConfig cfg = cloudConfig(sm, "none", "none");
  cfg.edge_timeout = 300ms;
  CloudThread cloud(top, cfg, "none");
  const data::Dataset d = quadrants(32, 1);
  transport::Context ctx;
  {  // edge 5 opens a session, sends a step and is gone before the answer
    RawPeer gone(ctx, cloud.endpoint());
    pr::SplitReplyMsg hello;
    REQUIRE(gone.ask(pr::encode(pr::SplitHelloMsg{5, sessionFingerprint(sm, "none", "none"), "none",
                                                  "none"}),
                     &hello) == "reply");
    SplitModel m = model();
    SplitEdge e(m, bottom, "none", 0.05);
    pr::SplitStepMsg step;
    step.session = hello.session;
    step.step = 1;
    step.examples = 8;
    step.labels.assign(d.labels.begin(), d.labels.begin() + 8);
    step.activations = e.forward(std::span<const float>(d.images).first(8 * 64), 8);
    gone.socket.send(pr::encode(step));
  }
  SplitModel edge_model = model();
  SplitEdge edge(edge_model, bottom, "none", 0.05);
  SplitTrainConfig tc;
  tc.batch_size = 8;
  {
    SplitEdgeClient client(ctx, edge, edgeConfig(sm, cloud.endpoint(), 6, "none", "none"));
    client.connect();
    const std::vector<size_t> idx = testing::allIndices(d);
    const EpochRecord r = runEdgeEpoch(client, tc, 1, 0, d, idx, d, {});
    CHECK(r.steps == 4);
    CHECK(std::isfinite(r.train_loss));
    // Edge 5 vanished after its step: its session times out.
    REQUIRE(cloud.waitStats([](const CloudStats& st) { return st.timed_out >= 1; }));
  }
  // Edge 6 has said goodbye, or is silent and times out too.
  REQUIRE(cloud.waitStats([](const CloudStats& st) { return st.timed_out + st.goodbyes == 2; }));
  cloud.stop();
  const auto& st = cloud.stats();
  CHECK(st.hellos == 2);
  CHECK(st.timed_out >= 1);  // edge 5 (and edge 6 unless its goodbye came first)
  CHECK(st.timed_out + st.goodbyes == 2);
  CHECK(
      (st.steps == 4 || st.steps == 5));  // edge 5's step applied if it arrived before it vanished
  CHECK(cloud.sessions() == 0);
}

TEST_CASE("a restarted cloud goes on from its checkpoint and the edge opens a new session",
          "[split][net]") {
  SplitModel sm = model();
  const auto [bottom, top] = sm.cutParameters(sm.initParameters(2));
  const auto dir = tempDir("restart");
  CloudServerConfig cfg = cloudConfig(sm, "int8", "int8");
  cfg.checkpoint = (dir / "cloud.bin").string();
  cfg.checkpoint_every = 1000;  // only at exit here
  const data::Dataset d = quadrants(32, 1);
  const std::vector<size_t> idx = testing::allIndices(d);
  SplitTrainConfig tc;
  tc.batch_size = 8;
  tc.up = tc.down = "int8";
  SplitModel edge_model = model();
  SplitEdge edge(edge_model, bottom, "int8", 0.05);
  transport::Context ctx;
  EdgeClientConfig ec = edgeConfig(sm, "", 7, "int8", "int8");
  ec.step_timeout = 500ms;
  ec.tries = 20;
  std::vector<float> top_after_first;
  std::string endpoint;
  {
    auto first = std::make_unique<CloudThread>(top, cfg, "int8");
    endpoint = ec.cloud = first->endpoint();
    SplitEdgeClient client(ctx, edge, ec);
    CHECK(runEdgeEpoch(client, tc, 1, 0, d, idx, d, {}).steps == 4);
    first->stop();
    top_after_first = first->top();
    first.reset();
    // The cloud comes back on the same endpoint from its checkpoint.
    auto ck = loadCloudCheckpoint(cfg.checkpoint, cfg.fingerprint, sm.top().numel());
    REQUIRE(ck.has_value());
    CHECK(ck->steps == 4);
    CHECK(testing::maxAbsDiff(ck->top, top_after_first) == 0);
    CloudServerConfig again = cfg;
    again.bind = endpoint;
    again.steps_done = ck->steps;
    CloudThread second(ck->top, again, "int8");
    const EpochRecord r = runEdgeEpoch(client, tc, 2, 0, d, idx, d, {});
    CHECK(r.steps == 4);
    CHECK(client.stats().sessions == 2);
    client.bye();
    REQUIRE(second.waitStats([](const CloudStats& st) { return st.goodbyes == 1; }));
    second.stop();
    CHECK(second.stats().steps == 8);
    CHECK(second.stats().hellos == 1);
    CHECK(testing::maxAbsDiff(second.top(), top_after_first) > 0);
  }
  // A checkpoint of another cut or codecs, or a damaged one, is refused.
  CHECK_THROWS_AS(loadCloudCheckpoint(cfg.checkpoint, cfg.fingerprint ^ 1, sm.top().numel()),
                  IoError);
  CHECK_THROWS_AS(loadCloudCheckpoint(cfg.checkpoint, cfg.fingerprint, sm.top().numel() + 1),
                  IoError);
  std::filesystem::resize_file(cfg.checkpoint, 40);
  CHECK_THROWS_AS(loadCloudCheckpoint(cfg.checkpoint, cfg.fingerprint, sm.top().numel()), IoError);
  CHECK_FALSE(loadCloudCheckpoint((dir / "absent.bin").string(), cfg.fingerprint, 1).has_value());
  std::filesystem::remove_all(dir);
}

TEST_CASE("under CURVE the cloud admits listed keys under their own ids only", "[split][net]") {
  SplitModel sm = model();
  const auto [bottom, top] = sm.cutParameters(sm.initParameters(2));
  const transport::CurveKeyPair server = transport::generateKeyPair(),
                                listed = transport::generateKeyPair(),
                                stranger = transport::generateKeyPair();
  auto allow = std::make_shared<transport::AllowList>();
  allow->add(7, listed.public_key, "test");
  CloudServerConfig cfg = cloudConfig(sm, "none", "none");
  cfg.security = transport::SecurityConfig{false, server, "", allow};
  CloudThread cloud(top, cfg, "none");
  const data::Dataset d = quadrants(8, 1);
  transport::Context ctx;
  auto edgeWith = [&](const transport::CurveKeyPair& key, uint64_t id) {
    EdgeClientConfig ec = edgeConfig(sm, cloud.endpoint(), id, "none", "none");
    ec.security = transport::SecurityConfig{false, key, server.public_key, nullptr};
    ec.step_timeout = 400ms;
    ec.tries = 2;
    return ec;
  };
  SplitModel m = model();
  SplitEdge edge(m, bottom, "none", 0.05);
  {
    SplitEdgeClient ok(ctx, edge, edgeWith(listed, 7));
    ok.connect();
    const auto r = ok.train(d.images, d.labels, 8);
    CHECK(std::isfinite(r.loss));
    CHECK(r.down_bytes > 0);
  }
  {  // a listed key claiming another edge's id
    SplitEdgeClient liar(ctx, edge, edgeWith(listed, 8));
    CHECK_THROWS_AS(liar.connect(), ConfigError);
  }
  {  // a key that is not listed: the handshake fails, nothing ever answers
    SplitEdgeClient outsider(ctx, edge, edgeWith(stranger, 9));
    CHECK_THROWS_AS(outsider.connect(), IoError);
  }
  cloud.stop();
  CHECK(cloud.stats().steps == 1);
  CHECK(cloud.stats().hellos == 1);
}

TEST_CASE(
    "SplitFed over the network: the examples-weighted mean of the edges' bottoms, a missing edge "
    "left out",
    "[split][net]") {
  SplitModel sm = model();
  const auto [bottom, top] = sm.cutParameters(sm.initParameters(2));
  CloudServerConfig cfg = cloudConfig(sm, "none", "none");
  cfg.splitfed_edges = 2;
  cfg.splitfed_wait = 1500ms;
  CloudThread cloud(top, cfg, "none");
  const data::Dataset d = quadrants(48, 3);
  std::vector<std::vector<size_t>> shards(2);
  for (size_t i = 0; i < d.size(); ++i) shards[i < 16 ? 0 : 1].push_back(i);  // 16 and 32 examples
  SplitTrainConfig tc;
  tc.batch_size = 8;
  struct Edge {
    SplitModel m = model();
    std::unique_ptr<SplitEdge> edge;
    std::vector<float> before, after;
    uint32_t edges = 0;
  };
  Edge e[2];
  transport::Context ctx;
  std::vector<std::unique_ptr<SplitEdgeClient>> clients;
  for (int i = 0; i < 2; ++i) {
    e[i].edge = std::make_unique<SplitEdge>(e[i].m, bottom, "none", 0.05);
    EdgeClientConfig ec = edgeConfig(sm, cloud.endpoint(), 10 + i, "none", "none");
    ec.step_timeout = 500ms;
    ec.splitfed_wait = 20000ms;
    clients.push_back(std::make_unique<SplitEdgeClient>(ctx, *e[i].edge, ec));
  }
  // Epoch 1: both edges train, then average; each in its own thread (the cloud waits for both).
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      runEdgeEpoch(*clients[i], tc, 1, i, d, shards[i], d, {});
      e[i].before.assign(e[i].edge->bottom().begin(), e[i].edge->bottom().end());
      e[i].edges = clients[i]->average(1, shards[i].size());
      e[i].after.assign(e[i].edge->bottom().begin(), e[i].edge->bottom().end());
    });
  for (auto& t : threads) t.join();
  std::vector<float> want(bottom.size());
  for (size_t j = 0; j < want.size(); ++j)
    want[j] = static_cast<float>((16.0 * e[0].before[j] + 32.0 * e[1].before[j]) / 48.0);
  CHECK(e[0].edges == 2);
  CHECK(e[1].edges == 2);
  CHECK(testing::maxAbsDiff(e[0].before, e[1].before) > 1e-4);  // there was something to average
  CHECK(testing::maxAbsDiff(e[0].after, want) < 1e-6);
  CHECK(testing::maxAbsDiff(e[1].after, want) < 1e-6);
  // Epoch 2: edge 10 alone; after the cloud's wait it gets the average of one (its own bottom),
  // and edge 10's late bottom of epoch 2 then gets that same average.
  runEdgeEpoch(*clients[0], tc, 2, 0, d, shards[0], d, {});
  const std::vector<float> own(e[0].edge->bottom().begin(), e[0].edge->bottom().end());
  CHECK(clients[0]->average(2, 16) == 1);
  CHECK(testing::maxAbsDiff({e[0].edge->bottom().begin(), e[0].edge->bottom().end()}, own) < 1e-6);
  CHECK(clients[1]->average(2, 32) == 1);
  CHECK(testing::maxAbsDiff({e[1].edge->bottom().begin(), e[1].edge->bottom().end()}, own) < 1e-6);
  // Lies: a bottom of another size, one over the value bound, an absurd weight.
  RawPeer peer(ctx, cloud.endpoint());
  pr::SplitReplyMsg hello;
  REQUIRE(peer.ask(pr::encode(pr::SplitHelloMsg{12, sessionFingerprint(sm, "none", "none"), "none",
                                                "none"}),
                   &hello) == "reply");
  auto lie = [&](std::vector<float> b, uint64_t examples) {
    return peer.ask(pr::encode(pr::SplitBottomMsg{hello.session, 3, examples, std::move(b)}));
  };
  CHECK(lie(std::vector<float>(bottom.size() + 1, 0.0f), 10) == errcName(Errc::kSizeMismatch));
  std::vector<float> huge = bottom;
  huge[5] = 1e30f;
  CHECK(lie(huge, 10) == errcName(Errc::kValueTooLarge));
  CHECK(lie(bottom, uint64_t{1} << 40) == errcName(Errc::kBadWeight));
  clients.clear();
  cloud.stop();
  CHECK(cloud.stats().averages == 2);
  CHECK(cloud.stats().averages_short == 1);
  CHECK(cloud.stats().refused == 3);
}

TEST_CASE("a cloud without SplitFed refuses an edge's bottom", "[split][net]") {
  SplitModel sm = model();
  const auto [bottom, top] = sm.cutParameters(sm.initParameters(2));
  CloudThread cloud(top, cloudConfig(sm, "none", "none"), "none");
  SplitModel m = model();
  SplitEdge edge(m, bottom, "none", 0.05);
  transport::Context ctx;
  SplitEdgeClient client(ctx, edge, edgeConfig(sm, cloud.endpoint(), 4, "none", "none"));
  client.connect();
  CHECK_THROWS_WITH(client.average(1, 10), Catch::Contains("does not run SplitFed"));
}

TEST_CASE(
    "a full split cloud tells a new edge to come back later, a bad checkpoint path does not stop "
    "it",
    "[split][net]") {
  SplitModel sm = model();
  const auto [bottom, top] = sm.cutParameters(sm.initParameters(2));
  CloudServerConfig cfg = cloudConfig(sm, "none", "none");
  cfg.max_sessions = 1;
  cfg.checkpoint = "/nonexistent-starling-dir/cloud.bin";  // every write fails
  cfg.checkpoint_every = 1;
  CloudThread cloud(top, cfg, "none");
  transport::Context ctx;
  const uint64_t fp = sessionFingerprint(sm, "none", "none");
  const data::Dataset d = quadrants(8, 1);
  SplitModel m = model();
  SplitEdge edge(m, bottom, "none", 0.05);
  SplitEdgeClient first(ctx, edge, edgeConfig(sm, cloud.endpoint(), 1, "none", "none"));
  first.connect();
  CHECK(std::isfinite(first.train(d.images, d.labels, 8).loss));  // a checkpoint is tried and fails
  RawPeer second(ctx, cloud.endpoint());
  CHECK(second.ask(pr::encode(pr::SplitHelloMsg{2, fp, "none", "none"})) == errcName(Errc::kBusy));
  CHECK(std::isfinite(first.train(d.images, d.labels, 8).loss));  // still serving
  cloud.stop();
  CHECK(cloud.stats().steps == 2);
  CHECK(cloud.checkpointFailed());  // the final checkpoint reports its failure to the caller
}

TEST_CASE(
    "a hello sent again keeps its session, a repeated step is answered once, refusals echo their "
    "request",
    "[split][net]") {
  SplitModel sm = model();
  const auto [bottom, top] = sm.cutParameters(sm.initParameters(2));
  CloudThread cloud(top, cloudConfig(sm, "none", "none"), "none");
  transport::Context ctx;
  RawPeer peer(ctx, cloud.endpoint());
  const uint64_t fp = sessionFingerprint(sm, "none", "none");
  pr::SplitReplyMsg a, b;
  REQUIRE(peer.ask(pr::encode(pr::SplitHelloMsg{5, fp, "none", "none"}), &a) == "reply");
  REQUIRE(peer.ask(pr::encode(pr::SplitHelloMsg{5, fp, "none", "none"}), &b) == "reply");
  CHECK(b.session == a.session);  // no step yet: the same session, not a new one
  const data::Dataset d = quadrants(8, 1);
  SplitModel m = model();
  SplitEdge edge(m, bottom, "none", 0.05);
  pr::SplitStepMsg step;
  step.session = a.session;
  step.step = 4;
  step.examples = 8;
  step.labels = d.labels;
  step.activations = edge.forward(d.images, 8);
  const auto bytes = pr::encode(step);
  REQUIRE(peer.ask(bytes) == "reply");
  REQUIRE(peer.ask(bytes) == "reply");  // the cached answer, once
  CHECK(peer.ask(bytes) == "none");     // and not again
  // A refusal carries the session and step it refuses.
  step.step = 2;
  peer.socket.send(pr::encode(step));
  const auto r = peer.socket.receive(3000ms);
  REQUIRE(r);
  REQUIRE(pr::peekKind(r->bytes()) == pr::MessageKind::kReject);
  const auto rej = pr::decodeReject(r->bytes());
  CHECK(rej.code == static_cast<uint32_t>(Errc::kLate));
  CHECK(rej.nonce == a.session);
  CHECK(rej.round == 2);
  cloud.stop();
  CHECK(cloud.stats().hellos == 1);
  CHECK(cloud.stats().steps == 1);
  CHECK(cloud.stats().duplicates == 1);
}

TEST_CASE(
    "an edge refuses a gradient that would blow up its bottom, the fingerprint sees a removed skip",
    "[split]") {
  SplitModel sm = model();
  const auto [bottom, top] = sm.cutParameters(sm.initParameters(2));
  SplitEdge edge(sm, bottom, "none", 0.05);
  const data::Dataset d = quadrants(8, 1);
  edge.forward(d.images, 8);
  const auto none = makeActivationCodec("none");
  CodecState st;
  const auto huge =
      none->encode(std::vector<float>(8 * sm.activationSize(), 1e20f), 8, sm.activationSize(), st);
  CHECK_THROWS_AS(edge.backward(huge), InputError);
  CHECK(std::equal(bottom.begin(), bottom.end(), edge.bottom().begin()));
  SplitModel with("vit", "ffn2", 8, 8, 4), without("vit", "ffn2", 8, 8, 4, 0, false);
  CHECK(with.activationSize() == without.activationSize());
  CHECK(sessionFingerprint(with, "none", "none") != sessionFingerprint(without, "none", "none"));
}
