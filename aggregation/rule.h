#pragma once
// Aggregation rules, picked by spec from a registry (core/registry.h):
//
//   "fedavg"        streaming weighted mean over compressed payloads (PartialAggregate): O(model)
//                   memory, decomposable, so edge aggregators and simulator workers pre-aggregate
//   "median", "trimmed_mean", "krum", "multikrum", "bulyan": robust rules (robust.h). They need
//                   every update of the round dense at the root: O(n * model) memory, and they
//                   cannot run below edge aggregators (a median of medians is not the median)
//
// Options: fedavg and multikrum weight=examples|uniform (the others ignore weights, as in Flower,
// and so accept updates that report zero examples); every rule clip=<L2 norm> (0 = off: each
// update is scaled to at most this norm first); trimmed_mean beta=0.2; krum, multikrum, bulyan
// f=<assumed malicious clients>; multikrum m=<kept> (0 = n - f).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "aggregation/robust.h"
#include "core/registry.h"

namespace starling::aggregation {

class AggregationRule {
 public:
  virtual ~AggregationRule() = default;
  virtual std::string name() const = 0;
  // Canonical spec with every option.
  virtual std::string spec() const = 0;
  // True for rules whose result is a function of the weighted sum (fedavg).
  virtual bool streaming() const = 0;
  // True if an update's weight is its number of examples (so 0 examples is refused); false if
  // every update weighs 1.
  virtual bool weightsByExamples() const = 0;
  double clipNorm() const { return clip_; }
  // Robust rules: the round's delta from every update, dense, with their weights. Throws
  // InvalidArgument when the rule's precondition fails (e.g. Krum with n < 2f + 3) or an input is
  // not finite. The result is checked finite. Streaming rules throw InternalError.
  virtual std::vector<float> combine(const DenseUpdates& updates,
                                     const std::vector<double>& weights) const = 0;

 protected:
  double clip_ = 0.0;
};

using RuleRegistry = Registry<AggregationRule>;
const RuleRegistry& aggregationRules();
std::unique_ptr<AggregationRule> makeRule(std::string_view spec);

}  // namespace starling::aggregation
