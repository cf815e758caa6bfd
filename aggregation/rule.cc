#include "aggregation/rule.h"

#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/finite.h"

namespace starling::aggregation {
namespace {

double readClip(OptionReader& r) {
  const double c = r.number("clip", 0.0);
  if (c < 0) STARLING_THROW(ConfigError, "aggregation rule: clip must be >= 0 (0 = off), got ", c);
  return c;
}

bool readWeighting(OptionReader& r) {
  return r.choice("weight", "examples", {"examples", "uniform"}) == "examples";
}

uint32_t readF(OptionReader& r) { return r.count("f", 0); }

std::string clipText(double c) {
  std::ostringstream os;
  os << ",clip=" << c;
  return os.str();
}

class FedAvg final : public AggregationRule {
 public:
  FedAvg(bool by_examples, double clip) : by_examples_(by_examples) { clip_ = clip; }
  std::string name() const override { return "fedavg"; }
  std::string spec() const override {
    return std::string("fedavg:weight=") + (by_examples_ ? "examples" : "uniform") +
           clipText(clip_);
  }
  bool streaming() const override { return true; }
  bool weightsByExamples() const override { return by_examples_; }
  std::vector<float> combine(const DenseUpdates&, const std::vector<double>&) const override {
    STARLING_THROW(InternalError, "fedavg aggregates by streaming sums, not by combine()");
  }

 private:
  bool by_examples_;
};

// A robust rule: a function of the dense updates (and weights, for multikrum).
class Robust final : public AggregationRule {
 public:
  enum class Kind { kMedian, kTrimmedMean, kKrum, kMultiKrum, kBulyan };
  Robust(Kind k, double clip, bool by_examples, double beta, uint32_t f, uint32_t m)
      : kind_(k), by_examples_(by_examples), beta_(beta), f_(f), m_(m) {
    clip_ = clip;
    if (kind_ == Kind::kTrimmedMean && !(beta_ >= 0 && beta_ < 0.5))
      STARLING_THROW(ConfigError, "aggregation rule 'trimmed_mean': beta must be in [0, 0.5), got ",
                     beta_);
  }
  std::string name() const override {
    switch (kind_) {
      case Kind::kMedian:
        return "median";
      case Kind::kTrimmedMean:
        return "trimmed_mean";
      case Kind::kKrum:
        return "krum";
      case Kind::kMultiKrum:
        return "multikrum";
      case Kind::kBulyan:
        return "bulyan";
    }
    return "?";
  }
  std::string spec() const override {
    std::ostringstream os;
    os << name() << ":";
    if (kind_ == Kind::kTrimmedMean) os << "beta=" << beta_ << ",";
    if (kind_ == Kind::kKrum || kind_ == Kind::kMultiKrum || kind_ == Kind::kBulyan)
      os << "f=" << f_ << ",";
    if (kind_ == Kind::kMultiKrum)
      os << "m=" << m_ << ",weight=" << (by_examples_ ? "examples" : "uniform") << ",";
    os << "clip=" << clip_;
    return os.str();
  }
  bool streaming() const override { return false; }
  bool weightsByExamples() const override { return kind_ == Kind::kMultiKrum && by_examples_; }
  std::vector<float> combine(const DenseUpdates& u, const std::vector<double>& w) const override {
    for (size_t i = 0; i < u.size(); ++i)
      STARLING_CHECK_ARG(allFinite(u[i]), name(), ": update ", i, " has non-finite values");
    std::vector<float> out;
    switch (kind_) {
      case Kind::kMedian:
        out = coordinateMedian(u);
        break;
      case Kind::kTrimmedMean:
        out = trimmedMean(u, beta_);
        break;
      case Kind::kKrum:
        out = krum(u, f_);
        break;
      case Kind::kMultiKrum:
        out = multiKrum(u, w, f_, m_);
        break;
      case Kind::kBulyan:
        out = bulyan(u, f_);
        break;
    }
    // What a rule selects or averages must itself be usable.
    STARLING_CHECK_ARG(allFinite(out), name(), ": the aggregate is not finite");
    return out;
  }

 private:
  Kind kind_;
  bool by_examples_;
  double beta_;
  uint32_t f_, m_;
};

}  // namespace

const RuleRegistry& aggregationRules() {
  using K = Robust::Kind;
  static const RuleRegistry kRegistry(
      "aggregation rule",
      {
          {"fedavg",
           "streaming weighted mean over compressed payloads; O(model) memory, decomposable",
           "weight=examples|uniform, clip=0 (L2 norm, 0 = off)",
           [](OptionReader& r) -> std::unique_ptr<AggregationRule> {
             const bool w = readWeighting(r);
             return std::make_unique<FedAvg>(w, readClip(r));
           }},
          {"median", "coordinate-wise median; ignores weights", "clip=0",
           [](OptionReader& r) -> std::unique_ptr<AggregationRule> {
             return std::make_unique<Robust>(K::kMedian, readClip(r), false, 0, 0, 0);
           }},
          {"trimmed_mean",
           "coordinate-wise mean after dropping int(beta n) at each end; ignores weights",
           "beta=0.2, clip=0",
           [](OptionReader& r) -> std::unique_ptr<AggregationRule> {
             const double beta = r.number("beta", 0.2);
             return std::make_unique<Robust>(K::kTrimmedMean, readClip(r), false, beta, 0, 0);
           }},
          {"krum", "the update with the lowest Krum score; needs n >= 2f + 3; ignores weights",
           "f=0, clip=0",
           [](OptionReader& r) -> std::unique_ptr<AggregationRule> {
             const uint32_t f = readF(r);
             return std::make_unique<Robust>(K::kKrum, readClip(r), false, 0, f, 0);
           }},
          {"multikrum", "weighted mean of the m lowest Krum scores; needs n >= 2f + 3",
           "f=0, m=0 (0 = n - f), weight=examples|uniform, clip=0",
           [](OptionReader& r) -> std::unique_ptr<AggregationRule> {
             const uint32_t f = readF(r);
             const uint32_t m = r.count("m", 0);
             const bool w = readWeighting(r);
             return std::make_unique<Robust>(K::kMultiKrum, readClip(r), w, 0, f, m);
           }},
          {"bulyan",
           "repeated Krum then a trimmed mean around the median; needs n >= 4f + 3; ignores "
           "weights",
           "f=0, clip=0",
           [](OptionReader& r) -> std::unique_ptr<AggregationRule> {
             const uint32_t f = readF(r);
             return std::make_unique<Robust>(K::kBulyan, readClip(r), false, 0, f, 0);
           }},
      });
  return kRegistry;
}

std::unique_ptr<AggregationRule> makeRule(std::string_view spec) {
  return aggregationRules().make(spec);
}

}  // namespace starling::aggregation
