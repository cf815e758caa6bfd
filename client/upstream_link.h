#pragma once
// UpstreamLink: the connection a deployed client, or an edge aggregator, keeps with the server
// above it, written once for both (the Python client is a deployed client): the socket, the
// session (client/upstream_session.h), the answers to the session's own messages, the back-off
// after Reject(Busy) drawn from a seeded stream, and reading the server while the owner works.
//
// The owner's messages (Task, Shutdown, and a Reject(Refused) it should log) come from next(), in
// the order they arrived. Welcome, Heartbeat, Reject(NotRegistered) and Reject(Busy) are answered
// here. upkeep() reads what came before it decides anything (the server's answers to heartbeats
// say it is alive), answers the session's messages, keeps the owner's for next(), then sends what
// is due. While the owner works -- a client's fit, an aggregator's relayed phase, minutes on a
// real device -- it calls upkeep() every few milliseconds. So a long fit is never taken for a
// silent server (a fit over 15 s once re-registered, stopped heartbeating and lost the next
// round).
//
// What registering again cannot mend ends the link with UpstreamRefused, which says what to check:
// - the server refused the registration for good (Reject(RegistrationRefused) while a Register is
//   out: a key listed under another id, another model's layout fingerprint, an aggregator not
//   listed as one);
// - handshakes failed (transport::HandshakeReport): the server refused this side's key (ZAP status
//   400, once: libzmq does not try again), the two sides disagree on CURVE against plain TCP, or
//   handshakes failed otherwise at least max_failed_handshakes times in a row over at least
//   handshake_failure_window_ms (a wrong server key). Each failure is logged as it comes.
// A server that is not up yet (connections refused) is no failure: the link waits for it.
//
// Kept messages are bounded: at most kMaxKept (the oldest task is dropped first, with a warning),
// and a Shutdown replaces whatever was kept (the federation is over).
//
// Threading: one thread (the owner's) calls every method; the socket is its.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "client/upstream_session.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/rng.h"
#include "transport/socket.h"

namespace spdlog {
class logger;
}

namespace starling::client {

// The server above will not take this client or aggregator: a mistake of configuration that
// waiting cannot mend. Not a ConfigError on purpose: the owners' per-message handlers drop a task
// on a ConfigError and go on, where this must end run().
class UpstreamRefused : public Error {
 public:
  using Error::Error;
};

struct UpstreamLinkConfig {
  std::string endpoint;  // tcp://host:port (or inproc:// in tests)
  transport::SecurityConfig security;
  transport::TransportLimits limits;
  std::string name = "client";        // "client 3", "aggregator 100": log lines and errors
  uint32_t register_retry_ms = 1000;  // send Register again when no Welcome came in this long
  uint32_t silence_ms = 15000;        // register again when the server was silent this long
  // Handshakes that failed for a reason that may pass (not a refused key, not CURVE against plain
  // TCP) are given up on when at least this many failed in a row over at least this long: a proxy
  // that accepts connections while its server restarts fails every handshake for a while.
  uint32_t max_failed_handshakes = 5;
  uint32_t handshake_failure_window_ms = 60'000;
  // Registration retries, silence, heartbeats and back-offs are measured in it.
  const Clock* clock = &steadyClock();
  // The Busy back-off's stream: its jitter is the run's, reproducible, and differs per id.
  uint64_t seed = 0, id = 0;
  void validate() const;  // ConfigError naming the bad field
};

struct UpstreamStats {
  uint64_t registrations = 0, heartbeats = 0, rejects = 0, resent_after_busy = 0;
  uint64_t uplink_bytes = 0, downlink_bytes = 0;  // every message, each time it is sent
};

class UpstreamLink {
 public:
  // `make_register`: the Register to send now, or nullopt when there is nothing to offer yet (an
  // aggregator before its clients registered; upkeep() asks again at the retry interval).
  // `make_heartbeat`: a Heartbeat for session `session`. `on_sent`: called after every message sent
  // (a client's progress); may be empty.
  UpstreamLink(transport::Context& ctx, UpstreamLinkConfig config,
               std::function<std::optional<std::vector<uint8_t>>()> make_register,
               std::function<std::vector<uint8_t>(uint64_t session)> make_heartbeat,
               std::shared_ptr<spdlog::logger> log, std::function<void()> on_sent = {});
  ~UpstreamLink();

  // Sends a Register now (the owner's reason: the server thinks it holds another model version,
  // an aggregator's subtree changed).
  void registerNow();
  // Reads what came without waiting (the owner's messages are kept for next()), checks the
  // handshakes (UpstreamRefused), then sends what is due: a Register (first, retried, after
  // silence), a Heartbeat, a resend after Busy. Call it every turn of the owner's loop, and every
  // few milliseconds while the owner works.
  void upkeep();
  // The next message for the owner: one kept while it worked, else one read within `timeout`
  // (the session's own messages are handled here and not returned). nullopt when none came.
  // Refusals of the transport (a chunk gone wrong) are logged here, not returned.
  std::optional<transport::Received> next(std::chrono::milliseconds timeout);

  // Sends a message (false: the socket's queue is full or a chunked send was cut short).
  bool send(std::span<const uint8_t> bytes);
  // The owner's answer to its task (an update, a partial): sent, and kept -- sent again after a
  // Reject(Busy), and what lastAnswer() returns.
  void answer(std::vector<uint8_t> bytes);
  // An answer kept without sending it (made before a restart, or saved before it is sent): a
  // resend after Busy pending for an earlier answer is cancelled.
  void restoreAnswer(std::vector<uint8_t> bytes) {
    answer_ = std::move(bytes);
    resend_at_.reset();
  }
  void resendAnswer();
  const std::vector<uint8_t>& lastAnswer() const { return answer_; }

  const UpstreamSession& session() const { return session_; }
  const UpstreamStats& stats() const { return stats_; }
  const transport::ClientSocket& socket() const { return socket_; }

 private:
  // Handles the session's messages; the owner's are returned. Throws UpstreamRefused.
  std::optional<transport::Received> dispatch(transport::Received r);
  void checkHandshakes();

  UpstreamLinkConfig config_;
  std::function<std::optional<std::vector<uint8_t>>()> make_register_;
  std::function<std::vector<uint8_t>(uint64_t)> make_heartbeat_;
  std::shared_ptr<spdlog::logger> log_;
  std::function<void()> on_sent_;
  transport::ClientSocket socket_;
  UpstreamSession session_;
  UpstreamStats stats_;
  static constexpr size_t kMaxKept = 8;
  std::deque<transport::Received> kept_;  // the owner's messages read while it worked
  void keep(transport::Received r);
  uint64_t failures_logged_ = 0;                    // handshake failures already logged
  std::optional<Clock::time_point> failing_since_;  // the first failure of the current streak
  std::vector<uint8_t> answer_;
  std::optional<Clock::time_point> resend_at_;
  std::chrono::milliseconds busy_backoff_{200};
  RngStream backoff_rng_;
};

}  // namespace starling::client
