#include "compression/lowrank.h"

#include <Eigen/QR>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/finite.h"
#include "core/rng.h"

namespace starling::compression {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using FactorMap = Eigen::Map<RowMatrix>;
using ConstFactorMap = Eigen::Map<const RowMatrix>;

std::string optionText(const char* name, const LowRankOptions& o, bool powersgd) {
  std::ostringstream os;
  os << name << ":rank=" << o.rank << ",min_rate=" << exactText(o.min_compression_rate)
     << o.ef.specText();
  if (powersgd)
    os << ",mode=" << (o.two_phase ? "two_phase" : "local")
       << ",warm_start=" << (o.warm_start ? "true" : "false");
  return os.str();
}

// Sends the tensor whole; a kept buffer has nothing left of it.
DenseF32 denseAndClear(std::span<const float> v, std::span<float> kept) {
  DenseF32 d{{v.begin(), v.end()}};
  std::fill(kept.begin(), kept.end(), 0.0f);
  return d;
}

std::span<float> sliceOrEmpty(const ParamLayout& layout, std::span<float> buf, size_t t) {
  return buf.empty() ? buf : layout.slice(buf, t);
}

// An orthonormal dim x r factor from the stream (run_seed, round, kLowRankInit, tensor): round 0
// is the initial factor; later rounds re-seed columns an aggregate left zero.
std::vector<float> seededFactor(uint64_t run_seed, uint64_t round, size_t tensor_index, size_t dim,
                                uint32_t r) {
  RngStream rng(StreamKey{run_seed, round, kAnyClient, StreamPurpose::kLowRankInit, tensor_index});
  std::vector<float> f(dim * r);
  for (float& x : f) x = static_cast<float>(rng.normal());
  orthogonalize(f.data(), dim, r);
  return f;
}

// Replaces the (numerically) zero columns of a dim x r factor by seeded ones, then
// re-orthogonalizes if `orthonormal`. Every party computes the same result.
void reseedZeroColumns(std::vector<float>& f, size_t dim, uint32_t r, bool orthonormal,
                       uint64_t run_seed, uint64_t round, size_t t) {
  FactorMap m(f.data(), static_cast<Eigen::Index>(dim), r);
  bool any = false;
  for (Eigen::Index c = 0; c < m.cols(); ++c) any |= !(m.col(c).norm() > 1e-30f);
  if (!any) return;
  // Round numbers are offset so these streams never coincide with the initial factor's.
  const auto seeded = seededFactor(run_seed, round + 1, t, dim, r);
  ConstFactorMap s(seeded.data(), static_cast<Eigen::Index>(dim), r);
  for (Eigen::Index c = 0; c < m.cols(); ++c)
    if (!(m.col(c).norm() > 1e-30f)) m.col(c) = s.col(c);
  if (orthonormal) orthogonalize(f.data(), dim, r);
}

// Orthogonalized factor sums as the opposite side's shared factors.
SharedFactors orthogonalizedSums(const ParamLayout& layout, const RoundContext& ctx,
                                 const SharedFactors& current,
                                 std::span<const std::span<const float>> sums) {
  const bool was_q = current.fixed == SharedFactors::Side::kQ;
  SharedFactors next;
  next.fixed = was_q ? SharedFactors::Side::kP : SharedFactors::Side::kQ;
  next.factors.resize(layout.size());
  for (size_t t = 0; t < layout.size() && t < sums.size(); ++t) {
    if (sums[t].empty()) continue;
    const size_t dim = was_q ? layout[t].rows() : layout[t].cols();
    const auto r = static_cast<uint32_t>(sums[t].size() / dim);
    next.factors[t].assign(sums[t].begin(), sums[t].end());
    orthogonalize(next.factors[t].data(), dim, r);
    reseedZeroColumns(next.factors[t], dim, r, true, ctx.run_seed, ctx.round, t);
  }
  return next;
}

}  // namespace

