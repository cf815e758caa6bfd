#pragma once
// The in-memory forms of a compressed model update.
//
// A Payload is what one tensor of one update travels as, owning its data: compressors produce
// them. A PayloadView is the same thing as spans over someone else's memory: the decoder yields
// views straight into a verified wire buffer (no copy), and validation and accumulation read
// views only, so an update is read where it arrived. view(payload) makes a view of an owned one.
//
// Every payload is read against the TensorSpec it claims to describe: validatePayload() checks
// every size, index, level and value before anything trusts them, and measures what the round's
// bounds need (the largest decoded magnitude and the exact squared L2 norm of the decoded
// tensor), in the same pass.
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/input_error.h"
#include "core/metric.h"
#include "core/param_layout.h"

namespace starling::compression {

// ---------------------------------------------------------------- owned payloads

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
// (1 sign bit + qsgdLevelBits(s) level bits) packed LSB-first.
struct Qsgd {
  float norm = 0.0f;
  uint32_t s = 0;
  std::vector<uint8_t> packed;
};

// Sparse ternary (STC): `count` strictly increasing positions, each value +-mu. The positions
// travel Rice-coded with parameter `rice` (compression/rice.h), the signs one bit each (1 =
// negative) packed LSB-first in ceil(count/8) bytes; both streams' padding bits are zero. On the
// wire the two travel as one byte vector, the signs first.
struct Ternary {
  uint32_t count = 0;
  float mu = 0.0f;
  uint8_t rice = 0;
  std::vector<uint8_t> positions;
  std::vector<uint8_t> signs;
};

// Block-scaled levels (the q2 and q3 downlinks, server/model_store.h): the tensor in blocks of
// `block` values (the last may be shorter), each block with its own power-of-two step 2^e. Value j
// of block b is (2 c_j + 1 - 2^bits) 2^(e_b - 1), c_j in [0, 2^bits) its `bits`-bit code (packed
// LSB-first): the 2^bits levels spaced 2^e apart and centred on zero, none at zero. Every decoded
// value is a small odd integer times a power of two, so exact in float. e_b = kBlockQZero marks a
// block of zeros (its codes 0); otherwise e_b is in [kBlockQMinExp, kBlockQMaxExp], so that no
// value exceeds 255 x 2^89 < 1e30 and none is subnormal.
struct BlockQ {
  uint8_t bits = 0;             // 1 to 8
  uint32_t block = 0;           // values a block: 1 to kBlockQMaxBlock
  std::vector<int8_t> exps;     // ceil(numel / block)
  std::vector<uint8_t> packed;  // numel codes of `bits` bits
};
inline constexpr int8_t kBlockQZero = -128;
inline constexpr int kBlockQMinExp = -100, kBlockQMaxExp = 90;
inline constexpr uint32_t kBlockQMaxBlock = 1u << 20;

using Payload = std::variant<DenseF32, DenseF16, DenseBF16, Sparse, RandBlock, LowRank, Sign, Qsgd,
                             Ternary, BlockQ>;

// ---------------------------------------------------------------- views

struct DenseF32View {
  std::span<const float> values;
};
struct DenseF16View {
  std::span<const uint16_t> values;
};
struct DenseBF16View {
  std::span<const uint16_t> values;
};
struct SparseView {
  std::span<const uint32_t> indices;
  std::span<const float> values;
};
struct RandBlockView {
  uint32_t offset = 0;
  std::span<const float> values;
};
struct LowRankView {
  uint32_t rows = 0, cols = 0, rank = 0;
  std::span<const float> p, q;
  bool oneFactor() const { return p.empty() != q.empty(); }
};
struct SignView {
  float scale = 0.0f;
  std::span<const uint8_t> bits;
};
struct QsgdView {
  float norm = 0.0f;
  uint32_t s = 0;
  std::span<const uint8_t> packed;
};

struct TernaryView {
  uint32_t count = 0;
  float mu = 0.0f;
  uint8_t rice = 0;
  std::span<const uint8_t> positions, signs;
};

struct BlockQView {
  uint8_t bits = 0;
  uint32_t block = 0;
  std::span<const int8_t> exps;
  std::span<const uint8_t> packed;
};

// Same alternatives, same order as Payload: index() names the encoding in both.
using PayloadView =
    std::variant<DenseF32View, DenseF16View, DenseBF16View, SparseView, RandBlockView, LowRankView,
                 SignView, QsgdView, TernaryView, BlockQView>;

PayloadView view(const Payload& p);
Payload toOwned(const PayloadView& v);

// Stable names ("dense_f32", "sparse", ...), used in logs, errors and docs.
const char* encodingName(size_t index);
inline const char* encodingName(const Payload& p) { return encodingName(p.index()); }
inline const char* encodingName(const PayloadView& p) { return encodingName(p.index()); }

// Bits for a QSGD level in [0, s].
uint32_t qsgdLevelBits(uint32_t s);

// ---------------------------------------------------------------- updates

// The fields of an update besides its payloads.
struct UpdateHeader {
  uint64_t layout_fingerprint = 0;
  uint64_t round = 0;
  uint32_t phase = 0;
  uint64_t client_id = 0;
  uint64_t num_examples = 0;
  uint64_t nonce = 0;  // the deployment's task nonce (replay protection); 0 in process
};

// One client's update of one phase of one round, owning its data (what a client builds).
struct Update {
  UpdateHeader header;
  std::vector<Payload> tensors;  // one per layout tensor, in layout order
  std::vector<Metric> metrics;
  // SCAFFOLD only (a phase 0 whose task carried the server's control variate): the client's
  // control-variate change c_i+ - c_i, numel floats, dense; empty otherwise.
  std::vector<float> control;
};

struct MetricView {
  std::string_view name;
  double value = 0.0;
};

// An update whose data lives elsewhere (a verified wire buffer, or an owned Update). Reusable:
// the decoder clears and refills one, keeping the vectors' capacity.
struct UpdateView {
  UpdateHeader header;
  std::vector<PayloadView> tensors;
  std::vector<MetricView> metrics;
  std::span<const float> control;  // Update::control
};

UpdateView view(const Update& u);
Update toOwned(const UpdateView& v);

// ---------------------------------------------------------------- partial aggregates in transit

// A partial aggregate of one phase of one round, as it travels from an edge aggregator (or a
// simulator worker) to the root: per tensor the weighted sum of its updates (dense, or sparse
// after re-sparsification; a tensor with a shared factor this phase travels as its one-factor
// sum, a LowRank payload), the total weight, the count and the metrics' weighted sums.
struct PartialHeader {
  uint64_t layout_fingerprint = 0;
  uint64_t round = 0;
  uint32_t phase = 0;
  uint64_t shared_tag = 0;
  uint64_t count = 0;
  double total_weight = 0.0;
  uint64_t nonce = 0;  // the deployment's task nonce; 0 in process
};

struct MetricSum {
  std::string name;
  double weighted_sum = 0.0;  // sum_i w_i m_i over the updates that reported it
  double weight = 0.0;        // sum_i w_i over those updates
};
struct MetricSumView {
  std::string_view name;
  double weighted_sum = 0.0;
  double weight = 0.0;
};

struct PartialMessage {
  PartialHeader header;
  std::vector<Payload> tensors;
  std::vector<MetricSum> metrics;
  // SCAFFOLD: the unweighted sum of its updates' control changes (numel floats); empty otherwise.
  std::vector<float> control;
};
struct PartialView {
  PartialHeader header;
  std::vector<PayloadView> tensors;
  std::vector<MetricSumView> metrics;
  std::span<const float> control;
};

PartialView view(const PartialMessage& m);

// ---------------------------------------------------------------- shared factors

// Per-tensor factors shared by every client of a round phase (PowerSGD's Q and P-hat, ACP-SGD's
// fixed side). factors[i] is empty for a tensor that is not low-rank compressed; otherwise it is
// cols x rank_i (side kQ) or rows x rank_i (side kP), row-major. Made by the server (or seeded
// identically everywhere), so it is trusted input.
struct SharedFactors {
  enum class Side : uint8_t { kQ, kP };  // which factor is fixed (shared) this phase
  Side fixed = Side::kQ;
  std::vector<std::vector<float>> factors;
  bool any() const;
};

// A 64-bit hash of the side and every factor value, so that partial aggregates made against
// different shared factors (different rounds or phases) are never merged.
uint64_t sharedFactorsTag(const SharedFactors& s);

// ---------------------------------------------------------------- validation and accumulation

// What validation measured of a payload's decoded tensor.
struct PayloadStats {
  double max_abs = 0.0;  // an upper bound of max_j |decoded_j| (exact except for low-rank, where
                         // it is max_i ||P_i|| * max_j ||Q_j|| >= every |(P Q^T)_ij|)
  double sq_norm = 0.0;  // ||decoded||_2^2, exact (low-rank: trace(P^T P Q^T Q))
  double declared_norm = 0.0;  // a norm the payload states and decoding multiplies by (QSGD's
                               // norm), which must itself be bounded even when every level is 0
};

// Checks a payload against the tensor it claims to describe: sizes, index ranges and order,
// low-rank shapes, QSGD levels, padding bits, finite values. Throws InputError naming the tensor
// and the problem. `shared` is required for a low-rank payload that carries only one factor.
PayloadStats validatePayload(const PayloadView& p, const TensorSpec& t,
                             const SharedFactors* shared = nullptr, size_t tensor_index = 0);

// Checks the update's fingerprint and tensor count against the layout (O(1)); throws InputError.
void checkUpdateHeader(const ParamLayout& layout, const UpdateHeader& h, size_t tensors);
// checkUpdateHeader, then validatePayload for every tensor; returns the whole update's stats
// (max_abs over tensors, sq_norm summed).
PayloadStats validateUpdate(const ParamLayout& layout, const UpdateView& u,
                            const SharedFactors* shared = nullptr);

// out[j] += weight * decoded(p)[j] for the tensor's numel positions, without materialising the
// decoded tensor. A one-factor low-rank payload uses `shared` for the other factor. The payload
// must have passed validatePayload for this tensor.
void accumulatePayload(const PayloadView& p, const TensorSpec& t, std::span<float> out,
                       float weight, const SharedFactors* shared = nullptr,
                       size_t tensor_index = 0);

// Decodes a whole update's payloads (validated) into `out` (layout.numel() floats, overwritten).
// For the paths that need an update dense: robust rules, tools and tests.
void densifyUpdate(const ParamLayout& layout, std::span<const PayloadView> tensors,
                   std::span<float> out, const SharedFactors* shared = nullptr);
void densifyUpdate(const ParamLayout& layout, const std::vector<Payload>& tensors,
                   std::span<float> out, const SharedFactors* shared = nullptr);

// Exact size of the payload's data on the wire, in bytes, excluding framing. protocol/ reports
// the framed size of a whole message.
size_t payloadDataBytes(const PayloadView& p);
inline size_t payloadDataBytes(const Payload& p) { return payloadDataBytes(view(p)); }

}  // namespace starling::compression
