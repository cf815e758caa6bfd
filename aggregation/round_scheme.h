#pragma once
// The round as one object. A RoundScheme is built from the compressor spec, the aggregation rule
// spec, the run seed, the validation bounds and the declared metrics; from those alone it knows
// the round's phases (one for most compressors, two for PowerSGD), what is broadcast before each
// phase (round seed, shared low-rank factors), how updates are validated and added, how partial
// aggregates merge and export for the hierarchy, and how a round finishes: the mean delta and the
// state the next round inherits (RoundCarry). The root server, an edge aggregator, a simulator
// worker and the demo drive every compressor through this one generic loop, with no compressor
// names and no casts:
//
//   RoundScheme scheme(layout, options);
//   RoundCarry carry = scheme.initialCarry();
//   for each round r:
//     auto round = scheme.begin(r, carry);
//     for (;;) {
//       const PhaseBroadcast& b = round->broadcast();     // send to clients / edge aggregators
//       ... clients: compressWithFeedback(..., b.context(id)) -> encode -> decode ->
//       round->current().add(update_view);                 // or .merge(partial from an edge)
//       if (round->lastPhase()) break;
//       round->nextPhase();                                // e.g. PowerSGD: P-hat from phase P
//     }
//     RoundResult res = round->finish();                   // delta, metrics, next carry
//     optimizer.step(model, res.delta); carry = std::move(res.next);
//
// An edge aggregator (or simulator worker) takes the phase's broadcast, builds
// scheme.phaseAggregator(b), adds its clients' updates and sends partial().exportDense() (or
// exportSparse) up; the root merges it into round->current(). Tested: a tree of partials equals the
// flat aggregate for every compressor, and the low-rank compressors carry their state across
// rounds.
#include <array>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "aggregation/bounds.h"
#include "aggregation/partial.h"
#include "aggregation/rule.h"
#include "compression/compressor.h"
#include "core/bytes.h"
#include "core/input_error.h"

namespace starling::aggregation {

using compression::PhaseBroadcast;

struct RoundSchemeOptions {
  std::string compressor = "none";  // compressor spec (compression/registry.h)
  std::string rule = "fedavg";      // aggregation rule spec (rule.h)
  uint64_t run_seed = 0;
  ValidationBounds bounds;
  std::vector<std::string> metrics = {"train_loss"};  // metric names aggregated (others ignored)
  // SCAFFOLD (Karimireddy et al. 2020): phase 0's updates carry the clients' control changes
  // c_i+ - c_i (numel floats each), which the phase sums unweighted (PartialAggregate::controlSum)
  // for the server's c += sum / N. Every party of a federation must agree (the partials' tags
  // differ otherwise).
  bool scaffold = false;
  // Adaptive clipping (privacy/dp.h): the name of a metric slot each aggregation point fills
  // itself, 1 for an update within the round's clip and 0 for one it clipped, so that the slot's
  // sum counts the unclipped updates across workers. Clients are not asked for it, and one that
  // sends it is refused (kBadMetric). Empty: none.
  std::string clip_indicator;
};

// What a round hands to the next: the shared factors of the next round's first phase (empty for
// compressors without shared state). Saved in checkpoints.
struct RoundCarry {
  compression::SharedFactors shared;
  void save(ByteWriter& w) const;
  // Throws IoError on corrupt bytes or factors that do not fit `layout`.
  static RoundCarry load(ByteReader& r, const ParamLayout& layout);
};

struct RoundResult {
  std::vector<float> delta;               // the round's pseudo-gradient: mean client update
  std::map<std::string, double> metrics;  // weighted means of the declared metrics
  uint64_t count = 0;                     // updates aggregated (last phase)
  double total_weight = 0.0;              // their total weight (last phase)
  uint64_t rejected = 0;                  // updates and partials refused, all phases
  RoundCarry next;
};

// When a round counts (Flower's min_fit_clients and FaultTolerantFedAvg's completion rate).
// results = updates aggregated, failures = clients that did not deliver plus rejected updates.
struct CompletionPolicy {
  uint64_t min_results = 1;
  double min_completion_rate = 0.0;
  void validate() const;
};
struct RoundDecision {
  bool apply = false;
  std::string reason;  // why the round was skipped, empty when applied
};
RoundDecision decideRound(const CompletionPolicy& p, uint64_t results, uint64_t failures);

class RoundScheme;
class Round;

// One phase of one round at one aggregation point (root, edge aggregator, simulator worker).
// Validates and adds client updates, merges children's partials, and keeps per-error-code
// rejection counts. It refers to its RoundScheme, which must outlive it. Not thread-safe.
class PhaseAggregator {
 public:
  const PhaseBroadcast& broadcast() const { return broadcast_; }
  const PartialAggregate& partial() const { return partial_; }
  // For collectives (all-reduce of partial().buffer()) and in-process merging.
  PartialAggregate& partial() { return partial_; }

