// The attacker's test, in real processes on 127.0.0.1: a root starling-server (CURVE on) with
// honest starling-client processes, and a raw ZeroMQ DEALER in this process that holds an
// ADMITTED key (it passes CURVE and the allow-list) and lies in every way a client can: truncated,
// oversized and garbage frames, updates with a wrong fingerprint, an index out of range, a NaN, a
// huge norm, 2^64-1 examples, a wrong round, a wrong nonce, another client's id, a Register under
// another client's id, a heartbeat flood, a PartialAggregate from a client, and an honest-looking
// update replayed in the next round. The server must refuse each one (and say why), stay up,
// apply every round with the honest clients, and end with the model the same federation reaches
// without the attacker. Each wait is bounded; only processes this test started are killed (by pid).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <zmq.hpp>

#include "client/trainer.h"
#include "compression/registry.h"
#include "integration/federation.h"
#include "protocol/codec.h"
#include "protocol/control.h"
#include "transport/keys.h"

using namespace starling;
using namespace starling::testing;
using std::chrono::milliseconds;
using std::chrono::seconds;
namespace pr = starling::protocol;
namespace cz = starling::compression;

namespace {

using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock

// The server's model: softmax on 784 features, 10 classes (starling-server's defaults).
const ParamLayout& serverLayout() {
  static const ParamLayout l = client::makeTrainer("softmax", 784, 10)->layout();
  return l;
}

// A raw DEALER with hand-set CURVE options, speaking the protocol by hand.
class Attacker {
 public:
  // `routing_id`: one this connection names itself (none: ZeroMQ's own, as Starling's clients).
  Attacker(const std::string& endpoint, const std::string& key_secret,
           const std::string& server_key, const std::string& routing_id = {})
      : sock_(ctx_, zmq::socket_type::dealer) {
    const transport::CurveKeyPair own = transport::loadKeyPair(key_secret);
    if (!routing_id.empty()) sock_.set(zmq::sockopt::routing_id, routing_id);
    sock_.set(zmq::sockopt::curve_serverkey, transport::loadPublicKey(server_key));
    sock_.set(zmq::sockopt::curve_publickey, own.public_key);
    sock_.set(zmq::sockopt::curve_secretkey, own.secret_key);
    sock_.set(zmq::sockopt::linger, 0);
    sock_.set(zmq::sockopt::sndtimeo, 2000);  // a send never hangs the test
    sock_.set(zmq::sockopt::sndhwm, 10000);
    sock_.connect(endpoint);
  }

  bool send(std::span<const uint8_t> bytes) {
    return sock_.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none).has_value();
  }
  // One ZeroMQ message of two frames (Starling sends one frame per message).
  bool sendTwoFrames(std::span<const uint8_t> a, std::span<const uint8_t> b) {
    return sock_.send(zmq::buffer(a.data(), a.size()), zmq::send_flags::sndmore).has_value() &&
           sock_.send(zmq::buffer(b.data(), b.size()), zmq::send_flags::none).has_value();
  }
  // Sends with `how` and waits for the Reject it earns; true when one with `code` came.
  bool expectRejectOf(const std::function<void()>& how, Errc code,
                      milliseconds timeout = milliseconds(3000)) {
    const size_t before = rejects.size();
    how();
    pump(timeout, [&](pr::MessageKind k) {
      return k == pr::MessageKind::kReject && rejects.size() > before;
    });
    if (rejects.size() == before) return false;
    return rejects.back().code == static_cast<uint32_t>(code);
  }

