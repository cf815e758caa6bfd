#include "client/conv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "client/eigen_model.h"
#include "core/error.h"

namespace starling::client::detail {
namespace {

// Weight index maps between PyTorch's [out, in, kh, kw] and the patch order [out, (kh, kw, in)].
size_t torchIndex(const ConvShape& s, size_t o, size_t ci, size_t kh, size_t kw) {
  return ((o * s.in_c + ci) * s.k + kh) * s.k + kw;
}
size_t patchIndex(const ConvShape& s, size_t o, size_t ci, size_t kh, size_t kw) {
  return o * s.patch() + (kh * s.k + kw) * s.in_c + ci;
}

}  // namespace

Conv2d::Conv2d(ConvShape s, size_t chunk_images) : s_(s), chunk_(chunk_images) {
  STARLING_CHECK_ARG(s.in_c > 0 && s.out_c > 0 && s.k > 0 && s.stride > 0 && chunk_images > 0,
                     "conv2d: channels, kernel, stride and chunk must be positive");
  STARLING_CHECK_ARG(s.h + 2 * s.pad >= s.k && s.w + 2 * s.pad >= s.k, "conv2d: a ", s.h, "x", s.w,
                     " input with padding ", s.pad, " is smaller than the ", s.k, "x", s.k,
                     " kernel");
}

void Conv2d::permuteWeight(std::span<const float> weight) {
  STARLING_CHECK_ARG(weight.size() == s_.weightNumel(), "conv2d: weight has ", weight.size(),
                     " floats, expected ", s_.weightNumel());
  if (wp_.size() < weight.size()) wp_.resize(weight.size());
  for (size_t o = 0; o < s_.out_c; ++o)
    for (size_t ci = 0; ci < s_.in_c; ++ci)
      for (size_t kh = 0; kh < s_.k; ++kh)
        for (size_t kw = 0; kw < s_.k; ++kw)
          wp_[patchIndex(s_, o, ci, kh, kw)] = weight[torchIndex(s_, o, ci, kh, kw)];
}

void Conv2d::im2col(const float* in, size_t first, size_t n) {
  const size_t oh = s_.outH(), ow = s_.outW(), k = s_.k, c = s_.in_c, patch = s_.patch();
  if (cols_.size() < n * oh * ow * patch) cols_.resize(n * oh * ow * patch);
  float* out = cols_.data();
  for (size_t i = 0; i < n; ++i) {
    const float* image = in + (first + i) * s_.h * s_.w * c;
    for (size_t oy = 0; oy < oh; ++oy)
      for (size_t ox = 0; ox < ow; ++ox, out += patch)
        for (size_t kh = 0; kh < k; ++kh) {
          const auto iy = static_cast<std::ptrdiff_t>(oy * s_.stride + kh) -
                          static_cast<std::ptrdiff_t>(s_.pad);
          float* dst = out + kh * k * c;
          if (iy < 0 || iy >= static_cast<std::ptrdiff_t>(s_.h)) {
            std::fill_n(dst, k * c, 0.0f);
            continue;
          }
          for (size_t kw = 0; kw < k; ++kw, dst += c) {
            const auto ix = static_cast<std::ptrdiff_t>(ox * s_.stride + kw) -
                            static_cast<std::ptrdiff_t>(s_.pad);
            if (ix < 0 || ix >= static_cast<std::ptrdiff_t>(s_.w))
              std::fill_n(dst, c, 0.0f);
            else
              std::memcpy(dst,
                          image + (static_cast<size_t>(iy) * s_.w + static_cast<size_t>(ix)) * c,
                          c * sizeof(float));
          }
        }
  }
}

void Conv2d::col2im(float* din, size_t first, size_t n) {
  const size_t oh = s_.outH(), ow = s_.outW(), k = s_.k, c = s_.in_c, patch = s_.patch();
  const float* src = dcols_.data();
  for (size_t i = 0; i < n; ++i) {
    float* image = din + (first + i) * s_.h * s_.w * c;
    for (size_t oy = 0; oy < oh; ++oy)
      for (size_t ox = 0; ox < ow; ++ox, src += patch)
        for (size_t kh = 0; kh < k; ++kh) {
          const auto iy = static_cast<std::ptrdiff_t>(oy * s_.stride + kh) -
                          static_cast<std::ptrdiff_t>(s_.pad);
          if (iy < 0 || iy >= static_cast<std::ptrdiff_t>(s_.h)) continue;
          for (size_t kw = 0; kw < k; ++kw) {
            const auto ix = static_cast<std::ptrdiff_t>(ox * s_.stride + kw) -
                            static_cast<std::ptrdiff_t>(s_.pad);
            if (ix < 0 || ix >= static_cast<std::ptrdiff_t>(s_.w)) continue;
            float* dst = image + (static_cast<size_t>(iy) * s_.w + static_cast<size_t>(ix)) * c;
            const float* g = src + (kh * k + kw) * c;
            for (size_t ci = 0; ci < c; ++ci) dst[ci] += g[ci];
          }
        }
  }
}

size_t Conv2d::batchOf(const ConstRowMatrixMap& in) const {
  const size_t pixels_in = s_.h * s_.w;
  STARLING_CHECK_ARG(
      static_cast<size_t>(in.cols()) == s_.in_c && static_cast<size_t>(in.rows()) % pixels_in == 0,
      "conv2d: input [", in.rows(), ", ", in.cols(), "] is not images of ", s_.h, "x", s_.w, "x",
      s_.in_c);
  return static_cast<size_t>(in.rows()) / pixels_in;
}

void Conv2d::forward(ConstRowMatrixMap in, std::span<const float> weight,
                     std::span<const float> bias, RowMatrixMap out) {
  const size_t pixels_out = s_.outH() * s_.outW();
  const size_t batch = batchOf(in);
  STARLING_CHECK_ARG(static_cast<size_t>(out.rows()) == batch * pixels_out &&
                         static_cast<size_t>(out.cols()) == s_.out_c,
                     "conv2d: output [", out.rows(), ", ", out.cols(), "], expected [",
                     batch * pixels_out, ", ", s_.out_c, "]");
  STARLING_CHECK_ARG(bias.empty() || bias.size() == s_.out_c, "conv2d: bias has ", bias.size(),
                     " floats, expected ", s_.out_c);
  permuteWeight(weight);
  const ConstRowMatrixMap wp(wp_.data(), idx(s_.out_c), idx(s_.patch()));
  for (size_t first = 0; first < batch; first += chunk_) {
    const size_t n = std::min(chunk_, batch - first);
    im2col(in.data(), first, n);
    const ConstRowMatrixMap cols(cols_.data(), idx(n * pixels_out), idx(s_.patch()));
    auto block = out.middleRows(idx(first * pixels_out), idx(n * pixels_out));
    block.noalias() = cols * wp.transpose();
    if (!bias.empty()) block.rowwise() += ConstVectorMap(bias.data(), idx(s_.out_c)).transpose();
  }
}

void Conv2d::backward(ConstRowMatrixMap in, std::span<const float> weight, ConstRowMatrixMap dout,
                      std::span<float> dweight, std::span<float> dbias, RowMatrixMap* din) {
  const size_t pixels_out = s_.outH() * s_.outW();
  const size_t batch = batchOf(in);
  STARLING_CHECK_ARG(!din || (din->rows() == in.rows() && din->cols() == in.cols()),
                     "conv2d: the input gradient's shape is not the input's");
  STARLING_CHECK_ARG(static_cast<size_t>(dout.rows()) == batch * pixels_out &&
                         static_cast<size_t>(dout.cols()) == s_.out_c,
                     "conv2d: output gradient [", dout.rows(), ", ", dout.cols(), "], expected [",
                     batch * pixels_out, ", ", s_.out_c, "]");
  STARLING_CHECK_ARG(dweight.size() == s_.weightNumel(), "conv2d: weight gradient has ",
                     dweight.size(), " floats, expected ", s_.weightNumel());
  if (!dbias.empty()) {
    STARLING_CHECK_ARG(dbias.size() == s_.out_c, "conv2d: bias gradient has ", dbias.size(),
                       " floats, expected ", s_.out_c);
    VectorMap(dbias.data(), idx(s_.out_c)) = dout.colwise().sum().transpose();
  }
  permuteWeight(weight);
  const ConstRowMatrixMap wp(wp_.data(), idx(s_.out_c), idx(s_.patch()));
  RowMatrixMap dwp = scratchMatrix(dwp_, s_.out_c, s_.patch());
  dwp.setZero();
  if (din) din->setZero();
  for (size_t first = 0; first < batch; first += chunk_) {
    const size_t n = std::min(chunk_, batch - first);
    const auto rows = idx(n * pixels_out);
    const auto block = dout.middleRows(idx(first * pixels_out), rows);
    im2col(in.data(), first, n);
    const ConstRowMatrixMap cols(cols_.data(), rows, idx(s_.patch()));
    dwp.noalias() += block.transpose() * cols;
    if (din) {
      RowMatrixMap dcols = scratchMatrix(dcols_, n * pixels_out, s_.patch());
      dcols.noalias() = block * wp;
      col2im(din->data(), first, n);
    }
  }
  // Back to PyTorch's order.
  for (size_t o = 0; o < s_.out_c; ++o)
    for (size_t ci = 0; ci < s_.in_c; ++ci)
      for (size_t kh = 0; kh < s_.k; ++kh)
        for (size_t kw = 0; kw < s_.k; ++kw)
          dweight[torchIndex(s_, o, ci, kh, kw)] = dwp_[patchIndex(s_, o, ci, kh, kw)];
}

void MaxPool2::forward(ConstRowMatrixMap in, size_t batch, size_t h, size_t w, RowMatrixMap out) {
  const size_t c = static_cast<size_t>(in.cols()), oh = h / 2, ow = w / 2;
  STARLING_CHECK_ARG(static_cast<size_t>(in.rows()) == batch * h * w && oh > 0 && ow > 0 &&
                         static_cast<size_t>(out.rows()) == batch * oh * ow &&
                         static_cast<size_t>(out.cols()) == c,
                     "maxpool2: input [", in.rows(), ", ", in.cols(), "] and output [", out.rows(),
                     ", ", out.cols(), "] do not fit ", batch, " images of ", h, "x", w);
  STARLING_CHECK_ARG(batch * h * w <= UINT32_MAX, "maxpool2: ", batch * h * w,
                     " input rows; positions are kept as 32-bit");
  in_rows_ = batch * h * w;
  if (arg_.size() < batch * oh * ow * c) arg_.resize(batch * oh * ow * c);
  const float* x = in.data();
  float* y = out.data();
  uint32_t* arg = arg_.data();
  for (size_t b = 0; b < batch; ++b)
    for (size_t oy = 0; oy < oh; ++oy)
      for (size_t ox = 0; ox < ow; ++ox) {
        const size_t r00 = (b * h + 2 * oy) * w + 2 * ox;
        const size_t window[4] = {r00, r00 + 1, r00 + w, r00 + w + 1};
        const size_t o = ((b * oh + oy) * ow + ox) * c;
        for (size_t ch = 0; ch < c; ++ch) {
          size_t best = window[0];
          float top = x[best * c + ch];
          for (int j = 1; j < 4; ++j) {
            const float v = x[window[j] * c + ch];
            if (v > top || (std::isnan(v) && !std::isnan(top))) {
              top = v;
              best = window[j];
            }
          }
          y[o + ch] = top;
          arg[o + ch] = static_cast<uint32_t>(best);
        }
      }
}

void MaxPool2::backward(ConstRowMatrixMap dout, RowMatrixMap din) const {
  const size_t c = static_cast<size_t>(dout.cols()), n = static_cast<size_t>(dout.rows()) * c;
  STARLING_CHECK_ARG(static_cast<size_t>(din.cols()) == c && arg_.size() >= n &&
                         static_cast<size_t>(din.rows()) == in_rows_,
                     "maxpool2: backward does not match the forward pass");
  din.setZero();
  const float* g = dout.data();
  float* d = din.data();
  for (size_t i = 0; i < n; ++i) d[arg_[i] * c + i % c] = g[i];
}

}  // namespace starling::client::detail
