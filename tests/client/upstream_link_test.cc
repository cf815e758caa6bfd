// UpstreamLink (client/upstream_link.h) against a scripted server on 127.0.0.1: what it keeps while
// its owner works is bounded and a Shutdown goes first; a refusal of a registration is believed
// only while its own Register is unanswered; a subtree with nothing to offer withdraws.
#include "client/upstream_link.h"

#include <catch2/catch.hpp>
#include <optional>
#include <thread>

#include "protocol/control.h"
#include "transport/context.h"
#include "transport/socket.h"

using namespace starling;
namespace pr = starling::protocol;
using std::chrono::milliseconds;

namespace {

transport::SecurityConfig plain() {
  transport::SecurityConfig s;
  s.insecure = true;
  return s;
}

// A server socket that answers what the test says, and the link of client 5 to it.
struct Pair {
  transport::Context ctx;
  transport::ServerSocket server{ctx, "tcp://127.0.0.1:*", plain()};
  std::optional<std::vector<uint8_t>> registration = pr::encode([] {
    pr::RegisterMsg m;
    m.client_id = 5;
    m.num_examples = 10;
    return m;
  }());
  client::UpstreamLink link;
  std::string peer;

  Pair()
      : link(
            ctx,
            [&] {
              client::UpstreamLinkConfig c;
              c.endpoint = server.endpoint();
              c.security = plain();
              c.id = 5;
              c.name = "client 5";
              return c;
            }(),
            [this] { return registration; },
            [](uint64_t session) {
              return pr::encode(pr::HeartbeatMsg{5, session, 0});
            },
            nullptr) {}

  // The next message the server receives of `kind` (the link's upkeep runs meanwhile).
  std::optional<transport::Received> serverGets(pr::MessageKind kind) {
    for (int i = 0; i < 200; ++i) {
      link.upkeep();
      if (auto r = server.receive(milliseconds(10));
          r && r->ok() && pr::peekKind(r->bytes()) == kind) {
        peer = r->peer;
        return r;
      }
    }
    return std::nullopt;
  }
  void welcome() {
    REQUIRE(serverGets(pr::MessageKind::kRegister));
    server.send(peer, pr::encode(pr::WelcomeMsg{5, 77, 100, 1 << 20, 1 << 16}));
    for (int i = 0; i < 200 && !link.session().registered(); ++i) {
      link.upkeep();
      (void)link.next(milliseconds(5));
    }
    REQUIRE(link.session().registered());
    REQUIRE_FALSE(link.session().awaitingWelcome());
  }
  // Sends `messages` to the link and runs its upkeep only (the owner "works": no next()) until
  // the link has read them all, by the bytes it counts (at most 10 s).
  void sendWhileWorking(const std::vector<std::vector<uint8_t>>& messages) {
    uint64_t expect = link.stats().downlink_bytes;
    for (const auto& m : messages) {
      server.send(peer, m);
      expect += m.size();
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (link.stats().downlink_bytes < expect && std::chrono::steady_clock::now() < until) {
      link.upkeep();
      std::this_thread::yield();
    }
    REQUIRE(link.stats().downlink_bytes >= expect);
  }
  std::vector<uint8_t> refused(pr::RejectKind kind, const std::string& why) {
    pr::RejectMsg m;
    m.kind = kind;
    m.message = why;
    return pr::encode(m);
  }
};

}  // namespace

TEST_CASE("upstream link: what comes while the owner works is kept, at most 8, a Shutdown first",
          "[client][upstream]") {
  Pair p;
  p.welcome();
  // The owner "works": upkeep() only, no next(). Twenty owner messages arrive, then a Shutdown.
  std::vector<std::vector<uint8_t>> twenty;
  for (int i = 0; i < 20; ++i)
    twenty.push_back(p.refused(pr::RejectKind::kRefused, std::to_string(i)));
  p.sendWhileWorking(twenty);
  size_t kept = 0;
  // At most 8 kept: the newest.
  std::vector<std::string> got;
  while (auto r = p.link.next(milliseconds(20))) {
    got.push_back(pr::decodeReject(r->bytes()).message);
    ++kept;
  }
  CHECK(kept <= 8);
  REQUIRE_FALSE(got.empty());
  CHECK(got.back() == "19");
  // A Shutdown replaces what was kept.
  std::vector<std::vector<uint8_t>> then(5, p.refused(pr::RejectKind::kRefused, "stale"));
  then.push_back(pr::encode(pr::ShutdownMsg{3, "done"}));
  p.sendWhileWorking(then);
  auto first = p.link.next(milliseconds(20));
  REQUIRE(first);
  CHECK(pr::peekKind(first->bytes()) == pr::MessageKind::kShutdown);
}

TEST_CASE("upstream link: a registration refusal ends it only as the answer to its own Register",
          "[client][upstream]") {
  Pair p;
  p.welcome();
  // A stray refusal while registered: logged and ignored.
  p.server.send(p.peer, p.refused(pr::RejectKind::kRegistrationRefused, "stray"));
  for (int i = 0; i < 50; ++i) {
    CHECK_NOTHROW(p.link.upkeep());
    CHECK_NOTHROW(p.link.next(milliseconds(2)));
  }
  // The answer to its Register: the link gives up, with the server's words.
  p.link.registerNow();
  REQUIRE(p.serverGets(pr::MessageKind::kRegister));
  p.server.send(p.peer, p.refused(pr::RejectKind::kRegistrationRefused, "listed as client 4"));
  bool threw = false;
  for (int i = 0; i < 200 && !threw; ++i) {
    try {
      p.link.upkeep();
      (void)p.link.next(milliseconds(5));
    } catch (const client::UpstreamRefused& e) {
      threw = true;
      CHECK(std::string(e.what()).find("listed as client 4") != std::string::npos);
    }
  }
  CHECK(threw);
}

TEST_CASE("upstream link: with nothing to offer it withdraws: no heartbeats, a Register later",
          "[client][upstream]") {
  Pair p;
  p.welcome();
  REQUIRE(p.serverGets(pr::MessageKind::kHeartbeat));  // heartbeats flow (every 100 ms)
  p.registration.reset();                              // an aggregator whose clients all left
  p.link.registerNow();
  CHECK_FALSE(p.link.session().registered());
  // No heartbeat in the next 400 ms (four intervals) ...
  bool beat = false;
  for (int i = 0; i < 40; ++i) {
    p.link.upkeep();
    if (auto r = p.server.receive(milliseconds(10)); r && r->ok())
      beat = beat || pr::peekKind(r->bytes()) == pr::MessageKind::kHeartbeat;
  }
  CHECK_FALSE(beat);
  // ... and once there is something to offer again, a Register at the retry.
  p.registration = pr::encode([] {
    pr::RegisterMsg m;
    m.client_id = 5;
    m.num_examples = 3;
    return m;
  }());
  CHECK(p.serverGets(pr::MessageKind::kRegister));
}
