#pragma once
// The ZeroMQ fleet: the round engine's Fleet over a ROUTER socket (transport::ServerSocket),
// serving clients and edge aggregators. One thread owns it and its socket: every method runs on
// the caller's thread, and no other thread may call it. Everything a peer sends is handled on
// that thread in arrival order; nothing is held per client beyond its registry entry and, during
// a phase, its pending task (nonce). See docs/protocol.md for the state machine.
//
// Every message is checked before use: the transport bounds size, chunks and rate; then the kind,
// the FlatBuffers Verifier, the sender (its CURVE-authenticated id must be the id it registered
// and the id the message claims), the task nonce (an update replayed from an earlier round or
// from another client is refused), and the round's own checks (PhaseAggregator: fingerprint,
// shapes, index ranges, finite values, norm and weight bounds, the weight capped by the examples
// the client registered). A refused message is counted per error code, logged, and answered with
// a Reject; it never changes the aggregate.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include "core/clock.h"
#include "protocol/codec.h"
#include "server/engine.h"
#include "transport/socket.h"

namespace spdlog {
class logger;
}

namespace starling::server {

struct FleetConfig {
  std::string bind = "tcp://127.0.0.1:7700";
  transport::SecurityConfig security;
  transport::TransportLimits limits;
  uint32_t heartbeat_ms = 1000;  // clients send a Heartbeat this often (told in the Welcome)
  uint32_t silence_ms = 5000;    // a client silent this long is failed for the phase and unlisted
  uint64_t max_examples =
      10'000'000;  // the most training (and evaluation) examples a peer may register
  // The ids that may register as edge aggregators (their partial aggregates carry the weight of
  // many clients); every other id may only be a client.
  std::set<uint64_t> aggregator_ids;
  // The time deadlines, silence and waits are measured in (core/clock.h; a test moves it forward).
  const Clock* clock = &steadyClock();
  void validate() const;
};

// What the fleet's asynchronous rounds ask of their driver (server/async_root.h): the task a
// client starting now trains on, and what to do with each update. Called on the fleet's thread.
class AsyncDriver {
 public:
  virtual ~AsyncDriver() = default;
  // The current version's fit task (phase 0; header.round = header.model_version = the version).
  // The reference stays valid, at the same address, for the driver's life; its contents change
  // when the version does.
  virtual const PhaseTask& currentTask() = 0;
  // Whether `client` may start a task on the current version (one accepted update per version).
  virtual bool mayStart(uint64_t client) const = 0;
  // An update to a task of this fleet's, its sender, nonce and version already checked, with the
  // message it came in: the driver adds it (InputError refuses it, counted by the fleet, and
  // nothing changes; any other error, such as the driver's journal failing, ends runAsync).
  virtual void add(const compression::UpdateView& u, const aggregation::ClientLimits& limits,
                   std::span<const uint8_t> message) = 0;
  // An edge aggregator's partial aggregate answering its task (sender, nonce, version and its
  // weight against what the aggregator registered already checked): as add().
  virtual void addPartial(const compression::PartialView& p, uint64_t source,
                          std::span<const uint8_t> message) = 0;
  // After an add() or addPartial() that was taken, once the message is handled: the driver steps
  // when its buffer is full and checkpoints. What this throws ends runAsync (it is not the client's
  // doing).
  virtual void added() = 0;
  virtual void sent(uint64_t bytes) = 0;                      // a task went out
  virtual void failed(uint64_t client, const char* why) = 0;  // a task expired, unanswered
  virtual bool done() const = 0;                              // every step is taken
  // On every turn of the loop (about every 100 ms at most), with the fleet's clock and the tasks
  // open: how many more tasks may go out now (the fleet hands out at most that many, and never
  // more than AsyncFleetOptions::concurrency open). A driver that steps on time (semi-synchronous
  // rounds) steps here; what this throws ends runAsync.
  virtual size_t tick(std::chrono::steady_clock::time_point now, size_t open) = 0;
  // After each turn at which tick() allowed tasks (and the hand-out was not throttled): how many
  // went out (0 when none of the available clients may start, or fewer than min_available are
  // registered).
  virtual void handedOut(size_t sent) = 0;
};

struct AsyncFleetOptions {
  size_t concurrency = 10;            // tasks open at once (FedBuff's C); an aggregator's is one
  size_t min_available = 1;           // no task starts before this many peers are registered
  uint32_t task_deadline_ms = 60000;  // a task unanswered this long is failed
};

class ZmqFleet final : public Fleet {
 public:
  ZmqFleet(transport::Context& ctx, FleetConfig config, std::shared_ptr<const ParamLayout> layout,
           std::shared_ptr<spdlog::logger> log);
  ~ZmqFleet() override;

  std::string endpoint() const;
  uint64_t session() const { return session_; }

  std::vector<ClientInfo> waitForClients(size_t min, std::chrono::milliseconds timeout,
                                         uint64_t round = 0) override;
  PhaseReport runPhase(const PhaseTask& task, std::span<const ClientInfo> participants,
                       size_t target, aggregation::PhaseAggregator& agg) override;
  EvalReport evaluate(const PhaseTask& task, std::span<const ClientInfo> participants) override;
  void finish(const std::string& reason) override;

