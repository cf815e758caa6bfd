#include "aggregation/partial.h"

#include <cmath>
#include <cstring>

#include "compression/compressor.h"
#include "compression/topk_select.h"
#include "core/error.h"

namespace starling::aggregation {
namespace cz = starling::compression;

namespace {
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstFactorMap = Eigen::Map<const RowMatrix>;

void checkWeight(double w) {
  STARLING_CHECK_ARG(std::isfinite(w) && w > 0.0, "aggregation: weight must be finite and > 0, got ", w);
}
}  // namespace

uint64_t sharedFactorsTag(const SharedFactors& s) {
  uint64_t h = 0xcbf29ce484222325ull ^ static_cast<uint64_t>(s.fixed);
  for (const auto& f : s.factors) {
    h = (h ^ f.size()) * 0x100000001b3ull;
    for (float x : f) {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      h = (h ^ u) * 0x100000001b3ull;
    }
  }
  return h;
}

PartialAggregate::PartialAggregate(const ParamLayout& layout, const SharedFactors* shared)
    : layout_(layout), sum_(layout.numel(), 0.0f), factor_sums_(layout.size()) {
  if (shared) {
    STARLING_CHECK_ARG(shared->factors.size() == layout.size(), "aggregation: shared factors cover ",
                       shared->factors.size(), " tensors, the layout has ", layout.size());
    shared_ = *shared;
    for (size_t t = 0; t < layout.size(); ++t) {
      const auto& f = shared_.factors[t];
      if (f.empty()) continue;
      const TensorSpec& spec = layout[t];
      const size_t fixed_dim = shared_.fixed == SharedFactors::Side::kQ ? spec.cols() : spec.rows();
      const size_t other_dim = shared_.fixed == SharedFactors::Side::kQ ? spec.rows() : spec.cols();
      STARLING_CHECK_ARG(f.size() % fixed_dim == 0, "aggregation: shared factor of '", spec.name, "' has ",
                         f.size(), " floats, not a multiple of ", fixed_dim);
      factor_sums_[t].assign(other_dim * (f.size() / fixed_dim), 0.0f);
    }
  } else {
    shared_.factors.resize(layout.size());
  }
  shared_tag_ = sharedFactorsTag(shared_);
}

void PartialAggregate::checkUpdate(const Update& u, double weight) const {
  checkWeight(weight);
  cz::checkUpdateHeader(layout_, u);
  // A tensor with a shared factor this round is aggregated in factor space only, so it must
  // arrive as exactly one factor of the right size (which keeps exportDense exact).
  // Conversely a one-factor payload needs a factor sum to go into: O(1) per tensor, so that
  // addValidated stays memory-safe even if its caller validated against other shared factors.
  for (size_t t = 0; t < layout_.size(); ++t) {
    const auto* lr = std::get_if<cz::LowRank>(&u.tensors[t]);
    const bool one = lr && (lr->p.empty() != lr->q.empty());
    if (factor_sums_[t].empty()) {
      STARLING_CHECK_ARG(!one, "aggregation: tensor '", layout_[t].name, "' from client ", u.client_id,
                         " is one low-rank factor, but this round has no shared factor for it");
      continue;
    }
    STARLING_CHECK_ARG(one && (lr->p.empty() ? lr->q.size() : lr->p.size()) == factor_sums_[t].size(),
                       "aggregation: tensor '", layout_[t].name, "' from client ", u.client_id,
                       " must be one low-rank factor against this round's shared factor, got ",
                       cz::encodingName(u.tensors[t]));
  }
}

void PartialAggregate::validate(const Update& u, double weight) const {
  checkUpdate(u, weight);
  cz::validateUpdate(layout_, u, &shared_);
}

void PartialAggregate::checkScale(double scale) {
  STARLING_CHECK_ARG(std::isfinite(scale) && scale > 0.0 && scale <= 1.0, "aggregation: scale must be in (0, 1], got ",
                     scale);
}

void PartialAggregate::add(const Update& u, double weight, double scale) {
  checkScale(scale);
  validate(u, weight);
  addChecked(u, weight, scale);
}

void PartialAggregate::addValidated(const Update& u, double weight, double scale) {
  checkScale(scale);
  checkUpdate(u, weight);
  addChecked(u, weight, scale);
}

void PartialAggregate::accumulate(const Payload& p, size_t t, float w) {
  if (const auto* lr = std::get_if<cz::LowRank>(&p); lr && (lr->p.empty() != lr->q.empty())) {
    // One factor: add in factor space (checkUpdate / merge checked side and size).
    const auto& f = lr->p.empty() ? lr->q : lr->p;
    float* s = factor_sums_[t].data();
    for (size_t i = 0; i < f.size(); ++i) s[i] += w * f[i];
    return;
  }
  cz::accumulatePayload(p, layout_[t], layout_.slice(std::span<float>(sum_), t), w, &shared_, t);
}

void PartialAggregate::addChecked(const Update& u, double weight, double scale) {
  const float w = static_cast<float>(weight * scale);
  for (size_t t = 0; t < layout_.size(); ++t) accumulate(u.tensors[t], t, w);
  total_weight_ += weight;
  ++count_;
  for (const auto& m : u.metrics)
    if (std::isfinite(m.value)) metric_sums_[m.name] += weight * m.value;
}

void PartialAggregate::merge(const PartialAggregate& other) {
  STARLING_CHECK_ARG(other.layout_.fingerprint() == layout_.fingerprint(),
                     "aggregation: cannot merge partial aggregates of different models");
  STARLING_CHECK_ARG(other.shared_tag_ == shared_tag_,
                     "aggregation: cannot merge partial aggregates made with different shared factors (rounds)");
  for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += other.sum_[i];
  for (size_t t = 0; t < factor_sums_.size(); ++t)
    for (size_t i = 0; i < factor_sums_[t].size(); ++i) factor_sums_[t][i] += other.factor_sums_[t][i];
  total_weight_ += other.total_weight_;
  count_ += other.count_;
  for (const auto& [k, v] : other.metric_sums_) metric_sums_[k] += v;
}

void PartialAggregate::merge(const AggregateSummary& s) {
  STARLING_CHECK_ARG(s.layout_fingerprint == layout_.fingerprint(), "aggregation: summary is for another model");
  STARLING_CHECK_ARG(s.shared_tag == shared_tag_, "aggregation: summary was made with other shared factors");
  STARLING_CHECK_ARG(s.sum.size() == layout_.size(), "aggregation: summary carries ", s.sum.size(),
                     " tensors, the model has ", layout_.size());
  STARLING_CHECK_ARG(std::isfinite(s.total_weight) && s.total_weight >= 0.0 && (s.count > 0) == (s.total_weight > 0.0),
                     "aggregation: summary has total weight ", s.total_weight, " for ", s.count, " updates");
  for (size_t t = 0; t < layout_.size(); ++t) {
    cz::validatePayload(s.sum[t], layout_[t], &shared_, t);
    const auto* lr = std::get_if<cz::LowRank>(&s.sum[t]);
    const bool one = lr && (lr->p.empty() != lr->q.empty());
    STARLING_CHECK_ARG(one == !factor_sums_[t].empty(), "aggregation: summary tensor '", layout_[t].name,
                       "' does not match this round's factored tensors");
  }
  for (size_t t = 0; t < layout_.size(); ++t) accumulate(s.sum[t], t, 1.0f);
  total_weight_ += s.total_weight;
  count_ += s.count;
  for (const auto& [k, v] : s.metric_sums) metric_sums_[k] += v;
}

void PartialAggregate::meanInto(std::span<float> out) const {
  STARLING_CHECK_ARG(count_ > 0, "aggregation: the round has no updates to average");
  STARLING_CHECK_ARG(out.size() == sum_.size(), "aggregation: output has ", out.size(), " floats, expected ",
                     sum_.size());
  const float inv = static_cast<float>(1.0 / total_weight_);
  for (size_t i = 0; i < sum_.size(); ++i) out[i] = sum_[i] * inv;
  for (size_t t = 0; t < layout_.size(); ++t) {
    if (factor_sums_[t].empty()) continue;
    const TensorSpec& spec = layout_[t];
    const auto& f = shared_.factors[t];
    auto m = layout_.matrix(out, t);
    if (shared_.fixed == SharedFactors::Side::kQ) {
      const Eigen::Index r = static_cast<Eigen::Index>(f.size() / spec.cols());
      m.noalias() += inv * (ConstFactorMap(factor_sums_[t].data(), spec.rows(), r) *
                            ConstFactorMap(f.data(), spec.cols(), r).transpose());
    } else {
      const Eigen::Index r = static_cast<Eigen::Index>(f.size() / spec.rows());
      m.noalias() += inv * (ConstFactorMap(f.data(), spec.rows(), r) *
                            ConstFactorMap(factor_sums_[t].data(), spec.cols(), r).transpose());
    }
  }
}

std::vector<float> PartialAggregate::mean() const {
  std::vector<float> out(sum_.size());
  meanInto(out);
  return out;
}

std::map<std::string, double> PartialAggregate::metricMeans() const {
  std::map<std::string, double> out;
  if (total_weight_ <= 0.0) return out;
  for (const auto& [k, v] : metric_sums_) out[k] = v / total_weight_;
  return out;
}

namespace {
cz::Payload factorPayload(const TensorSpec& spec, const SharedFactors& shared, const std::vector<float>& fsum) {
  cz::LowRank l;
  l.rows = static_cast<uint32_t>(spec.rows());
  l.cols = static_cast<uint32_t>(spec.cols());
  if (shared.fixed == SharedFactors::Side::kQ) {
    l.rank = static_cast<uint32_t>(fsum.size() / spec.rows());
    l.p = fsum;
  } else {
    l.rank = static_cast<uint32_t>(fsum.size() / spec.cols());
    l.q = fsum;
  }
  return l;
}
}  // namespace

AggregateSummary PartialAggregate::exportDense() const {
  AggregateSummary s{layout_.fingerprint(), shared_tag_, {}, total_weight_, count_, metric_sums_};
  s.sum.reserve(layout_.size());
  for (size_t t = 0; t < layout_.size(); ++t) {
    auto v = layout_.slice(std::span<const float>(sum_), t);
    s.sum.emplace_back(cz::DenseF32{{v.begin(), v.end()}});
  }
  // A tensor with a shared factor only ever receives factors (checkUpdate), so its dense slot is
  // zero and the factor sum alone describes it.
  for (size_t t = 0; t < layout_.size(); ++t)
    if (!factor_sums_[t].empty()) s.sum[t] = factorPayload(layout_[t], shared_, factor_sums_[t]);
  return s;
}

AggregateSummary PartialAggregate::exportSparse(double density, std::vector<float>& residual) const {
  STARLING_CHECK_ARG(density > 0.0 && density <= 1.0, "aggregation: export density must be in (0, 1], got ", density);
  if (residual.empty()) residual.assign(sum_.size(), 0.0f);
  STARLING_CHECK_ARG(residual.size() == sum_.size(), "aggregation: residual has ", residual.size(),
                     " floats, expected ", sum_.size());
  AggregateSummary s{layout_.fingerprint(), shared_tag_, {}, total_weight_, count_, metric_sums_};
  s.sum.reserve(layout_.size());
  std::vector<uint32_t> idx;
  for (size_t t = 0; t < layout_.size(); ++t) {
    if (!factor_sums_[t].empty()) {
      s.sum.push_back(factorPayload(layout_[t], shared_, factor_sums_[t]));
      continue;
    }
    auto r = layout_.slice(std::span<float>(residual), t);
    auto v = layout_.slice(std::span<const float>(sum_), t);
    for (size_t i = 0; i < r.size(); ++i) r[i] += v[i];
    cz::selectTopK(r, cz::countForDensity(density, r.size()), idx);
    cz::Sparse sp;
    sp.indices = idx;
    sp.values.resize(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) {
      sp.values[i] = r[idx[i]];
      r[idx[i]] = 0.0f;
    }
    s.sum.emplace_back(std::move(sp));
  }
  return s;
}

size_t PartialAggregate::bufferCount() const {
  size_t n = 1;
  for (const auto& f : factor_sums_) n += !f.empty();
  return n;
}

size_t PartialAggregate::bufferBytes() const {
  size_t b = sum_.capacity() * sizeof(float);
  for (const auto& f : factor_sums_) b += f.capacity() * sizeof(float);
  return b;
}

void PartialAggregate::reset() {
  std::fill(sum_.begin(), sum_.end(), 0.0f);
  for (auto& f : factor_sums_) std::fill(f.begin(), f.end(), 0.0f);
  total_weight_ = 0.0;
  count_ = 0;
  metric_sums_.clear();
}

}  // namespace starling::aggregation
