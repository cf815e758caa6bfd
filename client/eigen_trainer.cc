#include "client/eigen_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/finite.h"
#include "data/sampling.h"

namespace starling::client {
EigenTrainer::EigenTrainer(std::unique_ptr<EigenModel> model, double momentum)
    : model_(std::move(model)), momentum_(momentum) {
  STARLING_CHECK_ARG(model_ != nullptr, "EigenTrainer: no model");
  STARLING_CHECK_ARG(momentum >= 0 && momentum < 1, "EigenTrainer: momentum ", momentum,
                     " is not in [0, 1)");
}

std::string EigenTrainer::spec() const {
  std::string s = model_->spec();
  if (momentum_ == 0) return s;
  std::ostringstream m;  // the LibTorch trainer's form, so both trainers' specs compare equal
  m << "momentum=" << momentum_;
  return s + (s.find(':') == std::string::npos ? ":" : ",") + m.str();
}

void EigenTrainer::checkParams(size_t n) const {
  STARLING_CHECK_ARG(n == layout().numel(), spec(), ": params has ", n,
                     " floats, the model's layout has ", layout().numel());
}

void EigenTrainer::initParameters(std::span<float> params, uint64_t seed) const {
  checkParams(params.size());
  model_->initParameters(params, seed);
}

std::span<float> EigenTrainer::load(std::span<const float> params) {
  work_.assign(params.begin(), params.end());
  return work_;
}

std::pair<ConstRowMatrixMap, std::span<const uint8_t>> EigenTrainer::gather(
    const data::Dataset& d, std::span<const size_t> order) {
  const size_t f = d.features(), n = order.size();
  if (x_.size() < n * f) x_.resize(n * f);
  if (y_.size() < n) y_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(x_.data() + i * f, d.images.data() + order[i] * f, f * sizeof(float));
    y_[i] = d.labels[order[i]];
  }
  return {ConstRowMatrixMap(x_.data(), static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(f)),
          std::span<const uint8_t>(y_.data(), n)};
}

FitResult EigenTrainer::fit(std::span<float> caller_params, const DataView& data,
                            const FitConfig& cfg, RngStream& rng) {
  cfg.check();
  checkParams(caller_params.size());
  checkGradientTerms(cfg, caller_params.size());
  checkDataView(data, features(), classes());
  const data::Dataset& d = *data.dataset;
  const size_t batch = std::min<size_t>(cfg.batch_size, data.size());
  const double scratch_bytes = 4.0 * static_cast<double>(model_->activationFloats(batch));
  if (scratch_bytes > static_cast<double>(kMaxActivationBytes))
    STARLING_THROW(InvalidArgument, spec(), ": a batch of ", batch, " examples needs ",
                   static_cast<uint64_t>(scratch_bytes / 1048576), " MB of activations, above the ",
                   kMaxActivationBytes / 1048576,
                   " MB this trainer allows; use a smaller batch_size");

  // The caller's buffer is written only once training has succeeded: a divergence leaves it
  // untouched, so nothing needs restoring.
  const std::span<float> params = load(caller_params);
  grad_.resize(params.size());
  order_.assign(data.indices.begin(), data.indices.end());
  const auto diverged = [&](const std::string& what) {
    STARLING_THROW(DivergenceError, spec(), ": training diverged: ", what, " (learning rate ",
                   cfg.lr,
                   " too high for this model and data?); the parameters are left as they were");
  };

  double loss_sum = 0;
  size_t correct = 0, seen = 0;
  const float lr = static_cast<float>(cfg.lr);
  const auto mu = static_cast<float>(cfg.prox_mu);
  // SGD and the extra terms act on the trainable tensors, a prefix of the layout; the buffers
  // after them (running statistics) change only through the model's commitBuffers.
  const size_t trainable = model_->trainableTensors();
  const auto n_params = static_cast<Eigen::Index>(
      trainable == 0 ? 0 : layout()[trainable - 1].offset + layout()[trainable - 1].numel);
  const ConstVectorMap anchor(cfg.prox_mu > 0 ? cfg.prox_anchor.data() : params.data(), n_params);
  const ConstVectorMap corr(cfg.correction.empty() ? params.data() : cfg.correction.data(),
                            n_params);
  VectorMap p(params.data(), n_params), gm(grad_.data(), n_params);
  const ConstVectorMap g(grad_.data(), n_params);
  const auto momentum = static_cast<float>(momentum_);
  if (momentum_ > 0) velocity_.assign(static_cast<size_t>(n_params), 0.0f);
  VectorMap v(momentum_ > 0 ? velocity_.data() : grad_.data(), n_params);
  for (uint32_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    data::shuffleInPlace(std::span<size_t>(order_), rng);
    for (size_t start = 0; start < order_.size(); start += cfg.batch_size) {
      if (cfg.stop && cfg.stop->load(std::memory_order_relaxed))
        STARLING_THROW(TrainingStopped, spec(), ": training stopped at epoch ", epoch + 1,
                       ", example ", start, " of ", order_.size(),
                       "; the parameters are left as they were");
      const size_t n = std::min<size_t>(cfg.batch_size, order_.size() - start);
      const auto [x, y] = gather(d, std::span<const size_t>(order_).subspan(start, n));
      const BatchStats st = model_->forwardBackward(params, x, y, grad_);
      if (!std::isfinite(st.loss_sum))
        diverged(::starling::detail::concat("the loss is ", st.loss_sum, " at epoch ", epoch + 1,
                                            ", examples ", start, "..", start + n - 1));
      model_->commitBuffers(params);
      loss_sum += st.loss_sum;
      correct += st.correct;
      seen += n;
      if (mu > 0) gm.noalias() += mu * (p - anchor);  // FedProx
      if (!cfg.correction.empty()) gm += corr;        // SCAFFOLD
      if (momentum_ > 0) {
        v = momentum * v + g;
        p.noalias() -= lr * v;
      } else {
        p.noalias() -= lr * g;
      }
    }
  }
  if (!allFinite(params)) diverged("a parameter is not finite after the last step");
  std::copy(params.begin(), params.end(), caller_params.begin());

  FitResult r;
  r.num_examples = data.size();
  r.metrics = {{"train_loss", loss_sum / static_cast<double>(seen)},
               {"train_accuracy", static_cast<double>(correct) / static_cast<double>(seen)}};
  return r;
}

EvalResult EigenTrainer::evaluate(std::span<const float> caller_params, const DataView& data) {
  checkParams(caller_params.size());
  checkDataView(data, features(), classes());
  const std::span<const float> params = load(caller_params);
  double loss_sum = 0;
  size_t correct = 0;
  const size_t eval_batch = model_->evalBatch();
  for (size_t start = 0; start < data.indices.size(); start += eval_batch) {
    const size_t n = std::min(eval_batch, data.indices.size() - start);
    const auto [x, y] = gather(*data.dataset, data.indices.subspan(start, n));
    const BatchStats st = model_->forwardBackward(params, x, y, {});
    loss_sum += st.loss_sum;
    correct += st.correct;
  }
  EvalResult r;
  r.num_examples = data.size();
  r.loss = loss_sum / static_cast<double>(data.size());
  r.accuracy = static_cast<double>(correct) / static_cast<double>(data.size());
  return r;
}

}  // namespace starling::client
