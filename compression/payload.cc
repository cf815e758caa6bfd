#include "compression/payload.h"

#include <array>
#include <cmath>
#include <cstring>

#include "compression/bitpack.h"
#include "compression/rice.h"
#include "core/half.h"
#include "core/overloaded.h"

namespace starling::compression {
namespace {

[[noreturn]] void fail(Errc code, const TensorSpec& t, size_t index, const std::string& what) {
  failInput(code, "tensor ", index, " '", t.name, "' ", describeShape(t.shape), ": ", what);
}

void requireSize(size_t got, size_t want, const TensorSpec& t, size_t ti, const char* field) {
  if (got != want)
    fail(Errc::kSizeMismatch, t, ti,
         std::string(field) + " has " + std::to_string(got) + " entries, expected " +
             std::to_string(want));
}

// One pass over floats: the largest magnitude's bit pattern (NaN and inf compare above every
// finite value, so `max_bits < 0x7f800000` is "all finite") and the sum of squares. Eight
// independent lanes let the compiler vectorise both reductions; the float lanes are flushed into
// a double every block so the sum stays accurate over millions of values.
struct FloatScan {
  uint32_t max_bits = 0;
  double sq = 0.0;
};
FloatScan scanFloats(std::span<const float> v) {
  FloatScan s;
  const float* p = v.data();
  const size_t n = v.size();
  size_t i = 0;
  constexpr size_t kLanes = 8, kBlock = 2048;
  while (i + kLanes <= n) {
    uint32_t mb[kLanes] = {};
    float ss[kLanes] = {};
    const size_t begin = i, end = std::min(n - (n - i) % kLanes, i + kBlock);
    for (; i < end; i += kLanes) {
      for (size_t j = 0; j < kLanes; ++j) {
        uint32_t u;
        std::memcpy(&u, p + i + j, 4);
        u &= 0x7fffffffu;
        mb[j] = u > mb[j] ? u : mb[j];
        ss[j] += p[i + j] * p[i + j];
      }
    }
    bool overflowed = false;
    for (size_t j = 0; j < kLanes; ++j) {
      s.max_bits = std::max(s.max_bits, mb[j]);
      overflowed |= !std::isfinite(ss[j]);
    }
    if (!overflowed) {
      for (size_t j = 0; j < kLanes; ++j) s.sq += ss[j];
    } else {
      // Squares of finite values above about 1e18 overflow a float lane (an honest update
      // of such values once read as an infinite norm, and was refused): this block again in
      // double. (A non-finite value is caught through max_bits; its square does not matter.)
      for (size_t k = begin; k < end; ++k) s.sq += static_cast<double>(p[k]) * p[k];
    }
  }
  for (; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, p + i, 4);
    s.max_bits = std::max(s.max_bits, u & 0x7fffffffu);
    s.sq += static_cast<double>(p[i]) * p[i];
  }
  return s;
}

// Checks every value is finite and returns the stats of the values as decoded.
PayloadStats requireFinite(std::span<const float> v, const TensorSpec& t, size_t ti,
                           const char* field) {
  const FloatScan s = scanFloats(v);
  if (s.max_bits >= 0x7f800000u) {
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        fail(Errc::kNonFinite, t, ti,
             std::string(field) + "[" + std::to_string(i) + "] is not finite");
  }
  return {std::fabs(static_cast<double>(bitsFloat(s.max_bits))), s.sq};
}

// 16-bit dense values: an all-ones exponent (`exp_mask`) is inf or NaN.
template <class Decode>
PayloadStats halfStats(std::span<const uint16_t> v, const TensorSpec& t, size_t ti,
                       const char* kind, uint16_t exp_mask, Decode decode) {
  requireSize(v.size(), t.numel, t, ti, (std::string(kind) + " values").c_str());
  PayloadStats s;
  for (size_t i = 0; i < v.size(); ++i) {
    if ((v[i] & exp_mask) == exp_mask)
      fail(Errc::kNonFinite, t, ti,
           std::string(kind) + " value[" + std::to_string(i) + "] is not finite");
    const double x = decode(v[i]);
    s.max_abs = std::max(s.max_abs, std::fabs(x));
    s.sq_norm += x * x;
  }
  return s;
}

void requireScalar(float x, const TensorSpec& t, size_t ti, const char* field) {
  if (!std::isfinite(x) || x < 0.0f)
    fail(Errc::kNonFinite, t, ti, std::string(field) + " must be finite and >= 0");
}

void requirePadding(std::span<const uint8_t> bytes, size_t used_bits, const TensorSpec& t,
                    size_t ti) {
  if (bytes.empty() || used_bits % 8 == 0) return;
  const uint8_t mask = static_cast<uint8_t>(0xffu << (used_bits % 8));
  if (bytes.back() & mask)
    fail(Errc::kBadPadding, t, ti, "non-zero padding bits after the last element");
}

// The shared factor the other side of a one-factor payload uses, or a failure.
std::span<const float> sharedFactor(const SharedFactors* shared, SharedFactors::Side want,
                                    const TensorSpec& t, size_t ti, size_t rows, uint32_t rank) {
  if (!shared || shared->fixed != want || ti >= shared->factors.size() ||
      shared->factors[ti].size() != rows * rank)
    fail(Errc::kMissingSharedFactor, t, ti,
         std::string("carries one low-rank factor, but no shared ") +
             (want == SharedFactors::Side::kQ ? "Q" : "P") + " factor of rank " +
             std::to_string(rank) + " is known for it");
  return shared->factors[ti];
}

// Row norms and Gram matrix of a row-major rows x r factor, in double. Ranks up to 16 use an
// inline buffer, so validating a low-rank payload allocates nothing.
struct FactorStats {
  double max_row_norm = 0.0;
  size_t r = 0;
  std::array<double, 256> small{};
  std::vector<double> large;
  double* gram() { return r * r <= small.size() ? small.data() : large.data(); }
  const double* gram() const { return r * r <= small.size() ? small.data() : large.data(); }
};
FactorStats factorStats(std::span<const float> f, size_t rows, size_t r) {
  FactorStats s;
  s.r = r;
  if (r * r > s.small.size()) s.large.assign(r * r, 0.0);
  double* g = s.gram();
  double max_sq = 0.0;
  for (size_t i = 0; i < rows; ++i) {
    const float* row = f.data() + i * r;
    double sq = 0.0;
    for (size_t a = 0; a < r; ++a) {
      const double x = row[a];
      sq += x * x;
      for (size_t b = a; b < r; ++b) g[a * r + b] += x * row[b];
    }
    max_sq = std::max(max_sq, sq);
  }
  for (size_t a = 0; a < r; ++a)
    for (size_t b = 0; b < a; ++b) g[a * r + b] = g[b * r + a];
  s.max_row_norm = std::sqrt(max_sq);
  return s;
}

// ||P Q^T||_F^2 = trace((P^T P)(Q^T Q)); the Gram matrices are symmetric.
double productSqNorm(const FactorStats& p, const FactorStats& q) {
  double s = 0.0;
  const double *gp = p.gram(), *gq = q.gram();
  for (size_t i = 0; i < p.r * p.r; ++i) s += gp[i] * gq[i];
  return std::max(s, 0.0);
}

using ConstFactor =
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

Errc riceErrc(RiceCheck::Problem p) {
  switch (p) {
    case RiceCheck::Problem::kParameter:
      return Errc::kLevelOutOfRange;
    case RiceCheck::Problem::kBeyond:
      return Errc::kIndexOutOfRange;
    case RiceCheck::Problem::kPadding:
      return Errc::kBadPadding;
    default:
      return Errc::kSizeMismatch;
  }
}

}  // namespace

