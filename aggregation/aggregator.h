#pragma once
// The one interface through which anything aggregates a round: the server, edge aggregators and
// the simulator's workers. An Aggregator takes decoded client updates one at a time and yields the
// round's aggregated pseudo-gradient (mean client delta), which a ServerOptimizer then applies.
//
//   "fedavg"        streaming weighted mean over compressed payloads (PartialAggregate): O(model)
//   "median", "trimmed_mean", "krum", "multikrum", "bulyan": robust rules (robust.h): O(n*model)
//
// Spec options (all rules): weight=examples|uniform (fedavg and multikrum weights), clip=<L2 norm>
// (0 = off; each update is scaled to at most this norm first). trimmed_mean: beta=0.2.
// krum, multikrum, bulyan: f=<assumed malicious clients>. multikrum: m=<kept> (0 = n - f).
//
// Bad updates (wrong model, malformed payload, non-finite values, zero weight) are rejected by
// add(): it throws InvalidArgument, counts the update in rejected(), and the round continues.
//
// Not thread-safe: one thread per aggregator.
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "aggregation/partial.h"

namespace starling::aggregation {

struct AggregatorOptions {
  enum class Weighting { kExamples, kUniform };
  std::string rule = "fedavg";
  Weighting weighting = Weighting::kExamples;
  double clip_norm = 0.0;
  double beta = 0.2;   // trimmed_mean
  uint32_t f = 0;      // krum, multikrum, bulyan
  uint32_t m = 0;      // multikrum
  void validate() const;
  static AggregatorOptions parse(std::string_view spec);
  bool streaming() const { return rule == "fedavg"; }
};

struct AggregateResult {
  std::vector<float> delta;  // aggregated pseudo-gradient, layout-sized
  double total_weight = 0.0;
  uint64_t count = 0;
  std::map<std::string, double> metrics;  // weighted means of the clients' metrics
};

class Aggregator {
 public:
  virtual ~Aggregator() = default;
  // Adds one client's update. Throws InvalidArgument (and counts it in rejected()) if unusable.
  void add(const Update& u);
  uint64_t rejected() const { return rejected_; }
  virtual uint64_t count() const = 0;
  // Throws InvalidArgument for an empty round or when the rule's precondition fails
  // (e.g. Bulyan with n < 4f + 3).
  virtual AggregateResult finish() const = 0;
  // Starts a new round (optionally with new shared low-rank factors).
  virtual void reset(const SharedFactors* shared = nullptr) = 0;
  virtual size_t memoryBytes() const = 0;
  const AggregatorOptions& options() const { return opt_; }

 protected:
  explicit Aggregator(AggregatorOptions o) : opt_(std::move(o)) {}
  double weightOf(const Update& u) const;
  virtual void doAdd(const Update& u, double weight) = 0;
  AggregatorOptions opt_;
  uint64_t rejected_ = 0;
};

std::unique_ptr<Aggregator> makeAggregator(const AggregatorOptions& o, const ParamLayout& layout,
                                           const SharedFactors* shared = nullptr);
std::unique_ptr<Aggregator> makeAggregator(std::string_view spec, const ParamLayout& layout,
                                           const SharedFactors* shared = nullptr);

// When a round counts. results = updates aggregated, failures = clients that did not deliver
// (time-outs, drop-outs) plus rejected updates.
struct CompletionPolicy {
  uint64_t min_results = 1;
  double min_completion_rate = 0.0;  // results / (results + failures)
  void validate() const;
};

struct RoundDecision {
  bool apply = false;
  std::string reason;  // why the round was skipped, empty when applied
};

RoundDecision decideRound(const CompletionPolicy& p, uint64_t results, uint64_t failures);

}  // namespace starling::aggregation