void LowRankOptions::validate() const {
  if (rank == 0) STARLING_THROW(ConfigError, "low-rank: rank must be >= 1");
  if (!(min_compression_rate >= 1.0) || !std::isfinite(min_compression_rate))
    STARLING_THROW(ConfigError, "low-rank: min_rate must be a finite number >= 1, got ",
                   min_compression_rate);
  ef.validate("low-rank");
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

namespace {

// halvingSum applied to `count` sums at once: term t of sum j at x[t * stride + j], t < n; the sums
// are left in x[0 .. count). The same tree as halvingSum, one row of terms at a time (vectorises).
void halvingSums(double* x, size_t n, size_t stride, size_t count) {
  if (n == 0) {
    std::fill(x, x + count, 0.0);
    return;
  }
  while (n > 1) {
    const size_t h = n / 2;
    for (size_t t = 0; t < h; ++t) {
      double* to = x + t * stride;
      const double* from = x + (t + h) * stride;
      for (size_t j = 0; j < count; ++j) to[j] += from[j];
    }
    if (n % 2 != 0) std::copy(x + 2 * h * stride, x + 2 * h * stride + count, x + h * stride);
    n -= h;
  }
}

// A factor's columns as rows of doubles: out[c * dim + k] = f[k * r + c].
std::vector<double> transposedDoubles(std::span<const float> f, size_t dim, size_t r) {
  std::vector<double> out(dim * r);
  for (size_t k = 0; k < dim; ++k)
    for (size_t c = 0; c < r; ++c) out[c * dim + k] = f[k * r + c];
  return out;
}

void checkProduct(std::span<const float> m, size_t rows, size_t cols, size_t a, size_t r, size_t b,
                  const char* who) {
  STARLING_CHECK_ARG(m.size() == rows * cols && a == rows * r && b == cols * r && r > 0, who,
                     ": sizes do not agree (M ", m.size(), " for ", rows, " x ", cols, ", factors ",
                     a, " and ", b, " for rank ", r, ")");
}

// Q = M^T P for rank R (0: any rank, r). Lane l sums rows [l chunk, (l + 1) chunk) in order; a
// block of columns at a time, each lane's sums of a tile of columns kept in registers over its
// rows (fma: a term is exact in double, so fma rounds as the separate add does).
template <size_t R>
void transposedProductKernel(const float* m, size_t rows, size_t cols, const float* p, size_t r,
                             float* q) {
  constexpr size_t L = kProductLanes, kBlock = 256, kTile = 4;
  if constexpr (R != 0) r = R;
  const size_t chunk = (rows + L - 1) / L;
  std::vector<double> lanes(L * kBlock * r);
  for (size_t j0 = 0; j0 < cols; j0 += kBlock) {
    const size_t w = std::min(kBlock, cols - j0);
    for (size_t l = 0; l < L; ++l) {
      const size_t i0 = std::min(rows, l * chunk), i1 = std::min(rows, i0 + chunk);
      double* out = lanes.data() + l * kBlock * r;
      size_t j = 0;
      if constexpr (R != 0) {
        for (; j + kTile <= w; j += kTile) {
          double acc[kTile][R] = {};
          for (size_t i = i0; i < i1; ++i) {
            const float* mi = m + i * cols + j0 + j;
            double pi[R];
            for (size_t c = 0; c < R; ++c) pi[c] = p[i * R + c];
            for (size_t a = 0; a < kTile; ++a)
              for (size_t c = 0; c < R; ++c)
                acc[a][c] = std::fma(static_cast<double>(mi[a]), pi[c], acc[a][c]);
          }
          for (size_t a = 0; a < kTile; ++a)
            for (size_t c = 0; c < R; ++c) out[(j + a) * R + c] = acc[a][c];
        }
      }
      for (; j < w; ++j)
        for (size_t c = 0; c < r; ++c) {
          double acc = 0.0;
          for (size_t i = i0; i < i1; ++i)
            acc = std::fma(static_cast<double>(m[i * cols + j0 + j]), p[i * r + c], acc);
          out[j * r + c] = acc;
        }
    }
    halvingSums(lanes.data(), L, kBlock * r, w * r);
    for (size_t j = 0; j < w; ++j)
      for (size_t c = 0; c < r; ++c) q[(j0 + j) * r + c] = static_cast<float>(lanes[j * r + c]);
  }
}

}  // namespace

double halvingSum(double* x, size_t n) {
  if (n == 0) return 0.0;
  halvingSums(x, n, 1, 1);
  return x[0];
}

void factorProduct(std::span<const float> m, size_t rows, size_t cols, std::span<const float> q,
                   size_t r, std::span<float> p) {
  checkProduct(m, rows, cols, p.size(), r, q.size(), "factorProduct");
  constexpr size_t L = kProductLanes;
  const std::vector<double> qt = transposedDoubles(q, cols, r);
  const size_t whole = cols - cols % L;
  // r x L lane sums from +0 (a lane's sum is never -0, so a lane without terms adds nothing); fma
  // rounds as the separate add does, a term being exact in double.
  std::vector<double> lanes(r * L);
  for (size_t i = 0; i < rows; ++i) {
    const float* row = m.data() + i * cols;
    std::fill(lanes.begin(), lanes.end(), 0.0);
    for (size_t k = 0; k < whole; k += L) {
      double x[L];
      for (size_t l = 0; l < L; ++l) x[l] = row[k + l];
      for (size_t c = 0; c < r; ++c) {
        double* __restrict lane = lanes.data() + c * L;
        const double* qc = qt.data() + c * cols + k;
        for (size_t l = 0; l < L; ++l) lane[l] = std::fma(x[l], qc[l], lane[l]);
      }
    }
    for (size_t c = 0; c < r; ++c) {
      double* lane = lanes.data() + c * L;
      const double* qc = qt.data() + c * cols;
      for (size_t k = whole; k < cols; ++k)
        lane[k - whole] = std::fma(static_cast<double>(row[k]), qc[k], lane[k - whole]);
      p[i * r + c] = static_cast<float>(halvingSum(lane, L));
    }
  }
}

void transposedFactorProduct(std::span<const float> m, size_t rows, size_t cols,
                             std::span<const float> p, size_t r, std::span<float> q) {
  checkProduct(m, rows, cols, p.size(), r, q.size(), "transposedFactorProduct");
  switch (r) {
    case 1:
      return transposedProductKernel<1>(m.data(), rows, cols, p.data(), r, q.data());
    case 2:
      return transposedProductKernel<2>(m.data(), rows, cols, p.data(), r, q.data());
    case 4:
      return transposedProductKernel<4>(m.data(), rows, cols, p.data(), r, q.data());
    case 8:
      return transposedProductKernel<8>(m.data(), rows, cols, p.data(), r, q.data());
    default:
      return transposedProductKernel<0>(m.data(), rows, cols, p.data(), r, q.data());
  }
}

void subtractFactorProduct(std::span<float> m, size_t rows, size_t cols, std::span<const float> p,
                           std::span<const float> q, size_t r) {
  checkProduct(m, rows, cols, p.size(), r, q.size(), "subtractFactorProduct");
  // A block of columns at a time: its r x kBlock terms, [c][column], stay in cache.
  const std::vector<double> qt = transposedDoubles(q, cols, r);
  constexpr size_t kBlock = 512;
  std::vector<double> terms(r * kBlock);
  for (size_t i = 0; i < rows; ++i) {
    float* row = m.data() + i * cols;
    for (size_t j0 = 0; j0 < cols; j0 += kBlock) {
      const size_t w = std::min(kBlock, cols - j0);
      for (size_t c = 0; c < r; ++c) {
        const double pic = p[i * r + c];
        const double* qc = qt.data() + c * cols + j0;
        double* tc = terms.data() + c * kBlock;
        for (size_t j = 0; j < w; ++j) tc[j] = pic * qc[j];
      }
      halvingSums(terms.data(), r, kBlock, w);
      for (size_t j = 0; j < w; ++j)
        row[j0 + j] = static_cast<float>(static_cast<double>(row[j0 + j]) - terms[j]);
    }
  }
}

void orthogonalize(float* data, size_t rows, size_t rank) {
  FactorMap m(data, static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(rank));
  // In double: a float column norm overflows once entries pass about 1e19, and inputs may reach
  // kMaxCompressMagnitude; the factor is rows x rank, small next to the products that made it.
  Eigen::MatrixXd a = m.cast<double>();
  Eigen::VectorXd original(a.cols());
  for (Eigen::Index c = 0; c < a.cols(); ++c) original(c) = a.col(c).norm();
  if (rank <= 2) {
    // Modified Gram-Schmidt. A column left with a tiny fraction of its own norm after removing
    // the earlier ones is dependent on them: zero it rather than normalise round-off noise.
    for (Eigen::Index c = 0; c < a.cols(); ++c) {
      const double norm = a.col(c).norm();
      if (norm <= 1e-30 || norm <= original(c) * 1e-5) {
        a.col(c).setZero();
        continue;
      }
      a.col(c) /= norm;
      for (Eigen::Index d = c + 1; d < a.cols(); ++d) a.col(d) -= a.col(c).dot(a.col(d)) * a.col(c);
    }
    m = a.cast<float>();
    return;
  }
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(a);
  Eigen::MatrixXd q = qr.householderQ() * Eigen::MatrixXd::Identity(a.rows(), a.cols());
  // A zero column of the input gives an arbitrary unit column in Q; keep the contract that a
  // dependent column stays zero by checking R's diagonal.
  const auto& r = qr.matrixQR();
  for (Eigen::Index c = 0; c < q.cols(); ++c)
    if (std::fabs(r(c, c)) <= 1e-30 || std::fabs(r(c, c)) <= original(c) * 1e-5) q.col(c).setZero();
  m = q.cast<float>();
}

SharedFactors initialSharedFactors(const ParamLayout& layout, const LowRankOptions& o,
                                   uint64_t run_seed) {
  o.validate();
  SharedFactors s;
  s.fixed = SharedFactors::Side::kQ;
  s.factors.resize(layout.size());
  for (size_t t = 0; t < layout.size(); ++t)
    if (lowRankCompressible(layout[t], o.rank, o.min_compression_rate))
      s.factors[t] =
          seededFactor(run_seed, 0, t, layout[t].cols(), effectiveRank(layout[t], o.rank));
  return s;
}

const LowRankOptions* lowRankOptionsOf(const Compressor& c) {
  if (const auto* p = dynamic_cast<const PowerSgdCompressor*>(&c)) return &p->options();
  if (const auto* a = dynamic_cast<const AcpSgdCompressor*>(&c)) return &a->options();
  return nullptr;
}

void checkSharedFactors(const ParamLayout& layout, const LowRankOptions& o,
                        const SharedFactors* shared, SharedFactors::Side side, const char* who) {
  const char* side_name = side == SharedFactors::Side::kQ ? "Q" : "P";
  if (shared == nullptr) {
    // A model with no tensor worth factoring shares nothing (RoundScheme broadcasts no factors).
    for (size_t t = 0; t < layout.size(); ++t)
      STARLING_CHECK_ARG(
          !lowRankCompressible(layout[t], o.rank, o.min_compression_rate), who,
          ": the round context carries no shared factors; this round needs the shared ", side_name,
          " factors");
    return;
  }
  STARLING_CHECK_ARG(shared->fixed == side, who, ": shared factors hold the wrong side (expected ",
                     side_name, ")");
  STARLING_CHECK_ARG(shared->factors.size() == layout.size(), who, ": shared factors cover ",
                     shared->factors.size(), " tensors, the layout has ", layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    size_t want = 0;
    if (lowRankCompressible(spec, o.rank, o.min_compression_rate))
      want = (side == SharedFactors::Side::kQ ? spec.cols() : spec.rows()) *
             effectiveRank(spec, o.rank);
    STARLING_CHECK_ARG(shared->factors[t].size() == want, who, ": shared ", side_name,
                       " factor of tensor '", spec.name, "' has ", shared->factors[t].size(),
                       " floats, expected ", want);
  }
}

// ---------------------------------------------------------------- PowerSGD

void PowerSgdState::save(ByteWriter& w) const {
  w.u8(pending_phase);
  w.u64(factors.size());
  for (const auto& f : factors) w.floats(f);
}

void PowerSgdState::load(ByteReader& r, uint32_t version) {
  if (version != 1) r.fail("powersgd state version ", version, " not supported");
  pending_phase = r.u8();
  if (pending_phase > 1) r.fail("pending phase ", int{pending_phase});
  const uint64_t n = r.u64();
  if (n > r.remaining() / 8) r.fail("claims ", n, " factors");
  factors.resize(n);
  for (auto& f : factors) r.floats(f);
}

size_t PowerSgdState::memoryBytes() const {
  size_t b = 0;
  for (const auto& f : factors) b += f.capacity() * sizeof(float);
  return b;
}

PowerSgdCompressor::PowerSgdCompressor(LowRankOptions o) : opt_(o) { opt_.validate(); }

std::string PowerSgdCompressor::spec() const { return optionText("powersgd", opt_, true); }

SharedFactors PowerSgdCompressor::initialShared(const ParamLayout& layout,
                                                uint64_t run_seed) const {
  if (!opt_.two_phase) return Compressor::initialShared(layout, run_seed);
  return initialSharedFactors(layout, opt_, run_seed);
}

SharedFactors PowerSgdCompressor::nextShared(const ParamLayout& layout, const RoundContext& ctx,
                                             const SharedFactors& current,
                                             std::span<const std::span<const float>> sums,
                                             double total_weight) const {
  if (!opt_.two_phase) return Compressor::initialShared(layout, ctx.run_seed);
  if (ctx.phase == 0) return orthogonalizedSums(layout, ctx, current, sums);  // P-hat
  // After phase Q: the next round's Q warm-starts from the mean Q, orthonormalized. Vogels et al.
  // carry the mean itself; its scale, though, multiplies into every phase-P factor of the next
  // round (P_i = M_i Q), so an unnormalized Q that grew (correlated updates, or one client's large
  // but bounded Q) would push honest phase-P factors past the round's bounds and stall training.
  // Orthonormalizing Q = Q' R changes P_i = M_i Q' R by the triangular R on the right only, so
  // P-hat = orth(sum P_i) spans the same columns and the round's update is the same.
  STARLING_CHECK_ARG(total_weight > 0 && std::isfinite(total_weight),
                     "powersgd: phase Q ended with total weight ", total_weight);
  SharedFactors next;
  next.fixed = SharedFactors::Side::kQ;
  next.factors.resize(layout.size());
  for (size_t t = 0; t < layout.size() && t < sums.size(); ++t) {
    if (sums[t].empty()) continue;
    next.factors[t].assign(sums[t].begin(),
                           sums[t].end());  // the 1/W scale vanishes in orthonormalization
    const size_t dim = layout[t].cols();
    const auto r = static_cast<uint32_t>(sums[t].size() / dim);
    orthogonalize(next.factors[t].data(), dim, r);
    reseedZeroColumns(next.factors[t], dim, r, true, ctx.run_seed, ctx.round, t);
  }
  return next;
}

void PowerSgdCompressor::checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                                       const RoundContext& ctx) const {
  const TensorSpec& spec = layout[t];
  if (!lowRankCompressible(spec, opt_.rank, opt_.min_compression_rate)) {
    // Dense tensors travel whole in the first phase and as nothing in the second.
    if (opt_.two_phase && ctx.phase == 1) {
      const auto* s = std::get_if<SparseView>(&p);
      if (!s || !s->indices.empty())
        unexpected(layout, t, p, "an empty sparse payload in phase Q for a dense tensor");
    } else if (!std::holds_alternative<DenseF32View>(p)) {
      unexpected(layout, t, p, "dense_f32 for a tensor too small to factor");
    }
    return;
  }
  const auto* l = std::get_if<LowRankView>(&p);
  if (!l) unexpected(layout, t, p, "lowrank");
  const uint32_t r = effectiveRank(spec, opt_.rank);
  const bool want_p = !opt_.two_phase || ctx.phase == 0, want_q = !opt_.two_phase || ctx.phase == 1;
  if (l->rank != r || l->p.empty() == want_p || l->q.empty() == want_q)
    failInput(Errc::kRoundMismatch, "tensor ", t, " '", spec.name, "' carries rank ", l->rank,
              l->p.empty() ? "" : " P", l->q.empty() ? "" : " Q", "; ", this->spec(),
              " sends rank ", r, want_p ? " P" : "", want_q ? " Q" : "", " in phase ", ctx.phase);
}

