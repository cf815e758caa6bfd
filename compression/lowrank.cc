#include "compression/lowrank.h"

#include <cmath>
#include <sstream>

#include <Eigen/QR>

#include "core/error.h"
#include "core/finite.h"
#include "core/rng.h"

namespace starling::compression {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using FactorMap = Eigen::Map<RowMatrix>;
using ConstFactorMap = Eigen::Map<const RowMatrix>;

std::string optionText(const char* name, const LowRankOptions& o, bool with_warm) {
  std::ostringstream os;
  os << name << ":rank=" << o.rank << ",min_rate=" << o.min_compression_rate
     << ",ef=" << (o.error_feedback ? "true" : "false");
  if (with_warm) os << ",warm_start=" << (o.warm_start ? "true" : "false");
  return os.str();
}

DenseF32 denseAndClear(std::span<float> v, bool clear) {
  DenseF32 d{{v.begin(), v.end()}};
  if (clear) std::fill(v.begin(), v.end(), 0.0f);
  return d;
}

std::vector<float> seededFactor(uint64_t run_seed, size_t tensor_index, size_t dim, uint32_t r) {
  RngStream rng(StreamKey{run_seed, 0, kAnyClient, StreamPurpose::kLowRankInit, tensor_index});
  std::vector<float> f(dim * r);
  for (float& x : f) x = static_cast<float>(rng.normal());
  orthogonalize(f.data(), dim, r);
  return f;
}

}  // namespace

void LowRankOptions::validate() const {
  if (rank == 0) STARLING_THROW(ConfigError, "low-rank: rank must be >= 1");
  if (!(min_compression_rate >= 1.0) || !std::isfinite(min_compression_rate))
    STARLING_THROW(ConfigError, "low-rank: min_rate must be a finite number >= 1, got ", min_compression_rate);
}

uint32_t effectiveRank(const TensorSpec& t, uint32_t rank) {
  return static_cast<uint32_t>(std::min<size_t>({rank, t.rows(), t.cols()}));
}

bool lowRankCompressible(const TensorSpec& t, uint32_t rank, double min_rate) {
  if (t.shape.size() < 2) return false;
  const double r = effectiveRank(t, rank);
  return (static_cast<double>(t.rows()) + static_cast<double>(t.cols())) * r * min_rate <
         static_cast<double>(t.rows()) * static_cast<double>(t.cols());
}

void orthogonalize(float* data, size_t rows, size_t rank) {
  FactorMap m(data, static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(rank));
  if (rank <= 2) {
    // Modified Gram-Schmidt. A column left with a tiny fraction of its own norm after removing
    // the earlier ones is dependent on them: zero it rather than normalise round-off noise.
    float original[2];
    for (Eigen::Index c = 0; c < m.cols(); ++c) original[c] = m.col(c).norm();
    for (Eigen::Index c = 0; c < m.cols(); ++c) {
      const float norm = m.col(c).norm();
      if (norm <= 1e-30f || norm <= original[c] * 1e-5f) {
        m.col(c).setZero();
        continue;
      }
      m.col(c) /= norm;
      for (Eigen::Index d = c + 1; d < m.cols(); ++d) m.col(d) -= m.col(c).dot(m.col(d)) * m.col(c);
    }
    return;
  }
  Eigen::MatrixXf a = m;
  Eigen::HouseholderQR<Eigen::MatrixXf> qr(a);
  Eigen::MatrixXf q = qr.householderQ() * Eigen::MatrixXf::Identity(a.rows(), a.cols());
  // A zero column of the input gives an arbitrary unit column in Q; keep the contract that a
  // dependent column stays zero by checking R's diagonal.
  const auto& r = qr.matrixQR();
  for (Eigen::Index c = 0; c < q.cols(); ++c) {
    const float original = a.col(c).norm();
    if (std::fabs(r(c, c)) <= 1e-30f || std::fabs(r(c, c)) <= original * 1e-5f) q.col(c).setZero();
  }
  m = q;
}

SharedFactors initialSharedFactors(const ParamLayout& layout, const LowRankOptions& o, uint64_t run_seed) {
  o.validate();
  SharedFactors s;
  s.fixed = SharedFactors::Side::kQ;
  s.factors.resize(layout.size());
  for (size_t t = 0; t < layout.size(); ++t)
    if (lowRankCompressible(layout[t], o.rank, o.min_compression_rate))
      s.factors[t] = seededFactor(run_seed, t, layout[t].cols(), effectiveRank(layout[t], o.rank));
  return s;
}

