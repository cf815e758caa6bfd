#pragma once
// Buffered asynchronous federated learning (FedBuff) on the simulated clock: at most C
// clients train at once, each on the model version it downloaded, and the server
// (server/async_server.h) steps every K accepted updates, weighting each by its staleness. The
// concurrency is simulated, not serialized: every client's duration comes from the device model
// (simulator/device_model.h: its speed and bandwidth, the exact bytes of its task and its update),
// and events are taken in the order of their simulated finish. The loop (when to start, when to
// step, the step's record, evaluation, the metrics line) is the buffered engine's, written once
// for the root and this simulation (server/async_engine.h); this class is its fleet on the event
// clock (start: the picker below; next: the first finish) and its durability (the checkpoint).
//
//   t = 0: C clients start on version 1
//   each finish, in simulated time: its update goes to the server (refused beyond the staleness
//   bound), K accepted -> a server step (a metrics record), and one idle client starts on the
//   version now current, so C stay in flight
//
// Which client starts is a pure function of the seed: uniformly among the idle clients with data
// that have not trained on the current version yet (a second update from a version would be a
// duplicate) and are available: online now by the devices' windows of time (FedScale's behaviour
// traces, device_model.h), or else by their availability probability drawn per model version. With
// windows, a client that comes online while fewer than C train starts then, and one offline at its
// finish is a dropout: it does not train, its state stays as it was, it counts as failed when it
// would have finished, and it may try again on the version if one of its windows is long enough.
// Its finish is known at its start from phaseZeroUpdateBytes, except when the compressor's update
// sizes vary (Compressor::updateSizeVaries: STC, random-block with per-client offsets): such a
// client is judged once trained, by its own bytes, and drops out then if it is offline by its
// finish (trained, its update and new state discarded). In both asynchronous modes.
// None may qualify: fewer than C train until the version moves on, and when no client is in flight
// and none can start, the server cannot reach K and run() throws Error saying why (diverging
// clients, refused updates, availability). A client trains on the one model replica, by the time
// its finish is needed (see "Several workers" below: at the latest at the next step), and its
// update waits, compressed, for its simulated finish: memory holds C updates
// (error feedback's residuals are in the client-state store, as in the synchronous simulator; a
// residual is kept when the server then refuses the update as too stale, as a deployed client's
// would be).
//
// Semi-synchronous rounds (round_seconds > 0), the middle ground: rounds of a fixed simulated
// length; at a round's start idle clients top the ones in flight up to C, at its deadline the
// server steps with whatever arrived (K does not apply; a round where nothing arrived is recorded
// as not applied), and a client still training goes on: its update joins a later round, weighted
// by its staleness (refused beyond the bound), instead of being dropped as a synchronous round's
// straggler is.
//
// Downlinks: the server's encoding (server::AsyncServerConfig::downlink): a client that holds an
// older version gets a delta against it, or with the lossy top-k downlink the broadcast model's
// refreshed coordinates, which it trains from, as in synchronous rounds (server/model_store.h).
//
// Checkpoints (config.checkpoint): after every step, one file with the server (model, version,
// optimizer, buffer), the clients in flight with their finish times and compressed updates, the
// picker's random stream, the clock and the step's record, written in two phases around the
// client-state store's flush, which records the step (CHECKPOINT.next, the flush, the rename): a
// run killed anywhere resumes from a checkpoint and states of one step, and a pair that does not
// match is refused. A run started again with the same configuration (train.rounds may grow)
// resumes from it and takes the steps the uninterrupted run would have taken: the same models bit
// for bit, the same bytes too with dense, fp16, q8, q4, q3, q2 and stc (their refreshes are in the
// file, ModelStore::saveRefreshes). The delta and top-k downlinks' histories are whole models and
// are not kept: after a resume a client holding an older version gets the whole model once, as a
// restarted root's clients do, so those tasks cost more bytes.
//
// Several workers (config.workers, sim.workers): every worker runs this same event loop on the same
// state (the server, the clock, the picker, the clients in flight), and only the training is
// shared out. A client's finish depends on its update's size (STC's, a failed client's), so a
// started client waits, untrained, until its finish is needed: until a step (it trains on the
// version it started on) or until the earliest arrival might be its (the earliest it can finish,
// with an empty update, is not after the first known finish). Then every waiting client trains at
// once, each on one worker (the largest shards first, each to the least loaded worker), and every
// worker receives every update (allGatherBytes): the server adds them in the order of their
// finish on every worker, as one worker does alone. The client states stay in the first worker's
// store: it sends each state to the worker that trains it and takes the new state back; only the
// first worker checkpoints, evaluates, writes metrics and reports progress. So a run is the
// one-worker run of the same seed, the same updates added in the same order, bit for bit when the
// trainer's arithmetic does not depend on its thread count, and it resumes with any number of
// workers.
//
// SCAFFOLD is refused where it is configured (apps::checkRoundMode says why).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "client/algorithm.h"
#include "client/trainer.h"
#include "compression/payload.h"
#include "core/rng.h"
#include "server/async_engine.h"
#include "server/async_server.h"
#include "simulator/collectives.h"
#include "simulator/sim_fleet.h"
#include "simulator/state_store.h"