void PowerSgdCompressor::checkRound(const ParamLayout& layout, const ClientState& state,
                                    const RoundContext& ctx) const {
  if (!opt_.two_phase) return;
  const auto* ps = state.find<PowerSgdState>(kPowerSgdComponent);
  if (ctx.phase == 0) {
    checkSharedFactors(layout, opt_, ctx.shared, SharedFactors::Side::kQ, "powersgd phase P");
    return;
  }
  STARLING_CHECK_ARG(ps && ps->pending_phase == 1, "powersgd: phase Q without phase P");
  checkSharedFactors(layout, opt_, ctx.shared, SharedFactors::Side::kP, "powersgd phase Q");
}

std::vector<float> PowerSgdCompressor::localStartFactor(const ParamLayout& layout, size_t t,
                                                        const ClientState* state,
                                                        const RoundContext& ctx) const {
  const TensorSpec& spec = layout[t];
  const uint32_t r = effectiveRank(spec, opt_.rank);
  const auto* ps = state ? state->find<PowerSgdState>(kPowerSgdComponent) : nullptr;
  if (opt_.warm_start && ps && t < ps->factors.size() && ps->factors[t].size() == spec.cols() * r)
    return ps->factors[t];
  return seededFactor(ctx.run_seed, 0, t, spec.cols(), r);
}

