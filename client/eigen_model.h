#pragma once
// EigenModel: a small differentiable classifier written with Eigen (no LibTorch), evaluated on a
// batch of rows. EigenTrainer (client/eigen_trainer.h) turns any EigenModel into a Trainer with
// minibatch SGD, so a new Eigen model only writes its forward and backward pass.
//
// Models hold their sizes and scratch buffers, never parameters: every call reads a flat buffer
// laid out by layout(). Not thread-safe (scratch); one model per thread.
//
// Same values in, same bits out: forwardBackward takes params, x and grad starting on 64-byte
// boundaries (core/aligned.h; InvalidArgument otherwise) and keeps its scratch in AlignedVector,
// so where Eigen's vectorised loops split into a scalar head and packets is a function of the
// sizes alone, never of where a buffer happens to lie. EigenTrainer passes its own
// aligned copies, so a Trainer's caller may pass any buffer.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/param_layout.h"

namespace starling::client {

struct BatchStats {
  double loss_sum = 0;  // sum over the batch of the cross-entropy -log softmax(logits)[label]
  size_t correct = 0;   // examples whose arg-max logit (lowest index on ties) is the label
};

class EigenModel {
 public:
  virtual ~EigenModel() = default;
  virtual std::string name() const = 0;
  virtual std::string spec() const = 0;
  virtual const ParamLayout& layout() const = 0;
  virtual size_t features() const = 0;
  virtual uint32_t classes() const = 0;

  // Writes initial parameters, a pure function of the seed.
  virtual void initParameters(std::span<float> params, uint64_t seed) const = 0;

  // Forward pass on x [batch, features()] with labels y (batch of them, each < classes()).
  // When grad is non-empty (layout().numel() floats) it receives the gradient of the MEAN loss
  // over the batch with respect to params (overwritten, not accumulated).
  // Throws InvalidArgument for mismatched sizes or a params, x or grad that does not start on a
  // 64-byte boundary; labels are the caller's to check.
  virtual BatchStats forwardBackward(std::span<const float> params, ConstRowMatrixMap x,
                                     std::span<const uint8_t> y, std::span<float> grad) = 0;

  // Examples per forward pass when evaluating: bounds the scratch, not the result.
  virtual size_t evalBatch() const { return 256; }

  // Floats of scratch (activations, their gradients, patch blocks) a training batch of `batch`
  // examples needs, within a few percent: EigenTrainer refuses a batch above its limit before
  // allocating (a Task's batch_size may be 2^20: the CNN would want 400 GB).
  virtual size_t activationFloats(size_t batch) const = 0;

  // The layout's first trainableTensors() tensors are trained; the rest are buffers the model
  // updates itself (BatchNorm's running statistics), which SGD, FedProx and SCAFFOLD leave alone.
  virtual size_t trainableTensors() const { return layout().size(); }
  // Training mode is a forwardBackward with a gradient: a model with buffers computes the batch's
  // statistics there, and commitBuffers writes the buffers' updated values into params (the
  // trainer calls it after each training batch). Nothing for a model without buffers.
  virtual void commitBuffers(std::span<float> /*params*/) const {}
};

// Softmax regression: logits = x W^T + b with W = "fc.weight" [classes, features] and
// b = "fc.bias" [classes]. "softmax" starts at zero (the loss is convex; any start works),
// "logreg" as PyTorch's Linear (client/trainer.h, initLikePyTorch), like the LibTorch trainer's.
std::unique_ptr<EigenModel> makeSoftmaxModel(size_t features, uint32_t classes);
std::unique_ptr<EigenModel> makeLogregModel(size_t features, uint32_t classes);

// One hidden ReLU layer: logits = relu(x W1^T + b1) W2^T + b2 with "fc1.weight" [hidden,
// features], "fc1.bias" [hidden], "fc2.weight" [classes, hidden], "fc2.bias" [classes],
// initialised as PyTorch's Linear layers (initLikePyTorch), like the LibTorch trainer's "mlp".
std::unique_ptr<EigenModel> makeMlpModel(size_t features, uint32_t classes, uint32_t hidden);

// McMahan et al. 2017's CNN on rows x cols images (client/cnn_model.cc), the LibTorch trainer's
// "cnn": same layout, initialisation and function. ConfigError for images smaller than 4x4.
std::unique_ptr<EigenModel> makeCnnModel(size_t rows, size_t cols, uint32_t classes);

// ResNet-8 on rows x cols images (client/resnet_model.cc), the LibTorch trainer's "resnet", with
// BatchNorm: its running statistics travel in the layout after the trainable tensors.
std::unique_ptr<EigenModel> makeResnetModel(size_t rows, size_t cols, uint32_t classes);

namespace detail {

// Grows buf to rows * cols floats if needed (never shrinks: no allocation once warmed up) and
// maps its front as a rows x cols row-major matrix.
RowMatrixMap scratchMatrix(AlignedVector<float>& buf, size_t rows, size_t cols);

// Turns logits [batch, classes] into d(mean loss)/d(logits) = (softmax - onehot) / batch in
// place when want_grad, and returns the batch's loss sum and correct count. Numerically stable
// (log-sum-exp with the row maximum subtracted).
BatchStats softmaxCrossEntropy(RowMatrixMap logits, std::span<const uint8_t> y, bool want_grad);

// The size and alignment checks every model shares (InvalidArgument).
void checkBatch(const EigenModel& m, std::span<const float> params, const ConstRowMatrixMap& x,
                std::span<const uint8_t> y, std::span<float> grad);

}  // namespace detail
}  // namespace starling::client
