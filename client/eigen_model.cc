#include "client/eigen_model.h"

#include <cmath>

#include "core/error.h"

namespace starling::client::detail {

RowMatrixMap scratchMatrix(AlignedVector<float>& buf, size_t rows, size_t cols) {
  if (buf.size() < rows * cols) buf.resize(rows * cols);
  return RowMatrixMap(buf.data(), static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
}

BatchStats softmaxCrossEntropy(RowMatrixMap logits, std::span<const uint8_t> y, bool want_grad) {
  BatchStats st;
  const Eigen::Index batch = logits.rows(), classes = logits.cols();
  const float inv_batch = 1.0f / static_cast<float>(batch);
  for (Eigen::Index i = 0; i < batch; ++i) {
    auto row = logits.row(i);
    // Arg-max by hand: the lowest index wins ties, whatever Eigen's vectorised reduction does.
    Eigen::Index arg = 0;
    for (Eigen::Index c = 1; c < classes; ++c)
      if (row(c) > row(arg)) arg = c;
    const float top = row(arg);
    const size_t label = y[static_cast<size_t>(i)];
    st.correct += static_cast<size_t>(arg) == label;
    // loss = log sum_c exp(l_c - top) - (l_y - top): every exponent is <= 0 and the sum is >= 1,
    // so nothing overflows, and l_y - top is taken before exp so a tiny probability cannot
    // underflow into log(0).
    const double shifted_label = static_cast<double>(row(static_cast<Eigen::Index>(label))) - top;
    row.array() = (row.array() - top).exp();
    const float sum = row.sum();
    st.loss_sum += std::log(static_cast<double>(sum)) - shifted_label;
    if (want_grad) {
      row *= inv_batch / sum;
      row(static_cast<Eigen::Index>(label)) -= inv_batch;
    }
  }
  return st;
}

void checkBatch(const EigenModel& m, std::span<const float> params, const ConstRowMatrixMap& x,
                std::span<const uint8_t> y, std::span<float> grad) {
  const size_t numel = m.layout().numel();
  STARLING_CHECK_ARG(params.size() == numel, m.spec(), ": params has ", params.size(),
                     " floats, the layout ", numel);
  STARLING_CHECK_ARG(grad.empty() || grad.size() == numel, m.spec(), ": grad has ", grad.size(),
                     " floats, the layout ", numel);
  STARLING_CHECK_ARG(static_cast<size_t>(x.cols()) == m.features(), m.spec(), ": batch has ",
                     x.cols(), " features, the model ", m.features());
  STARLING_CHECK_ARG(x.rows() > 0 && static_cast<size_t>(x.rows()) == y.size(), m.spec(),
                     ": batch of ", x.rows(), " rows with ", y.size(), " labels");
  // Reproducible bits need buffers whose placement is fixed (eigen_model.h).
  STARLING_CHECK_ARG(isSimdAligned(params.data()) && isSimdAligned(x.data()) &&
                         (grad.empty() || isSimdAligned(grad.data())),
                     m.spec(), ": params, x and grad must start on ", kSimdAlign,
                     "-byte boundaries (AlignedVector); EigenTrainer copies into such buffers");
}

}  // namespace starling::client::detail