  // Receives for up to `timeout`, heartbeating every 200 ms once welcomed, until `stop` holds for
  // a received message. Records what it sees. True when `stop` held.
  bool pump(milliseconds timeout, const std::function<bool(pr::MessageKind)>& stop = {}) {
    const auto until = Steady::now() + timeout;
    for (;;) {
      const auto now = Steady::now();
      if (session_ && now - last_hb_ > milliseconds(200)) {
        send(pr::encode(pr::HeartbeatMsg{id_, session_, 0}));
        last_hb_ = now;
      }
      if (now >= until) return false;
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, milliseconds(20));
      zmq::message_t m;
      while (sock_.recv(m, zmq::recv_flags::dontwait)) {
        // An aligned copy: the decoders read FlatBuffers in place.
        std::vector<uint64_t> buf((m.size() + 7) / 8);
        std::memcpy(buf.data(), m.data(), m.size());
        const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(buf.data()),
                                             m.size());
        const auto kind = pr::peekKind(bytes);
        if (!kind) continue;
        switch (*kind) {
          case pr::MessageKind::kWelcome:
            session_ = pr::decodeWelcome(bytes).session;
            break;
          case pr::MessageKind::kTask:
            tasks.push_back(pr::decodeTask(bytes, serverLayout()));
            break;
          case pr::MessageKind::kReject:
            rejects.push_back(pr::decodeReject(bytes));
            break;
          case pr::MessageKind::kShutdown:
            shutdown = true;
            break;
          default:
            break;
        }
        if (stop && stop(*kind)) return true;
      }
    }
  }

  // Sends `bytes` and waits for the Reject it earns; true when one with `code` came.
  bool expectReject(std::span<const uint8_t> bytes, Errc code,
                    milliseconds timeout = milliseconds(3000)) {
    const size_t before = rejects.size();
    send(bytes);
    pump(timeout, [&](pr::MessageKind k) {
      return k == pr::MessageKind::kReject && rejects.size() > before;
    });
    if (rejects.size() == before) return false;
    return rejects.back().code == static_cast<uint32_t>(code);
  }

  void setId(uint64_t id) { id_ = id; }
  uint64_t session() const { return session_; }

  std::vector<pr::TaskMsg> tasks;
  std::vector<pr::RejectMsg> rejects;
  bool shutdown = false;

 private:
  zmq::context_t ctx_;
  zmq::socket_t sock_;
  uint64_t id_ = 0, session_ = 0;
  Steady::time_point last_hb_{};
};

// A valid update for `task` (the task's own compressor on a small, honest-looking delta).
cz::Update honestUpdate(const pr::TaskMsg& task, uint64_t client_id, uint64_t examples) {
  const ParamLayout& l = serverLayout();
  std::vector<float> delta(l.numel());
  for (size_t i = 0; i < delta.size(); ++i)
    delta[i] = 1e-3f * std::sin(0.37f * static_cast<float>(i));
  const auto comp = cz::makeCompressor(task.compressor);
  cz::Update u;
  u.header.layout_fingerprint = l.fingerprint();
  u.header.round = task.round;
  u.header.phase = task.phase;
  u.header.client_id = client_id;
  u.header.num_examples = examples;
  u.header.nonce = task.nonce;
  u.tensors = comp->compress(
      l, delta, cz::RoundContext{task.run_seed, task.round, task.phase, client_id, nullptr});
  return u;
}

std::vector<uint8_t> enc(const cz::Update& u) { return pr::encodeUpdate(u); }

cz::Sparse& sparse0(cz::Update& u) { return std::get<cz::Sparse>(u.tensors[0]); }

// A dense partial aggregate of zeros for `task`, claiming one update of weight 1.
std::vector<uint8_t> zeroPartial(const pr::TaskMsg& task) {
  const ParamLayout& l = serverLayout();
  cz::PartialMessage p;
  p.header.layout_fingerprint = l.fingerprint();
  p.header.round = task.round;
  p.header.phase = task.phase;
  p.header.count = 1;
  p.header.total_weight = 1.0;
  p.header.nonce = task.nonce;
  for (size_t t = 0; t < l.size(); ++t)
    p.tensors.push_back(cz::DenseF32{std::vector<float>(l[t].numel, 0.0f)});
  return pr::encodePartial(p);
}

// `deadline_ms` bounds a phase; honest clients must make it even on a loaded CI machine under ASan
// (a 3 s deadline once dropped one there), and a phase with the silent attacker lasts all of it.
std::vector<std::string> rootArgs(Federation& f, const std::string& min_available,
                                  const std::string& deadline_ms,
                                  std::vector<std::string> extra = {}) {
  std::vector<std::string> a{"--train.rounds",           "3",
                             "--sampling.fraction",      "1.0",
                             "--sampling.min_available", min_available,
                             "--sampling.min_clients",   "3",
                             "--sampling.wait_ms",       "30000",
                             "--round.deadline_ms",      deadline_ms,
                             "--compression.compressor", "topk:density=0.05",
                             "--net.max_message_bytes",  "2000000",
                             "--state.checkpoint",       f.path("ck.bin"),
                             "--state.metrics",          f.path("metrics.jsonl")};
  for (auto& x : extra) a.push_back(x);
  return a;
}

