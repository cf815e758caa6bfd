#pragma once
// The buffered round engine: FedBuff's steps and semi-synchronous rounds, written once for the
// root (server/async_root.h, over ZmqFleet's asynchronous fleet) and for the simulator
// (simulator/async_sim.h, on the event clock). Beside it, RoundEngine (server/engine.h) drives
// synchronous rounds over the phase seam (Fleet::runPhase). The server's state (the model, its
// versions, the staleness-weighted buffer, the optimizer) is AsyncServer's; this engine holds
// the loop around it and the run's record:
//
//   FedBuff (round_seconds = 0):
//     fleet.start(C - open) -> fleet.next(): an arrival (or a failure) taken -> after K accepted:
//     step -> what else is due at this instant -> start again ...
//   semi-synchronous (round_seconds > 0):
//     at the round's start fleet.start(C - open) -> fleet.next(deadline) until the deadline
//     -> step with whatever was accepted (a round with none: recorded, not applied) -> ...
//
// The fleet seam (AsyncFleet) is three questions: start tasks, take the next arrival or failure,
// and the time on the fleet's clock. The root's is the wall clock (ZmqFleet::asyncFleet), the
// simulator's its event clock. Each step's record (server::RoundRecord: tasks started, their
// bytes, the updates' bytes, failures) is filled here, the fleet adds its own figures (a
// simulated clock's), the server's own evaluation runs when due (every eval_every steps), and the
// run recorder (server/run_recorder.h, the synchronous engine's too) closes it: its wall time,
// durability (the root's checkpoint and journal, the simulation's checkpoint), the metrics line
// and `progress`, in that order; evaluation, durability, the line and progress on the lead worker
// only (the simulator's first; a root is one).
//
// SCAFFOLD is refused where it is configured (apps::checkRoundMode says why: a buffered step
// mixes model versions).
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "server/async_server.h"

namespace starling::server {

// An answer to a task: a client's update or an edge aggregator's partial aggregate (exactly one
// is set), valid for the duration of AsyncIntake::take().
struct AsyncArrival {
  uint64_t client = 0;  // the sender (the fleet checked an update names it)
  const compression::UpdateView* update = nullptr;
  const compression::PartialView* partial = nullptr;
  aggregation::ClientLimits limits;  // the sender's registered examples (the weight's cap)
  std::span<const uint8_t> message;  // the bytes as received (a root journals them); may be empty
  uint64_t bytes = 0;                // what it cost on the uplink
};

// The engine, as a fleet sees it (called on the fleet's thread, from start() and next()).
class AsyncIntake {
 public:
  virtual ~AsyncIntake() = default;
  // The current version's fit task (phase 0; header.round = header.model_version = the version).
  // Its address stays the same for the engine's life; its contents change with the version.
  virtual const PhaseTask& task() const = 0;
  virtual uint64_t steps() const = 0;  // steps taken (applied or not), for a fleet's bookkeeping
  // Whether `client` may start a task on the current version (one accepted update per version).
  virtual bool mayStart(uint64_t client) const = 0;
  virtual void started(uint64_t bytes) = 0;  // a task went out, `bytes` on the downlink
  // An answer to a task: the server adds it, or refuses it with InputError, or InvalidArgument
  // for what the buffer cannot take at all (nothing changed; counted as refused, not as failed;
  // the fleet answers its sender). An IoError (a journal that cannot be written) ends the run.
  virtual void take(const AsyncArrival& a) = 0;
  // A task ended without an answer that reached the server: it expired, its client went silent
  // or registered again, the fleet refused the answer (another version's, a partial over its
  // weight), or (simulated) the training failed.
  virtual void failed(uint64_t client) = 0;
};

enum class AsyncEvent {
  kNothing,  // nothing was taken: time moved on (to `until`, or a fleet's turn ended)
  kTaken,    // an arrival or a failure was taken (the engine may step, then start tasks)
  kStalled,  // nothing is in flight, and no client can ever start on this version
};

// The seam between the buffered engine and whatever reaches the clients.
class AsyncFleet {
 public:
  static constexpr double kNever = std::numeric_limits<double>::infinity();
  virtual ~AsyncFleet() = default;
  virtual double now() const = 0;   // seconds on the fleet's clock
  virtual size_t open() const = 0;  // tasks in flight
  // Starts tasks of in.task() on up to `n` clients that in.mayStart() (the fleet picks which,
  // and may start none now: too few registered, or asked again too soon); returns how many.
  virtual size_t start(size_t n, AsyncIntake& in) = 0;
  // Takes what comes until one arrival or failure was taken (kTaken), `until` passed, or the
  // fleet's turn ended (kNothing), or nothing can ever come (kStalled; a simulated fleet's, with
  // until = kNever). With until <= now(): only what is due now, without waiting. A kNothing for a
  // later `until` must have moved now() on (or waited a turn), or the engine spins.
  virtual AsyncEvent next(double until, AsyncIntake& in) = 0;
  // Whether anything can still come at this version: a task in flight, or a client that may
  // start later. A real fleet always can (clients may register).
  virtual bool canProgress() const { return true; }
  // Before a step: a simulated fleet trains the clients it holds untrained, on the version they
  // started on (simulator/async_sim.h).
  virtual void beforeStep() {}
  // The step's record, on every worker: the fleet adds its own figures (a simulated clock's
  // sim_seconds and makespan_seconds).
  virtual void record(RoundRecord& /*rec*/) {}
};

// What makes a step durable, on the lead worker: the root's checkpoint and journal, the
// simulation's checkpoint. The engine calls it after the server took an arrival or refused it,
// and after every step (before the metrics line).
class AsyncDurability {
 public:
  virtual ~AsyncDurability() = default;
  virtual void taken(const AsyncArrival& /*a*/) {}
  virtual void refused(const AsyncArrival& /*a*/) {}
  virtual void stepped(const RoundRecord& rec) = 0;
};

struct AsyncEngineConfig {
  uint64_t steps = 10;      // server steps to take (train.rounds)
  size_t concurrency = 10;  // C: tasks open at once
  // > 0: semi-synchronous rounds of this many seconds on the fleet's clock; 0: FedBuff.
  double round_seconds = 0.0;
  // Semi-synchronous: a round with nothing open and nothing buffered waits for its first task to
  // start its clock (a root waiting for clients takes no empty steps); false: every round starts
  // at the previous step (the simulator's, whose clock only the events move).
  bool wait_for_first_task = false;
  protocol::FitSettings fit;
  uint32_t task_deadline_ms = 0;  // in the task header (0: none, the simulator's)
  // Every eval_every steps (0: never), on the lead: the model's test loss and accuracy, or
  // nothing (an evaluation that failed, which `evaluate` reports itself).
  uint32_t eval_every = 0;
  bool eval_applied_only = false;  // not after a step that was not applied (the root's)
  std::function<std::optional<std::pair<double, double>>(std::span<const float> model)> evaluate;
  std::string metrics;  // JSON Lines, one record per step (appended); empty: none
  bool lead = true;     // the worker that evaluates, makes steps durable, writes and reports
};

class AsyncEngine final : private AsyncIntake {
 public:
  // `server` and `durability` (may be null) must outlive the engine.
  AsyncEngine(AsyncServer& server, AsyncEngineConfig config, AsyncDurability* durability);