void checkSharedFactors(const ParamLayout& layout, const LowRankOptions& o, const SharedFactors* shared,
                        SharedFactors::Side side, const char* who) {
  const char* side_name = side == SharedFactors::Side::kQ ? "Q" : "P";
  STARLING_CHECK_ARG(shared != nullptr, who, ": this round needs the shared ", side_name, " factors");
  STARLING_CHECK_ARG(shared->fixed == side, who, ": shared factors hold the wrong side (expected ", side_name, ")");
  STARLING_CHECK_ARG(shared->factors.size() == layout.size(), who, ": shared factors cover ", shared->factors.size(),
                     " tensors, the layout has ", layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    size_t want = 0;
    if (lowRankCompressible(spec, o.rank, o.min_compression_rate))
      want = (side == SharedFactors::Side::kQ ? spec.cols() : spec.rows()) * effectiveRank(spec, o.rank);
    STARLING_CHECK_ARG(shared->factors[t].size() == want, who, ": shared ", side_name, " factor of tensor '",
                       spec.name, "' has ", shared->factors[t].size(), " floats, expected ", want);
  }
}

// ---------------------------------------------------------------- PowerSGD

PowerSgdCompressor::PowerSgdCompressor(LowRankOptions o) : opt_(o) { opt_.validate(); }

std::string PowerSgdCompressor::spec() const { return optionText("powersgd", opt_, true); }

void PowerSgdCompressor::checkRound(const ParamLayout& /*layout*/, const ClientState& state,
                                    const RoundContext& /*ctx*/) const {
  STARLING_CHECK_ARG(state.pending_phase == 0, "powersgd: compress() called between phase P and phase Q");
}

void PowerSgdCompressor::initState(const ParamLayout& layout, ClientState& state) const {
  state.factors.assign(layout.size(), {});
  // The two-phase form keeps M between the phases in the residual buffer, EF or not.
  if (state.residual.empty()) state.residual.assign(layout.numel(), 0.0f);
}

std::vector<Payload> PowerSgdCompressor::compressAccumulated(const ParamLayout& layout, std::span<float> acc,
                                                             ClientState& state, const RoundContext& ctx) const {
  if (state.factors.size() != layout.size()) state.factors.assign(layout.size(), {});
  std::vector<Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    if (!lowRankCompressible(spec, opt_.rank, opt_.min_compression_rate)) {
      out.emplace_back(denseAndClear(layout.slice(acc, t), opt_.error_feedback));
      continue;
    }
    const uint32_t r = effectiveRank(spec, opt_.rank);
    auto m = layout.matrix(acc, t);
    LowRank l{static_cast<uint32_t>(spec.rows()), static_cast<uint32_t>(spec.cols()), r, {}, {}};
    std::vector<float>& warm = state.factors[t];
    if (!opt_.warm_start || warm.size() != spec.cols() * r) warm = seededFactor(ctx.run_seed, t, spec.cols(), r);
    l.p.resize(spec.rows() * r);
    FactorMap p(l.p.data(), spec.rows(), r);
    p.noalias() = m * ConstFactorMap(warm.data(), spec.cols(), r);
    orthogonalize(l.p.data(), spec.rows(), r);
    l.q.resize(spec.cols() * r);
    FactorMap q(l.q.data(), spec.cols(), r);
    q.noalias() = m.transpose() * p;
    if (opt_.error_feedback) m.noalias() -= p * q.transpose();
    if (opt_.warm_start) warm = l.q;
    out.emplace_back(std::move(l));
  }
  return out;
}

std::vector<Payload> PowerSgdCompressor::compressPhaseP(const ParamLayout& layout, std::span<const float> update,
                                                        ClientState& state, const RoundContext& ctx) const {
  STARLING_CHECK_ARG(update.size() == layout.numel(), "powersgd phase P: update has ", update.size(),
                     " floats, the layout needs ", layout.numel());
  STARLING_CHECK_ARG(state.layout_fingerprint == layout.fingerprint() && state.residual.size() == layout.numel(),
                     "powersgd phase P: client state belongs to another model");
  STARLING_CHECK_ARG(state.pending_phase == 0, "powersgd: phase P called twice without phase Q");
  checkSharedFactors(layout, opt_, ctx.shared, SharedFactors::Side::kQ, "powersgd phase P");
  if (!allFinite(update))
    for (size_t i = 0; i < update.size(); ++i)
      STARLING_CHECK_ARG(std::isfinite(update[i]), "powersgd: update value ", i, " is not finite");
  float* acc = state.residual.data();
  for (size_t i = 0; i < update.size(); ++i) acc[i] = opt_.error_feedback ? acc[i] + update[i] : update[i];
  std::span<float> accs(state.residual);
  std::vector<Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    const auto& qf = ctx.shared->factors[t];
    if (qf.empty()) {
      out.emplace_back(denseAndClear(layout.slice(accs, t), true));
      continue;
    }
    const uint32_t r = effectiveRank(spec, opt_.rank);
    LowRank l{static_cast<uint32_t>(spec.rows()), static_cast<uint32_t>(spec.cols()), r, {}, {}};
    l.p.resize(spec.rows() * r);
    FactorMap(l.p.data(), spec.rows(), r).noalias() =
        layout.matrix(accs, t) * ConstFactorMap(qf.data(), spec.cols(), r);
    out.emplace_back(std::move(l));
  }
  state.pending_phase = 1;
  return out;
}

