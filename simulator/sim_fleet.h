#pragma once
// The simulator's Fleet (server/engine.h): many simulated clients trained one after another on
// this worker's one model replica, in the style of FedML Parrot. Every worker process runs the
// same RoundEngine with its own SimFleet; the engine samples the same clients on every worker
// (sampling is a function of the seed and the round), and for each phase the fleet:
//
//   1. times every sampled client on the simulated clock (device speed and bandwidth, the exact
//      wire sizes of its task and update) and accepts the fastest `target` within the deadline
//      (over-commitment and stragglers, FedScale's semantics); stragglers do not train. When the
//      update's size varies from client to client (Compressor::updateSizeVaries: STC, random-block
//      with per-client offsets), every sampled client trains first (steps 2 and 3), the workers
//      share the sizes and the clock accepts by them; when the clock may turn a client away, each
//      update waits with its state and only the accepted ones are added and their states kept (a
//      straggler's training is spent, its state as it was);
//   2. assigns the accepted clients to workers, longest job first by a cost model every worker
//      holds identically (scheduler.h), and keeps that assignment for the round's later phases
//      (a client stays on one worker: its PowerSGD phase Q needs its phase-P state); a client's
//      state lives in the store of the worker that trained it last, and moves to its new worker
//      (one all-reduce of the serialized states) when the scheduler assigns it elsewhere;
//   3. trains its own share one client after another with the shared client algorithm (state from
//      the bounded client-state store), adding each compressed update straight into the phase's
//      partial aggregate (local aggregation);
//   4. all-reduces the aggregate's one flat buffer, so that every worker holds the whole phase
//      (global aggregation), and all-reduces its counters (who completed, bytes, seconds) so that
//      every worker reports the same. With the sharded step, the round's last phase instead
//      all-reduces the buffer's small head and reduce-scatters its dense sum: each worker holds
//      its shard of the sum (zeros elsewhere), the engine steps the server optimizer on that shard
//      only, and gatherModel() all-gathers the new model (DeAR's decoupling).
//
// Afterwards the engine's nextPhase()/finish() are pure functions of that buffer: every worker
// derives the same next broadcast and model (with the sharded step, the same shard of it). Only
// streaming rules work across workers (a robust rule needs every update in one place). Not
// thread-safe: one per worker process.
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "client/algorithm.h"
#include "client/secure_party.h"
#include "client/trainer.h"
#include "compression/compressor.h"
#include "data/partition.h"
#include "server/client_copies.h"
#include "server/engine.h"
#include "simulator/collectives.h"
#include "simulator/device_model.h"
#include "simulator/scheduler.h"
#include "simulator/state_store.h"

namespace starling::simulator {

struct SimFleetConfig {
  SchedulePolicy schedule = SchedulePolicy::kLpt;
  double reference_seconds_per_example = 1e-3;  // the simulated clock's reference device
  double deadline_seconds = 0.0;                // simulated; <= 0: none
  uint64_t seed = 1;
  // Where this worker keeps, with its spilled states, which worker holds each client's state (so
  // that a resumed run moves states as the uninterrupted one would). Empty: nowhere.
  std::string homes_file;
  // The sharded server step (server::EngineConfig::shard_count = workers): the last phase's dense
  // sum is reduce-scattered (its small head all-reduced) instead of all-reduced, and the engine's
  // stepped shards are all-gathered. Off: one all-reduce, and every worker steps the whole model.
  bool sharded_step = false;
  // SCAFFOLD is the round engine's (server::EngineConfig::scaffold_population, scheme.scaffold):
  // a phase-0 task that carries the server's c makes each client correct its steps by c - c_i
  // (c_i in the state store) and send c_i+ - c_i with its update, as a deployed client does.
  // checkpoint() flushes the state store (a checkpointed run's states must survive a crash). Off
  // for a run without a checkpoint: its states stay in memory up to the bound between rounds.
  bool durable_states = true;
  // The round on the device (client::DeviceUpdate, torch_trainer/device_round.h) for the clients'
  // phase 0; null: the host. Must outlive the fleet.
  client::DeviceUpdate* device_update = nullptr;
  // Secure aggregation on several workers: the masked inputs (and their clients' states) gathered
  // at once, all workers' together, at most (one client's a worker at least).
  uint64_t secure_batch_bytes = uint64_t{256} << 20;
  // secagg.threat = malicious-server: the clients sign their advertised keys with signing keys
  // certified by simAuthority(seed), and check their neighbours' (as deployed clients do).
  bool secure_signed = false;
  // The downlink (server::EngineConfig::downlink): a mirrored one (q3-mirror, q2-mirror,
  // stc-mirror) makes the fleet keep every client's copy (server::ClientCopies, the same on every
  // worker: each encodes every participant's task) and train each client from its own; at most
  // `downlink_copies`; stc-mirror's density is downlink_density (EngineConfig::downlink_density).
  server::Downlink downlink = server::Downlink::kDense;
  size_t downlink_copies = 1000;
  double downlink_density = 0.01;
};

// Under secagg.threat = malicious-server a simulation plays the federation's authority itself:
// its key, and each client's signing key and certificate, derived from the run seed (a
// simulation keeps no secret from itself; what it measures is the protocol's bytes and work).
privacy::SigningKeyPair simAuthority(uint64_t run_seed);
// Client `client`'s trust: its signing key (from the run seed) certified by `authority`
// (simAuthority's, derived once a fleet), and the authority's public key.
client::SecAggTrust simTrust(const privacy::SigningKeyPair& authority, uint64_t run_seed,
                             uint64_t client);

// The simulated population: data shards and devices (identical on every worker).
struct SimClients {
  const data::Dataset* train = nullptr;
  data::ClientShards shards;  // per client id: held, or drawn whenever asked (a pool of millions)
  DevicePopulation devices;
};

// The wire bytes of a phase-0 update under `broadcast` before any client made one: an update of
// ones with the declared metrics at 1 (and SCAFFOLD's control change when `with_control`), of
// client `client_id` (an id of 0 is left out of a message: a few bytes fewer than any other's).
// Exact when the compressor's size does not vary (Compressor::updateSizeVaries: top-k sends k,
// low-rank its factors, quantizers their bits; an update of zeros would be bytes short, its zero
// scale left out) and every declared metric is sent and non-zero (a metric at 0 is left out too:
// error feedback's diagnostics on a client's first round). For STC, which leaves zeros out, a zero
// update's: the least an update can take. Both simulated clocks time clients with it, or, when
// the size varies, the synchronous one with each client's own.
uint64_t phaseZeroUpdateBytes(const ParamLayout& layout, const compression::Compressor& comp,
                              const compression::PhaseBroadcast& broadcast,
                              const std::vector<std::string>& metrics, bool with_control,
                              uint64_t client_id = 1);

class SimFleet final : public server::Fleet, public server::FleetWorkers {
 public:
  // Everything referenced must outlive the fleet. `test` (may be null) is what evaluate() uses.
  SimFleet(SimFleetConfig config, const SimClients& clients, client::Trainer& trainer,
           ClientStateStore& store, Collectives& collectives, const data::Dataset* test);

