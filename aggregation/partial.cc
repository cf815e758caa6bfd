#include "aggregation/partial.h"

#include <cmath>

#include "compression/compressor.h"
#include "compression/topk_select.h"
#include "core/error.h"
#include "core/half.h"
#include "core/overloaded.h"

namespace starling::aggregation {
namespace cz = starling::compression;

namespace {
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstFactorMap = Eigen::Map<const RowMatrix>;

uint64_t mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  return h;
}
}  // namespace

AggregateLayout::AggregateLayout(std::shared_ptr<const ParamLayout> model, uint64_t round,
                                 uint32_t phase, std::shared_ptr<const SharedFactors> shared,
                                 std::vector<std::string> metric_names, bool control)
    : model_(std::move(model)),
      round_(round),
      phase_(phase),
      shared_(std::move(shared)),
      metric_names_(std::move(metric_names)),
      control_(control) {
  STARLING_CHECK_ARG(model_ != nullptr, "aggregate layout: no model layout");
  const ParamLayout& m = *model_;
  if (!shared_) {
    auto none = std::make_shared<SharedFactors>();
    none->factors.resize(m.size());
    shared_ = std::move(none);
  }
  STARLING_CHECK_ARG(shared_->factors.size() == m.size(), "aggregate layout: shared factors cover ",
                     shared_->factors.size(), " tensors, the model has ", m.size());
  for (size_t i = 0; i < metric_names_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      STARLING_CHECK_ARG(metric_names_[i] != metric_names_[j], "aggregate layout: metric '",
                         metric_names_[i], "' declared twice");
  size_t off = 2 + 2 * metric_names_.size();  // weight, count, metric slots
  factor_offset_.assign(m.size(), 0);
  factor_size_.assign(m.size(), 0);
  for (size_t t = 0; t < m.size(); ++t) {
    const auto& f = shared_->factors[t];
    if (f.empty()) continue;
    const TensorSpec& spec = m[t];
    const bool fixed_q = shared_->fixed == SharedFactors::Side::kQ;
    const size_t fixed_dim = fixed_q ? spec.cols() : spec.rows();
    const size_t other_dim = fixed_q ? spec.rows() : spec.cols();
    STARLING_CHECK_ARG(f.size() % fixed_dim == 0 && f.size() / fixed_dim >= 1 &&
                           f.size() / fixed_dim <= std::min(spec.rows(), spec.cols()),
                       "aggregate layout: shared factor of '", spec.name, "' has ", f.size(),
                       " floats, not a factor of rank <= min(rows, cols) over ", fixed_dim);
    factor_offset_[t] = off;
    factor_size_[t] = other_dim * (f.size() / fixed_dim);
    off += factor_size_[t];
  }
  if (control_) {  // in the head: a sharded step all-reduces it whole
    control_offset_ = off;
    off += m.numel();
  }
  dense_offset_ = off;
  size_ = off + m.numel();
  shared_tag_ = cz::sharedFactorsTag(*shared_);
  uint64_t h = 0xcbf29ce484222325ull;
  h = mix(h, m.fingerprint());
  h = mix(h, round_);
  h = mix(h, phase_);
  h = mix(h, shared_tag_);
  h = mix(h, control_ ? 1 : 0);
  for (const auto& n : metric_names_) {
    h = mix(h, n.size());
    for (char c : n) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  }
  tag_ = h;
}

std::optional<size_t> AggregateLayout::metricIndex(std::string_view name) const {
  for (size_t i = 0; i < metric_names_.size(); ++i)
    if (metric_names_[i] == name) return i;
  return std::nullopt;
}

PartialAggregate::PartialAggregate(std::shared_ptr<const AggregateLayout> layout)
    : layout_(std::move(layout)) {
  STARLING_CHECK_ARG(layout_ != nullptr, "partial aggregate: no layout");
  buf_.assign(layout_->size(), 0.0f);
}

std::vector<std::span<const float>> PartialAggregate::factorSums() const {
  std::vector<std::span<const float>> out(layout_->model().size());
  for (size_t t = 0; t < out.size(); ++t) out[t] = factorSum(t);
  return out;
}

void PartialAggregate::addMetric(std::string_view name, double value, double weight) {
  const auto i = layout_->metricIndex(name);
  STARLING_CHECK_ARG(i.has_value(), "aggregation: no metric '", name, "' in this layout");
  STARLING_CHECK_ARG(std::isfinite(value) && std::isfinite(weight) && weight >= 0,
                     "aggregation: metric '", name, "' of ", value, " with weight ", weight);
  buf_[layout_->metricOffset(*i)] += static_cast<float>(weight * value);
  buf_[layout_->metricOffset(*i) + 1] += static_cast<float>(weight);
}

void PartialAggregate::addValidated(const UpdateView& u, double weight, double scale) {
  const AggregateLayout& L = *layout_;
  const ParamLayout& m = L.model();
  STARLING_CHECK_ARG(std::isfinite(weight) && weight > 0.0,
                     "aggregation: weight must be finite and > 0, got ", weight);
  STARLING_CHECK_ARG(std::isfinite(scale) && scale > 0.0 && scale <= 1.0,
                     "aggregation: scale must be in (0, 1], got ", scale);
  STARLING_CHECK_ARG(u.tensors.size() == m.size(), "aggregation: update carries ", u.tensors.size(),
                     " tensors, the model has ", m.size());
  // A tensor with a factor slot is aggregated in factor space only, so it must arrive as exactly
  // one factor of the slot's size; a one-factor payload needs a slot to go into.
  for (size_t t = 0; t < m.size(); ++t) {
    const auto* lr = std::get_if<cz::LowRankView>(&u.tensors[t]);
    const bool one = lr && lr->oneFactor();
    if (!L.hasFactorSlot(t)) {
      STARLING_CHECK_ARG(!one, "aggregation: tensor '", m[t].name, "' from client ",
                         u.header.client_id,
                         " is one low-rank factor, but this phase has no shared factor for it");
      continue;
    }
    STARLING_CHECK_ARG(one && (lr->p.empty() ? lr->q.size() : lr->p.size()) == L.factorSize(t) &&
                           lr->p.empty() == (L.shared().fixed == SharedFactors::Side::kP),
                       "aggregation: tensor '", m[t].name, "' from client ", u.header.client_id,
                       " must be one low-rank factor against this phase's shared factor, got ",
                       cz::encodingName(u.tensors[t]));
  }
  STARLING_CHECK_ARG(u.control.size() == (L.hasControl() ? m.numel() : 0),
                     "aggregation: update from client ", u.header.client_id, " carries ",
                     u.control.size(), " SCAFFOLD control values, this phase takes ",
                     L.hasControl() ? m.numel() : 0);
  addTensors(u.tensors, static_cast<float>(weight * scale));
  if (L.hasControl()) {  // unweighted and unclipped: c moves by the mean of the clients' changes
    float* c = buf_.data() + L.controlOffset();
    for (size_t i = 0; i < u.control.size(); ++i) c[i] += u.control[i];
  }
  for (const auto& metric : u.metrics) {
    if (auto i = L.metricIndex(metric.name)) {
      buf_[L.metricOffset(*i)] += static_cast<float>(weight * metric.value);
      buf_[L.metricOffset(*i) + 1] += static_cast<float>(weight);
    }
  }
  buf_[L.weightOffset()] += static_cast<float>(weight);
  buf_[L.countOffset()] += 1.0f;
}

void PartialAggregate::addTensors(std::span<const PayloadView> tensors, float w) {
  const AggregateLayout& L = *layout_;
  const ParamLayout& m = L.model();
  std::span<float> sum(buf_.data() + L.denseOffset(), m.numel());
  for (size_t t = 0; t < m.size(); ++t) {
    if (L.hasFactorSlot(t)) {  // a one-factor payload, checked by the caller: add in factor space
      const auto& lr = std::get<cz::LowRankView>(tensors[t]);
      const auto f = lr.p.empty() ? lr.q : lr.p;
      float* s = buf_.data() + L.factorOffset(t);
      for (size_t i = 0; i < f.size(); ++i) s[i] += w * f[i];
      continue;
    }
    cz::accumulatePayload(tensors[t], m[t], m.slice(sum, t), w, &L.shared(), t);
  }
}

void PartialAggregate::merge(const PartialAggregate& other) {
  STARLING_CHECK_ARG(other.layout_ == layout_ || other.layout_->tag() == layout_->tag(),
                     "aggregation: cannot merge partial aggregates of another model, round, phase, "
                     "shared factors or "
                     "metric set");
  const float* o = other.buf_.data();
  float* b = buf_.data();
  for (size_t i = 0; i < buf_.size(); ++i) b[i] += o[i];
}

void PartialAggregate::mergeValidated(const PartialView& p, double scale) {
  const AggregateLayout& L = *layout_;
  const ParamLayout& m = L.model();
  STARLING_CHECK_ARG(std::isfinite(scale) && scale > 0.0 && scale <= 1.0,
                     "aggregation: scale must be in (0, 1], got ", scale);
  STARLING_CHECK_ARG(p.tensors.size() == m.size(), "aggregation: partial carries ",
                     p.tensors.size(), " tensors, the model has ", m.size());
  for (size_t t = 0; t < m.size(); ++t) {
    const auto* lr = std::get_if<cz::LowRankView>(&p.tensors[t]);
    if (L.hasFactorSlot(t))
      STARLING_CHECK_ARG(
          lr && lr->oneFactor() && (lr->p.empty() ? lr->q.size() : lr->p.size()) == L.factorSize(t),
          "aggregation: partial's tensor '", m[t].name, "' must be its factor sum");
    else
      STARLING_CHECK_ARG(!lr, "aggregation: partial's tensor '", m[t].name,
                         "' must be a dense or sparse sum");
  }
  STARLING_CHECK_ARG(p.control.size() == (L.hasControl() ? m.numel() : 0),
                     "aggregation: partial carries ", p.control.size(),
                     " SCAFFOLD control values, this phase takes ", L.hasControl() ? m.numel() : 0);
  addTensors(p.tensors, static_cast<float>(scale));
  if (L.hasControl()) {
    float* c = buf_.data() + L.controlOffset();
    for (size_t i = 0; i < p.control.size(); ++i) c[i] += p.control[i];
  }
  for (const auto& metric : p.metrics) {
    if (auto i = L.metricIndex(metric.name)) {
      buf_[L.metricOffset(*i)] += static_cast<float>(metric.weighted_sum);
      buf_[L.metricOffset(*i) + 1] += static_cast<float>(metric.weight);
    }
  }
  buf_[L.weightOffset()] += static_cast<float>(p.header.total_weight);
  buf_[L.countOffset()] += static_cast<float>(p.header.count);
}

void PartialAggregate::meanInto(std::span<float> out, bool with_factors, bool add) const {
  const AggregateLayout& L = *layout_;
  const ParamLayout& m = L.model();
  STARLING_CHECK_ARG(count() > 0 && totalWeight() > 0,
                     "aggregation: the phase has no updates to average");
  STARLING_CHECK_ARG(out.size() == m.numel(), "aggregation: output has ", out.size(),
                     " floats, expected ", m.numel());
  const auto inv = static_cast<float>(1.0 / totalWeight());
  const float* s = buf_.data() + L.denseOffset();
  if (add)
    for (size_t i = 0; i < out.size(); ++i) out[i] += s[i] * inv;
  else
    for (size_t i = 0; i < out.size(); ++i) out[i] = s[i] * inv;
  if (!with_factors) return;
  const SharedFactors& shared = L.shared();
  for (size_t t = 0; t < m.size(); ++t) {
    if (!L.hasFactorSlot(t)) continue;
    const TensorSpec& spec = m[t];
    const auto& f = shared.factors[t];
    auto mat = m.matrix(out, t);
    const float* fs = buf_.data() + L.factorOffset(t);
    if (shared.fixed == SharedFactors::Side::kQ) {
      const auto r = static_cast<Eigen::Index>(f.size() / spec.cols());
      mat.noalias() += inv * (ConstFactorMap(fs, spec.rows(), r) *
                              ConstFactorMap(f.data(), spec.cols(), r).transpose());
    } else {
      const auto r = static_cast<Eigen::Index>(f.size() / spec.rows());
      mat.noalias() += inv * (ConstFactorMap(f.data(), spec.rows(), r) *
                              ConstFactorMap(fs, spec.cols(), r).transpose());
    }
  }
}

std::vector<float> PartialAggregate::mean(bool with_factors) const {
  std::vector<float> out(layout_->numel());
  meanInto(out, with_factors);
  return out;
}

std::map<std::string, double> PartialAggregate::metricMeans() const {
  std::map<std::string, double> out;
  const AggregateLayout& L = *layout_;
  for (size_t i = 0; i < L.metricNames().size(); ++i) {
    const double w = buf_[L.metricOffset(i) + 1];
    if (w > 0) out[L.metricNames()[i]] = buf_[L.metricOffset(i)] / w;
  }
  return out;
}

PartialMessage PartialAggregate::exportHeader() const {
  const AggregateLayout& L = *layout_;
  PartialMessage msg;
  msg.header = {L.model().fingerprint(), L.round(), L.phase(),
                L.sharedTag(),           count(),   totalWeight()};
  for (size_t i = 0; i < L.metricNames().size(); ++i) {
    const double w = buf_[L.metricOffset(i) + 1];
    if (w > 0) msg.metrics.push_back({L.metricNames()[i], buf_[L.metricOffset(i)], w});
  }
  msg.tensors.reserve(L.model().size());
  const auto control = controlSum();
  msg.control.assign(control.begin(), control.end());
  return msg;
}

namespace {
cz::Payload factorPayload(const TensorSpec& spec, const SharedFactors& shared,
                          std::span<const float> fsum) {
  cz::LowRank l;
  l.rows = static_cast<uint32_t>(spec.rows());
  l.cols = static_cast<uint32_t>(spec.cols());
  if (shared.fixed == SharedFactors::Side::kQ) {
    l.rank = static_cast<uint32_t>(fsum.size() / spec.rows());
    l.p.assign(fsum.begin(), fsum.end());
  } else {
    l.rank = static_cast<uint32_t>(fsum.size() / spec.cols());
    l.q.assign(fsum.begin(), fsum.end());
  }
  return l;
}
}  // namespace

PartialMessage PartialAggregate::exportDense() const {
  const AggregateLayout& L = *layout_;
  const ParamLayout& m = L.model();
  PartialMessage msg = exportHeader();
  const auto sum = denseSum();
  for (size_t t = 0; t < m.size(); ++t) {
    if (L.hasFactorSlot(t)) {
      msg.tensors.push_back(factorPayload(m[t], L.shared(), factorSum(t)));
      continue;
    }
    auto v = m.slice(sum, t);
    msg.tensors.emplace_back(cz::DenseF32{{v.begin(), v.end()}});
  }
  return msg;
}

PartialMessage PartialAggregate::exportSparse(double density, std::vector<float>& residual) const {
  STARLING_CHECK_ARG(density > 0.0 && density <= 1.0,
                     "aggregation: export density must be in (0, 1], got ", density);
  const AggregateLayout& L = *layout_;
  const ParamLayout& m = L.model();
  if (residual.empty()) residual.assign(m.numel(), 0.0f);
  STARLING_CHECK_ARG(residual.size() == m.numel(), "aggregation: residual has ", residual.size(),
                     " floats, expected ", m.numel());
  PartialMessage msg = exportHeader();
  const auto sum = denseSum();
  std::vector<uint32_t> idx;
  for (size_t t = 0; t < m.size(); ++t) {
    if (L.hasFactorSlot(t)) {
      msg.tensors.push_back(factorPayload(m[t], L.shared(), factorSum(t)));
      continue;
    }
    auto r = m.slice(std::span<float>(residual), t);
    auto v = m.slice(sum, t);
    for (size_t i = 0; i < r.size(); ++i) r[i] += v[i];
    cz::selectTopK(r, cz::countForDensity(density, r.size()), idx);
    cz::Sparse sp;
    sp.indices = idx;
    sp.values.resize(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) {
      sp.values[i] = r[idx[i]];
      r[idx[i]] = 0.0f;
    }
    msg.tensors.emplace_back(std::move(sp));
  }
  return msg;
}

void PartialAggregate::reset() { std::fill(buf_.begin(), buf_.end(), 0.0f); }

}  // namespace starling::aggregation
