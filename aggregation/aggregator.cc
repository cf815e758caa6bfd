#include "aggregation/aggregator.h"

#include <cmath>
#include <sstream>

#include "aggregation/robust.h"
#include "core/error.h"
#include "core/options.h"

namespace starling::aggregation {
namespace cz = starling::compression;

namespace {

const std::set<std::string> kRules = {"fedavg", "median", "trimmed_mean", "krum", "multikrum", "bulyan"};

// Streaming FedAvg. With clipping, each update is decoded once into a scratch buffer (allocated
// once) to measure its norm; its payloads are then added scaled, so memory stays O(model).
class FedAvgAggregator final : public Aggregator {
 public:
  FedAvgAggregator(AggregatorOptions o, const ParamLayout& layout, const SharedFactors* shared)
      : Aggregator(std::move(o)), agg_(layout, shared) {
    if (opt_.clip_norm > 0) scratch_.resize(layout.numel());
  }
  uint64_t count() const override { return agg_.count(); }
  AggregateResult finish() const override {
    return {agg_.mean(), agg_.totalWeight(), agg_.count(), agg_.metricMeans()};
  }
  void reset(const SharedFactors* shared) override {
    if (shared) agg_ = PartialAggregate(agg_.layout(), shared);
    else agg_.reset();
  }
  size_t memoryBytes() const override { return agg_.bufferBytes() + scratch_.capacity() * sizeof(float); }
  PartialAggregate& partial() { return agg_; }

 protected:
  void doAdd(const Update& u, double weight) override {
    if (opt_.clip_norm <= 0) {
      agg_.add(u, weight);
      return;
    }
    agg_.validate(u, weight);
    cz::densifyUpdate(agg_.layout(), u.tensors, scratch_, &agg_.shared());
    agg_.addValidated(u, weight, clipUpdate(scratch_, opt_.clip_norm));
  }

 private:
  PartialAggregate agg_;
  std::vector<float> scratch_;
};

// Robust rules: every update is decoded to dense and kept until finish().
class RobustAggregator final : public Aggregator {
 public:
  RobustAggregator(AggregatorOptions o, const ParamLayout& layout, const SharedFactors* shared)
      : Aggregator(std::move(o)), layout_(layout) {
    if (shared) shared_ = *shared;
    else shared_.factors.resize(layout.size());
  }
  uint64_t count() const override { return updates_.size(); }
  AggregateResult finish() const override {
    STARLING_CHECK_ARG(!updates_.empty(), opt_.rule, ": the round has no updates to aggregate");
    AggregateResult r;
    r.count = updates_.size();
    for (double w : weights_) r.total_weight += w;
    if (opt_.rule == "median") r.delta = coordinateMedian(updates_);
    else if (opt_.rule == "trimmed_mean") r.delta = trimmedMean(updates_, opt_.beta);
    else if (opt_.rule == "krum") r.delta = krum(updates_, opt_.f);
    else if (opt_.rule == "multikrum") r.delta = multiKrum(updates_, weights_, opt_.f, opt_.m);
    else r.delta = bulyan(updates_, opt_.f);
    for (const auto& [k, v] : metric_sums_) r.metrics[k] = v / r.total_weight;
    return r;
  }
  void reset(const SharedFactors* shared) override {
    updates_.clear();
    weights_.clear();
    metric_sums_.clear();
    if (shared) shared_ = *shared;
  }
  size_t memoryBytes() const override {
    size_t b = 0;
    for (const auto& u : updates_) b += u.capacity() * sizeof(float);
    return b;
  }

 protected:
  void doAdd(const Update& u, double weight) override {
    cz::validateUpdate(layout_, u, &shared_);
    std::vector<float> dense(layout_.numel());
    cz::densifyUpdate(layout_, u.tensors, dense, &shared_);
    if (opt_.clip_norm > 0) clipUpdate(dense, opt_.clip_norm);
    updates_.push_back(std::move(dense));
    weights_.push_back(weight);
    for (const auto& m : u.metrics)
      if (std::isfinite(m.value)) metric_sums_[m.name] += weight * m.value;
  }

