// ResNet-8, the LibTorch trainer's "resnet" (torch_trainer/models.cc) in Eigen: conv3x3 16 + BN +
// ReLU, three stages of one basic block (16, 32, 64 channels; stride 1, 2, 2; a 1x1 convolution +
// BN on the shortcut where the shape changes), global average pooling, fc. Convolutions have no
// bias. BatchNorm has PyTorch's defaults (momentum 0.1, eps 1e-5): in training it normalises with
// the batch's statistics (biased variance) and moves its running statistics towards them
// (unbiased variance), in evaluation it uses the running statistics. The layout is PyTorch's: the
// trainable tensors in module order, then the running statistics, which travel with the model.
#include <algorithm>
#include <cmath>
#include <vector>

#include "client/conv.h"
#include "client/eigen_model.h"
#include "client/trainer.h"
#include "core/error.h"

namespace starling::client {
namespace {

using detail::idx;

constexpr double kBnMomentum = 0.1, kBnEps = 1e-5;

// One BatchNorm layer over NHWC rows [M, C]. Statistics are summed in double (as PyTorch's CPU
// kernel does); the batch's mean and biased variance are kept until commit().
class BatchNorm {
 public:
  explicit BatchNorm(size_t channels)
      : c_(channels),
        mean_(channels),
        var_(channels),
        invstd_(channels),
        meanf_(channels),
        sum_g_(channels),
        sum_gx_(channels),
        k_(channels),
        mg_(channels),
        mgx_(channels) {}

  void train(ConstRowMatrixMap x, const float* gamma, const float* beta, RowMatrixMap y) {
    const size_t m = static_cast<size_t>(x.rows());
    if (m < 2)
      STARLING_THROW(InvalidArgument,
                     "resnet: BatchNorm needs more than one value per channel "
                     "in training (a batch of one 1x1 image)");
    rows_ = m;
    std::fill(mean_.begin(), mean_.end(), 0.0);
    std::fill(var_.begin(), var_.end(), 0.0);
    const float* in = x.data();
    for (size_t r = 0; r < m; ++r)
      for (size_t c = 0; c < c_; ++c) mean_[c] += in[r * c_ + c];
    for (size_t c = 0; c < c_; ++c) mean_[c] /= static_cast<double>(m);
    for (size_t r = 0; r < m; ++r)
      for (size_t c = 0; c < c_; ++c) {
        const double d = in[r * c_ + c] - mean_[c];
        var_[c] += d * d;
      }
    for (size_t c = 0; c < c_; ++c) {
      var_[c] /= static_cast<double>(m);
      invstd_[c] = static_cast<float>(1.0 / std::sqrt(var_[c] + kBnEps));
      meanf_[c] = static_cast<float>(mean_[c]);
    }
    if (xhat_.size() < m * c_) xhat_.resize(m * c_);
    float* out = y.data();
    for (size_t r = 0; r < m; ++r)
      for (size_t c = 0; c < c_; ++c) {
        const float h = (in[r * c_ + c] - meanf_[c]) * invstd_[c];
        xhat_[r * c_ + c] = h;
        out[r * c_ + c] = h * gamma[c] + beta[c];
      }
  }

  // The running variance is taken as at least 0: a compressed downlink may bring a slightly
  // negative one, which would otherwise make every output NaN.
  void eval(ConstRowMatrixMap x, const float* gamma, const float* beta, const float* running_mean,
            const float* running_var, RowMatrixMap y) {
    std::vector<float>& scale = k_;
    std::vector<float>& shift = mg_;
    for (size_t c = 0; c < c_; ++c) {
      const double var = std::max(0.0, static_cast<double>(running_var[c]));
      const double s = gamma[c] / std::sqrt(var + kBnEps);
      scale[c] = static_cast<float>(s);
      shift[c] = static_cast<float>(beta[c] - running_mean[c] * s);
    }
    const size_t m = static_cast<size_t>(x.rows());
    const float* in = x.data();
    float* out = y.data();
    for (size_t r = 0; r < m; ++r)
      for (size_t c = 0; c < c_; ++c) out[r * c_ + c] = in[r * c_ + c] * scale[c] + shift[c];
  }

