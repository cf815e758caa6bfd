#pragma once
// The round engine: sampling, task configuration, completion, the server optimizer step,
// checkpoints and per-round metrics, written once against the Fleet seam ("deliver tasks,
// receive updates"). The ZeroMQ server (server/zmq_fleet.h) is one Fleet; an in-process fleet
// (tests) and the simulator are others. The engine drives the generic round loop of
// aggregation/round_scheme.h and never names a compressor:
//
//   wait for clients -> sample (by count, or by Poisson) -> for each phase:
//   fleet.runPhase(task, sampled, agg) -> round.finish() -> completion policy
//   -> (central DP) noise on the mean -> optimizer step -> (every eval_every rounds)
//   fleet.evaluate() -> the run recorder closes the round (server/run_recorder.h, the buffered
//   engine's too): checkpoint, metrics line, progress
//
// Durability: after every round (applied or skipped) the engine writes its checkpoint atomically
// (core/file_io.h): the global model and its version, the next round number, the server
// optimizer's state and the round carry (PowerSGD's shared Q). Sampling is a pure function of
// (seed, round), so the round number is the sampling RNG's position. A restarted engine loads
// the checkpoint and resumes at the first round not completed; the round in flight at a crash is
// run again from the carry it began with.
#include <chrono>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "aggregation/round_scheme.h"
#include "aggregation/server_optimizer.h"
#include "privacy/dp.h"
#include "protocol/control.h"
#include "server/model_store.h"
#include "server/run_recorder.h"
#include "server/secure_round.h"

namespace starling::server {

struct ClientInfo {
  uint64_t id = 0;
  protocol::Role role = protocol::Role::kClient;
  uint64_t num_examples = 0;  // registered training examples: the cap on the weight it claims
  uint64_t eval_examples = 0;
  uint64_t model_version = 0;  // the model version it holds, for the delta downlink
  // It registered the capability "downlink-qsgd": it may be sent the quantised downlinks (q8, q4;
  // the others get the broadcast model dense); "downlink-stc": the sparse ternary one (stc);
  // "downlink-blockq": the block-scaled ones (q3, q2).
  bool qsgd_downlink = false;
  bool stc_downlink = false;
  bool block_downlink = false;
};

// The clients available to a round, by ascending id. A root's registry gives them as a list; a
// simulated pool gives how many there are and a function that makes any one's ClientInfo, so that
// a pool of ten million holds nothing per client (the ids 0..n-1, or, when some are offline, the
// ascending ids of those online, 4 bytes each).
class ClientPool {
 public:
  using Make = std::function<ClientInfo(uint64_t id)>;
  ClientPool() = default;
  // A list, in any order (sorted by id here). Implicit: a fleet returns its list.
  ClientPool(std::vector<ClientInfo> list);  // NOLINT(google-explicit-constructor)
  // Clients 0..n-1 / those listed (ascending, each below 2^32), each one's info made by `make`:
  // a client (not an edge aggregator) with training and evaluation examples.
  static ClientPool generated(uint64_t n, Make make);
  static ClientPool generated(std::vector<uint32_t> ids, Make make);

  size_t size() const { return generated_ ? (ids_ ? ids_->size() : n_) : list_.size(); }
  bool empty() const { return size() == 0; }
  // The i-th by ascending id (i < size()).
  ClientInfo operator[](size_t i) const;
  // Those that are clients (not edge aggregators) / that have evaluation examples (a generated
  // pool: all of them, without a copy).
  ClientPool clients() const;
  ClientPool evaluators() const;
  // Every client, ascending by id (a list's copy; a generated pool's made one by one).
  std::vector<ClientInfo> list() const;

  class Iterator {
   public:
    Iterator(const ClientPool* pool, size_t i) : pool_(pool), i_(i) {}
    ClientInfo operator*() const { return (*pool_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return i_ != o.i_; }

   private:
    const ClientPool* pool_;
    size_t i_;
  };
  Iterator begin() const { return Iterator(this, 0); }
  Iterator end() const { return Iterator(this, size()); }

 private:
  ClientPool filtered(bool (*keep)(const ClientInfo&)) const;

