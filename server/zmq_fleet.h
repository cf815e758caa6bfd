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
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/clock.h"
#include "protocol/codec.h"
#include "server/async_engine.h"
#include "server/client_copies.h"
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
  // A mirrored downlink (q3-mirror, q2-mirror, stc-mirror): the most clients whose copy the fleet
  // keeps (server/client_copies.h; not in the root's checkpoint: after a restart each client's next
  // task carries the whole model), and stc-mirror's density (downlink.density).
  size_t downlink_copies = 1000;
  double downlink_density = 0.01;
  // The time deadlines, silence and waits are measured in (core/clock.h; a test moves it forward).
  const Clock* clock = &steadyClock();
  void validate() const;
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
  // A mirrored downlink's copies of the clients' models (null before its first task, or with
  // another downlink); read between rounds, on the fleet's thread.
  const ClientCopies* clientCopies() const { return copies_ ? &*copies_ : nullptr; }
  uint64_t session() const { return session_; }

  ClientPool waitForClients(size_t min, std::chrono::milliseconds timeout,
                            uint64_t round = 0) override;
  PhaseReport runPhase(const PhaseTask& task, std::span<const ClientInfo> participants,
                       size_t target, aggregation::PhaseAggregator& agg) override;
  EvalReport evaluate(const PhaseTask& task, const ClientPool& participants) override;
  // Secure aggregation's exchange steps (server/secure_round.h): each participant is sent its
  // request, and its answer (of that step's kind only, from it, while the step is open) goes to
  // the round; an answer the round refuses fails the client for the step, as silence or the
  // deadline (`deadline_ms`) does. The masked-input step is runPhase's, with PhaseTask::secure:
  // each client gets its shares just before its task, and only a masked input answers it (an
  // update in the clear is refused).
  // A participant that is an edge aggregator is sent, in one SecAggRelay, the requests of the
  // clients it relays that take part in the step, and answers with theirs in one SecAggRelay,
  // each handed to the round (a refused one fails that client, not the aggregator); at the
  // masked-input step it is sent their shares, then the secure task, and answers with their
  // masked inputs' ring sum (round.replyRelayed). An edge aggregator's own fleet runs the same
  // steps for its clients with its SecureRelay (server/secure_relay.h).
  PhaseReport exchange(SecureStage stage, SecureSteps& round,
                       std::span<const ClientInfo> participants, uint32_t deadline_ms) override;
  // Each aggregator is sent a SecAggRelay of stage kRoster and answers with the clients it will
  // bring; one that does not answer within `deadline_ms` is left out. A roster is refused whole
  // (kSizeMismatch, kWrongSender) beyond kMaxRoster clients, or naming a peer registered at this
  // root, a listed aggregator, or an id secure aggregation cannot take.
  std::map<uint64_t, std::vector<uint64_t>> secureRoster(std::span<const ClientInfo> aggregators,
                                                         uint64_t round, uint32_t deadline_ms,
                                                         PhaseReport& report) override;
  // The most clients an edge aggregator may bring to a secure round.
  static constexpr size_t kMaxRoster = 100'000;
  void finish(const std::string& reason) override;

  // Called on every turn of the fleet's receive loops (about every 100 ms at most), on the
  // owning thread: an aggregator heartbeats its upstream from here while a phase runs.
  void setIdleHook(std::function<void()> hook) { idle_ = std::move(hook); }
  // Called at most every `period` from the same loops, on the owning thread, with the fleet (what
  // an operator's metrics read: server::FleetMetrics).
  void setObserver(std::function<void(const ZmqFleet&)> observer,
                   std::chrono::milliseconds period = std::chrono::milliseconds(250)) {
    observer_ = std::move(observer);
    observe_every_ = period;
  }
  // Once `*stop` is true, every receive loop (waiting for clients, a phase, an evaluation,
  // service()) throws server::Stopped within about 100 ms instead of waiting out its timeout.
  void setStopFlag(const std::atomic<bool>* stop) { stop_ = stop; }

  // Asynchronous rounds (FedBuff and semi-synchronous rounds at the root): this fleet as the
  // buffered engine's AsyncFleet (server/async_engine.h), on the fleet's clock, for as long as
  // the returned object lives (it closes every task still open when it goes). start() gives a
  // task to registered, idle clients the engine may start, once at least `opt.min_available`
  // peers are registered and never more than `opt.concurrency` open; an update must come from
  // its task's version (kWrongRound otherwise). A task unanswered at its deadline, or whose
  // client went silent or registered again (it lost the task), is failed and the client may start
  // again. An edge aggregator is given tasks as a client is: it relays the task to its clients (a
  // synchronous phase of its subtree) and answers with one partial aggregate of the task's
  // version; its task is one of the concurrency's slots. next() waits at most about 100 ms per
  // turn, then takes whatever else is queued (at most 1,000 messages, so that a flood cannot
  // starve the hand-outs and a round's end) before failing anyone as silent or late: a step, its
  // checkpoint or the root's evaluation can keep the loop away longer than net.silence_ms.
  // Throws Stopped as a phase does.
  std::unique_ptr<AsyncFleet> asyncFleet(const AsyncFleetOptions& opt);

  // Serves registrations and heartbeats for `timeout` outside a phase.
  void service(std::chrono::milliseconds timeout);
  // Clients heard from within silence_ms, by id.
  std::vector<ClientInfo> available() const;
  // Peers registered (heard from or not), and tasks or steps open now (a peer's each).
  size_t registeredCount() const { return clients_.size(); }
  size_t openTasks() const { return pending_.size(); }
  // Peers heard from within silence_ms (available().size(), without the list).
  size_t onlineCount() const;
  // The sum of the registered clients' training examples (an aggregator registers this upstream).
  uint64_t totalExamples() const;
  uint64_t totalEvalExamples() const;

  // Messages refused, by error code (core/input_error.h), for logs, metrics and tests.
  uint64_t refused(Errc code) const { return refused_[static_cast<size_t>(code)]; }
  uint64_t refusedTotal() const;
  // CURVE handshakes refused (logged with the peer's address), over the fleet's life.
  uint64_t refusedHandshakes() const { return refused_handshakes_; }

  // Administration without a restart (server/admin.h). The clients the ZAP handler admits from
  // the next handshake on (ConfigError for an insecure fleet or an empty list).
  void setAllowList(std::shared_ptr<const transport::AllowList> allow);
  std::shared_ptr<const transport::AllowList> allowList() const { return socket_.allowList(); }
  // Revokes client `id` now: its registration is forgotten, its open task or step fails (an
  // answer in flight is dropped, counted in revokedInFlight()), it is told (NotRegistered,
  // kRevoked) and every later message whose key says it is `id` is refused (kRevoked; its
  // Register with RegistrationRefused, on which its client stops), and kRevokeGrace later the TCP
  // connections its messages came on are closed if it has not closed them
  // (ServerSocket::cutConnections; counted in revokedConnectionsCut()). Only under CURVE, where a
  // message's sender is known (ConfigError otherwise). False when it was revoked already. Take
  // its key off the allow-list first (setAllowList), or it handshakes again at once.
  bool revoke(uint64_t id);
  bool revoked(uint64_t id) const { return revoked_.count(id) != 0; }
  // Client `id`'s key was replaced (the owner listed the new one with setAllowList first): its
  // registration is forgotten, its open task or step fails, and its connections, the old key's,
  // are closed now, what they queued dropped unread; the new key's client registers as any. How
  // many connections were closed.
  size_t replacedKey(uint64_t id);
  std::vector<uint64_t> revokedIds() const { return {revoked_.begin(), revoked_.end()}; }
  uint64_t revokedInFlight() const { return revoked_in_flight_; }
  uint64_t revokedConnectionsCut() const { return revoked_cut_; }
  static constexpr std::chrono::seconds kRevokeGrace{1};
  bool secure() const { return socket_.secure(); }
  // From now on a wait for clients (waitForClients) ends with server::Stopped: an operator's drain
  // stops a round that has not started instead of waiting sampling.wait_ms for it. In asynchronous
  // rounds (asyncFleet) no task is handed out from then on, and once every open task was answered
  // or failed (its deadline, its client's silence) next() throws server::Stopped.
  void drainWaits() { drain_waits_ = true; }
  // Asynchronous rounds: while held, no task is handed out (an operator's pause; the open ones
  // finish and their updates are taken as ever).
  void holdTasks(bool hold) { hold_tasks_ = hold; }
  // The socket's connections as ZeroMQ reported them (accepted, refused by kind, dropped); what
  // changed is logged, at most a line a second.
  const transport::ConnectionCounts& connections() const { return socket_.connections(); }
  const transport::TransportStats& transportStats() const { return socket_.stats(); }

  // What the status page shows of each peer this fleet has heard register (at most kMaxTallies:
  // when full, the 1% of peers not registered now that were seen longest ago are forgotten, and
  // while every tracked peer is registered a new one is not tracked): registered now or forgotten
  // (silent for 10 x silence_ms, or revoked), online, holding a task, its accepted updates (or
  // partials, or masked inputs: one a phase) and its refused messages, and the last refusal's
  // code. Sorted by id.
  struct PeerView {
    uint64_t id = 0;
    bool aggregator = false;
    bool registered = false, online = false, in_round = false, revoked = false;
    double seen_seconds_ago = 0;
    uint64_t updates = 0;  // updates (or partials, masked inputs) accepted, one a phase
    uint64_t refused = 0;
    std::optional<Errc> last_refusal;
    // An edge aggregator's clients, as its last subtree heartbeat said (protocol::HeartbeatMsg;
    // shared, not copied), and how long ago that came; null for a client, or before the first.
    std::shared_ptr<const std::vector<protocol::SubtreePeer>> subtree;
    double subtree_seconds_ago = 0;
  };
  std::vector<PeerView> peers() const;
  // The clients of this fleet's peers as a subtree an edge aggregator tells upstream: at most
  // protocol::kMaxSubtree, the online ones first, then the registered, then the others, each by
  // id. An aggregator's subtree is taken at most once a second (kSubtreeEvery; one sooner is read
  // and dropped).
  std::vector<protocol::SubtreePeer> subtree() const;
  static constexpr std::chrono::seconds kSubtreeEvery{1};
  static constexpr size_t kMaxTallies = 100'000;
  // The phase running now, for the status page: what it is ("idle" between phases, "fit",
  // "evaluate", "secure" for a secure aggregation step, "async" while buffered rounds run), the
  // round and phase, tasks sent and answers accepted and wanted, and the seconds to its deadline.
  struct Progress {
    const char* step = "idle";
    uint64_t round = 0;
    uint32_t phase = 0;
    size_t sent = 0, accepted = 0, target = 0, open = 0;
    double seconds_left = 0;
  };
  Progress progress() const;
  // The phases run (not asynchronous rounds'), each with its wall time, numbered from 1: the last
  // kPhaseTimesKept (an observer reads those after the last number it saw).
  struct PhaseTime {
    uint64_t seq = 0;
    const char* step = "fit";  // fit, evaluate, secure, roster
    double seconds = 0;
  };
  const std::deque<PhaseTime>& phaseTimes() const { return phase_times_; }
  static constexpr size_t kPhaseTimesKept = 1000;

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
  class Async;  // asyncFleet()

  void handle(const transport::Received& r);
  void handleRegister(const transport::Received& r);
  void handleUpdate(const transport::Received& r, Peer& peer, bool partial);
  void handleSecure(const transport::Received& r, Peer& peer, protocol::MessageKind kind);
  void handleRelay(const transport::Received& r, Peer& peer);
  // Sends `peer` its message of `stage`: an edge aggregator that relays clients of the round the
  // requests of those in the step (relayRequest), a client its request; false (nothing sent) when
  // it has none or the send failed. Adds the bytes sent to `bytes`.
  bool sendStep(Peer& peer, SecureSteps& round, SecureStage stage, uint32_t deadline_ms,
                uint64_t& bytes);
  void handleEvaluation(const transport::Received& r, Peer& peer);
  // A peer's Reject: it refuses the task or secure step it was sent (client/runtime.h: a floor of
  // its own, a round it will not take part in, a step of a round it has no side of after a
  // restart). The open task or step fails at once, logged with the peer's code, instead of at its
  // deadline; a Reject with nothing open for it (late, or another round's) is dropped. Never
  // answered (a Reject is not refused with a Reject).
  void handleDecline(const transport::Received& r, Peer& peer);
  // Who sent `r`, for a log line: the client its key is listed as, the client registered on its
  // connection, or neither.
  std::string describePeer(const transport::Received& r) const;
  void refuse(const std::string& routing, Errc code, const std::string& what, uint64_t round = 0,
              uint64_t nonce = 0, bool registration = false);
  bool sendTask(Peer& peer, uint64_t nonce);
  void expireSilent();
  // Fails the open task or step `it` (of pending_): its nonce expired (a late answer is refused),
  // the peer in the phase's report and, in asynchronous rounds, told to the engine. Returns the
  // next pending entry.
  std::unordered_map<uint64_t, Pending>::iterator failPending(
      std::unordered_map<uint64_t, Pending>::iterator it);
  Peer* peerOf(const transport::Received& r);
  void poll(std::chrono::milliseconds timeout);
  // At a step's deadline, what is already queued for it (at most 1,000 messages, until `target`
  // answers were accepted): an answer that arrived in time counts, however late the loop came
  // round to it. No task is sent again from then on (a registration then does not get it).
  void takeQueued(size_t target = SIZE_MAX);
  // A task or step sent to `p` now, with `nonce` (its caps frozen).
  Pending pendingOf(const Peer& p, uint64_t nonce, bool evaluate = false) const;
  // A secure step's wait: until every pending peer answered or `deadline_ms` passed (then what is
  // queued is taken); each peer still pending fails the step in `report` (its refusals counted
  // there too), and is named to `missed`.
  void awaitAnswers(uint32_t deadline_ms, PhaseReport& report,
                    const std::function<void(uint64_t)>& missed);

  FleetConfig config_;
  std::shared_ptr<const ParamLayout> layout_;
  std::optional<ClientCopies> copies_;  // a mirrored downlink's, made with its first task
  std::shared_ptr<spdlog::logger> log_;
  transport::ServerSocket socket_;
  protocol::Decoder decoder_;
  uint64_t session_;
  std::unordered_map<uint64_t, Peer> clients_;
  std::unordered_map<std::string, uint64_t> by_routing_;
  std::unordered_map<uint64_t, Pending> pending_;
  // Client -> the nonces of its last few closed tasks: an answer carrying one is late, not forged
  // (a slow straggler may answer a task several rounds old), or a duplicate when the task closed
  // because it was answered (its phase may still be open).
  struct Expired {
    std::array<uint64_t, 4> nonces{};
    std::array<bool, 4> answered{};
    size_t next = 0;
    void add(uint64_t n, bool was_answered = false) {
      answered[next % nonces.size()] = was_answered;
      nonces[next++ % nonces.size()] = n;
    }
    bool has(uint64_t n) const {
      return n != 0 && std::find(nonces.begin(), nonces.end(), n) != nonces.end();
    }
    bool answeredWith(uint64_t n) const {
      for (size_t i = 0; i < nonces.size(); ++i)
        if (n != 0 && nonces[i] == n && answered[i]) return true;
      return false;
    }
  };
  // Closes `id`'s task of `nonce` because it was answered (a second answer is a duplicate).
  void closeAnswered(uint64_t id, uint64_t nonce) { expired_[id].add(nonce, true); }
  std::unordered_map<uint64_t, Expired> expired_;
  std::set<uint64_t> revoked_;
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> revoked_said_;
  uint64_t revoked_in_flight_ = 0, revoked_cut_ = 0;
  // Revoked clients whose connections are closed at that time (kRevokeGrace after), in poll().
  std::map<uint64_t, std::chrono::steady_clock::time_point> cut_due_;
  void cutRevoked();
  bool drain_waits_ = false, hold_tasks_ = false;
  Phase* phase_ = nullptr;
  std::function<void()> idle_;
  std::function<void(const ZmqFleet&)> observer_;
  std::chrono::milliseconds observe_every_{250};
  std::chrono::steady_clock::time_point observed_{};
  const std::atomic<bool>* stop_ = nullptr;
  uint64_t refused_handshakes_ = 0;
  static constexpr size_t kRefusalLines = 10;
  static constexpr std::chrono::seconds kRefusalWindow{10};
  std::chrono::steady_clock::time_point refusal_window_{};
  size_t refusal_lines_ = 0;
  uint64_t refusals_unlisted_ = 0;
  // Connection events logged so far, and when last.
  transport::ConnectionCounts connections_logged_;
  std::chrono::steady_clock::time_point connections_log_{};
  void logConnections();
  std::array<uint64_t, static_cast<size_t>(kLastErrc) + 1> refused_{};
  // Per peer, what peers() shows; bounded by kMaxTallies (the peer seen longest ago goes).
  struct Tally {
    bool aggregator = false;
    std::chrono::steady_clock::time_point last_seen{};
    uint64_t updates = 0, refused = 0;
    std::optional<Errc> last_refusal;
    std::shared_ptr<const std::vector<protocol::SubtreePeer>> subtree;  // an aggregator's
    std::chrono::steady_clock::time_point subtree_at{};
  };
  Tally& tally(uint64_t id);
  // Client `id`'s open task or step fails now (true when it had one) and its registration is
  // forgotten; `tell`, when not empty, is sent to it first (revoke, replacedKey).
  bool forget(uint64_t id, const std::vector<uint8_t>& tell = {});
  std::unordered_map<uint64_t, Tally> tallies_;
  Tally untracked_;  // a peer's while every tracked one is registered (kMaxTallies)
  std::deque<PhaseTime> phase_times_;
  uint64_t phase_seq_ = 0;
};

}  // namespace starling::server
