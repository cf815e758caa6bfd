#pragma once
// Split fine-tuning in one process (the in-process mode, for experiments): the edge's and
// the cloud's steps run one after the other, and every activation matrix going up and every
// gradient matrix coming down goes through its codec's real encoding and decoding, so the bytes
// counted are exactly those that would cross the cut. Plain SGD on both parts, mean cross-entropy.
//
// One step on a batch of n examples:
//   edge:  a = bottom(x)                       up   = encode_up(a)      -> uplink bytes
//   cloud: a' = decode(up); loss(top(a')); g = dloss/da'; top -= lr grad_top
//                                              down = encode_down(g)    -> downlink bytes
//   edge:  g' = decode(down); bottom -= lr (dbottom from g')   (unless the bottom is frozen)
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/idx.h"
#include "split/codec.h"
#include "split/roles.h"
#include "split/split_model.h"

namespace starling::split {

struct SplitTrainConfig {
  std::string up = "none";    // activation codec spec, edge -> cloud
  std::string down = "none";  // gradient codec spec, cloud -> edge
  uint32_t batch_size = 32;
  double lr = 0.05;
  bool train_bottom = true;  // false: the edge's part stays as pre-trained
  bool splitfed = false;     // several edges: average their bottoms after each epoch (SplitFed)
  uint64_t seed = 1;         // shuffling
  void validate() const;     // ConfigError naming the key
};

struct EpochRecord {
  uint32_t epoch = 0;
  size_t steps = 0;
  double train_loss = 0;      // mean over the epoch's steps
  double train_accuracy = 0;  // on the cloud's (decoded) activations
  double test_loss = 0,
         test_accuracy = 0;  // whole model, uncompressed (0 without a test set); mean over edges
  uint64_t uplink_bytes = 0, downlink_bytes = 0;
  uint64_t eval_bytes = 0;  // networked: the uncompressed activations sent for the test accuracy
  double cloud_seconds =
      0;  // the cloud's compute time in its steps (top part forward, backward, update, encoding)
  double wall_seconds = 0;
  std::string json() const;  // one JSON object, no newline
};

// Copies the examples `which` of `d` into x (n x features) and y.
void gatherBatch(const data::Dataset& d, std::span<const size_t> which, std::vector<float>& x,
                 std::vector<uint8_t>& y);

// One cloud and K edge devices in one process (SplitCloud and SplitEdge, split/roles.h). Each
// epoch interleaves the edges' steps (batch j of edge 0, of edge 1, ..., then batch j+1); with
// SplitFed the edges' bottoms are averaged, weighted by their examples, after each epoch.
class InProcessSplit {
 public:
  // `params`: the whole model's parameters (model.full()'s layout), cut by model.cutParameters;
  // every edge starts from the same bottom.
  InProcessSplit(SplitModel& model, SplitTrainConfig config, std::vector<float> params,
                 size_t edges = 1);

  // One pass over every edge's examples (`shards[e]` indexes `train` for edge e; one shard per
  // edge), then evaluation on `test[test_idx]` when given.
  EpochRecord runEpoch(const data::Dataset& train, const std::vector<std::vector<size_t>>& shards,
                       const data::Dataset* test, std::span<const size_t> test_idx);
  // One edge.
  EpochRecord runEpoch(const data::Dataset& train, std::span<const size_t> idx,
                       const data::Dataset* test, std::span<const size_t> test_idx);

  size_t edges() const { return edges_.size(); }
  std::span<const float> bottom(size_t edge = 0) const { return edges_.at(edge)->bottom(); }
  std::span<const float> top() const { return cloud_->top(); }
  // Mean loss and accuracy of the whole model on `d[idx]`, in batches, uncompressed, with edge
  // `edge`'s bottom.
  std::pair<double, double> evaluate(const data::Dataset& d, std::span<const size_t> idx,
                                     size_t edge = 0);

 private:
  SplitModel& model_;
  SplitTrainConfig cfg_;
  std::unique_ptr<SplitCloud> cloud_;
  std::vector<std::unique_ptr<SplitEdge>> edges_;
  uint32_t epoch_ = 0;
  std::vector<float> x_;
  std::vector<uint8_t> y_;
};

}  // namespace starling::split
