#include "client/upstream_session.h"

namespace starling::client {

UpstreamSession::UpstreamSession(Timings t, Steady::time_point now) : t_(t), last_heard_(now) {}

UpstreamSession::Due UpstreamSession::tick(Steady::time_point now) {
  Due d;
  // Not welcomed yet, or a registration again unanswered: send it again.
  if ((!registered_ || awaiting_) && now - last_register_ > t_.register_retry)
    d.register_now = true;
  if (registered_ && !awaiting_ && now - last_heard_ > t_.silence) {
    last_heard_ = now;  // once per silent period, not on every turn
    d.register_now = d.silent = true;
  }
  d.heartbeat = !d.register_now && heartbeatDue(now);
  return d;
}

void UpstreamSession::registerSent(Steady::time_point now) {
  awaiting_ = true;
  last_register_ = now;
}

void UpstreamSession::withdraw(Steady::time_point now) {
  registered_ = awaiting_ = false;
  last_register_ = now;
}

void UpstreamSession::heartbeatSent(Steady::time_point now) { last_heartbeat_ = now; }

bool UpstreamSession::onWelcome(uint64_t session, uint32_t heartbeat_ms) {
  const bool fresh = !registered_ || session != session_;
  registered_ = true;
  awaiting_ = false;
  session_ = session;
  heartbeat_ = Millis(heartbeat_ms);
  return fresh;
}

bool UpstreamSession::onNotRegistered(Steady::time_point now) const {
  return !awaiting_ || now - last_register_ >= t_.register_retry;
}

}  // namespace starling::client