double maxRelDiff(const std::vector<float>& a, const std::vector<float>& b, double* max_abs) {
  double d = 0.0;
  *max_abs = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    *max_abs = std::max(*max_abs, std::fabs(static_cast<double>(b[i])));
  }
  return d;
}

// Pumps the attacker until the server's Shutdown, the server's exit, or `timeout`.
void awaitShutdown(Attacker& a, Proc& root, seconds timeout) {
  const auto until = Steady::now() + timeout;
  while (!a.shutdown && root.alive() && Steady::now() < until)
    a.pump(milliseconds(200), [](pr::MessageKind k) { return k == pr::MessageKind::kShutdown; });
}

constexpr uint64_t kAttackerId = 3;

}  // namespace

TEST_CASE(
    "an authenticated client that lies in every way changes nothing: the honest federation's model",
    "[integration][server][attack]") {
  // The same federation without the attacker: three honest clients (shards 0-2 of 4), same seeds.
  std::vector<float> honest_model;
  {
    Federation f("hostile-base");
    f.clientKeys(0, 4);
    const int port = freePort();
    f.root(
        "root", port, f.allowList("allow", {"client-0", "client-1", "client-2", "client-3"}),
        rootArgs(f, "3", "60000"));  // everyone answers: the phase closes then, not at the deadline
    for (uint64_t c = 0; c < 3; ++c) f.client(c, port, "server", 4);
    const int rc = f.proc("root").wait(seconds(40));
    INFO(f.allLogs());
    REQUIRE(rc == 0);
    const auto lines = readLines(f.path("metrics.jsonl"));
    REQUIRE(lines.size() == 3);
    for (const auto& l : lines) REQUIRE(field(l, "applied") == "true");
    honest_model = readCheckpoint(f.path("ck.bin")).model;
  }

  Federation f("hostile");
  f.clientKeys(0, 4);  // client-3's key is admitted: the attacker's
  const int port = freePort();
  // min_available 4: round 1 starts once the attacker registered, so it is sampled every round.
  f.root("root", port, f.allowList("allow", {"client-0", "client-1", "client-2", "client-3"}),
         rootArgs(f, "4", "10000"));
  for (uint64_t c = 0; c < 3; ++c) f.client(c, port, "server", 4);

  const ParamLayout& layout = serverLayout();
  Attacker a(Federation::endpoint(port), f.keys() + "/client-3.key_secret",
             f.keys() + "/server.key");
  a.setId(kAttackerId);
  pr::RegisterMsg reg;
  reg.client_id = kAttackerId;
  reg.layout_fingerprint = layout.fingerprint();
  reg.num_examples = 1000;
  reg.eval_examples = 0;
  a.send(pr::encode(reg));
  const bool welcomed =
      a.pump(seconds(20), [](pr::MessageKind k) { return k == pr::MessageKind::kWelcome; });
  INFO(f.allLogs());
  REQUIRE(welcomed);
  const bool tasked =
      a.pump(seconds(30), [](pr::MessageKind k) { return k == pr::MessageKind::kTask; });
  INFO(f.allLogs());
  REQUIRE(tasked);
  const pr::TaskMsg task = a.tasks.back();
  REQUIRE(task.kind == pr::TaskKind::kFit);
  REQUIRE(task.round == 1);
  const auto t_attack = Steady::now();

  // 1. A truncated update.
  {
    auto bytes = enc(honestUpdate(task, kAttackerId, 100));
    bytes.resize(bytes.size() / 2);
    CHECK(a.expectReject(bytes, Errc::kTruncated));
  }
  // 2. A frame over --net.max_message_bytes (within libzmq's slack, so the connection survives):
  //    refused by the transport, unread, and answered (transport refusals once got no Reject).
  {
    std::vector<uint8_t> big(2'000'000 + 4096, 0x5a);
    CHECK(a.expectRejectOf([&] { a.send(big); }, Errc::kTooLarge));
  }
  // 2b. A message of two frames: refused by the transport, and answered.
  {
    const auto hb = pr::encode(pr::HeartbeatMsg{kAttackerId, a.session(), 0});
    CHECK(a.expectRejectOf([&] { a.sendTwoFrames(hb, hb); }, Errc::kMalformed));
  }
  // 2b'. A heartbeat with a subtree (an edge aggregator's clients, for the root's status page):
  //      a client has none, and is refused before its entries are read.
  {
    pr::HeartbeatMsg hb{kAttackerId, a.session(), 0};
    hb.subtree = std::vector<pr::SubtreePeer>(5000, pr::SubtreePeer{99, true, true, 0, 7, 0, 0});
    CHECK(a.expectReject(pr::encode(hb), Errc::kUnexpectedMessage));
  }
  // 2c. A chunk that does not start its transfer (index 1 of 3 first): refused by the transport's
  //     reassembly, and answered with its code (chunk errors once got no Reject).
  {
    const std::vector<uint8_t> piece(64, 0x11);
    const auto chunk = pr::encodeChunk(pr::ChunkMsg{77, 1, 3, 192, piece});
    CHECK(a.expectRejectOf([&] { a.send(chunk); }, Errc::kBadChunk));
  }
  // 3. Garbage.
  {
    std::vector<uint8_t> junk(333);
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 131 + 7);
    CHECK(a.expectReject(junk, Errc::kMalformed));
  }
  // 4. Another model's fingerprint.
  {
    auto u = honestUpdate(task, kAttackerId, 100);
    u.header.layout_fingerprint ^= 1;
    CHECK(a.expectReject(enc(u), Errc::kFingerprintMismatch));
  }
  // 5. A sparse index one past the tensor.
  {
    auto u = honestUpdate(task, kAttackerId, 100);
    sparse0(u).indices.back() = static_cast<uint32_t>(layout[0].numel);
    CHECK(a.expectReject(enc(u), Errc::kIndexOutOfRange));
  }
  // 6. A NaN.
  {
    auto u = honestUpdate(task, kAttackerId, 100);
    sparse0(u).values[3] = std::nanf("");
    CHECK(a.expectReject(enc(u), Errc::kNonFinite));
  }
  // 7. Every value within max_abs (1e4), the norm far over max_norm (1e5).
  {
    auto u = honestUpdate(task, kAttackerId, 100);
    for (float& v : sparse0(u).values) v = 9000.0f;
    CHECK(a.expectReject(enc(u), Errc::kNormTooLarge));
  }
  // 8. 2^64 - 1 examples (it registered 1000).
  {
    auto u = honestUpdate(task, kAttackerId, ~uint64_t{0});
    CHECK(a.expectReject(enc(u), Errc::kBadWeight));
  }
  // 9. The right nonce, a round that has not started.
  {
    auto u = honestUpdate(task, kAttackerId, 100);
    u.header.round = task.round + 1;
    CHECK(a.expectReject(enc(u), Errc::kWrongRound));
  }
  // 10. Another task's nonce.
  {
    auto u = honestUpdate(task, kAttackerId, 100);
    u.header.nonce = task.nonce ^ 0x5a5a5a5a5a5a5a5aull;
    CHECK(a.expectReject(enc(u), Errc::kBadNonce));
  }
  // 11. An update claiming to be client 0.
  {
    auto u = honestUpdate(task, 0, 100);
    u.header.nonce = task.nonce;
    CHECK(a.expectReject(enc(u), Errc::kWrongSender));
  }
  // 12. A Register as client 0 (its key is listed as client 3).
  {
    pr::RegisterMsg r = reg;
    r.client_id = 0;
    CHECK(a.expectReject(pr::encode(r), Errc::kWrongSender));
  }
  // 13. A flood of 20000 heartbeats: the rate limiter drops most unread.
  {
    const auto hb = pr::encode(pr::HeartbeatMsg{kAttackerId, a.session(), 0});
    size_t sent = 0;
    for (int i = 0; i < 20000; ++i) sent += a.send(hb);
    CHECK(sent == 20000);
    a.pump(milliseconds(400));  // the bucket refills (10000/s, burst 2000)
  }
  // 14. A PartialAggregate from a client, with its task's nonce.
  CHECK(a.expectReject(zeroPartial(task), Errc::kWrongSender));
  const auto attack_time = Steady::now() - t_attack;
  CHECK(attack_time <
        milliseconds(9000));  // every attack of round 1 landed inside its phase (10 s)
  // 15. Round 2: its honest-looking round-1 update, replayed.
  const bool tasked2 = a.pump(seconds(30), [&](pr::MessageKind k) {
    return k == pr::MessageKind::kTask && a.tasks.back().round == 2;
  });
  INFO(f.allLogs());
  REQUIRE(tasked2);
  CHECK(a.tasks.back().nonce != task.nonce);
  CHECK(a.expectReject(enc(honestUpdate(task, kAttackerId, 100)), Errc::kLate));

  // 16. Connections of its own beside its registered one (which it keeps alive meanwhile):
  //   a. the same key on a connection that names its own routing id (a named id in use would take
  //      that connection over): refused unread, with its own code;
  {
    Attacker named(Federation::endpoint(port), f.keys() + "/client-3.key_secret",
                   f.keys() + "/server.key", "client-0");
    named.send(pr::encode(reg));
    for (int i = 0; i < 60 && named.rejects.empty(); ++i) {
      a.pump(milliseconds(50));
      named.pump(milliseconds(50), [](pr::MessageKind k) { return k == pr::MessageKind::kReject; });
    }
    REQUIRE(named.rejects.size() == 1);
    CHECK(named.rejects[0].code == static_cast<uint32_t>(Errc::kPeerRoutingId));
    CHECK(named.session() == 0);  // never welcomed
  }
  //   b. a frame past the limit by more than libzmq's slack (2 MB + 64 KiB): libzmq drops the
  //      connection unread; the server logs and counts the drop;
  {
    Attacker huge(Federation::endpoint(port), f.keys() + "/client-3.key_secret",
                  f.keys() + "/server.key");
    std::vector<uint8_t> big(2'000'000 + 64 * 1024 + 4096, 0x5a);
    CHECK(huge.send(big));
    a.pump(milliseconds(500));
  }
  //   c. plain TCP (no CURVE) on the CURVE port: refused in the handshake, logged and counted.
  {
    zmq::context_t plain_ctx;
    zmq::socket_t plain(plain_ctx, zmq::socket_type::dealer);
    plain.set(zmq::sockopt::linger, 0);
    plain.connect(Federation::endpoint(port));
    const auto hb = pr::encode(pr::HeartbeatMsg{kAttackerId, a.session(), 0});
    (void)plain.send(zmq::buffer(hb.data(), hb.size()), zmq::send_flags::dontwait);
    a.pump(milliseconds(500));
  }

  // It stays connected, heartbeating, answering nothing, until the federation ends.
  awaitShutdown(a, f.proc("root"), seconds(60));
  const int rc = f.proc("root").wait(seconds(10));
  const std::string log = f.log("root");
  INFO(f.allLogs());
  REQUIRE(rc == 0);  // alive throughout, ended on its own after all rounds
  CHECK(a.shutdown);

  const auto lines = readLines(f.path("metrics.jsonl"));
  REQUIRE(lines.size() == 3);
  for (const auto& l : lines) {
    CHECK(field(l, "applied") == "true");
    CHECK(field(l, "clients_selected") == "4");   // the attacker was sampled every round ...
    CHECK(field(l, "clients_completed") == "3");  // ... and contributed nothing
    CHECK(field(l, "clients_failed") == "1");
  }
  // Refusals by the round (index, NaN, norm, weight, round) are counted in the metrics.
  CHECK(std::stoull(field(lines[0], "updates_rejected")) >= 5);

  for (const char* why :
       {"truncated", "too large", "not a Starling message", "fingerprint mismatch",
        "index out of range", "non-finite", "norm too large", "bad weight", "wrong round",
        "bad nonce", "wrong sender: an update claiming to be client 0",
        "registration refused: wrong sender", "rate limited",
        "wrong sender: a partial aggregate from a client", "late: an answer to a task",
        "routing id named by the peer", "closed after their handshake"}) {
    INFO("refusal reason: " << why);
    CHECK(log.find(why) != std::string::npos);
  }
  CHECK(countOf(log, "client 0 registered (") ==
        1);  // the attacker's Register as client 0 changed nothing
  // The plaintext connection: the server saw the mechanisms differ, or the client (seeing it
  // first) close before its handshake finished.
  CHECK((log.find("of another security mechanism") != std::string::npos ||
         log.find("before their handshake finished") != std::string::npos));

  // The model is the honest federation's, up to float summation order.
  const Checkpoint ck = readCheckpoint(f.path("ck.bin"));
  CHECK(ck.next_round == 4);
  REQUIRE(ck.model.size() == honest_model.size());
  double max_abs = 0.0;
  const double diff = maxRelDiff(ck.model, honest_model, &max_abs);
  CHECK(max_abs > 0.0);
  CHECK(diff <= 1e-5 * max_abs);
  for (uint64_t c = 0; c < 3; ++c)
    CHECK(f.proc("client-" + std::to_string(c)).wait(seconds(10)) == 0);
}

