#pragma once
// PartialAggregate: the streaming weighted sum at the heart of every aggregation in Starling,
// kept in ONE contiguous float buffer so that a collective (Gloo, NCCL) can all-reduce or
// reduce-scatter it in place, with no pack or unpack:
//
//   [ total weight | count | metric slots (weighted sum, weight) per declared metric |
//     factor sums (per tensor with a shared factor) | SCAFFOLD control sum (numel, when the
//     phase carries one) | dense sum (numel) ]
//
// The head (everything before the dense sum) comes first, so a collective can all-reduce the head
// and reduce-scatter the dense sum in shards (the simulator's sharded server step). The head is
// small unless it holds SCAFFOLD's control sum, a second numel floats, which is all-reduced whole.
//
//   sum = sum_i w_i * update_i,   W = sum_i w_i,   n = count,   metric: sum_i w_i m_i and sum_i w_i
//   SCAFFOLD's control sum: sum_i (c_i+ - c_i), unweighted (the server adds it / N to c)
//
// Updates are added straight from their payload views (dense adds, sparse scatter-adds, a random
// block adds its block, sign/QSGD add decoded values, a two-factor low-rank payload adds P Q^T). A
// one-factor low-rank payload adds in factor space into its tensor's factor-sum slot, expanded
// with the shared factor only once, in meanInto(). Adding allocates nothing (tested by counting
// operator new), so memory is O(model) whatever the number of clients.
//
// What the buffer means is an AggregateLayout, built once per round phase and shared (never
// copied) by every partial of that phase: the model's layout, the phase's shared factors, the
// declared metric names, and the slot offsets. Partials of one layout merge associatively and
// commutatively by adding buffers (exactly in real arithmetic; float rounding depends on the
// order), which is what makes edge aggregators and a simulator worker's local aggregation exact.
//
// Float counts and weights are exact up to 2^24; beyond that they carry float's relative error,
// as the sums themselves do.
//
// Not thread-safe: one thread adds to one aggregate; threads aggregate into their own and merge.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compression/payload.h"
#include "core/param_layout.h"

namespace starling::aggregation {

using compression::PartialMessage;
using compression::PartialView;
using compression::Payload;
using compression::PayloadView;
using compression::SharedFactors;
using compression::UpdateView;

class AggregateLayout {
 public:
  // `shared` may be null (no shared factors this phase).
  // `control`: the phase carries SCAFFOLD's control changes (phase 0 of a SCAFFOLD round).
  AggregateLayout(std::shared_ptr<const ParamLayout> model, uint64_t round, uint32_t phase,
                  std::shared_ptr<const SharedFactors> shared,
                  std::vector<std::string> metric_names, bool control = false);

  const ParamLayout& model() const { return *model_; }
  const std::shared_ptr<const ParamLayout>& modelPtr() const { return model_; }
  uint64_t round() const { return round_; }
  uint32_t phase() const { return phase_; }
  const SharedFactors& shared() const { return *shared_; }
  const std::shared_ptr<const SharedFactors>& sharedPtr() const { return shared_; }
  uint64_t sharedTag() const { return shared_tag_; }
  // Identity of the layout: model fingerprint, round, phase, shared factors, metric names. Two
  // partials merge only if their tags agree.
  uint64_t tag() const { return tag_; }

  size_t size() const { return size_; }  // floats in the buffer
  size_t numel() const { return model_->numel(); }
  // The head (weight, count, metric slots, factor sums) is [0, denseOffset()); the dense sum is
  // [denseOffset(), size()).
  size_t denseOffset() const { return dense_offset_; }
  // Factor-sum slot of tensor t: empty (size 0) if the tensor has no shared factor this phase.
  size_t factorOffset(size_t t) const { return factor_offset_[t]; }
  size_t factorSize(size_t t) const { return factor_size_[t]; }
  bool hasFactorSlot(size_t t) const { return factor_size_[t] != 0; }
  bool hasControl() const { return control_; }
  size_t controlOffset() const { return control_offset_; }  // numel floats when hasControl()
  const std::vector<std::string>& metricNames() const { return metric_names_; }
  std::optional<size_t> metricIndex(std::string_view name) const;
  size_t metricOffset(size_t i) const { return 2 + 2 * i; }
  size_t weightOffset() const { return 0; }
  size_t countOffset() const { return 1; }