  std::vector<ClientInfo> list_;
  bool generated_ = false;
  uint64_t n_ = 0;
  std::shared_ptr<const std::vector<uint32_t>> ids_;  // null: 0..n_-1
  Make make_;
};

struct SamplingConfig {
  double fraction = 1.0;  // of the available clients, per round
  size_t clients_per_round =
      0;                     // instead of `fraction` when > 0: this many, or all available if fewer
  size_t min_clients = 1;    // results a round needs (and the fewest clients sampled)
  size_t min_available = 1;  // wait until this many clients are registered
  double overcommit = 1.0;   // sample this many times the target; close at the target
  uint32_t wait_ms = 60000;  // how long to wait for min_available before giving up the round
  // Poisson sampling (> 0): every available client is sampled independently with this probability,
  // instead of fraction and clients_per_round: the sampling differential privacy's accountant
  // assumes (privacy/dp.h). Its draws are ChaCha20's (privacy::KeyStream), keyed by the run seed,
  // or, under central DP, by the mechanism's key (secret unless privacy.seeded_noise).
  double poisson_rate = 0.0;
  void validate() const;
};

struct EngineConfig {
  uint64_t rounds = 10;
  aggregation::RoundSchemeOptions scheme;  // compressor, rule, run seed, bounds, metrics
  std::string server_opt = "fedavg";
  SamplingConfig sampling;
  aggregation::CompletionPolicy completion;
  protocol::FitSettings fit;
  uint32_t round_deadline_ms = 60000;  // per phase
  uint32_t eval_every = 0;             // federated evaluation every N rounds (0: never)
  Downlink downlink = Downlink::kDense;
  size_t delta_history = 4;        // model versions kept for the delta and topk downlinks
  double downlink_density = 0.01;  // topk downlink: fraction of the model refreshed per version
  std::string checkpoint;          // file; empty: no checkpoints
  std::string metrics;             // JSON Lines file; empty: none
  // False on every simulator worker but the first: it resumes from the checkpoint like the others
  // but writes neither the checkpoint nor the metrics.
  bool write_files = true;
  // The simulator's sharded server step (DeAR's decoupling): with shard_count > 1 this engine is
  // one of shard_count workers that each step only their shard of the model
  // (shardRange(numel, shard_rank, shard_count), core/shard.h), so the server optimizer's state
  // (FedAdam's moments) is that shard's alone; the fleet must have reduced that shard of the last
  // phase's dense sum and gathers the stepped model (Fleet::gatherModel). The optimizer shard's
  // state is then kept in `optimizer_shard_file` (required), not in the checkpoint, holding the
  // last two rounds' states, so that it matches the checkpoint even when a crash came between
  // this worker's write and the checkpoint's.
  uint32_t shard_rank = 0, shard_count = 1;
  std::string optimizer_shard_file;
  // SCAFFOLD (scheme.scaffold): the server's control variate c lives here, travels in every
  // phase-0 fit task, and after each round that reached its clients (applied or not) moves by the
  // sum of the accepted clients' changes over N, the population: this many clients, or with 0 the
  // clients available when the round began (at least the count). Those clients are acknowledged
  // (controlAcks(): their next task tells them to commit that round's c_i+). Checkpointed with
  // the model.
  uint64_t scaffold_population = 0;
  // Client-level differential privacy with a trusted server (privacy/dp.h): needs Poisson sampling
  // and the rule fedavg with uniform weights and clip = dp.clip (the settings compose it), a
  // compressor of one phase that shares no factors, no SCAFFOLD, and dp.population; refused
  // otherwise, with the reason. Only clients are sampled (an edge aggregator's partial holds
  // updates the root cannot clip: a round with one is not applied); under secagg every edge
  // aggregator takes part, and each client it names is kept on its own Poisson draw
  // (poissonSampled), as the root's own clients are. Each applied round's mean is
  // privatised before the server step, and the round is checkpointed before its model is sent out
  // to be evaluated (a crash then cannot make the round run again with other noise); every record
  // carries the epsilon spent after it; a run whose rounds would exceed dp.target_epsilon is
  // refused at construction. The checkpoint keeps (q, sigma, delta) and the mechanism: a resume
  // under other privacy settings, or a DP run from a checkpoint of rounds without DP, is refused.
  // Distributed (dp.mechanism; needs secagg): the clients add the noise in the ring (secagg.noise,
  // set from it), a round with fewer masked inputs than dp.min_clients stops before its unmask,
  // and the mean is only divided by q N.
  privacy::DpConfig dp;
  // Secure aggregation, SecAgg+ (server/secure_round.h): each round's clients mask their clipped
  // updates in a ring, and the engine (through the fleet's exchange()) learns only their sum. It
  // needs the rule fedavg with uniform weights (the sum is of unweighted updates), the dense
  // compressor "none" (the masked words replace the update), one optimizer shard, no SCAFFOLD;
  // refused otherwise, with the reason. A round with fewer than 3 clients, or whose survivors
  // are too few to unmask, is not applied, with the reason. Composes with central DP (the noise
  // is added to the unmasked sum).
  SecAggConfig secagg;
  void validate() const;  // ConfigError naming the key
};

// Secure aggregation: why `compressor` is refused with it, for the ConfigError; empty when it
// composes (a support the round shares, compression::Compressor::supportIsShared, or a low-rank
// factor against a shared one: acpsgd, two-phase powersgd with a secure sum per phase).
std::string secureCompressorRefusal(const compression::Compressor& compressor);
// The most values one client's masked input carries in `round` of this compressor: its shared
// support's size (the model's numel when dense), or the largest of its factors' (acpsgd, whose
// shared side alternates; two-phase powersgd, whose phases send P, then Q).
uint64_t secureDim(const compression::Compressor& compressor, const ParamLayout& layout,
                   uint64_t run_seed, uint64_t round);
// Round `round`'s clients from `pool`, ascending by id, and in `target` the results the round
// wants. By count (fraction or clients_per_round, over-committed): a shuffle of the pool keyed by
// (run_seed, round), the same clients whatever the pool's form (a list or generated), O(pool) time
// and 4 bytes a client of it while it runs. By Poisson: each client kept on a draw of its own,
// keyed by `poisson_key`.
std::vector<ClientInfo> sampleClients(const ClientPool& pool, const SamplingConfig& s,
                                      uint64_t run_seed, const privacy::Key32& poisson_key,
                                      uint64_t round, size_t* target);
// Poisson sampling's draw for one client: whether client `id` is in round `round`'s sample at
// `rate`. A function of the key, the round and the id alone, so a client is sampled alike whether
// the root or an edge aggregator reaches it.
bool poissonSampled(const privacy::Key32& poisson_key, uint64_t round, uint64_t id, double rate);
// The most clients a round of this sampling can have when it says (a count, over-committed); with
// Poisson sampling of a known `population` (under DP), its expected count and 7 standard deviations
// (rarer rounds are not applied, with the reason); 1 when each round's own count decides
// (Poisson sampling of an unknown population, a fraction).
uint64_t secureMaxClients(const SamplingConfig& s, uint64_t population = 0);
// The round scheme's options of `c`: its scheme's, with adaptive clipping's indicator under
// privacy.adaptive_clip.
aggregation::RoundSchemeOptions withClipIndicator(const EngineConfig& c);
// Adaptive clipping's count (aggregation::RoundSchemeOptions::clip_indicator): a reserved metric
// name, never in a round record.
inline constexpr const char* kClipIndicator = "dp_within_clip";
// The source id under which the engine merges a secure round's unmasked sum.
inline constexpr uint64_t kSecureSource = ~uint64_t{0};

// SCAFFOLD's acknowledgements: per client (or edge aggregator) id, the last round whose control
// change was counted into c. A deployed fleet writes a client's into its phase-0 task
// (TaskMsg::control_ack), and the client commits that round's c_i+ (client/algorithm.h).
using ControlAcks = std::unordered_map<uint64_t, uint64_t>;

// What the engine asks of a fleet for one phase: the broadcast and the task header (everything
// but the model, the nonce and SCAFFOLD's acknowledgement, which the fleet fills per client).
struct PhaseTask {
  const compression::PhaseBroadcast& broadcast;
  protocol::TaskMsg header;
  const ModelStore& model;
  Downlink downlink;
  const ControlAcks* control_acks = nullptr;  // with header.control: each client's control_ack
  // Secure aggregation's masked-input step: each participant is given request(kMaskedInput, id)
  // with its task, trains, and answers with its masked input, which the fleet hands to
  // reply(kMaskedInput, id, bytes) instead of adding an update to the aggregate (a refused one
  // fails the client). Null: a plain phase.
  SecureSteps* secure = nullptr;
};

// The header of a fit task of `round` on model `version` (every field but the phase, SCAFFOLD's
// c, the model, the nonce and the acknowledgement, which the driver and the fleet fill): the one
// builder of the round engine, the root's asynchronous rounds and the asynchronous simulation
// (whose rounds are a version's: round = version).
protocol::TaskMsg fitTaskHeader(const aggregation::RoundScheme& scheme, uint64_t round,
                                uint64_t version, const protocol::FitSettings& fit,
                                uint32_t deadline_ms);

// The wire bytes of `task` for a client that holds model version `held` (0: none), with `nonce`
// (non-zero, so that setTaskNonce can patch it): phase 0 carries the model in the task's downlink
// encoding (dense, fp16, or a delta against `held`), later phases the shared factors only. Every
// fleet encodes its tasks with this.
std::vector<uint8_t> encodeTask(const PhaseTask& task, uint64_t held, uint64_t nonce = 1);
// The same with the model encoded by the caller (a mirrored downlink's, against one client's copy:
// server/client_copies.h); ignored in later phases.
std::vector<uint8_t> encodeTask(const PhaseTask& task, const EncodedModel& model,
                                uint64_t nonce = 1);

struct PhaseReport {
  std::vector<uint64_t> completed;  // clients whose update (or partial) was accepted
  std::vector<uint64_t>
      failed;  // clients that did not deliver in time, went silent, or were refused
  uint64_t uplink_bytes = 0;
  uint64_t downlink_bytes = 0;
  uint64_t refused =
      0;  // messages the fleet refused during the phase (the aggregator's refusals included)
  // A simulated fleet's clock: the phase's simulated duration and its workers' makespan (wall
  // seconds of the busiest worker); nullopt for a real fleet.
  std::optional<double> sim_seconds, makespan_seconds;
  // A simulated fleet's breakdown of where its workers' time went (seconds summed over the
  // workers, by stage: kStageKeys' order); empty for a real fleet.
  std::vector<double> stage_seconds;
};

struct EvalReport {
  uint64_t clients = 0;
  uint64_t examples = 0;
  double loss = 0.0;      // weighted by examples
  double accuracy = 0.0;  // weighted by examples
  uint64_t uplink_bytes = 0;
  uint64_t downlink_bytes = 0;

