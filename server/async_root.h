#pragma once
// The root's asynchronous rounds (FedBuff over the network). The same server step as the
// simulator's (server::AsyncServer: the staleness-weighted buffer, the optimizer, the model's
// versions) and the same loop (server::AsyncEngine, server/async_engine.h), here over the ZeroMQ
// fleet's asynchronous rounds (ZmqFleet::asyncFleet): up to C clients train at once, each on the
// version current when its task left; every accepted update goes into the buffer, and every K a
// step makes the next version. What this class adds is the root's durability (below).
//
//   engine: idle client -> task of version v -> update from v -> the server adds it -> journal;
//   after K: step -> (evaluation) -> checkpoint, new journal -> metrics line -> tasks of v + 1
//
// Crash safety: with state.checkpoint every accepted update is appended, as it arrived, to the
// journal (CHECKPOINT.journal) and fsynced before the next message is handled, and the whole
// server (model, version, optimizer, the buffer with its sums and the senders seen per version) is
// written atomically at every step, a new journal after it. The server's refusals go to the
// journal too, fsynced as updates are, so that a resumed step counts them in updates_rejected. A
// root killed with SIGKILL and restarted with the same command loads the checkpoint and adds the
// journal's records again: it resumes with every update it had accepted; an update that arrived
// while it was being killed, before its record was written, is lost with the tasks in flight, and
// their clients, registering with the new root, are given new tasks on the current version (one
// accepted update per client and version, the restored buffer's, still holds).
//
// Semi-synchronous rounds (round_ms > 0), as the simulator's (simulator/async_sim.h): rounds of
// round_ms on the fleet's clock. At a round's start the idle clients top the tasks open up to C;
// at its end the server steps with whatever was accepted (K does not apply; a round where nothing
// was accepted is recorded as not applied), and a client still training goes on: its update joins
// a later round, weighted by its staleness, instead of being dropped as a synchronous round's
// straggler is. A round's clock starts at the previous step, or, when nothing was open or
// buffered then, with the first task that goes out (a root waiting for clients takes no empty
// steps); its length includes the step.
//
// Evaluation: the clients are busy training, so the root evaluates the model itself, every
// eval_every steps, with `evaluate` (starling-server passes its trainer on data.test), before the
// step's checkpoint (a kill during it loses nothing: the journal's updates make the step again);
// the record's test_loss and test_accuracy carry it. Federated evaluation (the clients' shares)
// runs in synchronous rounds only.
//
// Edge aggregators: a task to an aggregator is one of C; it relays the task to its clients as a
// synchronous phase of its subtree and answers with one partial aggregate of the task's version,
// which enters the buffer as its updates would (each weighted by the version's staleness) and
// counts their number toward K (a step may then hold more than K). With fresh partials of K
// updates each, the root's model equals what the same updates sent to the root directly make, up
// to float rounding; docs/protocol.md says where it differs, and what the root trusts an
// aggregator with.
//
// SCAFFOLD is refused where it is configured (apps::checkRoundMode says why).
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "server/async_engine.h"
#include "server/async_server.h"
#include "server/zmq_fleet.h"

namespace starling::server {

struct AsyncRootConfig {
  uint64_t steps = 10;  // server steps to take (train.rounds)
  AsyncFleetOptions fleet;
  uint32_t round_ms = 0;  // > 0: semi-synchronous rounds of this length (round.deadline_ms)
  // Edge aggregators may register (security.aggregator_ids): one partial brings many updates,
  // so FedBuff's K needs no K peers (fleet.min_available is not held against it).
  bool aggregators = false;
  // After each applied step whose number (skipped rounds counted) is a multiple of eval_every
  // (0: never), before the step's checkpoint: the broadcast model's test loss and accuracy, or
  // nothing (an evaluation that failed, which `evaluate` reports itself).
  uint32_t eval_every = 0;
  std::function<std::optional<std::pair<double, double>>(std::span<const float> model)> evaluate;
  protocol::FitSettings fit;
  std::string checkpoint;  // file; empty: none (a crash loses the run)
  std::string metrics;     // JSON Lines, one record per step; empty: none
  void validate() const;   // ConfigError naming the key
};

class AsyncRoot final : private AsyncDurability {
 public:
  // Resumes from config.checkpoint when the file exists (IoError if it is unreadable, corrupt, or
  // of another configuration: never silently replaced by a fresh start), and from its journal;
  // a fresh start writes the checkpoint at once (a journal left without one is an IoError).
  AsyncRoot(std::shared_ptr<const ParamLayout> layout, AsyncServerConfig server,
            AsyncRootConfig config, std::vector<float> initial);
  ~AsyncRoot() override;

  bool resumed() const { return resumed_; }
  // Of the resume: the updates and partials taken again from the journal, and the bytes of a
  // record the kill cut short (dropped).
  uint64_t replayed() const { return replayed_; }
  // Of the resume: the server's refusals since the checkpoint, counted again from the journal.
  uint64_t refusalsReplayed() const { return refusals_replayed_; }
  uint64_t tornBytes() const { return torn_bytes_; }
  const AsyncServer& server() const { return server_; }
  const AsyncRootConfig& config() const { return config_; }
  bool done() const { return server_.steps() >= config_.steps; }

  // The buffered engine (server/async_engine.h) over the fleet's asynchronous rounds
  // (ZmqFleet::asyncFleet) until done(), calling `progress` after each step and `accepted` after
  // each accepted update (both once it is durable); then fleet.finish(). Stopped (SIGTERM) passes
  // through with everything accepted checkpointed.
  void run(ZmqFleet& fleet, const std::function<void(const RoundRecord&)>& progress = {},
           const std::function<void()>& accepted = {});
  // The same over any AsyncFleet (a test's scripted one), without finish().
  void run(AsyncFleet& clients, const std::function<void(const RoundRecord&)>& progress = {},
           const std::function<void()>& accepted = {});

 private:
  struct Journal;
  // AsyncDurability: every accepted update, and every refusal, into the journal (fsynced); at
  // every step the whole server, then a new journal.
  void taken(const AsyncArrival& a) override;
  void refused(const AsyncArrival& a) override;
  void stepped(const RoundRecord& rec) override;
  void checkpoint();
  void replayJournal();

  AsyncRootConfig config_;
  AsyncServer server_;
  bool resumed_ = false;
  std::unique_ptr<Journal> journal_;
  uint64_t replayed_ = 0, refusals_replayed_ = 0, torn_bytes_ = 0;
};

}  // namespace starling::server
