// Softmax regression: logits = x W^T + b.
#include <algorithm>

#include "client/eigen_model.h"
#include "client/trainer.h"
#include "core/error.h"

namespace starling::client {
namespace {

class SoftmaxModel final : public EigenModel {
 public:
  SoftmaxModel(size_t features, uint32_t classes, bool pytorch_init)
      : features_(features), classes_(classes), pytorch_init_(pytorch_init) {
    layout_.add("fc.weight", {static_cast<int64_t>(classes), static_cast<int64_t>(features)});
    layout_.add("fc.bias", {static_cast<int64_t>(classes)});
  }

  std::string name() const override { return pytorch_init_ ? "logreg" : "softmax"; }
  std::string spec() const override { return name(); }
  const ParamLayout& layout() const override { return layout_; }
  size_t features() const override { return features_; }
  uint32_t classes() const override { return classes_; }

  void initParameters(std::span<float> params, uint64_t seed) const override {
    STARLING_CHECK_ARG(params.size() == layout_.numel(), spec(), ": params has ", params.size(),
                       " floats, the layout ", layout_.numel());
    std::fill(params.begin(), params.end(), 0.0f);
    if (pytorch_init_) initLikePyTorch(layout_, layout_.size(), params, seed);
  }

  size_t activationFloats(size_t batch) const override { return batch * classes_; }

  BatchStats forwardBackward(std::span<const float> params, ConstRowMatrixMap x,
                             std::span<const uint8_t> y, std::span<float> grad) override {
    detail::checkBatch(*this, params, x, y, grad);
    const ConstRowMatrixMap w = layout_.matrix(params, 0);
    const ConstVectorMap b(params.data() + layout_[1].offset, classes_);
    RowMatrixMap logits = detail::scratchMatrix(logits_, static_cast<size_t>(x.rows()), classes_);
    logits.noalias() = x * w.transpose();
    logits.rowwise() += b.transpose();
    const BatchStats st = detail::softmaxCrossEntropy(logits, y, !grad.empty());
    if (!grad.empty()) {  // logits now holds d(mean loss)/d(logits)
      layout_.matrix(grad, 0).noalias() = logits.transpose() * x;
      VectorMap(grad.data() + layout_[1].offset, classes_) = logits.colwise().sum().transpose();
    }
    return st;
  }

 private:
  size_t features_;
  uint32_t classes_;
  bool pytorch_init_;
  ParamLayout layout_;
  AlignedVector<float> logits_;  // scratch [batch, classes]
};

}  // namespace

std::unique_ptr<EigenModel> makeSoftmaxModel(size_t features, uint32_t classes) {
  STARLING_CHECK_ARG(features >= 1, "softmax: the data has 0 features");
  STARLING_CHECK_ARG(classes >= 2, "softmax: a classifier needs at least 2 classes, got ", classes);
  return std::make_unique<SoftmaxModel>(features, classes, false);
}

std::unique_ptr<EigenModel> makeLogregModel(size_t features, uint32_t classes) {
  STARLING_CHECK_ARG(features >= 1, "logreg: the data has 0 features");
  STARLING_CHECK_ARG(classes >= 2, "logreg: a classifier needs at least 2 classes, got ", classes);
  return std::make_unique<SoftmaxModel>(features, classes, true);
}

}  // namespace starling::client
