#pragma once
// Split fine-tuning in one process (issue 10's in-process mode, for experiments): the edge's and
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
#include "split/split_model.h"

namespace starling::split {

struct SplitTrainConfig {
  std::string up = "none";    // activation codec spec, edge -> cloud
  std::string down = "none";  // gradient codec spec, cloud -> edge
  uint32_t batch_size = 32;
  double lr = 0.05;
  bool train_bottom = true;   // false: the edge's part stays as pre-trained
  uint64_t seed = 1;          // shuffling
  void validate() const;      // ConfigError naming the key
};

struct EpochRecord {
  uint32_t epoch = 0;
  size_t steps = 0;
  double train_loss = 0;       // mean over the epoch's steps
  double train_accuracy = 0;   // on the cloud's (decoded) activations
  double test_loss = 0, test_accuracy = 0;  // whole model, uncompressed (0 without a test set)
  uint64_t uplink_bytes = 0, downlink_bytes = 0;
  double wall_seconds = 0;
  std::string json() const;   // one JSON object, no newline
};

class InProcessSplit {
 public:
  // `params`: the whole model's parameters (model.full()'s layout), cut by model.cutParameters.
  InProcessSplit(SplitModel& model, SplitTrainConfig config, std::vector<float> params);

  // One pass over `train[idx]` in batches, then evaluation on `test[test_idx]` when given.
  EpochRecord runEpoch(const data::Dataset& train, std::span<const size_t> idx, const data::Dataset* test,
                       std::span<const size_t> test_idx);

  std::span<const float> bottom() const { return bottom_; }
  std::span<const float> top() const { return top_; }
  std::vector<float> params() const;  // bottom then top
  // Mean loss and accuracy of the whole model on `d[idx]`, in batches, uncompressed.
  std::pair<double, double> evaluate(const data::Dataset& d, std::span<const size_t> idx);

 private:
  SplitModel& model_;
  SplitTrainConfig cfg_;
  std::unique_ptr<ActivationCodec> up_, down_;
  CodecState up_state_, down_state_;
  std::vector<float> bottom_, top_;
  uint32_t epoch_ = 0;
  std::vector<float> x_, act_, grad_;
  std::vector<uint8_t> y_;
};

}  // namespace starling::split