 private:
  ParamLayout layout_;
  SharedFactors shared_;
  DenseUpdates updates_;
  std::vector<double> weights_;
  std::map<std::string, double> metric_sums_;
};

}  // namespace

void AggregatorOptions::validate() const {
  if (!kRules.count(rule))
    STARLING_THROW(ConfigError, "unknown aggregation rule '", rule,
                   "' (registered: fedavg, median, trimmed_mean, krum, multikrum, bulyan)");
  if (!(clip_norm >= 0 && std::isfinite(clip_norm)))
    STARLING_THROW(ConfigError, "aggregator '", rule, "': clip must be finite and >= 0 (0 = off), got ", clip_norm);
  if (!(beta >= 0 && beta < 0.5)) STARLING_THROW(ConfigError, "aggregator '", rule, "': beta must be in [0, 0.5), got ", beta);
}

AggregatorOptions AggregatorOptions::parse(std::string_view text) {
  const Spec spec = Spec::parse(text, "aggregator");
  AggregatorOptions o;
  o.rule = spec.name;
  o.validate();
  OptionReader r(spec, "aggregator");
  o.weighting = r.choice("weight", "examples", {"examples", "uniform"}) == "examples"
                    ? AggregatorOptions::Weighting::kExamples
                    : AggregatorOptions::Weighting::kUniform;
  o.clip_norm = r.number("clip", o.clip_norm);
  std::string accepted = "weight, clip";
  if (o.rule == "trimmed_mean") {
    o.beta = r.number("beta", o.beta);
    accepted += ", beta";
  }
  if (o.rule == "krum" || o.rule == "multikrum" || o.rule == "bulyan") {
    o.f = r.count("f", o.f);
    accepted += ", f";
  }
  if (o.rule == "multikrum") {
    o.m = r.count("m", o.m);
    accepted += ", m";
  }
  r.finish(accepted);
  o.validate();
  return o;
}

double Aggregator::weightOf(const Update& u) const {
  if (opt_.weighting == AggregatorOptions::Weighting::kUniform) return 1.0;
  STARLING_CHECK_ARG(u.num_examples > 0, opt_.rule, ": update from client ", u.client_id,
                     " reports 0 examples, so its weight would be 0");
  return static_cast<double>(u.num_examples);
}

void Aggregator::add(const Update& u) {
  try {
    doAdd(u, weightOf(u));
  } catch (const InvalidArgument&) {
    ++rejected_;
    throw;
  }
}

std::unique_ptr<Aggregator> makeAggregator(const AggregatorOptions& o, const ParamLayout& layout,
                                           const SharedFactors* shared) {
  o.validate();
  if (o.streaming()) return std::make_unique<FedAvgAggregator>(o, layout, shared);
  return std::make_unique<RobustAggregator>(o, layout, shared);
}

std::unique_ptr<Aggregator> makeAggregator(std::string_view spec, const ParamLayout& layout,
                                           const SharedFactors* shared) {
  return makeAggregator(AggregatorOptions::parse(spec), layout, shared);
}

void CompletionPolicy::validate() const {
  if (min_results == 0) STARLING_THROW(ConfigError, "completion policy: min_results must be >= 1");
  if (!(min_completion_rate >= 0 && min_completion_rate <= 1))
    STARLING_THROW(ConfigError, "completion policy: min_completion_rate must be in [0, 1], got ", min_completion_rate);
}

RoundDecision decideRound(const CompletionPolicy& p, uint64_t results, uint64_t failures) {
  p.validate();
  std::ostringstream why;
  if (results < p.min_results) {
    why << "round skipped: " << results << " results, at least " << p.min_results << " required";
    return {false, why.str()};
  }
  const double rate = static_cast<double>(results) / static_cast<double>(results + failures);
  if (rate < p.min_completion_rate) {
    why << "round skipped: completion rate " << rate << " (" << results << " of " << results + failures
        << ") below the required " << p.min_completion_rate;
    return {false, why.str()};
  }
  return {true, ""};
}

}  // namespace starling::aggregation
