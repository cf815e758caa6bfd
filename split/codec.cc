#include "split/codec.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "compression/compressor.h"
#include "compression/lowrank.h"
#include "compression/topk_select.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/input_error.h"
#include "core/rng.h"

namespace starling::split {
namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const Matrix>;
using Map = Eigen::Map<Matrix>;

constexpr uint8_t kMagic = 'A';
enum Kind : uint8_t { kNone = 0, kInt8 = 1, kTopK = 2, kLowRank = 3 };
constexpr size_t kHeader = 1 + 1 + 4 + 4;

void checkInput(const ActivationCodec& c, std::span<const float> m, size_t rows, size_t cols) {
  STARLING_CHECK_ARG(rows > 0 && cols > 0 && rows <= UINT32_MAX && cols <= UINT32_MAX, c.name(),
                     ": a matrix of ", rows, " x ", cols, " cannot be encoded");
  STARLING_CHECK_ARG(m.size() == rows * cols, c.name(), ": ", m.size(), " values for a ", rows,
                     " x ", cols, " matrix");
  for (size_t i = 0; i < m.size(); ++i)
    STARLING_CHECK_ARG(std::isfinite(m[i]), c.name(), ": activation value ", i, " is not finite");
}

std::vector<uint8_t> header(uint8_t kind, size_t rows, size_t cols) {
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.u8(kMagic);
  w.u8(kind);
  w.u32(static_cast<uint32_t>(rows));
  w.u32(static_cast<uint32_t>(cols));
  return out;
}

void putFloats(std::vector<uint8_t>& out, const float* v, size_t n) {
  ByteWriter w(out);
  for (size_t i = 0; i < n; ++i) w.f32(v[i]);
}

class NoneCodec final : public ActivationCodec {
 public:
  std::string name() const override { return "none"; }
  std::string spec() const override { return "none"; }
  std::vector<uint8_t> encode(std::span<const float> m, size_t rows, size_t cols,
                              CodecState& st) const override {
    checkInput(*this, m, rows, cols);
    auto out = header(kNone, rows, cols);
    putFloats(out, m.data(), m.size());
    ++st.calls;
    return out;
  }
};

class Int8Codec final : public ActivationCodec {
 public:
  std::string name() const override { return "int8"; }
  std::string spec() const override { return "int8"; }
  std::vector<uint8_t> encode(std::span<const float> m, size_t rows, size_t cols,
                              CodecState& st) const override {
    checkInput(*this, m, rows, cols);
    auto out = header(kInt8, rows, cols);
    std::vector<float> scale(rows);
    for (size_t r = 0; r < rows; ++r) {
      float mx = 0.0f;
      for (size_t c = 0; c < cols; ++c) mx = std::max(mx, std::fabs(m[r * cols + c]));
      scale[r] = mx / 127.0f;
    }
    putFloats(out, scale.data(), rows);
    out.reserve(out.size() + m.size());
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) {
        const float q = scale[r] > 0.0f ? std::nearbyint(m[r * cols + c] / scale[r]) : 0.0f;
        out.push_back(static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f))));
      }
    ++st.calls;
    return out;
  }
};

class TopKCodec final : public ActivationCodec {
 public:
  explicit TopKCodec(double density) : density_(density) {
    if (!(density > 0.0 && density <= 1.0))
      STARLING_THROW(ConfigError, "topk activation codec: density must be in (0, 1], got ",
                     density);
  }
  std::string name() const override { return "topk"; }
  std::string spec() const override {
    std::ostringstream os;
    os << "topk:density=" << density_;
    return os.str();
  }
  std::vector<uint8_t> encode(std::span<const float> m, size_t rows, size_t cols,
                              CodecState& st) const override {
    checkInput(*this, m, rows, cols);
    const size_t k = compression::countForDensity(density_, m.size());
    std::vector<uint32_t> idx;
    compression::selectTopK(m, k, idx, st.calls);
    std::sort(idx.begin(), idx.end());
    auto out = header(kTopK, rows, cols);
    ByteWriter w(out);
    w.u32(static_cast<uint32_t>(idx.size()));
    for (uint32_t i : idx) w.u32(i);
    for (uint32_t i : idx) w.f32(m[i]);
    ++st.calls;
    return out;
  }

 private:
  double density_;
};