  // dx from dy (training mode), dgamma and dbeta overwritten.
  void backward(ConstRowMatrixMap dy, const float* gamma, float* dgamma, float* dbeta,
                RowMatrixMap dx) {
    const size_t m = rows_;
    STARLING_CHECK_ARG(m > 0 && static_cast<size_t>(dy.rows()) == m,
                       "resnet: BatchNorm's backward does not follow its training forward");
    std::fill(sum_g_.begin(), sum_g_.end(), 0.0);
    std::fill(sum_gx_.begin(), sum_gx_.end(), 0.0);
    const float* g = dy.data();
    for (size_t r = 0; r < m; ++r)
      for (size_t c = 0; c < c_; ++c) {
        sum_g_[c] += g[r * c_ + c];
        sum_gx_[c] += static_cast<double>(g[r * c_ + c]) * xhat_[r * c_ + c];
      }
    for (size_t c = 0; c < c_; ++c) {
      dgamma[c] = static_cast<float>(sum_gx_[c]);
      dbeta[c] = static_cast<float>(sum_g_[c]);
      k_[c] = gamma[c] * invstd_[c];
      mg_[c] = static_cast<float>(sum_g_[c] / static_cast<double>(m));
      mgx_[c] = static_cast<float>(sum_gx_[c] / static_cast<double>(m));
    }
    float* out = dx.data();
    for (size_t r = 0; r < m; ++r)
      for (size_t c = 0; c < c_; ++c)
        out[r * c_ + c] = k_[c] * (g[r * c_ + c] - mg_[c] - xhat_[r * c_ + c] * mgx_[c]);
  }

  // The running statistics moved towards the last training batch's (PyTorch's update).
  void commit(float* running_mean, float* running_var) const {
    if (rows_ < 2) return;  // no training pass yet (train() refuses fewer than 2 values)
    const double unbias = static_cast<double>(rows_) / static_cast<double>(rows_ - 1);
    for (size_t c = 0; c < c_; ++c) {
      running_mean[c] =
          static_cast<float>(kBnMomentum * mean_[c] + (1 - kBnMomentum) * running_mean[c]);
      running_var[c] =
          static_cast<float>(kBnMomentum * var_[c] * unbias + (1 - kBnMomentum) * running_var[c]);
    }
  }