 private:
  std::shared_ptr<const ParamLayout> model_;
  uint64_t round_;
  uint32_t phase_;
  std::shared_ptr<const SharedFactors> shared_;
  uint64_t shared_tag_ = 0;
  uint64_t tag_ = 0;
  std::vector<size_t> factor_offset_, factor_size_;
  std::vector<std::string> metric_names_;
  bool control_ = false;
  size_t control_offset_ = 0;
  size_t dense_offset_ = 0;
  size_t size_ = 0;
};

class PartialAggregate {
 public:
  explicit PartialAggregate(std::shared_ptr<const AggregateLayout> layout);

  const AggregateLayout& layout() const { return *layout_; }
  const std::shared_ptr<const AggregateLayout>& layoutPtr() const { return layout_; }

  // The whole state, for a collective to reduce in place.
  std::span<float> buffer() { return buf_; }
  std::span<const float> buffer() const { return buf_; }

  double totalWeight() const { return buf_[layout_->weightOffset()]; }
  uint64_t count() const { return static_cast<uint64_t>(buf_[layout_->countOffset()]); }
  bool empty() const { return count() == 0; }
  std::span<const float> denseSum() const {
    return std::span<const float>(buf_).subspan(layout_->denseOffset(), layout_->numel());
  }
  std::span<const float> factorSum(size_t t) const {
    return std::span<const float>(buf_).subspan(layout_->factorOffset(t), layout_->factorSize(t));
  }
  // SCAFFOLD's unweighted sum of control changes (numel floats); empty without one.
  std::span<const float> controlSum() const {
    if (!layout_->hasControl()) return {};
    return std::span<const float>(buf_).subspan(layout_->controlOffset(), layout_->numel());
  }
  // Per tensor, the factor sum (empty where the tensor has no shared factor).
  std::vector<std::span<const float>> factorSums() const;

  // Adds scale * update with weight w: the sums grow by w * scale * update, the total weight by
  // w alone (how a clipped update, scale = min(1, C / ||u||), enters the mean). The update must
  // have passed validation for this phase (the round does it); this only re-checks, in O(1) per
  // tensor, what memory safety needs (tensor count, factor slots), and throws InvalidArgument
  // before changing anything if that fails.
  void addValidated(const UpdateView& u, double weight, double scale = 1.0);
  // Adds `value` with `weight` to the declared metric `name`'s slot (the server's own metrics:
  // adaptive clipping's count). InvalidArgument for a name the layout does not declare.
  void addMetric(std::string_view name, double value, double weight);

  // Adds everything `other` holds. Throws InvalidArgument if it has another layout tag.
  void merge(const PartialAggregate& other);
  // Adds a received partial aggregate (already validated against this layout by the round), its
  // sums times `scale` in (0, 1] (an asynchronous partial's staleness weight, as addValidated's
  // scale: the weight, count and metrics as they are).
  void mergeValidated(const PartialView& p, double scale = 1.0);

  // mean of the dense part; with `with_factors`, plus the factor sums expanded with the shared
  // factors; all divided by W. `out` (numel floats) is overwritten, or added to with `add`.
  // Throws InvalidArgument when empty.
  void meanInto(std::span<float> out, bool with_factors = true, bool add = false) const;
  std::vector<float> mean(bool with_factors = true) const;
  // Weighted means of the declared metrics that some update reported.
  std::map<std::string, double> metricMeans() const;

  // The partial for sending upstream. exportDense() is exact. exportSparse() keeps the top
  // `density` fraction per tensor of (dense sum + residual) and stores the rest in `residual`
  // (numel floats; zeros on first use): exported + new residual == sum + old residual. Factor
  // sums always travel whole, as one-factor LowRank payloads.
  PartialMessage exportDense() const;
  PartialMessage exportSparse(double density, std::vector<float>& residual) const;

  size_t bufferBytes() const { return buf_.capacity() * sizeof(float); }
  void reset();

 private:
  PartialMessage exportHeader() const;
  // Adds w * each tensor; tensors with a factor slot must be one-factor payloads of its size.
  void addTensors(std::span<const PayloadView> tensors, float w);
  std::shared_ptr<const AggregateLayout> layout_;
  std::vector<float> buf_;
};

}  // namespace starling::aggregation
