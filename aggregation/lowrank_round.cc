#include "aggregation/lowrank_round.h"

#include "core/error.h"

namespace starling::aggregation {

SharedFactors orthogonalizedFactorSums(const PartialAggregate& agg) {
  const ParamLayout& layout = agg.layout();
  const bool was_q = agg.shared().fixed == SharedFactors::Side::kQ;
  SharedFactors next;
  next.fixed = was_q ? SharedFactors::Side::kP : SharedFactors::Side::kQ;
  next.factors.resize(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    auto f = agg.factorSum(t);
    if (f.empty()) continue;
    const size_t rows = was_q ? layout[t].rows() : layout[t].cols();
    next.factors[t].assign(f.begin(), f.end());
    compression::orthogonalize(next.factors[t].data(), rows, f.size() / rows);
  }
  return next;
}

PowerSgdRound::PowerSgdRound(const ParamLayout& layout, const SharedFactors& q) : layout_(layout), p_agg_(layout, &q) {
  STARLING_CHECK_ARG(q.fixed == SharedFactors::Side::kQ, "powersgd round: the shared factors must be Q");
}

void PowerSgdRound::addPhaseP(const Update& u, double weight) {
  STARLING_CHECK_ARG(!q_agg_, "powersgd round: phase P is already finished");
  p_agg_.add(u, weight);
}

const SharedFactors& PowerSgdRound::finishPhaseP() {
  STARLING_CHECK_ARG(!q_agg_, "powersgd round: phase P finished twice");
  STARLING_CHECK_ARG(!p_agg_.empty(), "powersgd round: no update arrived in phase P");
  p_hat_ = orthogonalizedFactorSums(p_agg_);
  q_agg_ = std::make_unique<PartialAggregate>(layout_, &p_hat_);
  return p_hat_;
}

const PartialAggregate& PowerSgdRound::phaseQ() const {
  STARLING_CHECK_ARG(q_agg_ != nullptr, "powersgd round: phase Q has not started");
  return *q_agg_;
}

void PowerSgdRound::addPhaseQ(const Update& u, double weight) {
  STARLING_CHECK_ARG(q_agg_ != nullptr, "powersgd round: phase Q before finishPhaseP()");
  q_agg_->add(u, weight);
}

std::vector<float> PowerSgdRound::finish(SharedFactors* next_q) const {
  STARLING_CHECK_ARG(q_agg_ && !q_agg_->empty(), "powersgd round: no update arrived in phase Q");
  // Factored tensors come from phase Q (whose dense slots are all zero: those tensors sent
  // nothing in phase Q); the dense tensors were complete after phase P.
  std::vector<float> out = q_agg_->mean();
  const auto p_sum = p_agg_.denseSum();
  const double inv_p = 1.0 / p_agg_.totalWeight();
  for (size_t t = 0; t < layout_.size(); ++t) {
    if (!q_agg_->factorSum(t).empty()) continue;
    const TensorSpec& spec = layout_[t];
    for (size_t i = spec.offset; i < spec.offset + spec.numel; ++i) out[i] = static_cast<float>(p_sum[i] * inv_p);
  }
  if (next_q) {
    next_q->fixed = SharedFactors::Side::kQ;
    next_q->factors.assign(layout_.size(), {});
    const float inv = static_cast<float>(1.0 / q_agg_->totalWeight());
    for (size_t t = 0; t < layout_.size(); ++t) {
      auto f = q_agg_->factorSum(t);
      next_q->factors[t].resize(f.size());
      for (size_t i = 0; i < f.size(); ++i) next_q->factors[t][i] = f[i] * inv;
    }
  }
  return out;
}

std::vector<float> AcpSgdRound::finish(SharedFactors* next) const {
  std::vector<float> out = agg_.mean();
  if (next) *next = orthogonalizedFactorSums(agg_);
  return out;
}

}  // namespace starling::aggregation