  server::ClientPool waitForClients(size_t min, std::chrono::milliseconds timeout,
                                    uint64_t round) override;
  server::PhaseReport runPhase(const server::PhaseTask& task,
                               std::span<const server::ClientInfo> participants, size_t target,
                               aggregation::PhaseAggregator& agg) override;
  // Secure aggregation's exchange steps (advertise, share keys, unmask): each participant's real
  // client side (client::SecureParty) answers the engine's request, timed on the simulated clock
  // by its bytes (a client offline before its answer arrives, or past the deadline, fails the
  // step). On several workers each client's side lives on one worker for the round (its owner,
  // dealt round-robin over the advertise step's participants by id), which answers for it, trains
  // it and masks its input; the answers and the masked inputs go to every worker
  // (allGatherBytes), whose engines take them in the same order: one run, whatever the number of
  // workers.
  server::PhaseReport exchange(server::SecureStage stage, server::SecureSteps& round,
                               std::span<const server::ClientInfo> participants,
                               uint32_t deadline_ms) override;
  // Central evaluation of the task's model on the test set, split among the workers.
  server::EvalReport evaluate(const server::PhaseTask& task,
                              const server::ClientPool& participants) override;
  void finish(const std::string&) override {}
  server::FleetWorkers* workers() override { return this; }
  // Makes every client state durable, and where it is (before the engine writes its checkpoint).
  void checkpoint() override;
  uint32_t stepShards() const override;
  void gatherModel(std::span<float> model) override;
  std::vector<uint8_t> saveState() const override;
  void restoreState(std::span<const uint8_t> bytes) override;
  uint64_t agreeNonce(uint64_t mine) override;

  const CostModel& cost() const { return cost_; }
  // Clients this worker trained so far (all phases).
  uint64_t clientsTrained() const { return trained_; }
  // Client states moved between workers so far (the same count on every worker).
  uint64_t statesMigrated() const { return migrated_; }
  // Simulated seconds since the run began (checkpointed): what the devices' windows of time follow.
  double clock() const { return clock_; }

