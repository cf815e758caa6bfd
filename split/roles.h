#pragma once
// The two sides of split fine-tuning (docs/split.md), written once for the in-process mode and the
// networked roles: an edge device holds the bottom part and its private data; the cloud holds the
// top part, shared by every edge device it serves, one step at a time, each edge with its own
// codec state. What passes between them is bytes: an activation encoding with its labels going up,
// a gradient encoding coming down (split/codec.h).
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "split/codec.h"
#include "split/split_model.h"

namespace starling::split {

class SplitCloud {
 public:
  struct Limits {
    size_t max_batch = 4096;  // examples in one step
    double max_abs = 1e6;     // largest decoded activation value accepted
  };
  // `top`: the cloud's parameters (model.top().numel()); `down`: the gradient codec spec.
  SplitCloud(SplitModel& model, std::vector<float> top, const std::string& down, double lr,
             Limits limits);
  SplitCloud(SplitModel& model, std::vector<float> top, const std::string& down, double lr)
      : SplitCloud(model, std::move(top), down, lr, Limits{}) {}

  struct Reply {
    std::vector<uint8_t> gradient;  // empty for an evaluation or a frozen bottom
    double loss = 0;
    size_t correct = 0;
  };
  // One step for edge `edge` on n examples: decodes the activations (checked against n x
  // activationSize() and the limits), runs the top part and the loss, steps the top part, and
  // encodes the activations' gradient with this edge's codec state (unless `send_gradient` is
  // false). InputError for anything an edge can lie about (shape, sizes, values, labels, n); the
  // cloud's parameters and every state are then unchanged.
  Reply step(uint64_t edge, std::span<const uint8_t> activations, std::span<const uint8_t> labels,
             size_t n, bool send_gradient = true);
  // The loss and the number correct on n examples, without any update.
  Reply evaluate(std::span<const uint8_t> activations, std::span<const uint8_t> labels, size_t n);
  // Drops an edge's codec state (it vanished or said goodbye).
  void forget(uint64_t edge) { states_.erase(edge); }
  size_t edges() const { return states_.size(); }
  std::span<const float> top() const { return top_; }
  const SplitModel& model() const { return model_; }

 private:
  void decode(std::span<const uint8_t> activations, std::span<const uint8_t> labels, size_t n);
  SplitModel& model_;
  std::vector<float> top_;
  std::unique_ptr<ActivationCodec> down_;
  double lr_;
  Limits limits_;
  std::map<uint64_t, CodecState> states_;
  std::vector<float> act_;
};

// An edge device. Its model object holds the scratch of its last forward pass: edges that
// interleave need one SplitModel each.
class SplitEdge {
 public:
  SplitEdge(SplitModel& model, std::vector<float> bottom, const std::string& up, double lr);
  // The bottom part's forward pass on n examples, encoded for the cloud.
  std::vector<uint8_t> forward(std::span<const float> x, size_t n);
  // The same pass encoded uncompressed ("none"), for evaluation: the codec state is untouched
  // and no gradient is expected for it.
  std::vector<uint8_t> forwardUncompressed(std::span<const float> x, size_t n);
  // The gradient the cloud sent for the last forward pass: decoded (checked; InputError for a
  // lie, the bottom unchanged), then one SGD step of the bottom part.
  void backward(std::span<const uint8_t> gradient);
  std::span<const float> bottom() const { return bottom_; }
  void setBottom(std::span<const float> b);  // SplitFed: the averaged bottom
  size_t lastBatch() const { return n_; }

 private:
  SplitModel& model_;
  std::vector<float> bottom_;
  std::unique_ptr<ActivationCodec> up_;
  std::unique_ptr<ActivationCodec> plain_;
  double lr_;
  CodecState state_;
  size_t n_ = 0;
  std::vector<float> grad_;
};

}  // namespace starling::split