const char* encodingName(size_t index) {
  static constexpr const char* kNames[] = {"dense_f32", "dense_f16", "dense_bf16", "sparse",
                                           "randblock", "lowrank",   "sign",       "qsgd",
                                           "ternary",   "blockq"};
  return index < std::size(kNames) ? kNames[index] : "unknown";
}

uint32_t qsgdLevelBits(uint32_t s) {
  uint32_t bits = 1;
  while ((1ull << bits) <= s) ++bits;
  return bits;
}

PayloadView view(const Payload& p) {
  return std::visit(Overloaded{
                        [](const DenseF32& d) -> PayloadView { return DenseF32View{d.values}; },
                        [](const DenseF16& d) -> PayloadView { return DenseF16View{d.values}; },
                        [](const DenseBF16& d) -> PayloadView { return DenseBF16View{d.values}; },
                        [](const Sparse& s) -> PayloadView {
                          return SparseView{s.indices, s.values};
                        },
                        [](const RandBlock& b) -> PayloadView {
                          return RandBlockView{b.offset, b.values};
                        },
                        [](const LowRank& l) -> PayloadView {
                          return LowRankView{l.rows, l.cols, l.rank, l.p, l.q};
                        },
                        [](const Sign& s) -> PayloadView {
                          return SignView{s.scale, s.bits};
                        },
                        [](const Qsgd& q) -> PayloadView {
                          return QsgdView{q.norm, q.s, q.packed};
                        },
                        [](const Ternary& x) -> PayloadView {
                          return TernaryView{x.count, x.mu, x.rice, x.positions, x.signs};
                        },
                        [](const BlockQ& q) -> PayloadView {
                          return BlockQView{q.bits, q.block, q.exps, q.packed};
                        },
                    },
                    p);
}