 private:
  // What one phase costs on the wire: each participant's task, and its update: `update` is
  // phaseZeroUpdateBytes (0 after phase 0), `up` each participant's (its exact size once its
  // update is made, when the compressor's size depends on the values; `update` otherwise).
  struct PhaseBytes {
    uint64_t task = 0, update = 0;
    uint64_t update_of_zero = 0;     // client 0's (its id is left out)
    std::vector<uint64_t> down, up;  // per participant
  };
  // The counters the workers sum after a phase (allReduceCounts): per participant its outcome and
  // its update's bytes (when measured), then the bytes up, then per worker the work it did
  // (examples x epochs) and its microseconds, then the microseconds of each stage of the clients'
  // turns (server::kStageKeys), summed over the workers.
  struct PhaseCounts {
    static constexpr uint64_t kCompleted = 1, kFailed = 2;
    enum Stage : size_t { kLoad, kTrain, kUpdate, kAggregate, kStore };
    PhaseCounts(size_t participants, int workers)
        : values(2 * participants + 1 + 2 * static_cast<size_t>(workers) + server::kStages, 0),
          np(participants),
          nw(static_cast<size_t>(workers)) {}
    uint64_t& outcome(size_t i) { return values[i]; }
    uint64_t& size(size_t i) { return values[np + i]; }
    uint64_t& uplink() { return values[2 * np]; }
    uint64_t& work(int w) { return values[2 * np + 1 + 2 * static_cast<size_t>(w)]; }
    uint64_t& micros(int w) { return values[2 * np + 2 + 2 * static_cast<size_t>(w)]; }
    uint64_t& stage(size_t s) { return values[2 * np + 1 + 2 * nw + s]; }
    std::vector<uint64_t> values;
    size_t np, nw;
  };
  // A client trained before the clock decided whether it is accepted (updateSizeVaries()).
  struct Held {
    uint64_t id = 0;
    size_t index = 0;    // among the participants
    uint64_t bytes = 0;  // its update's, on the wire
    compression::Update update;
    ClientState state;
  };
  PhaseBytes phaseBytes(const server::PhaseTask& task,
                        std::span<const server::ClientInfo> participants,
                        const compression::Compressor& comp);
  // Phase 0: the clients the simulated clock does not accept (offline before they finish, past the
  // deadline, beyond the target), with the phase's simulated seconds in `rep`.
  std::set<uint64_t> timeClients(const server::PhaseTask& task,
                                 std::span<const server::ClientInfo> participants, size_t target,
                                 const PhaseBytes& bytes, server::PhaseReport& rep);
  // The round's assignment of `ids` to workers (kept for its later phases); states move.
  void assign(std::vector<uint64_t> ids, uint32_t epochs, uint64_t round);
  // A later phase: the longest transfer of its factors.
  double laterPhaseSeconds(std::span<const server::ClientInfo> participants,
                           const PhaseBytes& bytes) const;
  // This worker's share, one client after another, into `agg`; or, with `held`, kept there
  // untouched by the store, each participant's size in `counts`.
  void trainMine(const server::PhaseTask& task, std::span<const server::ClientInfo> participants,
                 const compression::Compressor& comp, aggregation::PhaseAggregator& agg,
                 PhaseCounts& counts, std::vector<Held>* held = nullptr);
  void reduceGlobal(const server::PhaseTask& task, const compression::Compressor& comp,
                    aggregation::PhaseAggregator& agg);
  const compression::Compressor& compressor(const std::string& spec);
  // Sums `counts` over the workers exactly (16-bit pieces in floats).
  void allReduceCounts(std::vector<uint64_t>& counts);
  // Moves the state of every client assigned to another worker than the one holding its state
  // (its home) to its new worker, through all-reduces of the serialized states in bounded batches;
  // the old home drops its copy.
  void migrateStates();
  void writeHomes() const;

  SimFleetConfig config_;
  const SimClients& clients_;
  client::Trainer& trainer_;
  ClientStateStore& store_;
  Collectives& coll_;
  const data::Dataset* test_;
  CostModel cost_;
  std::map<std::string, std::unique_ptr<compression::Compressor>> compressors_;
  Assignment assignment_;  // this round's, kept across its phases
  std::map<uint64_t, int>
      home_;  // the worker holding each client's state (the same on every worker)
  std::map<uint64_t, uint64_t>
      held_;  // the model version each client last downloaded (same everywhere)
  // The phase's participants' versions before its task (a quantised downlink's clients train
  // from what their task gives them).
  std::map<uint64_t, uint64_t> held_before_;
  std::optional<server::ClientCopies> copies_;  // a mirrored downlink's (SimFleetConfig)
  uint64_t assignment_round_ = 0;
  double clock_ = 0.0;         // simulated seconds since the run began (the same everywhere)
  uint64_t waited_round_ = 0;  // the round of the last waitForClients call
  double wait_ = 0.0;          // the clock's wait for a client to come online, not yet reported
  ClientState state_;          // reused for every client
  std::vector<size_t> shard_;  // a drawn client's shard, reused for every client
  uint64_t trained_ = 0, migrated_ = 0;
  // Secure aggregation: the round's clients' own sides, made at its advertise step (on several
  // workers, only those this worker owns), and every participant's owner.
  std::map<uint64_t, client::SecureParty> parties_;
  uint64_t secure_round_ = 0;                         // the round of the last secure exchange
  std::optional<privacy::SigningKeyPair> authority_;  // config_.secure_signed: simAuthority's
  std::map<uint64_t, int> secure_owner_;
  bool ownsSecure(uint64_t id) const;
  // The masked inputs this worker made (client, message), to every worker's engine in batches
  // of at most kSecureBatchBytes: each worker replies with every worker's, in rank order; a
  // refused one fails its client (on its owner, which counts it).
  void replyMasked(server::SecureSteps& round,
                   std::vector<std::pair<uint64_t, std::vector<uint8_t>>>& mine,
                   const std::map<uint64_t, size_t>& index, PhaseCounts& counts);
};

}  // namespace starling::simulator