// With a robust rule (median), partial aggregates cannot be merged (PhaseAggregator::merge throws
// InvalidArgument, not InputError). A client key that registers with role Aggregator and sends a
// PartialAggregate with its task's nonce must be refused, not end the server.
TEST_CASE(
    "a client registered as an aggregator cannot bring down a robust-rule root with a partial",
    "[integration][server][attack]") {
  Federation f("hostile-robust");
  f.clientKeys(0, 3);
  const int port = freePort();
  f.root("root", port, f.allowList("allow", {"client-0", "client-1", "client-2"}),
         {"--train.rounds", "2", "--sampling.min_available", "2", "--sampling.min_clients", "2",
          "--sampling.wait_ms", "30000", "--round.deadline_ms", "10000", "--aggregation.rule",
          "median", "--compression.compressor", "topk:density=0.05", "--state.metrics",
          f.path("metrics.jsonl")});
  for (uint64_t c = 0; c < 2; ++c) f.client(c, port, "server", 3);

  Attacker a(Federation::endpoint(port), f.keys() + "/client-2.key_secret",
             f.keys() + "/server.key");
  a.setId(2);
  pr::RegisterMsg reg;
  reg.client_id = 2;
  reg.role = pr::Role::kAggregator;  // nothing on the allow-list says client-2 may be one
  reg.layout_fingerprint = serverLayout().fingerprint();
  reg.num_examples = 1000;
  a.send(pr::encode(reg));
  a.pump(seconds(20), [](pr::MessageKind k) {
    return k == pr::MessageKind::kWelcome || k == pr::MessageKind::kReject;
  });
  // Refused at registration (one fix) or welcomed: then it gets a task and sends its partial.
  if (a.session() != 0 &&
      a.pump(seconds(30), [](pr::MessageKind k) { return k == pr::MessageKind::kTask; }))
    a.send(zeroPartial(a.tasks.back()));
  awaitShutdown(a, f.proc("root"), seconds(45));
  const int rc = f.proc("root").wait(seconds(10));
  INFO(f.allLogs());
  CHECK(rc == 0);  // not "starling-server: aggregation rule median ... cannot merge partial
                   // aggregates" (rc 2)
  const auto lines = readLines(f.path("metrics.jsonl"));
  REQUIRE(lines.size() == 2);
  for (const auto& l : lines) CHECK(field(l, "applied") == "true");
}

