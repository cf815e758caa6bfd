// McMahan et al. 2017's CNN, the LibTorch trainer's "cnn" (torch_trainer/models.cc) in Eigen:
// conv5x5 'same' (32) + ReLU + maxpool 2, conv5x5 'same' (64) + ReLU + maxpool 2, fc 512 + ReLU,
// fc classes. The layout, the names and PyTorch's flattening order (channel, row, column) are the
// LibTorch model's, so the same parameters give the same function, and the same seed the same
// model.
#include <algorithm>
#include <cmath>

#include "client/conv.h"
#include "client/eigen_model.h"
#include "client/trainer.h"
#include "core/error.h"

namespace starling::client {
namespace {

using detail::idx;

class CnnModel final : public EigenModel {
 public:
  CnnModel(size_t rows, size_t cols, uint32_t classes)
      : rows_(rows),
        cols_(cols),
        classes_(classes),
        conv1_({.in_c = 1, .h = rows, .w = cols, .out_c = 32, .k = 5, .stride = 1, .pad = 2}),
        conv2_({.in_c = 32,
                .h = rows / 2,
                .w = cols / 2,
                .out_c = 64,
                .k = 5,
                .stride = 1,
                .pad = 2}) {
    const auto c = static_cast<int64_t>(classes);
    layout_.add("conv1.weight", {32, 1, 5, 5});
    layout_.add("conv1.bias", {32});
    layout_.add("conv2.weight", {64, 32, 5, 5});
    layout_.add("conv2.bias", {64});
    layout_.add("fc1.weight", {512, static_cast<int64_t>(flat())});
    layout_.add("fc1.bias", {512});
    layout_.add("fc2.weight", {c, 512});
    layout_.add("fc2.bias", {c});
  }

  std::string name() const override { return "cnn"; }
  std::string spec() const override { return "cnn"; }
  const ParamLayout& layout() const override { return layout_; }
  size_t features() const override { return rows_ * cols_; }
  uint32_t classes() const override { return classes_; }
  size_t evalBatch() const override { return 32; }

  size_t activationFloats(size_t batch) const override {
    const size_t h1 = rows_ * cols_, h2 = (rows_ / 2) * (cols_ / 2), h3 = pooled();
    // a1, da1; p1, dp1; a2, da2; p2, dp2; f, df; h, dh; logits; and the two convolutions'
    // patch blocks (patches and their gradients, 2 images at a time).
    const size_t per_example =
        2 * 32 * h1 + 2 * 32 * h2 + 2 * 64 * h2 + 2 * 64 * h3 + 2 * flat() + 2 * 512 + classes_;
    const size_t patches = 2 * 2 * (h1 * conv1_.shape().patch() + h2 * conv2_.shape().patch());
    return batch * per_example + patches;
  }

  void initParameters(std::span<float> params, uint64_t seed) const override {
    STARLING_CHECK_ARG(params.size() == layout_.numel(), spec(), ": params has ", params.size(),
                       " floats, the layout ", layout_.numel());
    std::ranges::fill(params, 0.0f);
    initLikePyTorch(layout_, layout_.size(), params, seed);
  }

