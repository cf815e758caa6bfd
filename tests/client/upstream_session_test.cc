// UpstreamSession (client/upstream_session.h) with made-up times: when to register, to heartbeat,
// to register again after silence or a server restart, and one registration for a burst of
// Reject(NotRegistered) (after a restart, every heartbeat queued during the outage draws one).
#include "client/upstream_session.h"

#include <catch2/catch.hpp>

using starling::client::UpstreamSession;
using Ms = std::chrono::milliseconds;

namespace {
const UpstreamSession::Steady::time_point t0{};
UpstreamSession::Steady::time_point at(int ms) { return t0 + Ms(ms); }
}  // namespace

TEST_CASE("upstream session: register until welcomed, then heartbeat at the server's interval",
          "[client][upstream]") {
  UpstreamSession s({Ms(1000), Ms(5000)}, at(0));
  s.registerSent(at(0));
  CHECK_FALSE(s.tick(at(500)).register_now);  // in flight
  CHECK_FALSE(s.tick(at(1000)).register_now);
  CHECK(s.tick(at(1001)).register_now);  // no welcome within register_retry: again
  s.registerSent(at(1001));
  CHECK(s.onWelcome(7, 200));  // a session starts: worth a log line
  CHECK(s.registered());
  CHECK(s.session() == 7);
  CHECK_FALSE(s.onWelcome(7, 200));   // a duplicate from a queued registration
  CHECK(s.tick(at(1100)).heartbeat);  // never sent one
  s.heartbeatSent(at(1100));
  CHECK_FALSE(s.tick(at(1299)).heartbeat);
  CHECK_FALSE(s.heartbeatDue(at(1299)));
  CHECK(s.heartbeatDue(at(1300)));
  CHECK(s.tick(at(1300)).heartbeat);
  CHECK_FALSE(s.tick(at(1300)).register_now);
}

TEST_CASE("upstream session: a silent server or a new session means registering again",
          "[client][upstream]") {
  UpstreamSession s({Ms(1000), Ms(5000)}, at(0));
  s.registerSent(at(0));
  s.onWelcome(1, 1000);
  s.heard(at(100));
  CHECK_FALSE(s.tick(at(5100)).silent);
  const UpstreamSession::Due d = s.tick(at(5101));
  CHECK(d.silent);
  CHECK(d.register_now);
  CHECK_FALSE(d.heartbeat);  // a registration first
  // Once per silent period, not on every turn.
  CHECK_FALSE(s.tick(at(5102)).silent);
  s.registerSent(at(5102));
  CHECK(s.awaitingWelcome());
  s.onWelcome(1, 1000);
  CHECK_FALSE(s.awaitingWelcome());
  CHECK_FALSE(s.onServerHeartbeat(1));
  CHECK(s.onServerHeartbeat(2));  // the server restarted
}

TEST_CASE("upstream session: heartbeats go on while a registration again awaits its welcome",
          "[client][upstream]") {
  // A registration again once stopped the heartbeats until a Welcome was read; a client
  // busy training read none, and the server failed it as silent.
  UpstreamSession s({Ms(1000), Ms(5000)}, at(0));
  CHECK_FALSE(s.onServerHeartbeat(2));  // no session yet: nothing to compare
  CHECK_FALSE(s.heartbeatDue(at(10)));  // nor heartbeats
  s.registerSent(at(0));
  s.onWelcome(1, 1000);
  s.heartbeatSent(at(0));
  s.registerSent(at(500));  // the owner's own reason (an aggregator whose clients changed)
  CHECK(s.registered());
  CHECK(s.heartbeatDue(at(1000)));
  CHECK(s.tick(at(1000)).heartbeat);
  s.heartbeatSent(at(1000));
  CHECK(s.tick(at(1501)).register_now);  // unanswered for register_retry: again
  s.registerSent(at(1501));
  CHECK(s.tick(at(2000)).heartbeat);  // and the heartbeats still go
  // No silence is declared while a registration is out (the server unheard since 0, past the
  // 5000 ms): the retries stand for it.
  s.heartbeatSent(at(2000));
  const UpstreamSession::Due d = s.tick(at(6000));
  CHECK(d.register_now);
  CHECK_FALSE(d.silent);
  s.registerSent(at(6000));
  CHECK_FALSE(s.onWelcome(1, 1000));  // the same session: nothing new
  CHECK_FALSE(s.awaitingWelcome());
}

TEST_CASE("upstream session: a burst of NotRegistered draws one registration",
          "[client][upstream]") {
  // A root restarted after an outage answers each heartbeat queued meanwhile with NotRegistered.
  UpstreamSession s({Ms(1000), Ms(15000)}, at(0));
  s.registerSent(at(0));
  s.onWelcome(1, 200);
  int sent = 0;
  for (int i = 0; i < 15; ++i) {
    const auto now = at(4000 + i);
    if (s.onNotRegistered(now)) {
      s.registerSent(now);
      ++sent;
    }
  }
  CHECK(sent == 1);
  // If no welcome comes back within register_retry, the next one is answered again.
  CHECK_FALSE(s.onNotRegistered(at(4999)));
  CHECK(s.onNotRegistered(at(5000)));
}

TEST_CASE("upstream session: withdrawn, it heartbeats no more and asks for a Register at the retry",
          "[client][upstream]") {
  UpstreamSession s({Ms(1000), Ms(5000)}, at(0));
  s.registerSent(at(0));
  s.onWelcome(1, 100);
  CHECK(s.heartbeatDue(at(200)));
  s.withdraw(at(200));
  CHECK_FALSE(s.registered());
  CHECK_FALSE(s.heartbeatDue(at(5000)));
  CHECK_FALSE(s.tick(at(1200)).register_now);
  CHECK(s.tick(at(1201)).register_now);
}
