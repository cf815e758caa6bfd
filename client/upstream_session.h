#pragma once
// UpstreamSession: the session a deployed client, or an edge aggregator, keeps with the server
// above it, written once: register, the Welcome, heartbeats, registering again when the
// server has been silent or restarted, and answering a burst of Reject(NotRegistered) with one
// registration, not one each (after a root restart, every heartbeat queued during the outage
// draws one: 7 to 9 registrations per client before, each bringing the task again).
//
// A registration again (after silence, a restart, or the owner's own reason) keeps the session it
// replaces until the Welcome comes: heartbeats go on meanwhile (a re-registration that once
// stopped them until a Welcome was read cost the next round, the server failing the client as
// silent while it trained). The owner reads the server while it works (client/upstream_link.h),
// so a long fit is never taken for a silent server.
//
// Pure logic over times the owner passes: it sends nothing. The owner sends the Register (and then
// calls registerSent) and the Heartbeat (heartbeatSent) when it says so, tells it what came back,
// and keeps its own reasons to register again (an aggregator whose clients changed). Tested on its
// own with made-up times (tests/client/upstream_session_test.cc).
#include <chrono>
#include <cstdint>

namespace starling::client {

class UpstreamSession {
 public:
  using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock
  using Millis = std::chrono::milliseconds;

  struct Timings {
    Millis register_retry{1000};  // send Register again when no Welcome came in this long
    Millis silence{15000};        // register again when the server was silent this long
  };

  // What tick() asks of the owner now.
  struct Due {
    bool register_now = false;  // send a Register (and call registerSent)
    bool silent = false;        // ... because the server was silent too long (worth a warning)
    bool heartbeat = false;     // send a Heartbeat (and call heartbeatSent)
  };

  UpstreamSession(Timings t, Steady::time_point now);

  Due tick(Steady::time_point now);
  // A heartbeat is due (a session, and heartbeatInterval() since the last).
  bool heartbeatDue(Steady::time_point now) const {
    return registered_ && now - last_heartbeat_ >= heartbeat_;
  }
  void registerSent(Steady::time_point now);
  // The owner has nothing to offer (an aggregator whose clients left): the session ends, no
  // heartbeats go out, and tick() asks for a Register again after register_retry.
  void withdraw(Steady::time_point now);
  void heartbeatSent(Steady::time_point now);
  // Anything arrived from the server (it is alive).
  void heard(Steady::time_point now) { last_heard_ = now; }

  // A Welcome: returns true when it starts a session (the first, or the server's new one), false
  // for a duplicate (registrations queued in an outage come back as several welcomes).
  bool onWelcome(uint64_t session, uint32_t heartbeat_ms);
  // The server's Heartbeat carries its session: true when it differs from ours (the server
  // restarted and forgot us; register again).
  bool onServerHeartbeat(uint64_t session) const { return registered_ && session != session_; }
  // A Reject(NotRegistered): true when a Register should go out. While one is in flight (sent less
  // than register_retry ago, no Welcome yet) the rest of a burst is answered by it.
  bool onNotRegistered(Steady::time_point now) const;

  // Welcomed at least once: a session (the server may have forgotten it; heartbeats will say).
  bool registered() const { return registered_; }
  // A Register is out and no Welcome has answered it yet.
  bool awaitingWelcome() const { return awaiting_; }
  uint64_t session() const { return session_; }
  Millis heartbeatInterval() const { return heartbeat_; }

 private:
  Timings t_;
  bool registered_ = false, awaiting_ = false;
  uint64_t session_ = 0;
  Millis heartbeat_{1000};
  Steady::time_point last_register_{}, last_heartbeat_{}, last_heard_;
};

}  // namespace starling::client