Payload toOwned(const PayloadView& v) {
  auto vec = [](auto s) {
    return std::vector<typename decltype(s)::value_type>(s.begin(), s.end());
  };
  return std::visit(Overloaded{
                        [&](const DenseF32View& d) -> Payload { return DenseF32{vec(d.values)}; },
                        [&](const DenseF16View& d) -> Payload { return DenseF16{vec(d.values)}; },
                        [&](const DenseBF16View& d) -> Payload { return DenseBF16{vec(d.values)}; },
                        [&](const SparseView& s) -> Payload {
                          return Sparse{vec(s.indices), vec(s.values)};
                        },
                        [&](const RandBlockView& b) -> Payload {
                          return RandBlock{b.offset, vec(b.values)};
                        },
                        [&](const LowRankView& l) -> Payload {
                          return LowRank{l.rows, l.cols, l.rank, vec(l.p), vec(l.q)};
                        },
                        [&](const SignView& s) -> Payload {
                          return Sign{s.scale, vec(s.bits)};
                        },
                        [&](const QsgdView& q) -> Payload {
                          return Qsgd{q.norm, q.s, vec(q.packed)};
                        },
                        [&](const TernaryView& x) -> Payload {
                          return Ternary{x.count, x.mu, x.rice, vec(x.positions), vec(x.signs)};
                        },
                        [&](const BlockQView& q) -> Payload {
                          return BlockQ{q.bits, q.block, vec(q.exps), vec(q.packed)};
                        },
                    },
                    v);
}

UpdateView view(const Update& u) {
  UpdateView v;
  v.header = u.header;
  v.tensors.reserve(u.tensors.size());
  for (const auto& p : u.tensors) v.tensors.push_back(view(p));
  v.metrics.reserve(u.metrics.size());
  for (const auto& m : u.metrics) v.metrics.push_back({m.name, m.value});
  v.control = u.control;
  return v;
}

Update toOwned(const UpdateView& v) {
  Update u;
  u.header = v.header;
  u.tensors.reserve(v.tensors.size());
  for (const auto& p : v.tensors) u.tensors.push_back(toOwned(p));
  for (const auto& m : v.metrics) u.metrics.push_back({std::string(m.name), m.value});
  u.control.assign(v.control.begin(), v.control.end());
  return u;
}

PartialView view(const PartialMessage& m) {
  PartialView v;
  v.header = m.header;
  v.tensors.reserve(m.tensors.size());
  for (const auto& p : m.tensors) v.tensors.push_back(view(p));
  for (const auto& x : m.metrics) v.metrics.push_back({x.name, x.weighted_sum, x.weight});
  v.control = m.control;
  return v;
}

bool SharedFactors::any() const {
  for (const auto& f : factors)
    if (!f.empty()) return true;
  return false;
}