 private:
  size_t c_, rows_ = 0;
  // Per channel; sized once, so training allocates nothing per batch.
  std::vector<double> mean_, var_;
  std::vector<float> invstd_, meanf_;
  std::vector<double> sum_g_, sum_gx_;
  std::vector<float> k_, mg_, mgx_;
  AlignedVector<float> xhat_;
};

// Tensor indices of one BatchNorm's weight, bias, running mean and running variance.
struct BnTensors {
  size_t weight = 0, bias = 0, mean = 0, var = 0;
};

struct Block {
  size_t in_c = 0, out_c = 0, stride = 1, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  bool down = false;
  size_t conv1 = 0, conv2 = 0, convd = 0;  // tensor indices
  BnTensors bn1, bn2, bnd;
  detail::Conv2d c1, c2, cd;
  BatchNorm n1{1}, n2{1}, nd{1};
  // Activations kept for the backward pass, and scratch.
  AlignedVector<float> r1, out, t1, t2, skip, g1, g2, gd, dh;
};

class ResnetModel final : public EigenModel {
 public:
  ResnetModel(size_t rows, size_t cols, uint32_t classes)
      : rows_(rows), cols_(cols), classes_(classes) {
    // Trainable tensors in module order, buffers after them (torch_trainer/models.cc).
    std::vector<std::pair<std::string, size_t>> bn_buffers;  // names and channels, in order
    const auto bn = [&](const std::string& prefix, size_t channels) {
      BnTensors t;
      t.weight = add(prefix + ".weight", {static_cast<int64_t>(channels)});
      t.bias = add(prefix + ".bias", {static_cast<int64_t>(channels)});
      bn_buffers.emplace_back(prefix, channels);
      return t;
    };
    stem_conv_ = add("conv1.weight", {16, 1, 3, 3});
    stem_bn_ = bn("bn1", 16);
    stem_ = detail::Conv2d(
        {.in_c = 1, .h = rows, .w = cols, .out_c = 16, .k = 3, .stride = 1, .pad = 1});
    stem_norm_ = BatchNorm(16);
    size_t in = 16, h = rows, w = cols;
    blocks_.resize(3);
    for (size_t s = 0; s < 3; ++s) {
      Block& b = blocks_[s];
      const size_t out = size_t{16} << s;
      const std::string p = "layer" + std::to_string(s + 1) + ".0.";
      b.in_c = in;
      b.out_c = out;
      b.stride = s == 0 ? 1 : 2;
      b.in_h = h;
      b.in_w = w;
      b.c1 = detail::Conv2d(
          {.in_c = in, .h = h, .w = w, .out_c = out, .k = 3, .stride = b.stride, .pad = 1});
      b.out_h = b.c1.shape().outH();
      b.out_w = b.c1.shape().outW();
      b.c2 = detail::Conv2d(
          {.in_c = out, .h = b.out_h, .w = b.out_w, .out_c = out, .k = 3, .stride = 1, .pad = 1});
      b.conv1 =
          add(p + "conv1.weight", {static_cast<int64_t>(out), static_cast<int64_t>(in), 3, 3});
      b.bn1 = bn(p + "bn1", out);
      b.conv2 =
          add(p + "conv2.weight", {static_cast<int64_t>(out), static_cast<int64_t>(out), 3, 3});
      b.bn2 = bn(p + "bn2", out);
      b.n1 = BatchNorm(out);
      b.n2 = BatchNorm(out);
      b.down = b.stride != 1 || in != out;
      if (b.down) {
        b.convd = add(p + "downsample.0.weight",
                      {static_cast<int64_t>(out), static_cast<int64_t>(in), 1, 1});
        b.bnd = bn(p + "downsample.1", out);
        b.cd = detail::Conv2d(
            {.in_c = in, .h = h, .w = w, .out_c = out, .k = 1, .stride = b.stride, .pad = 0});
        b.nd = BatchNorm(out);
      }
      in = out;
      h = b.out_h;
      w = b.out_w;
    }
    fc_w_ = add("fc.weight", {static_cast<int64_t>(classes), 64});
    fc_b_ = add("fc.bias", {static_cast<int64_t>(classes)});
    trainable_ = layout_.size();
    // Buffers, in the order the BatchNorms were made: running_mean, running_var each.
    std::vector<BnTensors*> bns{&stem_bn_};
    for (Block& b : blocks_) {
      bns.push_back(&b.bn1);
      bns.push_back(&b.bn2);
      if (b.down) bns.push_back(&b.bnd);
    }
    for (size_t i = 0; i < bn_buffers.size(); ++i) {
      const auto& [prefix, channels] = bn_buffers[i];
      bns[i]->mean = add(prefix + ".running_mean", {static_cast<int64_t>(channels)});
      bns[i]->var = add(prefix + ".running_var", {static_cast<int64_t>(channels)});
    }
  }

  std::string name() const override { return "resnet"; }
  std::string spec() const override { return "resnet"; }
  const ParamLayout& layout() const override { return layout_; }
  size_t features() const override { return rows_ * cols_; }
  uint32_t classes() const override { return classes_; }
  size_t trainableTensors() const override { return trainable_; }
  size_t evalBatch() const override { return 32; }