  // Adds one client's evaluation to the example-weighted means. A running mean that multiplies
  // by the weight's share (<= 1), never by an example count, so finite inputs give a finite mean
  // (loss x examples once overflowed to inf). `examples` > 0; the caller bounds the values.
  void add(uint64_t client_examples, double client_loss, double client_accuracy) {
    const double w = static_cast<double>(client_examples);
    const double share = w / (static_cast<double>(examples) + w);
    loss += (client_loss - loss) * share;
    accuracy += (client_accuracy - accuracy) * share;
    examples = examples > UINT64_MAX - client_examples ? UINT64_MAX : examples + client_examples;
    ++clients;
  }
};

// Thrown by a fleet's waiting calls (waitForClients, runPhase, evaluate) when its program was
// asked to stop (SIGTERM). Before the round is applied, runRound lets it through with nothing
// changed (no metrics line, the checkpoint's next round the same), so a restart runs that round
// again and a graceful stop costs no configured round. During the evaluation after an
// applied round, runRound records the round (without test metrics) and checkpoints it first.
class Stopped : public Error {
 public:
  using Error::Error;
};

// What a fleet adds when its clients' state lives in it and several workers share the server step
// (the simulator's SimFleet: every worker runs the engine, each with its share of the clients).
class FleetWorkers {
 public:
  virtual ~FleetWorkers() = default;
  // Called before the engine writes its checkpoint after a round: the fleet makes its client state
  // durable here, and returns only when every worker has (so the checkpoint never runs ahead of a
  // worker's state).
  virtual void checkpoint() = 0;
  // How many workers share the server step (EngineConfig::shard_count must agree; the engine
  // checks it before its first round): 1 unless the fleet reduce-scatters the last phase's dense
  // sum and gathers the stepped model.
  virtual uint32_t stepShards() const = 0;
  // After a sharded server step (EngineConfig::shard_count > 1) `model` holds the new values in
  // this worker's shard only: the fleet gathers every worker's shard into it. Only an element-wise
  // server optimizer can be sharded this way (every one in aggregation/server_optimizer.h is).
  virtual void gatherModel(std::span<float> model) = 0;
  // Server-side state of the fleet's own that the checkpoint keeps (the simulator's worker count
  // and the model versions its clients hold), the same on every worker; empty: none.
  // restoreState() gets it back once, before the first round after a resume.
  virtual std::vector<uint8_t> saveState() const = 0;
  virtual void restoreState(std::span<const uint8_t> bytes) = 0;
  // Secure aggregation: the nonce of the round's exchange, `mine` being this worker's fresh one;
  // every worker's engine must use one (the first worker's), as each answers for its own clients.
  virtual uint64_t agreeNonce(uint64_t mine) { return mine; }
};

// The seam between the round engine and whatever reaches the clients.
class Fleet {
 public:
  virtual ~Fleet() = default;
  // The clients available for round `round` now, after waiting up to `timeout` until there are at
  // least `min` (a simulated fleet also applies its devices' availability in that round).
  virtual ClientPool waitForClients(size_t min, std::chrono::milliseconds timeout,
                                    uint64_t round) = 0;
  // Delivers the phase's task to `participants` and adds what comes back to `agg` as it streams
  // in (never holding one update per client), until `target` results were accepted, every
  // participant answered or failed, or the task's deadline passed.
  virtual PhaseReport runPhase(const PhaseTask& task, std::span<const ClientInfo> participants,
                               size_t target, aggregation::PhaseAggregator& agg) = 0;
  // Secure aggregation (EngineConfig::secagg): step `stage` of `round` (not the masked input,
  // which runPhase carries): gives each participant round.request(stage, id) and hands its answer
  // to round.reply(stage, id, bytes) (an InputError refuses it: the client fails the step), until
  // every participant answered or failed or `deadline_ms` passed. `completed`: whose answer was
  // taken. A fleet that cannot run secure aggregation keeps this default, a ConfigError.
  // A participant that is an edge aggregator gets the requests of the clients it relays
  // (round.relayedBy) in one message and answers with theirs (one level of aggregators).
  virtual PhaseReport exchange(SecureStage stage, SecureSteps& round,
                               std::span<const ClientInfo> participants, uint32_t deadline_ms);
  // Secure aggregation through edge aggregators: asks each of `aggregators` which of its clients
  // it brings to round `round`, within `deadline_ms`; the answers by aggregator (one that does not
  // answer is left out). The default: none (a fleet without aggregators).
  // `report`: the bytes, refusals and the aggregators that did not answer.
  virtual std::map<uint64_t, std::vector<uint64_t>> secureRoster(
      std::span<const ClientInfo> aggregators, uint64_t round, uint32_t deadline_ms,
      PhaseReport& report);
  // Federated evaluation of the current model on the participants' held-out data.
  virtual EvalReport evaluate(const PhaseTask& task, const ClientPool& participants) = 0;
  // The federation is over: tell the clients.
  virtual void finish(const std::string& reason) = 0;
  // A fleet of workers that keep client state and share the server step (the simulator's) says so
  // here; null for a fleet that reaches its clients and keeps nothing (a root's, a test's).
  virtual FleetWorkers* workers() { return nullptr; }
};

class RoundEngine {
 public:
  // `initial` is the model to start from when there is no checkpoint to resume. Throws
  // ConfigError for a bad configuration and IoError for an unreadable checkpoint (a corrupt
  // checkpoint is never silently replaced by a fresh start).
  RoundEngine(std::shared_ptr<const ParamLayout> layout, EngineConfig config,
              std::vector<float> initial);
  ~RoundEngine();