uint64_t sharedFactorsTag(const SharedFactors& s) {
  uint64_t h = 0xcbf29ce484222325ull ^ static_cast<uint64_t>(s.fixed);
  for (const auto& f : s.factors) {
    h = (h ^ f.size()) * 0x100000001b3ull;
    for (float x : f) h = (h ^ floatBits(x)) * 0x100000001b3ull;
  }
  return h;
}

PayloadStats validatePayload(const PayloadView& payload, const TensorSpec& t,
                             const SharedFactors* shared, size_t ti) {
  const size_t n = t.numel;
  return std::visit(
      Overloaded{
          [&](const DenseF32View& d) {
            requireSize(d.values.size(), n, t, ti, "dense values");
            return requireFinite(d.values, t, ti, "dense value");
          },
          [&](const DenseF16View& d) {
            return halfStats(d.values, t, ti, "fp16", 0x7c00u,
                             [](uint16_t h) { return halfToFloat(h); });
          },
          [&](const DenseBF16View& d) {
            return halfStats(d.values, t, ti, "bf16", 0x7f80u,
                             [](uint16_t h) { return bf16ToFloat(h); });
          },
          [&](const SparseView& s) {
            requireSize(s.values.size(), s.indices.size(), t, ti, "sparse values (vs indices)");
            if (s.indices.size() > n)
              fail(Errc::kSizeMismatch, t, ti, "sparse payload has more entries than the tensor");
            // Strictly increasing and the last below n means every index is in range. One
            // branch-free pass (it vectorises); the failing position is looked up only on failure.
            const uint32_t* idx = s.indices.data();
            const size_t k = s.indices.size();
            bool ordered = true;
            for (size_t i = 1; i < k; ++i) ordered &= idx[i] > idx[i - 1];
            if (!ordered || (k > 0 && idx[k - 1] >= n)) {
              for (size_t i = 0; i < k; ++i) {
                if (i > 0 && idx[i] <= idx[i - 1])
                  fail(Errc::kIndexOrder, t, ti,
                       "sparse index " + std::to_string(idx[i]) + " at position " +
                           std::to_string(i) +
                           " does not exceed the previous one (duplicate or unsorted)");
                if (idx[i] >= n)
                  fail(Errc::kIndexOutOfRange, t, ti,
                       "sparse index " + std::to_string(idx[i]) + " >= numel " + std::to_string(n));
              }
            }
            return requireFinite(s.values, t, ti, "sparse value");
          },
          [&](const RandBlockView& b) {
            if (b.values.empty() || b.values.size() > n)
              fail(Errc::kSizeMismatch, t, ti,
                   "random block of " + std::to_string(b.values.size()) + " values for numel " +
                       std::to_string(n));
            if (b.offset >= n)
              fail(Errc::kIndexOutOfRange, t, ti,
                   "block offset " + std::to_string(b.offset) + " >= numel");
            return requireFinite(b.values, t, ti, "block value");
          },
          [&](const LowRankView& l) {
            if (l.rows != t.rows() || l.cols != t.cols() || l.rank == 0 ||
                l.rank > std::min(l.rows, l.cols))
              fail(Errc::kShapeMismatch, t, ti,
                   "low-rank " + std::to_string(l.rows) + "x" + std::to_string(l.cols) + " rank " +
                       std::to_string(l.rank) + " does not fit the matrix view " +
                       std::to_string(t.rows()) + "x" + std::to_string(t.cols()));
            if (l.p.empty() && l.q.empty())
              fail(Errc::kSizeMismatch, t, ti, "low-rank payload has no factor");
            if (!l.p.empty()) requireSize(l.p.size(), size_t{l.rows} * l.rank, t, ti, "P factor");
            if (!l.q.empty()) requireSize(l.q.size(), size_t{l.cols} * l.rank, t, ti, "Q factor");
            const auto pv =
                l.p.empty() ? sharedFactor(shared, SharedFactors::Side::kP, t, ti, l.rows, l.rank)
                            : l.p;
            const auto qv =
                l.q.empty() ? sharedFactor(shared, SharedFactors::Side::kQ, t, ti, l.cols, l.rank)
                            : l.q;
            requireFinite(l.p, t, ti, "P value");
            requireFinite(l.q, t, ti, "Q value");
            // Every entry of P Q^T is a dot product of a row of P and a row of Q (Cauchy-Schwarz).
            const FactorStats ps = factorStats(pv, l.rows, l.rank),
                              qs = factorStats(qv, l.cols, l.rank);
            return PayloadStats{ps.max_row_norm * qs.max_row_norm, productSqNorm(ps, qs)};
          },
          [&](const SignView& s) {
            requireSize(s.bits.size(), packedBytes(n, 1), t, ti, "sign bytes");
            requireScalar(s.scale, t, ti, "sign scale");
            requirePadding(s.bits, n, t, ti);
            const double sc = s.scale;
            return PayloadStats{sc, sc * sc * static_cast<double>(n)};
          },
          [&](const QsgdView& q) {
            if (q.s == 0 || q.s > 0xffffu)
              fail(Errc::kLevelOutOfRange, t, ti,
                   "QSGD s=" + std::to_string(q.s) + " outside [1, 65535]");
            const uint32_t bits = 1 + qsgdLevelBits(q.s);
            requireSize(q.packed.size(), packedBytes(n, bits), t, ti, "QSGD bytes");
            requireScalar(q.norm, t, ti, "QSGD norm");
            requirePadding(q.packed, n * bits, t, ti);
            BitReader r(q.packed.data());
            uint32_t max_level = 0;
            double sq_levels = 0.0;
            for (size_t i = 0; i < n; ++i) {
              const uint32_t level = r.get(bits) >> 1;
              if (level > q.s)
                fail(Errc::kLevelOutOfRange, t, ti,
                     "QSGD level " + std::to_string(level) + " at " + std::to_string(i) +
                         " exceeds s=" + std::to_string(q.s));
              max_level = std::max(max_level, level);
              sq_levels += static_cast<double>(level) * level;
            }
            const double unit = static_cast<double>(q.norm) / q.s;
            return PayloadStats{unit * max_level, unit * unit * sq_levels, q.norm};
          },
          [&](const TernaryView& x) {
            if (x.count > n)
              fail(Errc::kSizeMismatch, t, ti,
                   "ternary payload has " + std::to_string(x.count) + " positions for numel " +
                       std::to_string(n));
            requireSize(x.signs.size(), packedBytes(x.count, 1), t, ti, "ternary sign bytes");
            requireScalar(x.mu, t, ti, "ternary mu");
            requirePadding(x.signs, x.count, t, ti);
            RiceCheck check;
            if (!riceDecode(
                    x.positions, x.count, x.rice, n, [](uint32_t) {}, &check))
              fail(riceErrc(check.problem), t, ti,
                   std::string("ternary positions: ") + check.why + " (position " +
                       std::to_string(check.at) + ")");
            const double mu = x.mu;
            return PayloadStats{x.count ? mu : 0.0, mu * mu * static_cast<double>(x.count)};
          },
          [&](const BlockQView& q) {
            if (q.bits == 0 || q.bits > 8)
              fail(Errc::kLevelOutOfRange, t, ti,
                   "block levels of " + std::to_string(q.bits) + " bits, outside [1, 8]");
            if (q.block == 0 || q.block > kBlockQMaxBlock)
              fail(Errc::kSizeMismatch, t, ti,
                   "blocks of " + std::to_string(q.block) + " values, outside [1, " +
                       std::to_string(kBlockQMaxBlock) + "]");
            requireSize(q.exps.size(), (n + q.block - 1) / q.block, t, ti, "block exponents");
            requireSize(q.packed.size(), packedBytes(n, q.bits), t, ti, "block level bytes");
            requirePadding(q.packed, n * q.bits, t, ti);
            const int top = (1 << q.bits) - 1;  // the largest code
            BitReader r(q.packed.data());
            double max_abs = 0.0, sq = 0.0;
            for (size_t b = 0; b < q.exps.size(); ++b) {
              const int e = q.exps[b];
              const size_t end = std::min(n, (b + 1) * q.block);
              if (e == kBlockQZero) {
                for (size_t i = b * q.block; i < end; ++i)
                  if (r.get(q.bits) != 0)
                    fail(Errc::kLevelOutOfRange, t, ti,
                         "block " + std::to_string(b) + " of zeros has a level at " +
                             std::to_string(i));
                continue;
              }
              if (e < kBlockQMinExp || e > kBlockQMaxExp)
                fail(Errc::kValueTooLarge, t, ti,
                     "block " + std::to_string(b) + "'s exponent " + std::to_string(e) +
                         " is outside [" + std::to_string(kBlockQMinExp) + ", " +
                         std::to_string(kBlockQMaxExp) + "]");
              const double half = std::ldexp(1.0, e - 1);
              for (size_t i = b * q.block; i < end; ++i) {
                const double v = (2.0 * r.get(q.bits) - top) * half;
                max_abs = std::max(max_abs, std::fabs(v));
                sq += v * v;
              }
            }
            return PayloadStats{max_abs, sq};
          },
      },
      payload);
}