  // Validates `u` against this phase (round and phase, duplicates, the examples it claims
  // against the bounds and `limits`, the encoding the compressor sends, every payload, the value
  // and norm bounds, metrics) and adds it, clipped if the rule clips. Throws InputError, counted
  // in rejected(), leaving the aggregate unchanged.
  // `staleness`: an asynchronous update's weight s(tau) in (0, 1] (async_buffer.h), which scales
  // the update as a clip does, its weight unchanged; streaming rules only.
  void add(const compression::UpdateView& u, const ClientLimits& limits = {},
           double staleness = 1.0);
  // Merges a partial aggregate received from the child `source` (an edge aggregator), after
  // checking it against this phase and the bounds scaled by its count. Throws InputError
  // (counted) or InvalidArgument if the rule is not streaming. `staleness`: an asynchronous
  // partial's weight s(tau) in (0, 1], which scales its sums as add()'s scales an update.
  void merge(const compression::PartialView& p, uint64_t source, double staleness = 1.0);
  // Merges an in-process partial of the same phase (a simulator worker's): trusted.
  void merge(const PartialAggregate& p);

  uint64_t accepted() const { return accepted_; }  // updates and partials
  uint64_t rejected() const { return rejected_; }
  uint64_t rejected(Errc code) const { return by_code_[static_cast<size_t>(code)]; }
  // The updates a phase aggregated: count and weight of its partial (merged partials included).
  uint64_t count() const { return partial_.count(); }
  bool hasClient(uint64_t client_id) const { return seen_.count(client_id) != 0; }
  const std::unordered_set<uint64_t>& clients() const { return seen_; }
  // The children whose partials it merged.
  const std::unordered_set<uint64_t>& sources() const { return sources_; }

 private:
  friend class RoundScheme;
  friend class Round;
  struct RobustStore;
  PhaseAggregator(const RoundScheme& scheme, PhaseBroadcast b, RobustStore* robust,
                  const std::unordered_set<uint64_t>* allowed);
  void addChecked(const compression::UpdateView& u, const ClientLimits& limits, double staleness);
  void mergeChecked(const compression::PartialView& p, uint64_t source, double staleness);
  void checkControl(std::span<const float> control, double count, const char* what,
                    uint64_t who) const;
  [[noreturn]] void reject(const InputError& e);

  const RoundScheme& scheme_;
  PhaseBroadcast broadcast_;
  PartialAggregate partial_;
  double clip_;  // the rule's, or the round's (Round::setClip)
  RobustStore* robust_;
  const std::unordered_set<uint64_t>* allowed_;
  std::unordered_set<uint64_t> seen_, sources_;
  uint64_t accepted_ = 0, rejected_ = 0;
  std::array<uint64_t, static_cast<size_t>(kLastErrc) + 1> by_code_{};
};

class RoundScheme {
 public:
  // Throws ConfigError for a bad spec, bound or metric name.
  RoundScheme(std::shared_ptr<const ParamLayout> layout, RoundSchemeOptions options);
  ~RoundScheme();

  const ParamLayout& layout() const { return *layout_; }
  const std::shared_ptr<const ParamLayout>& layoutPtr() const { return layout_; }
  const RoundSchemeOptions& options() const { return opt_; }
  const compression::Compressor& compressor() const { return *compressor_; }
  const AggregationRule& rule() const { return *rule_; }
  uint32_t phases() const { return compressor_->phases(); }

