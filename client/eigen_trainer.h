#pragma once
// EigenTrainer: the Trainer of every EigenModel, by plain minibatch SGD.
//
// fit(): per epoch, a Fisher-Yates shuffle of the view's indices drawn from the caller's stream,
// then steps over consecutive batches of cfg.batch_size (the last one may be smaller):
// params -= lr * d(mean batch loss)/d(params), or with momentum m (restarted at zero each fit)
// v = m v + g, params -= lr * v, as torch.optim.SGD and the LibTorch trainer step. The loss of each
// batch is checked before its step; a non-finite loss, or non-finite parameters at the end, leave
// params as they were and throw DivergenceError. evaluate(): forward passes in fixed batches, no
// randomness.
//
// Training runs on the trainer's own copy of params, which like every other buffer the model sees
// starts on a 64-byte boundary (core/aligned.h), and is copied back once it has succeeded: the
// result is the same bits wherever the caller's buffers lie and whatever the trainer trained
// before.
//
// Scratch (the batch, the gradient, the working copy of params) grows to the largest size seen
// and is reused: after the first client, the trainer's own buffers allocate nothing per
// batch. (Eigen's matrix products may still take a temporary blocking workspace from malloc for
// large operands, about one per batch for the MLP at Fashion-MNIST size: cheap next to the
// product itself.)
#include <memory>

#include "client/eigen_model.h"
#include "client/trainer.h"

namespace starling::client {

class EigenTrainer final : public Trainer {
 public:
  // The most scratch a training batch may need (EigenModel::activationFloats): fit() refuses a
  // larger batch with InvalidArgument before allocating (a deployed client drops the task).
  // 1 GiB: the CNN's batch of 2,600 examples at 28 x 28, ResNet-8's of about 1,000.
  static constexpr size_t kMaxActivationBytes = size_t{1} << 30;

  // momentum in [0, 1) (InvalidArgument otherwise).
  explicit EigenTrainer(std::unique_ptr<EigenModel> model, double momentum = 0);

  std::string name() const override { return model_->name(); }
  // The model's spec, with ",momentum=M" (or ":momentum=M") when momentum is not 0.
  std::string spec() const override;
  double momentum() const override { return momentum_; }
  const ParamLayout& layout() const override { return model_->layout(); }
  size_t features() const override { return model_->features(); }
  uint32_t classes() const override { return model_->classes(); }

  void initParameters(std::span<float> params, uint64_t seed) const override;
  FitResult fit(std::span<float> params, const DataView& data, const FitConfig& cfg,
                RngStream& rng) override;
  EvalResult evaluate(std::span<const float> params, const DataView& data) override;

  EigenModel& model() { return *model_; }

 private:
  // Copies the examples order[begin, end) into the batch scratch; returns x and y.
  std::pair<ConstRowMatrixMap, std::span<const uint8_t>> gather(const data::Dataset& d,
                                                                std::span<const size_t> order);
  void checkParams(size_t n) const;

  std::unique_ptr<EigenModel> model_;
  double momentum_;
  // Loads params into work_ and returns it as a span.
  std::span<float> load(std::span<const float> params);

  AlignedVector<float> x_, grad_, work_, velocity_;
  std::vector<uint8_t> y_;
  std::vector<size_t> order_;
};

}  // namespace starling::client