namespace starling::simulator {

struct AsyncSimConfig {
  uint64_t steps = 50;        // server steps to run (train.rounds)
  uint64_t concurrency = 10;  // C: clients training at once (at most those with data)
  // > 0: semi-synchronous rounds of this many simulated seconds instead of FedBuff's steps.
  double round_seconds = 0.0;
  double reference_seconds_per_example = 1e-3;
  uint64_t seed = 1;
  protocol::FitSettings fit;
  uint32_t eval_every = 0;   // steps between evaluations on the test set (0: never)
  std::string metrics_file;  // JSON Lines, one record per step (appended); empty: none
  // Written after every step, resumed from when it exists (the store must then be the one
  // flushed with it: StateStoreOptions::resume); empty: none.
  std::string checkpoint;
  // The round on the device for the clients (torch_trainer/device_round.h); null: the host. Must
  // outlive the simulation.
  client::DeviceUpdate* device_update = nullptr;
  // The workers sharing the training (see above); null or a group of one: this process alone. Must
  // outlive the simulation; every worker constructs and runs its simulation with the same
  // configuration, and only the first one's store holds states.
  Collectives* workers = nullptr;
  // A mirrored downlink (q3-mirror, q2-mirror, stc-mirror; the server's AsyncServerConfig::downlink
  // and, for stc-mirror, its density): the most
  // clients whose copy is kept (a client past it gets the whole model next time). Every worker
  // keeps them all, and the checkpoint holds them.
  size_t downlink_copies = 1000;
  void validate() const;  // ConfigError naming the key
};

class AsyncSimulation final : private server::AsyncFleet, private server::AsyncDurability {
 public:
  // Everything referenced must outlive the simulation. `test` may be null (no evaluation).
  // ConfigError for a bad configuration, or fewer clients with data than the server's K. With
  // config.checkpoint on an existing file, resumes from it: IoError naming the file when it is
  // unreadable, corrupt, or of another configuration (the key named), never a silent fresh start.
  AsyncSimulation(AsyncSimConfig config, const SimClients& clients, client::Trainer& trainer,
                  ClientStateStore& store, server::AsyncServer& server, const data::Dataset* test);

  // Runs until config.steps server steps were taken, calling `progress` (on the first worker) with
  // each step's record:
  // sim_seconds is the simulated time since the previous step, uplink_bytes the updates that
  // arrived in it (refused ones too), downlink_bytes the tasks of the clients started in it,
  // clients_selected those clients, clients_failed the arrivals without an update (training
  // diverged, the state did not read back), and makespan_seconds the wall time spent training
  // the clients started in it. Error when the server cannot reach K (above).
  void run(const std::function<void(const server::RoundRecord&)>& progress = {});

  double now() const override { return now_; }  // simulated seconds since the start
  bool resumed() const { return resumed_; }
  uint64_t clientsTrained() const { return trained_; }
  // Per client id: its updates the server accepted so far.
  const std::vector<uint64_t>& accepted() const { return accepted_; }

 private:
  struct InFlight {
    uint64_t version = 0, examples = 0, down = 0, up = 0;
    std::optional<compression::Update> update;  // none: the client failed
  };
  struct Waiting {  // started, not trained yet (see "Several workers" above)
    uint64_t id = 0, held_before = 0;
    uint64_t previous = 0;               // the version it last started on before this one
    uint64_t timed_up = 0;               // a dropout's update bytes, which time its failure
    double start = 0.0, earliest = 0.0;  // its start, and its finish with an empty update
    InFlight job;
    std::vector<float> model;  // a mirrored downlink's: its copy as its task left it
  };
  struct Window {  // what happened since the last step (the engine counts the rest)
    double train_seconds = 0.0;
  };
  // server::AsyncFleet, on the event clock (see above), and server::AsyncDurability: the
  // checkpoint.
  size_t open() const override { return flying(); }
  size_t start(size_t n, server::AsyncIntake& in) override;
  server::AsyncEvent next(double until, server::AsyncIntake& in) override;
  bool canProgress() const override;
  void beforeStep() override { trainWaiting(); }  // on the version they started on
  void record(server::RoundRecord& rec) override;
  void stepped(const server::RoundRecord& rec) override;