  bool resumed() const { return resumed_; }
  uint64_t nextRound() const { return next_round_; }
  bool done() const { return next_round_ > config_.rounds; }
  const ModelStore& model() const { return model_; }
  const aggregation::RoundScheme& scheme() const { return scheme_; }
  const EngineConfig& config() const { return config_; }
  // SCAFFOLD's server control variate c (numel floats; empty without SCAFFOLD).
  const std::vector<float>& control() const { return control_; }
  // SCAFFOLD's acknowledgements (checkpointed with c): who had which round's change counted.
  const ControlAcks& controlAcks() const { return control_acks_; }

  // Runs round nextRound(). A round without enough clients, or one the completion policy
  // refuses, is recorded as not applied; the round number advances either way.
  RoundRecord runRound(Fleet& fleet);
  // DP's mechanism and accountant, central or distributed (null without privacy.dp).
  const privacy::ClientDp* dp() const { return dp_.get(); }

  // Rounds until done(), calling `progress` (on the lead: write_files) with each round recorded,
  // a round recorded before a stop or a failed evaluation ends the run included; then
  // fleet.finish().
  void run(Fleet& fleet, const std::function<void(const RoundRecord&)>& progress = {});

 private:
  void saveCheckpoint() const;
  void loadCheckpoint();
  void saveOptimizerShard();
  void loadOptimizerShard(uint64_t next_round);
  std::vector<ClientInfo> sample(const ClientPool& available, uint64_t round, size_t* target) const;
  // What one phase's secure sum gave: the clients whose input is in it, and under adaptive
  // clipping the count of updates within the round's clip (from the unmasked sum).
  struct SecureSum {
    std::set<uint64_t> in_sum;
    std::optional<double> within;
  };
  // One phase's secure sum (an exchange of its own: fresh keys, masks and shares), merged into
  // `agg`; nullopt, with rec.reason, when the round has none to apply. `only`: after the round's
  // first phase, the clients whose input is in its sum (a later phase continues from their state;
  // no one else joins).
  std::optional<SecureSum> secureSum(Fleet& fleet, const PhaseTask& plain,
                                     std::vector<ClientInfo>& active, size_t target,
                                     aggregation::PhaseAggregator& agg, RoundRecord& rec,
                                     std::set<uint64_t>& failed, const std::set<uint64_t>* only);
  // Under distributed DP, before a round's unmask: the checkpoint says the round is spent (the
  // model as before it), so that a root that crashes after the unmask does not run the round again
  // and release a second noisy sum the accountant does not count.
  void markRoundSpent();
  void updateControl(const aggregation::PartialAggregate& phase0, size_t available, uint64_t round,
                     const std::vector<uint64_t>& counted);

  std::shared_ptr<const ParamLayout> layout_;
  EngineConfig config_;
  RunRecorder recorder_;  // each round's record closed: durable, its line, progress
  aggregation::RoundScheme scheme_;
  std::unique_ptr<aggregation::ServerOptimizer>
      optimizer_;  // of this engine's shard (the whole model unsharded)
  size_t shard_begin_ = 0, shard_end_ = 0;
  std::vector<uint8_t> previous_shard_entry_;  // the optimizer shard file's older entry
  std::vector<uint8_t> fleet_state_;           // FleetWorkers::saveState() at the last checkpoint
  bool fleet_state_pending_ = false;           // loaded from a checkpoint, not yet restored
  bool fleet_checked_ = false;                 // stepShards() agreed with shard_count
  ModelStore model_;
  aggregation::RoundCarry carry_;
  std::vector<float> control_;  // SCAFFOLD's c
  ControlAcks control_acks_;
  std::unique_ptr<privacy::ClientDp> dp_;
  uint64_t next_round_ = 1;
  bool resumed_ = false;
};

}  // namespace starling::server