class LowRankCodec final : public ActivationCodec {
 public:
  LowRankCodec(uint32_t rank, uint32_t iters, bool ef) : rank_(rank), iters_(iters), ef_(ef) {
    if (rank == 0) STARLING_THROW(ConfigError, "lowrank activation codec: rank must be >= 1");
    if (iters == 0 || iters > 16)
      STARLING_THROW(ConfigError, "lowrank activation codec: iters must be in [1, 16], got ",
                     iters);
  }
  std::string name() const override { return "lowrank"; }
  std::string spec() const override {
    return "lowrank:rank=" + std::to_string(rank_) + ",iters=" + std::to_string(iters_) +
           ",ef=" + (ef_ ? "true" : "false");
  }
  std::vector<uint8_t> encode(std::span<const float> m, size_t rows, size_t cols,
                              CodecState& st) const override {
    checkInput(*this, m, rows, cols);
    const size_t r = std::min<size_t>({rank_, rows, cols});
    const bool same_shape = st.rows == rows && st.cols == cols;
    Matrix a = ConstMap(m.data(), static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
    if (ef_ && same_shape && st.residual.size() == m.size())
      a += ConstMap(st.residual.data(), static_cast<Eigen::Index>(rows),
                    static_cast<Eigen::Index>(cols));
    std::vector<float> q(cols * r);
    if (same_shape && st.q.size() == q.size()) {
      q = st.q;
    } else {
      RngStream rng(StreamKey{0x5741, rows, cols, StreamPurpose::kLowRankInit, r});
      for (float& x : q) x = static_cast<float>(rng.normal());
      compression::orthogonalize(q.data(), cols, r);
    }
    Matrix p(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(r));
    Map qm(q.data(), static_cast<Eigen::Index>(cols), static_cast<Eigen::Index>(r));
    for (uint32_t it = 0; it < iters_; ++it) {
      p.noalias() = a * qm;
      compression::orthogonalize(p.data(), rows, r);
      qm.noalias() = a.transpose() * p;
    }
    auto out = header(kLowRank, rows, cols);
    ByteWriter w(out);
    w.u32(static_cast<uint32_t>(r));
    putFloats(out, p.data(), static_cast<size_t>(p.size()));
    putFloats(out, q.data(), q.size());
    // Commit: nothing above can throw past this point but allocation, before any state changes.
    std::vector<float> residual;
    if (ef_) {
      Matrix res = a - p * qm.transpose();
      residual.assign(res.data(), res.data() + res.size());
    }
    std::vector<float> warm = q;
    compression::orthogonalize(warm.data(), cols, r);
    st.rows = rows;
    st.cols = cols;
    st.q = std::move(warm);
    st.residual = std::move(residual);
    ++st.calls;
    return out;
  }

 private:
  uint32_t rank_, iters_;
  bool ef_;
};

// Reads the body of an encoding against the expected shape; every failure is an InputError.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  void need(size_t n, const char* what) const {
    if (b_.size() - pos_ < n)
      failInput(Errc::kTruncated, "activation: ", what, " needs ", n, " bytes, ", b_.size() - pos_,
                " left");
  }
  uint8_t u8() {
    need(1, "a byte");
    return b_[pos_++];
  }
  uint32_t u32() {
    need(4, "a u32");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{b_[pos_ + i]} << (8 * i);
    pos_ += 4;
    return v;
  }
  float f32() { return std::bit_cast<float>(u32()); }
  size_t left() const { return b_.size() - pos_; }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

float finiteValue(Reader& r, double max_abs, const char* what, size_t i) {
  const float v = r.f32();
  if (!std::isfinite(v))
    failInput(Errc::kNonFinite, "activation: ", what, " ", i, " is not finite");
  if (std::fabs(v) > max_abs)
    failInput(Errc::kValueTooLarge, "activation: ", what, " ", i, " (", v, ") exceeds ", max_abs);
  return v;
}

}  // namespace

const char* activationKindName(uint8_t kind) {
  switch (kind) {
    case kNone:
      return "none";
    case kInt8:
      return "int8";
    case kTopK:
      return "topk";
    case kLowRank:
      return "lowrank";
  }
  return "unknown";
}

const Registry<ActivationCodec>& activationCodecs() {
  static const Registry<ActivationCodec> kRegistry(
      "activation codec",
      {
          {"none", "f32 values, exact", "",
           [](OptionReader&) { return std::make_unique<NoneCodec>(); }},
          {"int8", "one byte per value and an f32 scale per row (error <= scale / 2)", "",
           [](OptionReader&) { return std::make_unique<Int8Codec>(); }},
          {"topk", "the largest magnitudes of the matrix: u32 index + f32 value each",
           "density=0.05 (fraction kept)",
           [](OptionReader& r) { return std::make_unique<TopKCodec>(r.number("density", 0.05)); }},
          {"lowrank",
           "rank-r factors P, Q by power iteration, warm-started across steps (M ~= P Q^T)",
           "rank=4, iters=1 (power iterations per call), ef=false (error feedback across calls of "
           "one shape)",
           [](OptionReader& r) {
             const uint32_t rank = r.count("rank", 4);
             const uint32_t iters = r.count("iters", 1);
             return std::make_unique<LowRankCodec>(rank, iters, r.flag("ef", false));
           }},
      });
  return kRegistry;
}