  size_t activationFloats(size_t batch) const override {
    // The stem's conv output, BN output and its gradient (x 3), the output gradient (dh_); per
    // block eight activations or gradients of its output size, three BatchNorms' normalised
    // inputs, the input gradient; pooling, logits; and the patch blocks (2 images at a time).
    const size_t p0 = rows_ * cols_;
    size_t per_example = 4 * 16 * p0 + 2 * 64 + classes_, patches = 4 * p0 * stem_.shape().patch();
    for (const Block& b : blocks_) {
      const size_t out = b.out_c * b.out_h * b.out_w;
      per_example += 11 * out + b.in_c * b.in_h * b.in_w;
      patches +=
          4 * b.out_h * b.out_w *
          (b.c1.shape().patch() + b.c2.shape().patch() + (b.down ? b.cd.shape().patch() : 0));
    }
    return batch * per_example + patches;
  }

  void initParameters(std::span<float> params, uint64_t seed) const override {
    STARLING_CHECK_ARG(params.size() == layout_.numel(), spec(), ": params has ", params.size(),
                       " floats, the layout ", layout_.numel());
    std::ranges::fill(params, 0.0f);
    // What PyTorch's BatchNorm constructs: weight 1, bias 0, running mean 0, running var 1.
    const auto ones = [&](size_t t) { std::ranges::fill(layout_.slice(params, t), 1.0f); };
    ones(stem_bn_.weight);
    ones(stem_bn_.var);
    for (const Block& b : blocks_)
      for (const BnTensors* n : {&b.bn1, &b.bn2, &b.bnd})
        if (n != &b.bnd || b.down) {
          ones(n->weight);
          ones(n->var);
        }
    initLikePyTorch(layout_, trainable_, params, seed);
  }

  BatchStats forwardBackward(std::span<const float> params, ConstRowMatrixMap x,
                             std::span<const uint8_t> y, std::span<float> grad) override;
  void commitBuffers(std::span<float> params) const override;

 private:
  size_t add(const std::string& name, std::vector<int64_t> shape) {
    layout_.add(name, std::move(shape));
    return layout_.size() - 1;
  }
  const float* at(std::span<const float> p, size_t t) const { return p.data() + layout_[t].offset; }
  float* at(std::span<float> p, size_t t) const { return p.data() + layout_[t].offset; }
  // BatchNorm n of tensors `t` over x into y: batch statistics when training, running ones else.
  void norm(BatchNorm& n, const BnTensors& t, std::span<const float> params, bool training,
            ConstRowMatrixMap x, RowMatrixMap y) const {  // n is the caller's (mutable) layer
    if (training)
      n.train(x, at(params, t.weight), at(params, t.bias), y);
    else
      n.eval(x, at(params, t.weight), at(params, t.bias), at(params, t.mean), at(params, t.var), y);
  }

