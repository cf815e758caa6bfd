#pragma once
// The in-memory form of a compressed model update. A Payload is what one tensor of one update
// travels as; protocol/ serializes exactly these types, and aggregation/ consumes them without
// densifying each one first. Every payload is read against the TensorSpec it claims to describe;
// validatePayload() checks every size and index before anything trusts them.
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/param_layout.h"

namespace starling::compression {

struct DenseF32 {
  std::vector<float> values;  // numel
};
struct DenseF16 {
  std::vector<uint16_t> values;  // numel, IEEE binary16
};
struct DenseBF16 {
  std::vector<uint16_t> values;  // numel, bfloat16
};
// Sparse: strictly increasing indices (no duplicates), one value each.
struct Sparse {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};
// Random block: values for positions offset, offset+1, ... wrapping at numel. The offset is a
// function of (run seed, round, tensor), the same for every client of the round; it travels only
// as one u32 so a receiver can check it, never as per-value indices.
struct RandBlock {
  uint32_t offset = 0;
  std::vector<float> values;
};
// Low-rank factors of the tensor's matrix view [rows, cols]: P is rows x rank, Q is cols x rank,
// both row-major. A payload holds P, Q or both; with only one, the other is the round's shared
// factor (PowerSGD phases, ACP-SGD), which the receiver already has.
struct LowRank {
  uint32_t rows = 0, cols = 0, rank = 0;
  std::vector<float> p;  // empty or rows * rank
  std::vector<float> q;  // empty or cols * rank
};
// EF-SignSGD: value_i = scale * (bit_i ? -1 : +1). Bits packed LSB-first, ceil(numel/8) bytes.
struct Sign {
  float scale = 0.0f;
  std::vector<uint8_t> bits;
};
// QSGD: value_i = norm * (sign_i ? -1 : +1) * level_i / s, level_i in [0, s]. Each element is
// (1 sign bit + levelBits(s) level bits) packed LSB-first, ceil(numel * bitsPerElement / 8) bytes.
struct Qsgd {
  float norm = 0.0f;
  uint32_t s = 0;
  std::vector<uint8_t> packed;
};

using Payload = std::variant<DenseF32, DenseF16, DenseBF16, Sparse, RandBlock, LowRank, Sign, Qsgd>;

// Stable names, used in logs, errors and docs.
const char* encodingName(const Payload& p);

// Bits for a QSGD level in [0, s].
uint32_t qsgdLevelBits(uint32_t s);

struct Metric {
  std::string name;
  double value = 0.0;
};

// One client's update of one round.
struct Update {
  uint64_t layout_fingerprint = 0;
  uint64_t round = 0;
  uint64_t client_id = 0;
  uint64_t num_examples = 0;
  std::vector<Payload> tensors;  // one per layout tensor, in layout order
  std::vector<Metric> metrics;
};

// Per-tensor factors shared by every client of a round (PowerSGD's Q and P-hat, ACP-SGD's fixed
// side). factors[i] is empty for a tensor that is not low-rank compressed; otherwise it is
// cols x rank_i (side kQ) or rows x rank_i (side kP), row-major, rank_i = min(rank, rows, cols).
struct SharedFactors {
  enum class Side : uint8_t { kQ, kP };  // which factor is fixed (shared) this round
  Side fixed = Side::kQ;
  std::vector<std::vector<float>> factors;
};

// What validatePayload found wrong; protocol/ maps each to its own DecodeErrc.
enum class PayloadErrc : uint8_t {
  kSizeMismatch,         // a count or byte length disagrees with the tensor or another field
  kIndexOutOfRange,      // a sparse index or block offset >= numel
  kIndexOrder,           // sparse indices not strictly increasing (duplicates included)
  kShapeMismatch,        // low-rank rows/cols/rank disagree with the tensor's matrix view
  kNonFinite,            // NaN or inf in a value, scale or norm (or a negative scale/norm)
  kLevelOutOfRange,      // QSGD level > s, or s out of range
  kMissingSharedFactor,  // one-factor low-rank payload without a matching shared factor
  kBadPadding,           // non-zero bits after the last packed element
};
const char* payloadErrcName(PayloadErrc c);

class PayloadError : public InvalidArgument {
 public:
  PayloadError(PayloadErrc code, const std::string& msg) : InvalidArgument(msg), code_(code) {}
  PayloadErrc code() const { return code_; }

 private:
  PayloadErrc code_;
};

// Checks a payload against the tensor it claims to describe: sizes, index ranges and order,
// low-rank shapes, QSGD level range, finite values. Throws PayloadError naming the problem.
// `shared` is required for a low-rank payload that carries only one factor.
void validatePayload(const Payload& p, const TensorSpec& t, const SharedFactors* shared = nullptr,
                     size_t tensor_index = 0);

// Checks an update against the layout: the fingerprint and one payload per tensor (O(1)), then,
// for validateUpdate, every payload (validatePayload). Throws InvalidArgument naming the client.
void checkUpdateHeader(const ParamLayout& layout, const Update& u);
void validateUpdate(const ParamLayout& layout, const Update& u, const SharedFactors* shared = nullptr);

// out[j] += weight * decoded(p)[j] for the tensor's numel positions, without materialising the
// decoded tensor. A one-factor low-rank payload uses `shared` for the other factor. The payload
// must have passed validatePayload for this tensor.
void accumulatePayload(const Payload& p, const TensorSpec& t, std::span<float> out, float weight,
                       const SharedFactors* shared = nullptr, size_t tensor_index = 0);

// Decodes a whole update's payloads (one per layout tensor, already validated) into `out`
// (layout.numel() floats, overwritten). For the paths that need an update dense: clipping,
// robust rules, tools and tests.
void densifyUpdate(const ParamLayout& layout, const std::vector<Payload>& tensors, std::span<float> out,
                   const SharedFactors* shared = nullptr);

// Exact size of the payload's data on the wire, in bytes, excluding framing. protocol/ reports
// the framed size of a whole message.
size_t payloadDataBytes(const Payload& p);

}  // namespace starling::compression