  bool online(uint64_t client) const;
  double nextStart() const;
  // Starts idle clients until C are in flight (or none is idle and available); how many.
  size_t fill(server::AsyncIntake& in);
  void startClient(uint64_t client, server::AsyncIntake& in);
  bool lead() const { return !config_.workers || config_.workers->rank() == 0; }
  size_t flying() const { return in_flight_.size() + waiting_.size(); }
  // The first finish of the clients in flight (infinity: none), after training the waiting ones
  // when one of them might come first.
  double settleFirstArrival();
  void trainWaiting();  // every waiting client, on the workers, into in_flight_
  void trainShared();   // trainWaiting() on several workers, with the four below
  std::vector<size_t> placeWaiting(size_t world) const;  // each waiting client's worker
  std::vector<uint8_t> statesToShip(const std::vector<size_t>& owner);
  std::vector<uint8_t> trainMine(const std::vector<size_t>& owner, size_t me,
                                 std::span<const uint8_t> states);
  void takeUpdates(const std::vector<size_t>& owner, const std::vector<std::vector<uint8_t>>& got);
  bool loadState(uint64_t id, ClientState& out);  // false: it does not read back (a failure)
  bool train(Waiting& w, ClientState& state);     // true: an update (job.update, job.up)
  bool trainAndKeep(Waiting& w, ClientState& state, bool keep);
  void arrive(Waiting& w);  // into in_flight_ at its finish
  // Whether a trained client is offline by its finish with its own update's bytes, which its start
  // could not know (the compressor's sizes vary: STC's, random-block's per-client offsets): a pure
  // function of the shared state, the same on every worker. dropOut() makes it a dropout.
  bool finishesOffline(const Waiting& w) const;
  void dropOut(Waiting& w);
  void deliver(server::AsyncIntake& in);
  void resume();
  // The first worker's part of resume(): the checkpoint's bytes (none: start over), its step
  // checked against the store's. IoError when it cannot resume.
  std::vector<uint8_t> settledCheckpoint();
  // A reader of the checkpoint's fields after its frame (checked): a view into `bytes`, which
  // must outlive it.
  static ByteReader checkpointFields(std::span<const uint8_t> bytes, const std::string& what);
  // The checkpoint's fields, framed by stepped().
  std::vector<uint8_t> checkpointBytes(const std::string& record) const;
  void loadCheckpoint(std::span<const uint8_t> bytes);
  void completeMetrics(uint64_t step, const std::string& record) const;
  uint64_t taskBytes(uint64_t held, const server::PhaseTask& task);
  uint64_t updateBytes(uint64_t id);
  double timeOf(const Waiting& w, uint64_t up) const;
  void mayRetry(const Waiting& w, double total);
  std::optional<std::pair<double, double>> evaluate(std::span<const float> model);

  AsyncSimConfig config_;
  const SimClients& clients_;
  client::Trainer& trainer_;
  ClientStateStore& store_;
  server::AsyncServer& server_;
  const data::Dataset* test_;
  client::ClientAlgorithm algorithm_;
  RngStream picker_;
  std::map<std::pair<double, uint64_t>, InFlight> in_flight_;  // by (finish, client)
  std::vector<Waiting> waiting_;                               // in the order they started
  std::vector<char> busy_;
  std::vector<uint64_t> last_version_;  // the version each client last started on (0: none)
  std::vector<uint64_t> held_;          // the version each client last downloaded (0: none)
  server::ModelStore::WholeModelCache
      whole_;  // a quantised downlink's whole model, decoded (what a client trains from)
  std::vector<uint64_t> accepted_;
  ClientState state_;          // reused for every client
  std::vector<size_t> shard_;  // a drawn client's shard, reused for every client
  std::vector<std::string> declared_;
  std::map<uint64_t, uint64_t> task_bytes_;     // of the current version, per version held
  std::optional<server::ClientCopies> copies_;  // a mirrored downlink's (AsyncSimConfig)
  uint64_t task_version_ = 0;
  uint64_t update_bytes_[2] = {0, 0};  // client 0's, every other client's
  double now_ = 0.0, last_step_ = 0.0;
  uint64_t trained_ = 0;
  Window window_;
  bool resumed_ = false;
  uint64_t clients_fingerprint_ = 0;  // of the data split, for the checkpoint (computed once)
};

}  // namespace starling::simulator
