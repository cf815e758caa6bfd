#pragma once
// PartialAggregate: the streaming weighted sum at the heart of every aggregation in Starling.
//
//   sum = sum_i w_i * update_i,   W = sum_i w_i,   n = count,   metrics: sum_i w_i * m_i
//
// Updates are added one at a time straight from their encoded payloads (dense adds, sparse
// scatter-adds, a random block adds its block, sign/QSGD add decoded values, a two-factor
// low-rank payload adds P Q^T). A one-factor low-rank payload (PowerSGD phases, ACP-SGD) adds in
// factor space: its factor goes into a per-tensor factor sum, expanded with the round's shared
// factor only once, in mean(). All buffers are allocated at construction; add() allocates
// nothing, so memory is O(model) whatever the number of clients.
//
// Partial aggregates merge associatively and commutatively (exactly in real arithmetic; float
// rounding differs by summation order), which is what makes edge aggregators and a simulator
// worker's local aggregation exact: merge(a, b) holds the same sums as adding a's and b's
// updates into one aggregate.
//
// Not thread-safe: one thread adds to one aggregate; threads aggregate into their own and merge.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "compression/payload.h"
#include "core/param_layout.h"

namespace starling::aggregation {

using compression::Payload;
using compression::SharedFactors;
using compression::Update;

// A partial aggregate in transit (edge aggregator -> root): the weighted sum as payloads (dense,
// or sparse after re-sparsification), with its total weight, count and weighted metric sums.
struct AggregateSummary {
  uint64_t layout_fingerprint = 0;
  uint64_t shared_tag = 0;
  std::vector<Payload> sum;  // one per tensor; factor sums ride as one-factor LowRank payloads
  double total_weight = 0.0;
  uint64_t count = 0;
  std::map<std::string, double> metric_sums;
};

class PartialAggregate {
 public:
  // `shared` (copied) is the round's shared low-rank factors, if any update will carry one-factor
  // low-rank payloads; a factor-sum buffer is allocated for each tensor that has one.
  explicit PartialAggregate(const ParamLayout& layout, const SharedFactors* shared = nullptr);

  // Checks what add() checks without adding: the weight, the fingerprint, the tensor count,
  // every payload (validatePayload) and the round's factored tensors. Throws InvalidArgument
  // (PayloadError for a bad payload).
  void validate(const Update& u, double weight) const;
  // Adds scale * update with weight w (finite, > 0); the total weight grows by w alone, which is
  // how a clipped update (scale = min(1, C / ||u||)) enters the mean. Validates first and leaves
  // the aggregate unchanged on any error.
  void add(const Update& u, double weight, double scale = 1.0);
  // The same for an update that already passed validate(), protocol::decodeUpdate or
  // validatePayload for this layout: only O(1) checks per tensor.
  void addValidated(const Update& u, double weight, double scale = 1.0);

  // Adds everything `other` holds. Throws InvalidArgument if it is for another model or round.
  void merge(const PartialAggregate& other);
  void merge(const AggregateSummary& summary);

  double totalWeight() const { return total_weight_; }
  uint64_t count() const { return count_; }
  bool empty() const { return count_ == 0; }
  const ParamLayout& layout() const { return layout_; }

  // The dense part of the weighted sum (excluding factor sums).
  std::span<const float> denseSum() const { return sum_; }
  // sum_i w_i * factor_i for tensor t (rows x r for a shared Q, cols x r for a shared P); empty
  // if the tensor has no shared factor.
  std::span<const float> factorSum(size_t t) const { return factor_sums_[t]; }
  const SharedFactors& shared() const { return shared_; }
  uint64_t sharedTag() const { return shared_tag_; }

  // The weighted mean update sum / W (factor sums expanded with the shared factors). Throws
  // InvalidArgument when empty.
  std::vector<float> mean() const;
  void meanInto(std::span<float> out) const;
  // Weighted means of the reported metrics.
  std::map<std::string, double> metricMeans() const;

  // Exports the partial aggregate for sending upstream. exportDense() is exact. exportSparse()
  // keeps the top `density` fraction per tensor of (dense sum + residual) and stores the rest in
  // `residual` (layout-sized; zeros on first use), so nothing is lost across rounds: exported +
  // new residual == sum + old residual. Factor sums always travel whole.
  AggregateSummary exportDense() const;
  AggregateSummary exportSparse(double density, std::vector<float>& residual) const;

  // Buffers and bytes this aggregate holds (constant after construction).
  size_t bufferCount() const;
  size_t bufferBytes() const;

  void reset();

 private:
  void checkUpdate(const Update& u, double weight) const;
  void accumulate(const Payload& p, size_t t, float weight);
  void addChecked(const Update& u, double weight, double scale);
  static void checkScale(double scale);
  ParamLayout layout_;
  SharedFactors shared_;
  uint64_t shared_tag_ = 0;
  std::vector<float> sum_;
  std::vector<std::vector<float>> factor_sums_;
  double total_weight_ = 0.0;
  uint64_t count_ = 0;
  std::map<std::string, double> metric_sums_;
};

// A hash of the shared factors, so partials of different rounds are never merged.
uint64_t sharedFactorsTag(const SharedFactors& s);

}  // namespace starling::aggregation