std::unique_ptr<ActivationCodec> makeActivationCodec(std::string_view spec) {
  return activationCodecs().make(spec);
}

void decodeActivation(std::span<const uint8_t> bytes, size_t rows, size_t cols,
                      std::span<float> out, double max_abs) {
  STARLING_CHECK_ARG(out.size() == rows * cols, "decodeActivation: an output of ", out.size(),
                     " floats for ", rows, " x ", cols);
  Reader r(bytes);
  if (bytes.size() < kHeader)
    failInput(Errc::kTruncated, "activation: ", bytes.size(), " bytes, a header needs ", kHeader);
  if (r.u8() != kMagic) failInput(Errc::kBadIdentifier, "activation: not an activation encoding");
  const uint8_t kind = r.u8();
  const uint32_t got_rows = r.u32(), got_cols = r.u32();
  if (got_rows != rows || got_cols != cols)
    failInput(Errc::kShapeMismatch, "activation: a ", got_rows, " x ", got_cols,
              " matrix, expected ", rows, " x ", cols);
  const size_t n = rows * cols;
  switch (kind) {
    case kNone: {
      if (r.left() != 4 * n)
        failInput(Errc::kSizeMismatch, "activation: ", r.left(), " bytes of values, ", 4 * n,
                  " expected");
      for (size_t i = 0; i < n; ++i) out[i] = finiteValue(r, max_abs, "value", i);
      break;
    }
    case kInt8: {
      if (r.left() != 4 * rows + n)
        failInput(Errc::kSizeMismatch, "activation: ", r.left(), " bytes of int8 data, ",
                  4 * rows + n, " expected");
      std::vector<float> scale(rows);
      for (size_t i = 0; i < rows; ++i) {
        scale[i] = finiteValue(r, max_abs / 127.0, "scale", i);
        if (scale[i] < 0.0f) failInput(Errc::kNonFinite, "activation: scale ", i, " is negative");
      }
      for (size_t i = 0; i < n; ++i) {
        const auto q = static_cast<int8_t>(r.u8());
        if (q == -128)
          failInput(Errc::kSizeMismatch, "activation: int8 value ", i,
                    " is -128, outside [-127, 127]");
        out[i] = scale[i / cols] * static_cast<float>(q);
      }
      break;
    }
    case kTopK: {
      const uint32_t k = r.u32();
      if (k > n)
        failInput(Errc::kSizeMismatch, "activation: ", k, " top-k entries for ", n, " values");
      if (r.left() != size_t{8} * k)
        failInput(Errc::kSizeMismatch, "activation: ", r.left(), " bytes for ", k,
                  " top-k entries, ", 8 * size_t{k}, " expected");
      std::fill(out.begin(), out.end(), 0.0f);
      std::vector<uint32_t> idx(k);
      for (uint32_t i = 0; i < k; ++i) {
        idx[i] = r.u32();
        if (idx[i] >= n)
          failInput(Errc::kIndexOutOfRange, "activation: index ", idx[i], " of ", n, " values");
        if (i > 0 && idx[i] <= idx[i - 1])
          failInput(Errc::kIndexOrder, "activation: indices not strictly increasing at entry ", i);
      }
      for (uint32_t i = 0; i < k; ++i) out[idx[i]] = finiteValue(r, max_abs, "value", i);
      break;
    }
    case kLowRank: {
      const uint32_t rank = r.u32();
      if (rank == 0 || rank > std::min(rows, cols))
        failInput(Errc::kShapeMismatch, "activation: rank ", rank, " for a ", rows, " x ", cols,
                  " matrix");
      if (r.left() != size_t{4} * rank * (rows + cols))
        failInput(Errc::kSizeMismatch, "activation: ", r.left(), " bytes of factors, ",
                  size_t{4} * rank * (rows + cols), " expected");
      Matrix p(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(rank));
      Matrix q(static_cast<Eigen::Index>(cols), static_cast<Eigen::Index>(rank));
      // Factors bounded so that every product term stays finite (rank x the bound squared).
      const double factor_bound = std::sqrt(max_abs / rank);
      for (Eigen::Index i = 0; i < p.size(); ++i)
        p.data()[i] = finiteValue(r, factor_bound, "factor P value", i);
      for (Eigen::Index i = 0; i < q.size(); ++i)
        q.data()[i] = finiteValue(r, factor_bound, "factor Q value", i);
      Map(out.data(), static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols)).noalias() =
          p * q.transpose();
      break;
    }
    default:
      failInput(Errc::kUnknownEncoding, "activation: unknown encoding kind ", int{kind});
  }
}

}  // namespace starling::split