  BatchStats forwardBackward(std::span<const float> params, ConstRowMatrixMap x,
                             std::span<const uint8_t> y, std::span<float> grad) override {
    detail::checkBatch(*this, params, x, y, grad);
    const size_t b = static_cast<size_t>(x.rows());
    const size_t h1 = rows_ * cols_, h2 = (rows_ / 2) * (cols_ / 2), h3 = pooled();
    const ConstRowMatrixMap in(x.data(), idx(b * h1), 1);  // NHWC with one channel

    RowMatrixMap a1 = detail::scratchMatrix(a1_, b * h1, 32);
    conv1_.forward(in, layout_.slice(params, 0), layout_.slice(params, 1), a1);
    a1 = a1.cwiseMax(0.0f);
    RowMatrixMap p1 = detail::scratchMatrix(p1_, b * h2, 32);
    pool1_.forward(detail::constView(a1), b, rows_, cols_, p1);
    RowMatrixMap a2 = detail::scratchMatrix(a2_, b * h2, 64);
    conv2_.forward(detail::constView(p1), layout_.slice(params, 2), layout_.slice(params, 3), a2);
    a2 = a2.cwiseMax(0.0f);
    RowMatrixMap p2 = detail::scratchMatrix(p2_, b * h3, 64);
    pool2_.forward(detail::constView(a2), b, rows_ / 2, cols_ / 2, p2);
    // PyTorch flattens [B, C, H, W]: feature c * H * W + pixel.
    RowMatrixMap f = detail::scratchMatrix(f_, b, flat());
    for (size_t i = 0; i < b; ++i)
      RowMatrixMap(f.data() + i * flat(), 64, idx(h3)) =
          p2.middleRows(idx(i * h3), idx(h3)).transpose();

    const ConstRowMatrixMap w3 = layout_.matrix(params, 4), w4 = layout_.matrix(params, 6);
    RowMatrixMap h = detail::scratchMatrix(h_, b, 512);
    h.noalias() = f * w3.transpose();
    h.rowwise() += ConstVectorMap(params.data() + layout_[5].offset, 512).transpose();
    h = h.cwiseMax(0.0f);
    RowMatrixMap logits = detail::scratchMatrix(logits_, b, classes_);
    logits.noalias() = h * w4.transpose();
    logits.rowwise() += ConstVectorMap(params.data() + layout_[7].offset, classes_).transpose();
    const BatchStats st = detail::softmaxCrossEntropy(logits, y, !grad.empty());
    if (grad.empty()) return st;

    // logits holds d(mean loss)/d(logits).
    layout_.matrix(grad, 6).noalias() = logits.transpose() * h;
    VectorMap(grad.data() + layout_[7].offset, classes_) = logits.colwise().sum().transpose();
    RowMatrixMap dh = detail::scratchMatrix(dh_, b, 512);
    dh.noalias() = logits * w4;
    dh.array() *= (h.array() > 0.0f).cast<float>();
    layout_.matrix(grad, 4).noalias() = dh.transpose() * f;
    VectorMap(grad.data() + layout_[5].offset, 512) = dh.colwise().sum().transpose();
    RowMatrixMap df = detail::scratchMatrix(df_, b, flat());
    df.noalias() = dh * w3;
    RowMatrixMap dp2 = detail::scratchMatrix(dp2_, b * h3, 64);
    for (size_t i = 0; i < b; ++i)
      dp2.middleRows(idx(i * h3), idx(h3)) =
          ConstRowMatrixMap(df.data() + i * flat(), 64, idx(h3)).transpose();
    RowMatrixMap da2 = detail::scratchMatrix(da2_, b * h2, 64);
    pool2_.backward(detail::constView(dp2), da2);
    da2.array() *= (a2.array() > 0.0f).cast<float>();
    RowMatrixMap dp1 = detail::scratchMatrix(dp1_, b * h2, 32);
    conv2_.backward(detail::constView(p1), layout_.slice(params, 2), detail::constView(da2),
                    layout_.slice(grad, 2), layout_.slice(grad, 3), &dp1);
    RowMatrixMap da1 = detail::scratchMatrix(da1_, b * h1, 32);
    pool1_.backward(detail::constView(dp1), da1);
    da1.array() *= (a1.array() > 0.0f).cast<float>();
    conv1_.backward(in, layout_.slice(params, 0), detail::constView(da1), layout_.slice(grad, 0),
                    layout_.slice(grad, 1), nullptr);
    return st;
  }

 private:
  size_t pooled() const { return (rows_ / 4) * (cols_ / 4); }
  size_t flat() const { return 64 * pooled(); }

  size_t rows_, cols_;
  uint32_t classes_;
  ParamLayout layout_;
  detail::Conv2d conv1_, conv2_;
  detail::MaxPool2 pool1_, pool2_;
  // Scratch, grown on demand: activations (a: after ReLU, p: pooled, f: flattened, h: hidden)
  // and their gradients.
  AlignedVector<float> a1_, p1_, a2_, p2_, f_, h_, logits_, dh_, df_, dp2_, da2_, dp1_, da1_;
};

}  // namespace

std::unique_ptr<EigenModel> makeCnnModel(size_t rows, size_t cols, uint32_t classes) {
  if (rows < 4 || cols < 4)
    STARLING_THROW(ConfigError, "trainer 'cnn': images of ", rows, "x", cols,
                   " are too small (two 2x2 poolings need at least 4x4)");
  STARLING_CHECK_ARG(classes >= 2, "cnn: a classifier needs at least 2 classes, got ", classes);
  return std::make_unique<CnnModel>(rows, cols, classes);
}

}  // namespace starling::client