std::vector<Payload> PowerSgdCompressor::encodeLocal(
    const ParamLayout& layout, std::span<const float> input, std::span<float> residual,
    const ClientState& state, const RoundContext& ctx, StagedState& staged) const {
  // A state without warm factors (a new client, or the read-only entry's empty state) uses the
  // seeded Q.
  PowerSgdState* next =
      opt_.warm_start ? &staged.stage<PowerSgdState>(std::string(kPowerSgdComponent)) : nullptr;
  if (next) next->factors.resize(layout.size());
  std::vector<Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    if (!lowRankCompressible(spec, opt_.rank, opt_.min_compression_rate)) {
      out.emplace_back(denseAndClear(layout.slice(input, t), sliceOrEmpty(layout, residual, t)));
      continue;
    }
    const uint32_t r = effectiveRank(spec, opt_.rank);
    const size_t rows = spec.rows(), cols = spec.cols();
    const auto m = layout.slice(input, t);
    LowRank l{static_cast<uint32_t>(rows), static_cast<uint32_t>(cols), r, {}, {}};
    l.p.resize(rows * r);
    factorProduct(m, rows, cols, localStartFactor(layout, t, &state, ctx), r, l.p);
    orthogonalize(l.p.data(), rows, r);
    l.q.resize(cols * r);
    transposedFactorProduct(m, rows, cols, l.p, r, l.q);
    if (!residual.empty()) {
      const auto res = layout.slice(residual, t);
      if (opt_.ef.on)
        subtractFactorProduct(res, rows, cols, l.p, l.q, r);
      else
        std::fill(res.begin(), res.end(), 0.0f);
    }
    if (next) next->factors[t] = l.q;
    out.emplace_back(std::move(l));
  }
  return out;
}