// An operator revokes a listed client that ignores every refusal: the root closes its connection
// itself (after a second's grace) and refuses its key's next handshake.
TEST_CASE("a revoked client that ignores every refusal has its connection closed by the root",
          "[integration][server][attack]") {
  Federation f("hostile-revoke");
  f.clientKeys(0, 4);
  const int port = freePort();
  const std::string sock = f.path("admin.sock");
  // The round waits for ten clients that never come: the root only serves.
  f.root("root", port, f.allowList("allow", {"client-0", "client-1", "client-2", "client-3"}),
         rootArgs(f, "10", "10000", {"--admin.socket", sock}));
  Attacker a(Federation::endpoint(port), f.keys() + "/client-3.key_secret",
             f.keys() + "/server.key");
  a.setId(kAttackerId);
  pr::RegisterMsg reg;
  reg.client_id = kAttackerId;
  reg.layout_fingerprint = serverLayout().fingerprint();
  reg.num_examples = 100;
  a.send(pr::encode(reg));
  INFO(f.allLogs());
  REQUIRE(a.pump(seconds(20), [](pr::MessageKind k) { return k == pr::MessageKind::kWelcome; }));
  REQUIRE(f.waitFor([&] { return std::filesystem::exists(sock); }, seconds(20)));
  Proc& admin = f.start("admin", {binDir() + "/starling-admin", "--socket", sock, "revoke",
                                  std::to_string(kAttackerId)});
  REQUIRE(admin.wait(seconds(20)) == 0);
  // It goes on heartbeating as if nothing happened: told it was revoked, then its connection is
  // closed, and its key's next handshake refused.
  const auto until = Steady::now() + seconds(15);
  const auto closed = [&] {
    return f.log("root").find("closed 1 connection of revoked client 3") != std::string::npos;
  };
  const auto refused_again = [&] {
    return f.log("root").find("not on the allow-list") != std::string::npos;
  };
  while (Steady::now() < until && !(closed() && refused_again())) a.pump(milliseconds(200));
  CHECK(closed());
  CHECK(refused_again());
  CHECK(std::any_of(a.rejects.begin(), a.rejects.end(), [](const pr::RejectMsg& r) {
    return r.code == static_cast<uint32_t>(Errc::kRevoked);
  }));
  CHECK(f.log("admin").find("revoked client 3") != std::string::npos);
}