  RoundCarry initialCarry() const;
  // The root's (or a flat driver's) round `round`, starting at phase 0 with `carry`'s factors.
  std::unique_ptr<Round> begin(uint64_t round, const RoundCarry& carry) const;
  // An aggregation point below the root for the phase `b` announces (an edge aggregator). With
  // `previous` (this point's aggregator of the phase before), only the clients it accepted may
  // send this phase. Throws InvalidArgument for a robust rule (it cannot be decomposed).
  // A simulator worker rather keeps a Round of its own on every rank (see Round).
  std::unique_ptr<PhaseAggregator> phaseAggregator(const PhaseBroadcast& b,
                                                   const PhaseAggregator* previous = nullptr) const;
  // Throws InvalidArgument unless `carry`'s shared factors are what this scheme's compressor
  // shares in a first phase (a factor of the right rank and side per compressed tensor, finite).
  // begin() checks it; a driver loading a checkpoint can check it first.
  void checkCarry(const RoundCarry& carry) const;
  // The aggregate layout of a phase, as every party builds it from the broadcast.
  std::shared_ptr<const AggregateLayout> aggregateLayout(const PhaseBroadcast& b) const;

 private:
  friend class PhaseAggregator;
  std::shared_ptr<const ParamLayout> layout_;
  RoundSchemeOptions opt_;
  std::unique_ptr<compression::Compressor> compressor_;
  std::unique_ptr<AggregationRule> rule_;
};

// The root's view of one round: its phases in order, then the result. It refers to its
// RoundScheme, which must outlive it. A round is not checkpointed mid-way: a restarted root
// reruns it from the carry it began with (a PowerSGD client left between its phases starts the
// rerun with its kept matrix as residual, docs/compression.md).
//
// A simulator runs one Round per rank, identically: every rank begins the round with the same
// carry, adds its own clients to current(), all-reduces current().partial().buffer() in place
// (after which every rank holds the whole phase's aggregate), then calls nextPhase() / finish(),
// which are pure functions of that buffer and the scheme, so every rank derives the same next
// broadcast and result. (A client must stay on one rank for all phases of a round.)
class Round {
 public:
  ~Round();
  uint64_t number() const { return number_; }
  uint32_t phase() const { return static_cast<uint32_t>(phases_.size() - 1); }
  bool lastPhase() const { return phase() + 1 == scheme_.phases(); }
  const PhaseBroadcast& broadcast() const { return current().broadcast(); }
  PhaseAggregator& current() { return *phases_.back(); }
  const PhaseAggregator& current() const { return *phases_.back(); }
  // Every phase so far, for logs and metrics (accepted clients, per-code rejections).
  size_t phasesStarted() const { return phases_.size(); }
  // This round's clip, in place of the rule's (adaptive clipping: privacy/dp.h), for the current
  // phase and the next ones; before any update is added. InvalidArgument unless finite and > 0.
  void setClip(double clip);
  const PhaseAggregator& phaseAt(size_t p) const { return *phases_.at(p); }

  // Ends the current phase, which must not be the last, and starts the next with the shared
  // factors the compressor derives from this phase's sums. Only clients of this phase may send
  // in the next. Throws InvalidArgument if no update arrived.
  void nextPhase();
  // After the last phase: the mean delta and the next round's carry. Call it once. Throws
  // InvalidArgument if a phase had no update, or the robust rule's precondition fails; the round
  // is then dropped (the driver keeps the carry it began with).
  RoundResult finish();

 private:
  friend class RoundScheme;
  Round(const RoundScheme& scheme, uint64_t number, const RoundCarry& carry);
  const RoundScheme& scheme_;
  uint64_t number_;
  std::unique_ptr<PhaseAggregator::RobustStore> robust_;
  std::vector<std::unique_ptr<PhaseAggregator>> phases_;
  double clip_ = 0.0;  // setClip's, 0: the rule's
};

}  // namespace starling::aggregation