std::vector<Payload> PowerSgdCompressor::encode(const ParamLayout& layout,
                                                std::span<const float> input,
                                                std::span<float> residual, const ClientState& state,
                                                const RoundContext& ctx,
                                                StagedState& staged) const {
  if (!opt_.two_phase || residual.empty())
    return encodeLocal(layout, input, residual, state, ctx, staged);
  std::vector<Payload> out;
  out.reserve(layout.size());
  auto& next = staged.stage<PowerSgdState>(std::string(kPowerSgdComponent));
  // No shared factors: the model has no tensor worth factoring (checkSharedFactors allowed it).
  static const std::vector<float> kNoFactor;
  auto factor = [&](size_t t) -> const std::vector<float>& {
    return ctx.shared ? ctx.shared->factors[t] : kNoFactor;
  };
  if (ctx.phase == 0) {
    // Phase P: P_i = M_i Q; M_i stays in the kept buffer for phase Q; dense tensors go whole.
    for (size_t t = 0; t < layout.size(); ++t) {
      const TensorSpec& spec = layout[t];
      const auto& qf = factor(t);
      if (qf.empty()) {
        out.emplace_back(denseAndClear(layout.slice(input, t), layout.slice(residual, t)));
        continue;
      }
      const uint32_t r = effectiveRank(spec, opt_.rank);
      LowRank l{static_cast<uint32_t>(spec.rows()), static_cast<uint32_t>(spec.cols()), r, {}, {}};
      l.p.resize(spec.rows() * r);
      factorProduct(layout.slice(input, t), spec.rows(), spec.cols(), qf, r, l.p);
      out.emplace_back(std::move(l));
    }
    next.pending_phase = 1;
    return out;
  }
  // Phase Q: Q_i = M_i^T P-hat; what is kept becomes the residual (EF) or nothing.
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    const auto& pf = factor(t);
    if (pf.empty()) {
      out.emplace_back(Sparse{});  // sent whole in phase P
      continue;
    }
    const uint32_t r = effectiveRank(spec, opt_.rank);
    const auto m = layout.slice(residual, t);  // the same memory as input
    LowRank l{static_cast<uint32_t>(spec.rows()), static_cast<uint32_t>(spec.cols()), r, {}, {}};
    l.q.resize(spec.cols() * r);
    transposedFactorProduct(m, spec.rows(), spec.cols(), pf, r, l.q);
    if (opt_.ef.on)
      subtractFactorProduct(m, spec.rows(), spec.cols(), pf, l.q, r);
    else
      std::fill(m.begin(), m.end(), 0.0f);
    out.emplace_back(std::move(l));
  }
  next.pending_phase = 0;
  return out;
}