void checkUpdateHeader(const ParamLayout& layout, const UpdateHeader& h, size_t tensors) {
  if (h.layout_fingerprint != layout.fingerprint())
    failInput(Errc::kFingerprintMismatch, "update from client ", h.client_id,
              " is for model fingerprint ", h.layout_fingerprint, ", expected ",
              layout.fingerprint());
  if (tensors != layout.size())
    failInput(Errc::kTensorCountMismatch, "update from client ", h.client_id, " carries ", tensors,
              " tensors, the model has ", layout.size());
}

PayloadStats validateUpdate(const ParamLayout& layout, const UpdateView& u,
                            const SharedFactors* shared) {
  checkUpdateHeader(layout, u.header, u.tensors.size());
  PayloadStats total;
  for (size_t t = 0; t < layout.size(); ++t) {
    const PayloadStats s = validatePayload(u.tensors[t], layout[t], shared, t);
    total.max_abs = std::max(total.max_abs, s.max_abs);
    total.sq_norm += s.sq_norm;
  }
  return total;
}

void accumulatePayload(const PayloadView& payload, const TensorSpec& t, std::span<float> out,
                       float weight, const SharedFactors* shared, size_t ti) {
  STARLING_ENFORCE(out.size() == t.numel, "accumulate: out has ", out.size(), " floats, tensor ",
                   t.numel);
  float* o = out.data();
  const size_t n = t.numel;
  std::visit(
      Overloaded{
          [&](const DenseF32View& d) {
            const float* v = d.values.data();
            for (size_t i = 0; i < n; ++i) o[i] += weight * v[i];
          },
          [&](const DenseF16View& d) {
            for (size_t i = 0; i < n; ++i) o[i] += weight * halfToFloat(d.values[i]);
          },
          [&](const DenseBF16View& d) {
            for (size_t i = 0; i < n; ++i) o[i] += weight * bf16ToFloat(d.values[i]);
          },
          [&](const SparseView& s) {
            const size_t k = s.indices.size();
            const uint32_t* idx = s.indices.data();
            const float* v = s.values.data();
            for (size_t i = 0; i < k; ++i) o[idx[i]] += weight * v[i];
          },
          [&](const RandBlockView& b) {
            const size_t len = b.values.size();
            const size_t first = std::min(len, n - b.offset);
            for (size_t i = 0; i < first; ++i) o[b.offset + i] += weight * b.values[i];
            for (size_t i = first; i < len; ++i) o[i - first] += weight * b.values[i];
          },
          [&](const LowRankView& l) {
            RowMatrixMap m(o, l.rows, l.cols);
            const auto pv =
                l.p.empty() ? sharedFactor(shared, SharedFactors::Side::kP, t, ti, l.rows, l.rank)
                            : l.p;
            const auto qv =
                l.q.empty() ? sharedFactor(shared, SharedFactors::Side::kQ, t, ti, l.cols, l.rank)
                            : l.q;
            ConstFactor p(pv.data(), l.rows, l.rank);
            ConstFactor q(qv.data(), l.cols, l.rank);
            m.noalias() += weight * (p * q.transpose());
          },
          [&](const SignView& s) {
            const float pos = weight * s.scale;
            for (size_t i = 0; i < n; ++i) o[i] += ((s.bits[i >> 3] >> (i & 7)) & 1u) ? -pos : pos;
          },
          [&](const QsgdView& q) {
            const uint32_t bits = 1 + qsgdLevelBits(q.s);
            // In double: weight * norm may exceed float's range even when every level is
            // small.
            const auto unit = static_cast<float>(static_cast<double>(weight) * q.norm / q.s);
            BitReader r(q.packed.data());
            for (size_t i = 0; i < n; ++i) {
              const uint32_t field = r.get(bits);
              // A zero level adds nothing, whatever the unit (0 * inf would be NaN; the
              // bounds keep the unit finite, this keeps a zero a zero).
              if ((field >> 1) == 0) continue;
              const float v = unit * static_cast<float>(field >> 1);
              o[i] += (field & 1u) ? -v : v;
            }
          },
          [&](const TernaryView& x) {
            const float pos = weight * x.mu;
            size_t j = 0;
            const bool ok = riceDecode(x.positions, x.count, x.rice, n, [&](uint32_t i) {
              o[i] += ((x.signs[j >> 3] >> (j & 7)) & 1u) ? -pos : pos;
              ++j;
            });
            STARLING_ENFORCE(ok, "accumulate: ternary payload of tensor ", ti,
                             " was not validated");
          },
          [&](const BlockQView& q) {
            const int top = (1 << q.bits) - 1;
            BitReader r(q.packed.data());
            for (size_t b = 0; b < q.exps.size(); ++b) {
              const size_t end = std::min(n, (b + 1) * size_t{q.block});
              if (q.exps[b] == kBlockQZero) {
                for (size_t i = b * q.block; i < end; ++i) r.get(q.bits);
                continue;
              }
              // The level times the step is exact in float; with weight 1 (a downlink) so
              // is the product, and each sum is one float addition, as on the server.
              const float half =
                  static_cast<float>(static_cast<double>(weight) * std::ldexp(1.0, q.exps[b] - 1));
              for (size_t i = b * q.block; i < end; ++i)
                o[i] += static_cast<float>(2 * static_cast<int>(r.get(q.bits)) - top) * half;
            }
          },
      },
      payload);
}