std::vector<Payload> PowerSgdCompressor::compressPhaseQ(const ParamLayout& layout, ClientState& state,
                                                        const RoundContext& ctx) const {
  STARLING_CHECK_ARG(state.pending_phase == 1, "powersgd: phase Q called without phase P");
  STARLING_CHECK_ARG(state.layout_fingerprint == layout.fingerprint() && state.residual.size() == layout.numel(),
                     "powersgd phase Q: client state belongs to another model");
  checkSharedFactors(layout, opt_, ctx.shared, SharedFactors::Side::kP, "powersgd phase Q");
  std::span<float> accs(state.residual);
  std::vector<Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    const auto& pf = ctx.shared->factors[t];
    if (pf.empty()) {
      out.emplace_back(Sparse{});  // sent whole in phase P
      continue;
    }
    const uint32_t r = effectiveRank(spec, opt_.rank);
    auto m = layout.matrix(accs, t);
    ConstFactorMap p(pf.data(), spec.rows(), r);
    LowRank l{static_cast<uint32_t>(spec.rows()), static_cast<uint32_t>(spec.cols()), r, {}, {}};
    l.q.resize(spec.cols() * r);
    FactorMap q(l.q.data(), spec.cols(), r);
    q.noalias() = m.transpose() * p;
    if (opt_.error_feedback) {
      m.noalias() -= p * q.transpose();
    } else {
      m.setZero();
    }
    out.emplace_back(std::move(l));
  }
  state.pending_phase = 0;
  return out;
}

// ---------------------------------------------------------------- ACP-SGD

AcpSgdCompressor::AcpSgdCompressor(LowRankOptions o) : opt_(o) { opt_.validate(); }

std::string AcpSgdCompressor::spec() const { return optionText("acpsgd", opt_, false); }

void AcpSgdCompressor::checkRound(const ParamLayout& layout, const ClientState& /*state*/,
                                  const RoundContext& ctx) const {
  STARLING_CHECK_ARG(ctx.shared != nullptr, "acpsgd: the round context carries no shared factors");
  checkSharedFactors(layout, opt_, ctx.shared, ctx.shared->fixed, "acpsgd");
}

std::vector<Payload> AcpSgdCompressor::compressAccumulated(const ParamLayout& layout, std::span<float> acc,
                                                           ClientState& /*state*/, const RoundContext& ctx) const {
  const SharedFactors& shared = *ctx.shared;
  const bool fixed_q = shared.fixed == SharedFactors::Side::kQ;
  std::vector<Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    const auto& f = shared.factors[t];
    if (f.empty()) {
      out.emplace_back(denseAndClear(layout.slice(acc, t), opt_.error_feedback));
      continue;
    }
    const uint32_t r = effectiveRank(spec, opt_.rank);
    auto m = layout.matrix(acc, t);
    LowRank l{static_cast<uint32_t>(spec.rows()), static_cast<uint32_t>(spec.cols()), r, {}, {}};
    if (fixed_q) {
      ConstFactorMap q(f.data(), spec.cols(), r);
      l.p.resize(spec.rows() * r);
      FactorMap p(l.p.data(), spec.rows(), r);
      p.noalias() = m * q;
      if (opt_.error_feedback) m.noalias() -= p * q.transpose();
    } else {
      ConstFactorMap p(f.data(), spec.rows(), r);
      l.q.resize(spec.cols() * r);
      FactorMap q(l.q.data(), spec.cols(), r);
      q.noalias() = m.transpose() * p;
      if (opt_.error_feedback) m.noalias() -= p * q.transpose();
    }
    out.emplace_back(std::move(l));
  }
  return out;
}

}  // namespace starling::compression
