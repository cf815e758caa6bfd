#pragma once
// The deployed client: one client of a federation over ZeroMQ (its connection upstream is
// client/upstream_link.h, the edge aggregator's too). It registers, answers tasks with the shared
// client algorithm (client/algorithm.h: train -> delta -> compress with its own error-feedback
// state -> Update), answers evaluation tasks, heartbeats and reads the server while it trains (a
// fit of minutes is never taken for a silent server), and re-registers whenever the server says it
// does not know it or was silent for server_silence_ms (a restarted server, a dropped connection;
// ZeroMQ itself reconnects with backoff). What re-registering cannot mend -- a key the server does
// not admit, CURVE against plain TCP, a key listed under another id, another model -- ends run()
// with UpstreamRefused, saying what to check.
//
// Durability: with a state file, the client writes (atomically) its compressor state and the
// update it is about to send, with that task's nonce, before sending. A client killed and
// restarted therefore keeps its error-feedback residual, and when the server hands it the same
// task again (it does so for a client that re-registers mid-phase) it sends the same update
// instead of training again: nothing is lost or counted twice.
//
// Threading: run() owns the socket on the calling thread; training runs on a second thread so
// that heartbeats and the server's messages keep flowing (those for later are kept), and is
// joined before the next message is handled.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "client/secure_party.h"
#include "client/trainer.h"
#include "compression/compressor.h"
#include "core/client_state.h"
#include "core/clock.h"
#include "privacy/crypto.h"
#include "transport/socket.h"

namespace spdlog {
class logger;
}

namespace starling::client {

struct RuntimeStats {
  uint64_t tasks = 0, updates_sent = 0, evaluations_sent = 0, resent = 0;
  uint64_t rejects = 0, registrations = 0, heartbeats = 0;
  uint64_t uplink_bytes = 0, downlink_bytes = 0;  // every message, each time it is sent
  uint64_t update_bytes = 0;  // the updates made, each counted once (the simulator's uplink)
  uint64_t last_round = 0;
};

struct RuntimeConfig {
  std::string server = "tcp://127.0.0.1:7700";
  uint64_t client_id = 0;
  transport::SecurityConfig security;
  transport::TransportLimits limits;
  std::string state_file;             // empty: state lives in memory only (its folder must exist)
  uint32_t register_retry_ms = 1000;  // resend Register when no Welcome came in this long
  // Register again when nothing came from the server this long (net.server_silence_ms). The server
  // answers every heartbeat, and the client reads while it trains: only a server gone quiet
  // trips it, however long the fit.
  uint32_t server_silence_ms = 15000;
  // Heartbeats, registration retries, server silence, and back-offs are measured in it
  // (core/clock.h; a test moves it forward).
  const Clock* clock = &steadyClock();
  // Called on the runtime's thread with the statistics after each message it sends (a progress
  // display, or a test waiting for the client to have done something); empty: none.
  std::function<void(const RuntimeStats&)> on_sent;
  // Secure aggregation: the key of round r's stochastic rounding into the ring. Empty (the
  // default): a fresh random key each round, as the privacy of distributed noise needs; a test
  // gives one fixed by the round to compare two federations' sums bit for bit.
  std::function<privacy::Key32(uint64_t round, uint32_t phase)> secagg_rounding;
  // Secure aggregation: which rounds it runs and whose keys it trusts (client/secure_party.h).
  SecAggTrust secagg_trust;
  void validate() const;
};

class ClientRuntime {
 public:
  // `trainer`, `train` and `eval` (may be empty) must outlive the runtime.
  ClientRuntime(transport::Context& ctx, RuntimeConfig config, Trainer& trainer, DataView train,
                DataView eval, std::shared_ptr<spdlog::logger> log);
  ~ClientRuntime();

  // Serves the federation until the server sends Shutdown (returns true) or `stop` becomes true
  // (returns false). Throws IoError if the state file cannot be written, UpstreamRefused
  // (client/upstream_link.h) when the server will not take this client.
  bool run(const std::atomic<bool>& stop);

  const RuntimeStats& stats() const { return stats_; }
  const ClientState& state() const { return state_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  RuntimeStats stats_;
  ClientState state_;
};

}  // namespace starling::client