  size_t rows_, cols_;
  uint32_t classes_;
  ParamLayout layout_;
  size_t trainable_ = 0;
  size_t stem_conv_ = 0, fc_w_ = 0, fc_b_ = 0;
  BnTensors stem_bn_;
  detail::Conv2d stem_;
  BatchNorm stem_norm_{16};
  std::vector<Block> blocks_;
  AlignedVector<float> t0_, h0_, pooled_, logits_, dpooled_, dh_, g0_;
};

RowMatrixMap scratch(AlignedVector<float>& buf, size_t rows, size_t cols) {  // a shorter name
  return detail::scratchMatrix(buf, rows, cols);
}

BatchStats ResnetModel::forwardBackward(std::span<const float> params, ConstRowMatrixMap x,
                                        std::span<const uint8_t> y, std::span<float> grad) {
  detail::checkBatch(*this, params, x, y, grad);
  const bool training = !grad.empty();
  const size_t n = static_cast<size_t>(x.rows());
  using detail::constView;

  // Stem: conv, BN, ReLU.
  const size_t p0 = rows_ * cols_;
  const ConstRowMatrixMap in(x.data(), idx(n * p0), 1);
  RowMatrixMap t0 = scratch(t0_, n * p0, 16), h0 = scratch(h0_, n * p0, 16);
  stem_.forward(in, layout_.slice(params, stem_conv_), {}, t0);
  norm(stem_norm_, stem_bn_, params, training, constView(t0), h0);
  h0 = h0.cwiseMax(0.0f);

  // Blocks.
  const float* h_data = h0.data();
  for (Block& b : blocks_) {
    const size_t pin = b.in_h * b.in_w, pout = b.out_h * b.out_w, m = n * pout;
    const ConstRowMatrixMap h(h_data, idx(n * pin), idx(b.in_c));
    RowMatrixMap t1 = scratch(b.t1, m, b.out_c), r1 = scratch(b.r1, m, b.out_c);
    b.c1.forward(h, layout_.slice(params, b.conv1), {}, t1);
    norm(b.n1, b.bn1, params, training, constView(t1), r1);
    r1 = r1.cwiseMax(0.0f);
    RowMatrixMap t2 = scratch(b.t2, m, b.out_c), out = scratch(b.out, m, b.out_c);
    b.c2.forward(constView(r1), layout_.slice(params, b.conv2), {}, t2);
    norm(b.n2, b.bn2, params, training, constView(t2), out);
    if (b.down) {
      RowMatrixMap t = scratch(b.t1, m, b.out_c), skip = scratch(b.skip, m, b.out_c);
      b.cd.forward(h, layout_.slice(params, b.convd), {}, t);
      norm(b.nd, b.bnd, params, training, constView(t), skip);
      out += skip;
    } else {
      out += h;
    }
    out = out.cwiseMax(0.0f);
    h_data = out.data();
  }

  // Global average pooling and fc.
  const Block& last = blocks_.back();
  const size_t pl = last.out_h * last.out_w;
  RowMatrixMap pooled = scratch(pooled_, n, 64);
  for (size_t i = 0; i < n; ++i) {
    const ConstRowMatrixMap img(h_data + i * pl * 64, idx(pl), 64);
    // Summed in a fixed order, then divided, as a mean.
    pooled.row(idx(i)) = img.colwise().sum() / static_cast<float>(pl);
  }
  const ConstRowMatrixMap fw(at(params, fc_w_), idx(classes_), 64);
  RowMatrixMap logits = scratch(logits_, n, classes_);
  logits.noalias() = pooled * fw.transpose();
  logits.rowwise() += ConstVectorMap(at(params, fc_b_), idx(classes_)).transpose();
  const BatchStats st = detail::softmaxCrossEntropy(logits, y, training);
  if (!training) return st;

  std::ranges::fill(grad, 0.0f);  // the running statistics' "gradient" stays 0
  RowMatrixMap(at(grad, fc_w_), idx(classes_), 64).noalias() = logits.transpose() * pooled;
  VectorMap(at(grad, fc_b_), idx(classes_)) = logits.colwise().sum().transpose();
  RowMatrixMap dpooled = scratch(dpooled_, n, 64);
  dpooled.noalias() = logits * fw;
  // d(out of the last block): each pixel gets its image's pooled gradient / pixels.
  RowMatrixMap dh = scratch(dh_, n * pl, 64);  // the last block's output gradient
  for (size_t i = 0; i < n; ++i)
    dh.middleRows(idx(i * pl), idx(pl)).rowwise() = dpooled.row(idx(i)) / static_cast<float>(pl);

  for (size_t s = blocks_.size(); s-- > 0;) {
    Block& b = blocks_[s];
    const size_t pin = b.in_h * b.in_w, pout = b.out_h * b.out_w, m = n * pout;
    const float* h_in = s == 0 ? h0.data() : blocks_[s - 1].out.data();
    const ConstRowMatrixMap h(h_in, idx(n * pin), idx(b.in_c));
    const ConstRowMatrixMap out(b.out.data(), idx(m), idx(b.out_c));
    const ConstRowMatrixMap r1(b.r1.data(), idx(m), idx(b.out_c));
    // Through the final ReLU: dsum feeds both the main path's BN and the shortcut.
    RowMatrixMap dsum(dh_.data(), idx(m), idx(b.out_c));
    dsum.array() *= (out.array() > 0.0f).cast<float>();
    RowMatrixMap g2 = scratch(b.g2, m, b.out_c);
    b.n2.backward(constView(dsum), at(params, b.bn2.weight), at(grad, b.bn2.weight),
                  at(grad, b.bn2.bias), g2);
    RowMatrixMap g1 = scratch(b.g1, m, b.out_c);
    b.c2.backward(r1, layout_.slice(params, b.conv2), constView(g2), layout_.slice(grad, b.conv2),
                  {}, &g1);
    g1.array() *= (r1.array() > 0.0f).cast<float>();
    RowMatrixMap gt = scratch(b.t2, m, b.out_c);
    b.n1.backward(constView(g1), at(params, b.bn1.weight), at(grad, b.bn1.weight),
                  at(grad, b.bn1.bias), gt);
    RowMatrixMap dhin = scratch(b.dh, n * pin, b.in_c);
    b.c1.backward(h, layout_.slice(params, b.conv1), constView(gt), layout_.slice(grad, b.conv1),
                  {}, &dhin);
    if (b.down) {
      RowMatrixMap gd = scratch(b.gd, m, b.out_c);
      b.nd.backward(constView(dsum), at(params, b.bnd.weight), at(grad, b.bnd.weight),
                    at(grad, b.bnd.bias), gd);
      RowMatrixMap dskip = scratch(b.skip, n * pin, b.in_c);
      b.cd.backward(h, layout_.slice(params, b.convd), constView(gd), layout_.slice(grad, b.convd),
                    {}, &dskip);
      dhin += dskip;
    } else {
      dhin += dsum;
    }
    // dh_ becomes the earlier block's (or the stem's) output gradient; dsum is not read again.
    scratch(dh_, n * pin, b.in_c) = dhin;
  }
  // Stem: ReLU, BN, conv (no input gradient).
  RowMatrixMap d0(dh_.data(), idx(n * p0), 16);
  d0.array() *= (h0.array() > 0.0f).cast<float>();
  RowMatrixMap g0 = scratch(g0_, n * p0, 16);
  stem_norm_.backward(constView(d0), at(params, stem_bn_.weight), at(grad, stem_bn_.weight),
                      at(grad, stem_bn_.bias), g0);
  stem_.backward(in, layout_.slice(params, stem_conv_), constView(g0),
                 layout_.slice(grad, stem_conv_), {}, nullptr);
  return st;
}

void ResnetModel::commitBuffers(std::span<float> params) const {
  STARLING_CHECK_ARG(params.size() == layout_.numel(), spec(), ": params has ", params.size(),
                     " floats, the layout ", layout_.numel());
  stem_norm_.commit(at(params, stem_bn_.mean), at(params, stem_bn_.var));
  for (const Block& b : blocks_) {
    b.n1.commit(at(params, b.bn1.mean), at(params, b.bn1.var));
    b.n2.commit(at(params, b.bn2.mean), at(params, b.bn2.var));
    if (b.down) b.nd.commit(at(params, b.bnd.mean), at(params, b.bnd.var));
  }
}

}  // namespace

std::unique_ptr<EigenModel> makeResnetModel(size_t rows, size_t cols, uint32_t classes) {
  if (rows < 1 || cols < 1)
    STARLING_THROW(ConfigError, "trainer 'resnet': images of ", rows, "x", cols, " have no pixels");
  STARLING_CHECK_ARG(classes >= 2, "resnet: a classifier needs at least 2 classes, got ", classes);
  return std::make_unique<ResnetModel>(rows, cols, classes);
}

}  // namespace starling::client
