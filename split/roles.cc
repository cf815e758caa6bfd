#include "split/roles.h"

#include <cmath>

#include "core/error.h"
#include "core/input_error.h"

namespace starling::split {

SplitCloud::SplitCloud(SplitModel& model, std::vector<float> top, const std::string& down,
                       double lr, Limits limits)
    : model_(model),
      top_(std::move(top)),
      down_(makeActivationCodec(down)),
      lr_(lr),
      limits_(limits) {
  STARLING_CHECK_ARG(top_.size() == model.top().numel(), "split cloud: ", top_.size(),
                     " parameters, the top part has ", model.top().numel());
  STARLING_CHECK_ARG(lr > 0, "split cloud: the learning rate must be positive");
}

void SplitCloud::decode(std::span<const uint8_t> activations, std::span<const uint8_t> labels,
                        size_t n) {
  if (n == 0 || n > limits_.max_batch)
    failInput(Errc::kSizeMismatch, "split: a step of ", n, " examples, the cloud takes 1 to ",
              limits_.max_batch);
  if (labels.size() != n)
    failInput(Errc::kSizeMismatch, "split: ", labels.size(), " labels for ", n, " examples");
  for (size_t i = 0; i < n; ++i)
    if (labels[i] >= model_.classes())
      failInput(Errc::kIndexOutOfRange, "split: label ", int{labels[i]}, " of example ", i,
                ", the model has ", model_.classes(), " classes");
  act_.resize(n * model_.activationSize());
  decodeActivation(activations, n, model_.activationSize(), act_, limits_.max_abs);
}

SplitCloud::Reply SplitCloud::step(uint64_t edge, std::span<const uint8_t> activations,
                                   std::span<const uint8_t> labels, size_t n, bool send_gradient) {
  decode(activations, labels, n);  // everything an edge can lie about, before anything changes
  const SplitModel::CloudResult c = model_.cloudStep(top_, act_, labels, n);
  // A step that would make the shared top part non-finite is refused, whoever caused it.
  bool finite = std::isfinite(c.loss);
  for (float g : c.grad_top) finite = finite && std::isfinite(g);
  for (float g : c.grad_activations) finite = finite && std::isfinite(g);
  if (!finite)
    failInput(Errc::kNonFinite, "split: edge ", edge,
              "'s step gives a non-finite loss or gradient; refused");
  Reply r;
  r.loss = c.loss;
  r.correct = c.correct;
  CodecState pending;
  if (send_gradient) {
    if (auto it = states_.find(edge); it != states_.end())
      pending = it->second;  // installed only once the step succeeded
    r.gradient = down_->encode(c.grad_activations, n, model_.activationSize(), pending);
  }
  std::vector<float> next(top_.size());
  for (size_t i = 0; i < top_.size(); ++i) {
    next[i] = top_[i] - static_cast<float>(lr_) * c.grad_top[i];
    if (!std::isfinite(next[i]))
      failInput(Errc::kNonFinite, "split: edge ", edge,
                "'s step would make the top part non-finite; refused");
  }
  if (send_gradient) states_[edge] = std::move(pending);
  top_ = std::move(next);
  return r;
}

SplitCloud::Reply SplitCloud::evaluate(std::span<const uint8_t> activations,
                                       std::span<const uint8_t> labels, size_t n) {
  decode(activations, labels, n);
  const SplitModel::CloudResult c =
      model_.cloudStep(top_, act_, labels, n);  // gradients computed, not applied
  if (!std::isfinite(c.loss))
    failInput(Errc::kNonFinite, "split: an evaluation step gives a non-finite loss; refused");
  Reply r;
  r.loss = c.loss;
  r.correct = c.correct;
  return r;
}

SplitEdge::SplitEdge(SplitModel& model, std::vector<float> bottom, const std::string& up, double lr)
    : model_(model),
      bottom_(std::move(bottom)),
      up_(makeActivationCodec(up)),
      plain_(makeActivationCodec("none")),
      lr_(lr) {
  STARLING_CHECK_ARG(bottom_.size() == model.bottom().numel(), "split edge: ", bottom_.size(),
                     " parameters, the bottom part has ", model.bottom().numel());
  STARLING_CHECK_ARG(lr > 0, "split edge: the learning rate must be positive");
}

std::vector<uint8_t> SplitEdge::forward(std::span<const float> x, size_t n) {
  const std::vector<float> act = model_.edgeForward(bottom_, x, n);
  n_ = n;
  return up_->encode(act, n, model_.activationSize(), state_);
}

std::vector<uint8_t> SplitEdge::forwardUncompressed(std::span<const float> x, size_t n) {
  const std::vector<float> act = model_.edgeForward(bottom_, x, n);
  n_ = 0;  // no gradient follows
  CodecState scratch;
  return plain_->encode(act, n, model_.activationSize(), scratch);
}

void SplitEdge::backward(std::span<const uint8_t> gradient) {
  STARLING_CHECK_ARG(n_ > 0, "split edge: a gradient without a forward pass");
  grad_.resize(n_ * model_.activationSize());
  // A lying cloud: InputError, nothing changed (values over 1e6 too, as the cloud bounds
  // activations).
  decodeActivation(gradient, n_, model_.activationSize(), grad_, 1e6);
  const std::vector<float> g = model_.edgeBackward(grad_);
  std::vector<float> next(bottom_.size());
  for (size_t i = 0; i < bottom_.size(); ++i) {
    next[i] = bottom_[i] - static_cast<float>(lr_) * g[i];
    if (!std::isfinite(next[i]))
      failInput(Errc::kNonFinite, "split edge: the cloud's gradient makes the bottom non-finite");
  }
  bottom_ = std::move(next);
  n_ = 0;
}

void SplitEdge::setBottom(std::span<const float> b) {
  STARLING_CHECK_ARG(b.size() == bottom_.size(), "split edge: a bottom of ", b.size(),
                     " parameters, ", bottom_.size(), " expected");
  bottom_.assign(b.begin(), b.end());
}

}  // namespace starling::split
