#pragma once
// A model cut in two for split fine-tuning: the edge device runs the bottom part on its
// private data and sends the activations at the cut; the cloud runs the top part and the loss and
// sends back the gradient of the loss with respect to those activations; the edge finishes the
// backward pass through the bottom. This header includes no LibTorch (split_model.cc does).
//
// The CNN and the ResNet are torch_trainer models (same tensor names, same layout order, same
// initialization for a seed), so a split run starts from exactly the parameters an unsplit run
// would; the transformer is split/'s own. The bottom and top parameters are the whole layout's
// tensors divided at the cut (for the ResNet, each BatchNorm buffer goes with its layer).
//
// Cut points of the CNN (torch_trainer "cnn": conv1 5x5x32, pool, conv2 5x5x64, pool, fc1 512,
// fc2): "conv1" (after the first pooling: 32 x rows/2 x cols/2 values per example), "conv2"
// (after the second: 64 x rows/4 x cols/4), "fc1" (after fc1's ReLU: 512).
//
// "resnet" (torch_trainer's ResNet-8): "layer1", "layer2", "layer3", after that stage's block (16 x
// rows x cols, 32 x rows/2 x cols/2, 64 x rows/4 x cols/4). BatchNorm uses the batch's statistics
// in every split step and evaluation; the running statistics are carried, not updated.
//
// "vit": a small vision transformer over 4x4 patches (T = rows/4 x cols/4 tokens, width 64, 4
// heads, two pre-LN blocks with an FFN of 256, LN, mean over tokens, linear head; its own layout
// and initialization, split_model.cc). Cut points: "embed" (T x 64 values per example), "block1"
// (after the first block, T x 64), "ffn2" (inside the second block, before its FFN: h1 = h +
// Attn(LN1(h)), T x 64; the cloud runs LN2, the FFN and the skip h1 + FFN(...)). The weight-side
// cut at ffn2 splits the FFN's up-projection: the edge runs LN2 and S_r V_r^T and sends r values
// per token, plus h1 for the skip connection across the cut (T x (r + 64)) unless it is removed
// (T x r).
//
// One object holds the scratch of the last edge forward pass (for its backward); not thread-safe.
// An edge process and a cloud process each build their own.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/param_layout.h"
#include "torch_trainer/device.h"

namespace starling::split {

class SplitModel {
 public:
  // `model` a model with cut points (cutPoints()), `cut` one of them; images rows x cols, one
  // channel, `classes` classes. ConfigError for an unknown model or cut.
  //
  // `weight_rank` r > 0: the paper's weight-side cut. The first linear projection after the cut,
  // W (out x in) = U S V^T, is truncated to rank r and split across the cut: the edge applies
  // S_r V_r^T (r x in, tensor "<layer>.svd_v") and sends r values per example instead of `in`; the
  // cloud applies U_r (out x r, "<layer>.svd_u") and the layer's bias. With r = min(out, in) the
  // model computes what the uncut one does. Only where a linear layer follows the cut (the CNN:
  // conv2, before fc1; fc1, before fc2; the vit: ffn2); ConfigError elsewhere or for r > min(out,
  // in).
  //
  // `keep_skip` false removes the skip connection across the cut (the paper's eliminated link; the
  // vit at ffn2 only, ConfigError elsewhere): the second block's output is then FFN(LN2(h1))
  // without + h1, and with a weight-side cut only the r values per token cross.
  SplitModel(const std::string& model, const std::string& cut, size_t rows, size_t cols,
             uint32_t classes, uint32_t weight_rank = 0, bool keep_skip = true);
  ~SplitModel();
  SplitModel(const SplitModel&) = delete;
  SplitModel& operator=(const SplitModel&) = delete;

  static std::vector<std::string> cutPoints(const std::string& model);

  // Where the cloud's part computes: cloudStep() and evaluate() (the CPU by default; a GPU for
  // `starling-split --device cuda`). The edge's part always runs on the CPU. Parameters, inputs
  // and results stay host buffers; each step copies what it needs to the device and back.
  void setCloudDevice(const torch_trainer::Device& device);
  torch_trainer::Device cloudDevice() const;

  const ParamLayout& full() const;    // the whole model, as torch_trainer lays it out
  const ParamLayout& bottom() const;  // the edge's tensors (a prefix of full(), then svd_v)
  const ParamLayout& top() const;     // the cloud's tensors (svd_u, then the rest of full())
  size_t activationSize() const;      // values per example at the cut
  size_t features() const;            // rows x cols
  uint32_t classes() const;
  std::string describe() const;  // "cnn cut at conv2: 3136 values per example"

  // The whole model's initial parameters for `seed` (torch_trainer's rule), in full()'s layout.
  std::vector<float> initParameters(uint64_t seed) const;
  // The edge's and the cloud's parameters from the whole model's (full() layout): a cut at a
  // tensor boundary, and with a weight-side cut the truncated SVD of the projection.
  std::pair<std::vector<float>, std::vector<float>> cutParameters(
      std::span<const float> whole) const;

  // Edge: the bottom's forward pass on `x` (n examples x features()), returning n x
  // activationSize() activations; keeps what edgeBackward needs.
  std::vector<float> edgeForward(std::span<const float> bottom_params, std::span<const float> x,
                                 size_t n);
  // Edge: from d(loss)/d(activations) of the last edgeForward (n x activationSize()), the gradient
  // of the bottom's parameters (bottom().numel()). InvalidArgument without a forward pass or with
  // a gradient of another size.
  std::vector<float> edgeBackward(std::span<const float> grad_activations);

  // Cloud: the top's forward pass on activations (n x activationSize()) with the mean
  // cross-entropy loss against `labels`, and its backward pass.
  struct CloudResult {
    double loss = 0;                      // mean over the batch
    size_t correct = 0;                   // arg-max predictions equal to the label
    std::vector<float> grad_top;          // top().numel()
    std::vector<float> grad_activations;  // n x activationSize()
  };
  CloudResult cloudStep(std::span<const float> top_params, std::span<const float> activations,
                        std::span<const uint8_t> labels, size_t n);

  // Both parts without gradients: the mean loss and the number correct on n examples.
  CloudResult evaluate(std::span<const float> bottom_params, std::span<const float> top_params,
                       std::span<const float> x, std::span<const uint8_t> labels, size_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::split