// A malicious SERVER: a raw ROUTER holding the server's key welcomes a real starling-client, then
// sends a Task whose compressor spec is unknown. The client must drop that task (not exit), and
// still train the next, valid task and end on Shutdown.
TEST_CASE("a client survives a task with an unknown compressor spec from its server",
          "[integration][client][attack]") {
  Federation f("hostile-server");
  f.clientKeys(0, 1);
  const int port = freePort();
  zmq::context_t ctx;
  zmq::socket_t router(ctx, zmq::socket_type::router);
  const transport::CurveKeyPair server_keys =
      transport::loadKeyPair(f.keys() + "/server.key_secret");
  router.set(zmq::sockopt::curve_server, true);
  router.set(zmq::sockopt::curve_publickey, server_keys.public_key);
  router.set(zmq::sockopt::curve_secretkey, server_keys.secret_key);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::sndtimeo, 2000);
  router.bind(Federation::endpoint(port));
  Proc& client = f.client(0, port, "server", 4);

  std::string peer;
  // Receives until a message of `want` arrives (true) or `timeout`.
  auto await = [&](pr::MessageKind want, milliseconds timeout) {
    const auto until = Steady::now() + timeout;
    while (Steady::now() < until && client.alive()) {
      zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, milliseconds(50));
      zmq::message_t id, body;
      while (router.recv(id, zmq::recv_flags::dontwait)) {
        (void)router.recv(body, zmq::recv_flags::none);
        peer = id.to_string();
        std::vector<uint64_t> buf((body.size() + 7) / 8);
        std::memcpy(buf.data(), body.data(), body.size());
        if (pr::peekKind({reinterpret_cast<const uint8_t*>(buf.data()), body.size()}) == want)
          return true;
      }
    }
    return false;
  };
  auto sendTo = [&](const std::vector<uint8_t>& bytes) {
    router.send(zmq::buffer(peer), zmq::send_flags::sndmore);
    router.send(zmq::buffer(bytes), zmq::send_flags::none);
  };
  const ParamLayout& l = serverLayout();
  std::vector<std::vector<float>> weights;
  for (size_t t = 0; t < l.size(); ++t) weights.emplace_back(l[t].numel, 0.0f);
  auto task = [&](const std::string& spec, uint64_t round, uint64_t nonce) {
    pr::TaskMsg h;
    h.round = round;
    h.nonce = nonce;
    h.run_seed = 1;
    h.compressor = spec;
    h.model_version = round;
    h.deadline_ms = 10000;
    h.metrics = {"train_loss"};
    std::vector<cz::PayloadView> views;
    for (const auto& w : weights) views.push_back(cz::DenseF32View{w});
    return pr::encodeTask(h, views);
  };

  const bool registered = await(pr::MessageKind::kRegister, seconds(20));
  INFO(f.allLogs());
  REQUIRE(registered);
  sendTo(pr::encode(pr::WelcomeMsg{0, 77, 200, 1u << 30, 1u << 20}));
  sendTo(task("no-such-compressor", 1, 11));
  sendTo(task("topk:density=7", 1, 12));  // a known compressor, an impossible option
  // The client reads its messages in order (one connection): it has dropped both by the next.
  sendTo(task("topk:density=0.05", 2, 13));
  const bool trained = await(pr::MessageKind::kUpdate, seconds(20));
  INFO(f.allLogs());
  CHECK(client.alive());
  CHECK(trained);
  sendTo(pr::encode(pr::ShutdownMsg{2, "done"}));
  CHECK(client.wait(seconds(10)) == 0);
}