  // Called on every turn of the fleet's receive loops (about every 100 ms at most), on the
  // owning thread: an aggregator heartbeats its upstream from here while a phase runs.
  void setIdleHook(std::function<void()> hook) { idle_ = std::move(hook); }
  // Once `*stop` is true, every receive loop (waiting for clients, a phase, an evaluation,
  // service()) throws server::Stopped within about 100 ms instead of waiting out its timeout.
  void setStopFlag(const std::atomic<bool>* stop) { stop_ = stop; }

  // Asynchronous rounds (FedBuff at the root): keeps up to `opt.concurrency` clients
  // training, each on the version current when its task left, until driver.done(). A client gets
  // a task when it is registered, idle, and driver.mayStart() it; its update must come from the
  // task's version (kWrongRound otherwise). A task unanswered at its deadline, or whose client
  // went silent or registered again (it lost the task), is failed and the client may start
  // again. An edge aggregator is given tasks as a client is: it relays the task to its clients
  // (a synchronous phase of its subtree) and answers with one partial aggregate of the task's
  // version, which the driver takes with addPartial(); its task is one of the concurrency's
  // slots. Throws Stopped as a phase does; nothing is lost then that the driver has accepted.
  void runAsync(AsyncDriver& driver, const AsyncFleetOptions& opt);

  // Serves registrations and heartbeats for `timeout` outside a phase.
  void service(std::chrono::milliseconds timeout);
  // Clients heard from within silence_ms, by id.
  std::vector<ClientInfo> available() const;
  // The sum of the registered clients' training examples (an aggregator registers this upstream).
  uint64_t totalExamples() const;
  uint64_t totalEvalExamples() const;

  // Messages refused, by error code (core/input_error.h), for logs, metrics and tests.
  uint64_t refused(Errc code) const { return refused_[static_cast<size_t>(code)]; }
  uint64_t refusedTotal() const;
  // CURVE handshakes refused (logged with the peer's address), over the fleet's life.
  uint64_t refusedHandshakes() const { return refused_handshakes_; }

 private:
  struct Peer {
    std::string routing;
    ClientInfo info;
    std::chrono::steady_clock::time_point last_seen;
  };
  // A task in flight, with the sender's caps frozen when it was sent (registering again mid-task
  // cannot raise them).
  struct Pending {
    uint64_t nonce = 0;
    bool evaluate = false;
    uint64_t num_examples = 0, eval_examples = 0;
    protocol::Role role = protocol::Role::kClient;
    // Where the task went last, and the model version the peer then held: a registration from the
    // same connection at that version is a duplicate (queued during an outage), not a peer that
    // lost its task, and does not get the task (and bring its update) again.
    std::string sent_to;
    uint64_t sent_version = 0;
    // Asynchronous rounds: the version the task trains on, and when it is failed unanswered.
    uint64_t task_version = 0;
    std::chrono::steady_clock::time_point deadline{};
  };
  struct Phase;  // the state of the phase being run
  struct PhaseReset;

  void handle(const transport::Received& r);
  void handleRegister(const transport::Received& r);
  void handleUpdate(const transport::Received& r, Peer& peer, bool partial);
  void handleEvaluation(const transport::Received& r, Peer& peer);
  // Who sent `r`, for a log line: the client its key is listed as, the client registered on its
  // connection, or neither.
  std::string describePeer(const transport::Received& r) const;
  void refuse(const std::string& routing, Errc code, const std::string& what, uint64_t round = 0,
              uint64_t nonce = 0, bool registration = false);
  bool sendTask(Peer& peer, uint64_t nonce);
  void expireSilent();
  Peer* peerOf(const transport::Received& r);
  void poll(std::chrono::milliseconds timeout);

  FleetConfig config_;
  std::shared_ptr<const ParamLayout> layout_;
  std::shared_ptr<spdlog::logger> log_;
  transport::ServerSocket socket_;
  protocol::Decoder decoder_;
  uint64_t session_;
  std::unordered_map<uint64_t, Peer> clients_;
  std::unordered_map<std::string, uint64_t> by_routing_;
  std::unordered_map<uint64_t, Pending> pending_;
  // Client -> the nonces of its last few closed tasks: an answer carrying one is late, not forged
  // (a slow straggler may answer a task several rounds old).
  struct Expired {
    std::array<uint64_t, 4> nonces{};
    size_t next = 0;
    void add(uint64_t n) { nonces[next++ % nonces.size()] = n; }
    bool has(uint64_t n) const {
      return n != 0 && std::find(nonces.begin(), nonces.end(), n) != nonces.end();
    }
  };
  std::unordered_map<uint64_t, Expired> expired_;
  Phase* phase_ = nullptr;
  std::function<void()> idle_;
  const std::atomic<bool>* stop_ = nullptr;
  uint64_t refused_handshakes_ = 0;
  static constexpr size_t kRefusalLines = 10;
  static constexpr std::chrono::seconds kRefusalWindow{10};
  std::chrono::steady_clock::time_point refusal_window_{};
  size_t refusal_lines_ = 0;
  uint64_t refusals_unlisted_ = 0;
  std::array<uint64_t, static_cast<size_t>(kLastErrc) + 1> refused_{};
};

}  // namespace starling::server