// ---------------------------------------------------------------- ACP-SGD

AcpSgdCompressor::AcpSgdCompressor(LowRankOptions o) : opt_(o) { opt_.validate(); }

std::string AcpSgdCompressor::spec() const { return optionText("acpsgd", opt_, false); }

SharedFactors AcpSgdCompressor::initialShared(const ParamLayout& layout, uint64_t run_seed) const {
  return initialSharedFactors(layout, opt_, run_seed);
}

SharedFactors AcpSgdCompressor::nextShared(const ParamLayout& layout, const RoundContext& ctx,
                                           const SharedFactors& current,
                                           std::span<const std::span<const float>> sums,
                                           double /*total_weight*/) const {
  return orthogonalizedSums(layout, ctx, current, sums);
}

void AcpSgdCompressor::checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                                     const RoundContext& ctx) const {
  const TensorSpec& spec = layout[t];
  if (!lowRankCompressible(spec, opt_.rank, opt_.min_compression_rate)) {
    if (!std::holds_alternative<DenseF32View>(p))
      unexpected(layout, t, p, "dense_f32 for a tensor too small to factor");
    return;
  }
  const auto* l = std::get_if<LowRankView>(&p);
  if (!l) unexpected(layout, t, p, "lowrank");
  const bool fixed_q = !ctx.shared || ctx.shared->fixed == SharedFactors::Side::kQ;
  const uint32_t r = effectiveRank(spec, opt_.rank);
  if (l->rank != r || !l->oneFactor() || l->p.empty() == fixed_q)
    failInput(Errc::kRoundMismatch, "tensor ", t, " '", spec.name, "' carries rank ", l->rank,
              l->p.empty() ? "" : " P", l->q.empty() ? "" : " Q", "; this round of ", this->spec(),
              " sends rank ", r, fixed_q ? " P only" : " Q only");
}