void densifyUpdate(const ParamLayout& layout, std::span<const PayloadView> tensors,
                   std::span<float> out, const SharedFactors* shared) {
  STARLING_CHECK_ARG(tensors.size() == layout.size(), "densify: ", tensors.size(), " payloads for ",
                     layout.size(), " tensors");
  STARLING_CHECK_ARG(out.size() == layout.numel(), "densify: out has ", out.size(),
                     " floats, the layout needs ", layout.numel());
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t t = 0; t < layout.size(); ++t)
    accumulatePayload(tensors[t], layout[t], layout.slice(out, t), 1.0f, shared, t);
}

void densifyUpdate(const ParamLayout& layout, const std::vector<Payload>& tensors,
                   std::span<float> out, const SharedFactors* shared) {
  std::vector<PayloadView> views;
  views.reserve(tensors.size());
  for (const auto& p : tensors) views.push_back(view(p));
  densifyUpdate(layout, views, out, shared);
}

size_t payloadDataBytes(const PayloadView& payload) {
  return std::visit(
      Overloaded{
          [](const DenseF32View& d) { return d.values.size() * 4; },
          [](const DenseF16View& d) { return d.values.size() * 2; },
          [](const DenseBF16View& d) { return d.values.size() * 2; },
          [](const SparseView& s) { return s.indices.size() * 4 + s.values.size() * 4; },
          [](const RandBlockView& b) { return 4 + b.values.size() * 4; },
          [](const LowRankView& l) { return 12 + (l.p.size() + l.q.size()) * 4; },
          [](const SignView& s) { return 4 + s.bits.size(); },
          [](const QsgdView& q) { return 8 + q.packed.size(); },
          [](const TernaryView& x) { return 9 + x.positions.size() + x.signs.size(); },
          [](const BlockQView& q) { return 5 + q.exps.size() + q.packed.size(); },
      },
      payload);
}

}  // namespace starling::compression
