#include "compression/payload.h"

#include <cmath>

#include "compression/bitpack.h"
#include "core/finite.h"
#include "core/half.h"
#include "core/overloaded.h"

namespace starling::compression {
namespace {

[[noreturn]] void fail(PayloadErrc code, const TensorSpec& t, const std::string& what) {
  throw PayloadError(code, "payload for tensor '" + t.name + "' " + describeShape(t.shape) + ": " + what);
}

void requireSize(size_t got, size_t want, const TensorSpec& t, const char* field) {
  if (got != want)
    fail(PayloadErrc::kSizeMismatch, t,
         std::string(field) + " has " + std::to_string(got) + " entries, expected " + std::to_string(want));
}

void requireFinite(std::span<const float> v, const TensorSpec& t, const char* field) {
  if (!allFinite(v)) {
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        fail(PayloadErrc::kNonFinite, t, std::string(field) + "[" + std::to_string(i) + "] is not finite");
  }
}

void requireFiniteScalar(float x, const TensorSpec& t, const char* field) {
  if (!std::isfinite(x) || x < 0.0f)
    fail(PayloadErrc::kNonFinite, t, std::string(field) + " must be finite and >= 0");
}

void requirePadding(const std::vector<uint8_t>& bytes, size_t used_bits, const TensorSpec& t) {
  if (bytes.empty() || used_bits % 8 == 0) return;
  const uint8_t mask = static_cast<uint8_t>(0xffu << (used_bits % 8));
  if (bytes.back() & mask) fail(PayloadErrc::kBadPadding, t, "non-zero padding bits after the last element");
}

// The matrix the shared factor of `shared` forms for tensor i, or a failure.
const std::vector<float>& sharedFactor(const SharedFactors* shared, SharedFactors::Side want,
                                       const TensorSpec& t, size_t tensor_index, size_t rows, uint32_t rank) {
  if (!shared || shared->fixed != want || tensor_index >= shared->factors.size() ||
      shared->factors[tensor_index].size() != rows * rank)
    fail(PayloadErrc::kMissingSharedFactor, t,
         std::string("carries one low-rank factor, but no shared ") + (want == SharedFactors::Side::kQ ? "Q" : "P") +
             " factor of rank " + std::to_string(rank) + " is known for it");
  return shared->factors[tensor_index];
}

using ConstFactor = Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

}  // namespace

const char* payloadErrcName(PayloadErrc c) {
  switch (c) {
    case PayloadErrc::kSizeMismatch: return "size mismatch";
    case PayloadErrc::kIndexOutOfRange: return "index out of range";
    case PayloadErrc::kIndexOrder: return "indices not strictly increasing";
    case PayloadErrc::kShapeMismatch: return "shape mismatch";
    case PayloadErrc::kNonFinite: return "non-finite value";
    case PayloadErrc::kLevelOutOfRange: return "level out of range";
    case PayloadErrc::kMissingSharedFactor: return "missing shared factor";
    case PayloadErrc::kBadPadding: return "bad padding";
  }
  return "unknown";
}

const char* encodingName(const Payload& p) {
  static constexpr const char* kNames[] = {"dense_f32", "dense_f16", "dense_bf16", "sparse",
                                           "randblock", "lowrank",   "sign",       "qsgd"};
  return kNames[p.index()];
}

uint32_t qsgdLevelBits(uint32_t s) {
  uint32_t bits = 1;
  while ((1ull << bits) <= s) ++bits;
  return bits;
}

void validatePayload(const Payload& payload, const TensorSpec& t, const SharedFactors* shared,
                     size_t tensor_index) {
  const size_t n = t.numel;
  std::visit(
      Overloaded{
          [&](const DenseF32& d) {
            requireSize(d.values.size(), n, t, "dense values");
            requireFinite(d.values, t, "dense value");
          },
          [&](const DenseF16& d) {
            requireSize(d.values.size(), n, t, "fp16 values");
            for (size_t i = 0; i < n; ++i)
              if ((d.values[i] & 0x7c00u) == 0x7c00u)
                fail(PayloadErrc::kNonFinite, t, "fp16 value[" + std::to_string(i) + "] is not finite");
          },
          [&](const DenseBF16& d) {
            requireSize(d.values.size(), n, t, "bf16 values");
            for (size_t i = 0; i < n; ++i)
              if ((d.values[i] & 0x7f80u) == 0x7f80u)
                fail(PayloadErrc::kNonFinite, t, "bf16 value[" + std::to_string(i) + "] is not finite");
          },
          [&](const Sparse& s) {
            requireSize(s.values.size(), s.indices.size(), t, "sparse values (vs indices)");
            if (s.indices.size() > n)
              fail(PayloadErrc::kSizeMismatch, t, "sparse payload has more entries than the tensor");
            for (size_t i = 0; i < s.indices.size(); ++i) {
              if (s.indices[i] >= n)
                fail(PayloadErrc::kIndexOutOfRange, t,
                     "sparse index " + std::to_string(s.indices[i]) + " >= numel " + std::to_string(n));
              if (i > 0 && s.indices[i] <= s.indices[i - 1])
                fail(PayloadErrc::kIndexOrder, t,
                     "sparse index " + std::to_string(s.indices[i]) + " at position " + std::to_string(i) +
                         " does not exceed the previous one (duplicate or unsorted)");
            }
            requireFinite(s.values, t, "sparse value");
          },
          [&](const RandBlock& b) {
            if (b.values.empty() || b.values.size() > n)
              fail(PayloadErrc::kSizeMismatch, t,
                   "random block of " + std::to_string(b.values.size()) + " values for numel " + std::to_string(n));
            if (b.offset >= n)
              fail(PayloadErrc::kIndexOutOfRange, t, "block offset " + std::to_string(b.offset) + " >= numel");
            requireFinite(b.values, t, "block value");
          },
          [&](const LowRank& l) {
            if (l.rows != t.rows() || l.cols != t.cols() || l.rank == 0 || l.rank > std::min(l.rows, l.cols))
              fail(PayloadErrc::kShapeMismatch, t,
                   "low-rank " + std::to_string(l.rows) + "x" + std::to_string(l.cols) + " rank " +
                       std::to_string(l.rank) + " does not fit the matrix view " + std::to_string(t.rows()) + "x" +
                       std::to_string(t.cols()));
            if (l.p.empty() && l.q.empty()) fail(PayloadErrc::kSizeMismatch, t, "low-rank payload has no factor");
            if (!l.p.empty()) requireSize(l.p.size(), size_t{l.rows} * l.rank, t, "P factor");
            if (!l.q.empty()) requireSize(l.q.size(), size_t{l.cols} * l.rank, t, "Q factor");
            if (l.q.empty()) sharedFactor(shared, SharedFactors::Side::kQ, t, tensor_index, l.cols, l.rank);
            if (l.p.empty()) sharedFactor(shared, SharedFactors::Side::kP, t, tensor_index, l.rows, l.rank);
            requireFinite(l.p, t, "P value");
            requireFinite(l.q, t, "Q value");
          },
          [&](const Sign& s) {
            requireSize(s.bits.size(), packedBytes(n, 1), t, "sign bytes");
            requireFiniteScalar(s.scale, t, "sign scale");
            requirePadding(s.bits, n, t);
          },
          [&](const Qsgd& q) {
            if (q.s == 0 || q.s > 0xffffu)
              fail(PayloadErrc::kLevelOutOfRange, t, "QSGD s=" + std::to_string(q.s) + " outside [1, 65535]");
            const uint32_t bits = 1 + qsgdLevelBits(q.s);
            requireSize(q.packed.size(), packedBytes(n, bits), t, "QSGD bytes");
            requireFiniteScalar(q.norm, t, "QSGD norm");
            requirePadding(q.packed, n * bits, t);
            BitReader r(q.packed.data());
            for (size_t i = 0; i < n; ++i) {
              const uint32_t level = r.get(bits) >> 1;
              if (level > q.s)
                fail(PayloadErrc::kLevelOutOfRange, t,
                     "QSGD level " + std::to_string(level) + " at " + std::to_string(i) + " exceeds s=" +
                         std::to_string(q.s));
            }
          },
      },
      payload);
}

void checkUpdateHeader(const ParamLayout& layout, const Update& u) {
  STARLING_CHECK_ARG(u.layout_fingerprint == layout.fingerprint(), "update from client ", u.client_id,
                     " is for another model (fingerprint ", u.layout_fingerprint, ", expected ", layout.fingerprint(), ")");
  STARLING_CHECK_ARG(u.tensors.size() == layout.size(), "update from client ", u.client_id, " carries ",
                     u.tensors.size(), " tensors, the model has ", layout.size());
}

void validateUpdate(const ParamLayout& layout, const Update& u, const SharedFactors* shared) {
  checkUpdateHeader(layout, u);
  for (size_t t = 0; t < layout.size(); ++t) validatePayload(u.tensors[t], layout[t], shared, t);
}

void accumulatePayload(const Payload& payload, const TensorSpec& t, std::span<float> out, float weight,
                       const SharedFactors* shared, size_t tensor_index) {
  STARLING_ENFORCE(out.size() == t.numel, "accumulate: out has ", out.size(), " floats, tensor ", t.numel);
  float* o = out.data();
  const size_t n = t.numel;
  std::visit(
      Overloaded{
          [&](const DenseF32& d) {
            const float* v = d.values.data();
            for (size_t i = 0; i < n; ++i) o[i] += weight * v[i];
          },
          [&](const DenseF16& d) {
            for (size_t i = 0; i < n; ++i) o[i] += weight * halfToFloat(d.values[i]);
          },
          [&](const DenseBF16& d) {
            for (size_t i = 0; i < n; ++i) o[i] += weight * bf16ToFloat(d.values[i]);
          },
          [&](const Sparse& s) {
            const size_t k = s.indices.size();
            for (size_t i = 0; i < k; ++i) o[s.indices[i]] += weight * s.values[i];
          },
          [&](const RandBlock& b) {
            const size_t len = b.values.size();
            const size_t first = std::min(len, n - b.offset);
            for (size_t i = 0; i < first; ++i) o[b.offset + i] += weight * b.values[i];
            for (size_t i = first; i < len; ++i) o[i - first] += weight * b.values[i];
          },
          [&](const LowRank& l) {
            RowMatrixMap m(o, l.rows, l.cols);
            const auto& pv = l.p.empty() ? sharedFactor(shared, SharedFactors::Side::kP, t, tensor_index, l.rows, l.rank)
                                         : l.p;
            const auto& qv = l.q.empty() ? sharedFactor(shared, SharedFactors::Side::kQ, t, tensor_index, l.cols, l.rank)
                                         : l.q;
            ConstFactor p(pv.data(), l.rows, l.rank);
            ConstFactor q(qv.data(), l.cols, l.rank);
            m.noalias() += weight * (p * q.transpose());
          },
          [&](const Sign& s) {
            const float pos = weight * s.scale;
            for (size_t i = 0; i < n; ++i) o[i] += ((s.bits[i >> 3] >> (i & 7)) & 1u) ? -pos : pos;
          },
          [&](const Qsgd& q) {
            const uint32_t bits = 1 + qsgdLevelBits(q.s);
            const float unit = weight * q.norm / static_cast<float>(q.s);
            BitReader r(q.packed.data());
            for (size_t i = 0; i < n; ++i) {
              const uint32_t field = r.get(bits);
              const float v = unit * static_cast<float>(field >> 1);
              o[i] += (field & 1u) ? -v : v;
            }
          },
      },
      payload);
}

void densifyUpdate(const ParamLayout& layout, const std::vector<Payload>& tensors, std::span<float> out,
                   const SharedFactors* shared) {
  STARLING_CHECK_ARG(tensors.size() == layout.size(), "densify: ", tensors.size(), " payloads for ", layout.size(),
                     " tensors");
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t t = 0; t < layout.size(); ++t) accumulatePayload(tensors[t], layout[t], layout.slice(out, t), 1.0f, shared, t);
}

size_t payloadDataBytes(const Payload& payload) {
  return std::visit(Overloaded{
                        [](const DenseF32& d) { return d.values.size() * 4; },
                        [](const DenseF16& d) { return d.values.size() * 2; },
                        [](const DenseBF16& d) { return d.values.size() * 2; },
                        [](const Sparse& s) { return s.indices.size() * 4 + s.values.size() * 4; },
                        [](const RandBlock& b) { return 4 + b.values.size() * 4; },
                        [](const LowRank& l) { return 12 + (l.p.size() + l.q.size()) * 4; },
                        [](const Sign& s) { return 4 + s.bits.size(); },
                        [](const Qsgd& q) { return 8 + q.packed.size(); },
                    },
                    payload);
}

}  // namespace starling::compression