  bool done() const { return server_.steps() >= config_.steps; }
  const AsyncEngineConfig& config() const { return config_; }

  // Steps until done(), calling `progress` (on the lead) after each step and `accepted` after
  // each arrival the server took (once durable, and after the step it completed). Throws Error
  // when the fleet stalls (kStalled: the server can never step), and what the fleet throws
  // (server::Stopped), with every accepted arrival made durable.
  void run(AsyncFleet& fleet, const std::function<void(const RoundRecord&)>& progress = {},
           const std::function<void()>& accepted = {});

 private:
  // What happened since the last step.
  struct Window {
    uint64_t started = 0, downlink = 0, taken = 0, accepted = 0, refused = 0, failed = 0,
             uplink = 0;
  };

  // AsyncIntake
  const PhaseTask& task() const override { return *task_; }
  uint64_t steps() const override { return server_.steps(); }
  bool mayStart(uint64_t client) const override;
  void started(uint64_t bytes) override;
  void take(const AsyncArrival& a) override;
  void failed(uint64_t client) override;

  void runBuffered(AsyncFleet& fleet);
  void runRounds(AsyncFleet& fleet);
  size_t top(AsyncFleet& fleet);  // starts tasks up to C open
  // After an arrival or a failure: FedBuff's step when K are buffered; `accepted`.
  void afterTaken(AsyncFleet& fleet);
  void drainNow(AsyncFleet& fleet);  // every arrival due now, stepping as they fill the buffer
  void step(AsyncFleet& fleet);
  void refreshTask();
  [[noreturn]] void stalled() const;

  AsyncServer& server_;
  AsyncEngineConfig config_;
  AsyncDurability* durability_;
  RunRecorder recorder_;  // each step's record closed: durable, its line, progress
  compression::PhaseBroadcast broadcast_;
  std::optional<PhaseTask> task_;
  Window window_;
  bool accepted_pending_ = false;
  std::function<void()> accepted_;
};

}  // namespace starling::server
