#pragma once
// Convolution and pooling for the Eigen models (client/eigen_model.h), without LibTorch.
//
// Activations are NHWC: a batch of B images of H x W pixels and C channels is a row-major matrix
// [B * H * W, C] (one row per pixel). A convolution is im2col + one matrix product per chunk of
// images: the patch matrix [pixels, k * k * C_in] times the weight [C_out, k * k * C_in]^T. The
// weight travels in PyTorch's order [C_out, C_in, k, k]; the layer permutes it to the patch order
// (kh, kw, C_in) once per batch, and its gradient back.
//
// Chunks of images bound the patch matrix (a 5 x 5 x 32 patch matrix is 800 floats per pixel): the
// layer never holds more than `chunk` images' patches. The default, 2, keeps the CNN's conv2
// patches (1.25 MB) in a core's L2: chunks of 1, 2 and 4 images train the CNN at the same speed, a
// whole batch of 32 (20 MB of patches) 25% slower (starling-torch-loop-bench,
// cnn_fit/eigen_paired). Every buffer is an AlignedVector and every chunk's offset a multiple of
// the sizes, so results are a function of the sizes alone (core/aligned.h).
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/aligned.h"
#include "core/param_layout.h"

namespace starling::client::detail {

// A size as an Eigen index.
inline Eigen::Index idx(size_t v) { return static_cast<Eigen::Index>(v); }

// A read-only view of a scratch matrix.
inline ConstRowMatrixMap constView(const RowMatrixMap& m) {
  return ConstRowMatrixMap(m.data(), m.rows(), m.cols());
}

// Sizes of a square-kernel 2-D convolution, PyTorch's conv2d (zero padding, no dilation, groups 1).
struct ConvShape {
  size_t in_c = 1, h = 1, w = 1;  // input channels and image size
  size_t out_c = 1, k = 1;        // output channels, kernel size k x k
  size_t stride = 1, pad = 0;
  size_t outH() const { return (h + 2 * pad - k) / stride + 1; }
  size_t outW() const { return (w + 2 * pad - k) / stride + 1; }
  size_t patch() const { return k * k * in_c; }
  size_t weightNumel() const { return out_c * patch(); }
};

class Conv2d {
 public:
  Conv2d() = default;
  explicit Conv2d(ConvShape s, size_t chunk_images = 2);
  const ConvShape& shape() const { return s_; }

  // out [B * outH * outW, out_c] = conv(in [B * h * w, in_c]) + bias (bias may be empty: no bias).
  // weight: PyTorch's [out_c, in_c, k, k], flat.
  void forward(ConstRowMatrixMap in, std::span<const float> weight, std::span<const float> bias,
               RowMatrixMap out);

  // Given dout = d(loss)/d(out), writes dweight (PyTorch's order, overwritten), dbias (when not
  // empty, overwritten) and, when din is not empty, d(loss)/d(in) [B * h * w, in_c] (overwritten).
  // `in` and `weight` are forward()'s.
  void backward(ConstRowMatrixMap in, std::span<const float> weight, ConstRowMatrixMap dout,
                std::span<float> dweight, std::span<float> dbias, RowMatrixMap* din);

 private:
  // Patches of images [first, first + n) of `in` into cols_ [n * outH * outW, patch].
  void im2col(const float* in, size_t first, size_t n);
  // Adds the patch gradients dcols_ of images [first, first + n) into din.
  void col2im(float* din, size_t first, size_t n);
  void permuteWeight(std::span<const float> weight);  // PyTorch order -> wp_ [out_c, patch]
  size_t batchOf(
      const ConstRowMatrixMap& in) const;  // images in `in` (InvalidArgument if none fit)

  ConvShape s_;
  size_t chunk_ = 2;
  AlignedVector<float> cols_, dcols_, wp_, dwp_;
};

// 2 x 2 max pooling with stride 2 (PyTorch's max_pool2d(x, 2): odd edges dropped). As PyTorch's
// CPU kernel, a window's value is its first maximum in scan order (row, then column) or its first
// NaN, and that position is kept for the backward pass.
class MaxPool2 {
 public:
  // out [B * (h/2) * (w/2), c] from in [B * h * w, c].
  void forward(ConstRowMatrixMap in, size_t batch, size_t h, size_t w, RowMatrixMap out);
  // din [B * h * w, c] (overwritten) from dout, routed to each window's maximum: the last
  // forward()'s batch and sizes.
  void backward(ConstRowMatrixMap dout, RowMatrixMap din) const;

 private:
  AlignedVector<uint32_t> arg_;  // per output value, the input row of its maximum
  size_t in_rows_ = 0;           // the last forward()'s input rows
};

}  // namespace starling::client::detail