void AcpSgdCompressor::checkRound(const ParamLayout& layout, const ClientState& /*state*/,
                                  const RoundContext& ctx) const {
  // Without shared factors only a model with no tensor worth factoring passes.
  checkSharedFactors(layout, opt_, ctx.shared,
                     ctx.shared ? ctx.shared->fixed : SharedFactors::Side::kQ, "acpsgd");
}

namespace {
// Secure aggregation's view of a low-rank round: per tensor, the values its payload carries (the
// one factor, the tensor whole, or nothing) and the factor's shape; `ctx.shared` from the round
// (required for a layout with a tensor to factor, as encode's checkRound requires it). `p_side`:
// the factor sent is P (rows x r), else Q (cols x r); `dense_whole`: a tensor too small to factor
// travels whole (else as nothing, two-phase PowerSGD's phase Q).
struct SecurePart {
  size_t values = 0;
  bool factor = false;
  uint32_t rows = 0, cols = 0, rank = 0;
};
std::vector<SecurePart> secureParts(const ParamLayout& layout, const LowRankOptions& o,
                                    const RoundContext& ctx, const char* name, bool p_side,
                                    bool dense_whole) {
  std::vector<SecurePart> out(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    const bool factor =
        ctx.shared && t < ctx.shared->factors.size() && !ctx.shared->factors[t].empty();
    if (!factor) {
      STARLING_CHECK_ARG(!lowRankCompressible(spec, o.rank, o.min_compression_rate), name,
                         ": tensor ", t, " '", spec.name,
                         "' is factored, and the round gives no shared factor for it");
      out[t].values = dense_whole ? spec.numel : 0;
      continue;
    }
    const uint32_t r = effectiveRank(spec, o.rank);
    out[t] = {(p_side ? spec.rows() : spec.cols()) * r, true, static_cast<uint32_t>(spec.rows()),
              static_cast<uint32_t>(spec.cols()), r};
  }
  return out;
}

size_t secureCount(const std::vector<SecurePart>& parts) {
  size_t n = 0;
  for (const SecurePart& p : parts) n += p.values;
  return n;
}

// The values `update` (as the compressor sent it) carries on `parts`, in layout order.
std::vector<float> secureValuesOf(const std::vector<SecurePart>& parts,
                                  const std::vector<Payload>& update, const char* name) {
  STARLING_CHECK_ARG(update.size() == parts.size(), name, ": an update of ", update.size(),
                     " tensors for a layout of ", parts.size());
  std::vector<float> out;
  out.reserve(secureCount(parts));
  for (size_t t = 0; t < parts.size(); ++t) {
    std::span<const float> v;
    bool kind_ok = false;
    if (const auto* l = std::get_if<LowRank>(&update[t]); l && parts[t].factor) {
      v = l->p.empty() ? std::span<const float>(l->q) : std::span<const float>(l->p);
      kind_ok = l->p.empty() != l->q.empty();
    } else if (const auto* d = std::get_if<DenseF32>(&update[t]);
               d && !parts[t].factor && parts[t].values > 0) {
      v = d->values;
      kind_ok = true;
    } else if (const auto* s = std::get_if<Sparse>(&update[t]);
               s && !parts[t].factor && parts[t].values == 0) {
      kind_ok = s->indices.empty();
    }
    STARLING_CHECK_ARG(kind_ok && v.size() == parts[t].values && (!parts[t].factor || !v.empty()),
                       name, ": tensor ", t, "'s payload is not this round's ",
                       parts[t].factor ? "one factor" : "dense tensor", " of ", parts[t].values,
                       " values");
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// `sum` (secureCount values) back as one payload per tensor: a one-factor LowRank (P when
// `p_side`), the tensor dense, or an empty Sparse where the phase sends nothing.
std::vector<Payload> securePayloadsOf(const std::vector<SecurePart>& parts,
                                      std::span<const float> sum, bool p_side, const char* name) {
  STARLING_CHECK_ARG(sum.size() == secureCount(parts), name, ": a secure sum of ", sum.size(),
                     " values for a round of ", secureCount(parts));
  std::vector<Payload> out;
  out.reserve(parts.size());
  size_t at = 0;
  for (const SecurePart& p : parts) {
    std::vector<float> v(sum.begin() + static_cast<std::ptrdiff_t>(at),
                         sum.begin() + static_cast<std::ptrdiff_t>(at + p.values));
    at += p.values;
    if (!p.factor && p.values == 0) {
      out.emplace_back(Sparse{});
    } else if (!p.factor) {
      out.emplace_back(DenseF32{std::move(v)});
    } else if (p_side) {
      out.emplace_back(LowRank{p.rows, p.cols, p.rank, std::move(v), {}});
    } else {
      out.emplace_back(LowRank{p.rows, p.cols, p.rank, {}, std::move(v)});
    }
  }
  return out;
}

// acpsgd's one factor a round: P against a shared Q, or Q against a shared P.
bool acpSendsP(const RoundContext& ctx) {
  return ctx.shared && ctx.shared->fixed == SharedFactors::Side::kQ;
}
}  // namespace

size_t AcpSgdCompressor::secureSize(const ParamLayout& layout, const RoundContext& ctx) const {
  return secureCount(secureParts(layout, opt_, ctx, "acpsgd", acpSendsP(ctx), true));
}

std::vector<float> AcpSgdCompressor::secureValues(const ParamLayout& layout,
                                                  const RoundContext& ctx,
                                                  const std::vector<Payload>& update) const {
  return secureValuesOf(secureParts(layout, opt_, ctx, "acpsgd", acpSendsP(ctx), true), update,
                        "acpsgd");
}

std::vector<Payload> AcpSgdCompressor::securePayloads(const ParamLayout& layout,
                                                      const RoundContext& ctx,
                                                      std::span<const float> sum) const {
  return securePayloadsOf(secureParts(layout, opt_, ctx, "acpsgd", acpSendsP(ctx), true), sum,
                          acpSendsP(ctx), "acpsgd");
}

// Two-phase PowerSGD: phase P sends P = M Q and the small tensors whole, phase Q sends Q = M^T
// P-hat alone.
size_t PowerSgdCompressor::secureSize(const ParamLayout& layout, const RoundContext& ctx) const {
  STARLING_CHECK_ARG(opt_.two_phase && ctx.phase < 2,
                     "powersgd: a secure sum of mode=two_phase's phase 0 or 1 only");
  return secureCount(secureParts(layout, opt_, ctx, "powersgd", ctx.phase == 0, ctx.phase == 0));
}

std::vector<float> PowerSgdCompressor::secureValues(const ParamLayout& layout,
                                                    const RoundContext& ctx,
                                                    const std::vector<Payload>& update) const {
  STARLING_CHECK_ARG(opt_.two_phase && ctx.phase < 2,
                     "powersgd: a secure sum of mode=two_phase's phase 0 or 1 only");
  return secureValuesOf(secureParts(layout, opt_, ctx, "powersgd", ctx.phase == 0, ctx.phase == 0),
                        update, "powersgd");
}

std::vector<Payload> PowerSgdCompressor::securePayloads(const ParamLayout& layout,
                                                        const RoundContext& ctx,
                                                        std::span<const float> sum) const {
  STARLING_CHECK_ARG(opt_.two_phase && ctx.phase < 2,
                     "powersgd: a secure sum of mode=two_phase's phase 0 or 1 only");
  return securePayloadsOf(
      secureParts(layout, opt_, ctx, "powersgd", ctx.phase == 0, ctx.phase == 0), sum,
      ctx.phase == 0, "powersgd");
}

std::vector<Payload> AcpSgdCompressor::encode(const ParamLayout& layout,
                                              std::span<const float> input,
                                              std::span<float> residual,
                                              const ClientState& /*state*/, const RoundContext& ctx,
                                              StagedState& /*staged*/) const {
  static const SharedFactors kNone;
  const SharedFactors& shared = ctx.shared ? *ctx.shared : kNone;  // none: nothing is factored
  const bool fixed_q = shared.fixed == SharedFactors::Side::kQ;
  std::vector<Payload> out;
  out.reserve(layout.size());
  static const std::vector<float> kNoFactor;
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    const auto& f = shared.factors.empty() ? kNoFactor : shared.factors[t];
    if (f.empty()) {
      out.emplace_back(denseAndClear(layout.slice(input, t), sliceOrEmpty(layout, residual, t)));
      continue;
    }
    const uint32_t r = effectiveRank(spec, opt_.rank);
    const size_t rows = spec.rows(), cols = spec.cols();
    const auto m = layout.slice(input, t);
    LowRank l{static_cast<uint32_t>(rows), static_cast<uint32_t>(cols), r, {}, {}};
    if (fixed_q) {
      l.p.resize(rows * r);
      factorProduct(m, rows, cols, f, r, l.p);
      if (!residual.empty())
        subtractFactorProduct(layout.slice(residual, t), rows, cols, l.p, f, r);
    } else {
      l.q.resize(cols * r);
      transposedFactorProduct(m, rows, cols, f, r, l.q);
      if (!residual.empty())
        subtractFactorProduct(layout.slice(residual, t), rows, cols, f, l.q, r);
    }
    out.emplace_back(std::move(l));
  }
  return out;
}

}  // namespace starling::compression
