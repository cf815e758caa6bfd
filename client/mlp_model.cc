// One hidden ReLU layer: logits = relu(x W1^T + b1) W2^T + b2.
#include <algorithm>
#include <cmath>

#include "client/eigen_model.h"
#include "client/trainer.h"
#include "core/error.h"

namespace starling::client {
namespace {

class MlpModel final : public EigenModel {
 public:
  MlpModel(size_t features, uint32_t classes, uint32_t hidden)
      : features_(features), classes_(classes), hidden_(hidden) {
    layout_.add("fc1.weight", {static_cast<int64_t>(hidden), static_cast<int64_t>(features)});
    layout_.add("fc1.bias", {static_cast<int64_t>(hidden)});
    layout_.add("fc2.weight", {static_cast<int64_t>(classes), static_cast<int64_t>(hidden)});
    layout_.add("fc2.bias", {static_cast<int64_t>(classes)});
  }

  std::string name() const override { return "mlp"; }
  std::string spec() const override { return "mlp:hidden=" + std::to_string(hidden_); }
  const ParamLayout& layout() const override { return layout_; }
  size_t features() const override { return features_; }
  uint32_t classes() const override { return classes_; }

  void initParameters(std::span<float> params, uint64_t seed) const override {
    STARLING_CHECK_ARG(params.size() == layout_.numel(), spec(), ": params has ", params.size(),
                       " floats, the layout ", layout_.numel());
    std::ranges::fill(params, 0.0f);
    initLikePyTorch(layout_, layout_.size(), params, seed);
  }

  size_t activationFloats(size_t batch) const override {
    return batch * (2 * size_t{hidden_} + classes_);
  }

  BatchStats forwardBackward(std::span<const float> params, ConstRowMatrixMap x,
                             std::span<const uint8_t> y, std::span<float> grad) override {
    detail::checkBatch(*this, params, x, y, grad);
    const size_t batch = static_cast<size_t>(x.rows());
    const ConstRowMatrixMap w1 = layout_.matrix(params, 0), w2 = layout_.matrix(params, 2);
    const ConstVectorMap b1(params.data() + layout_[1].offset, hidden_);
    const ConstVectorMap b2(params.data() + layout_[3].offset, classes_);

    RowMatrixMap h = detail::scratchMatrix(hidden_buf_, batch, hidden_);
    h.noalias() = x * w1.transpose();
    h.rowwise() += b1.transpose();
    h = h.cwiseMax(0.0f);
    RowMatrixMap logits = detail::scratchMatrix(logits_buf_, batch, classes_);
    logits.noalias() = h * w2.transpose();
    logits.rowwise() += b2.transpose();
    const BatchStats st = detail::softmaxCrossEntropy(logits, y, !grad.empty());
    if (grad.empty()) return st;

    // logits now holds d(mean loss)/d(logits).
    layout_.matrix(grad, 2).noalias() = logits.transpose() * h;
    VectorMap(grad.data() + layout_[3].offset, classes_) = logits.colwise().sum().transpose();
    RowMatrixMap dh = detail::scratchMatrix(dhidden_buf_, batch, hidden_);
    dh.noalias() = logits * w2;
    // ReLU passes the gradient where the unit was active (subgradient 0 at exactly 0).
    dh.array() *= (h.array() > 0.0f).cast<float>();
    layout_.matrix(grad, 0).noalias() = dh.transpose() * x;
    VectorMap(grad.data() + layout_[1].offset, hidden_) = dh.colwise().sum().transpose();
    return st;
  }

 private:
  size_t features_;
  uint32_t classes_, hidden_;
  ParamLayout layout_;
  AlignedVector<float> hidden_buf_, logits_buf_, dhidden_buf_;  // scratch, grown on demand
};

}  // namespace

std::unique_ptr<EigenModel> makeMlpModel(size_t features, uint32_t classes, uint32_t hidden) {
  STARLING_CHECK_ARG(features >= 1, "mlp: the data has 0 features");
  STARLING_CHECK_ARG(classes >= 2, "mlp: a classifier needs at least 2 classes, got ", classes);
  if (hidden == 0) STARLING_THROW(ConfigError, "trainer 'mlp': hidden=0 must be at least 1");
  return std::make_unique<MlpModel>(features, classes, hidden);
}

}  // namespace starling::client
