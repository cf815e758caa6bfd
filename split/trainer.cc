#include "split/trainer.h"

#include <chrono>
#include <cmath>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "data/sampling.h"

namespace starling::split {

void SplitTrainConfig::validate() const {
  makeActivationCodec(up);
  makeActivationCodec(down);
  if (batch_size == 0) STARLING_THROW(ConfigError, "train.batch_size must be at least 1");
  if (!(lr > 0.0 && std::isfinite(lr))) STARLING_THROW(ConfigError, "train.lr must be a positive number, got ", lr);
}

std::string EpochRecord::json() const {
  std::ostringstream o;
  o.precision(9);
  o << "{\"round\":" << epoch << ",\"epoch\":" << epoch << ",\"steps\":" << steps << ",\"train_loss\":" << train_loss
    << ",\"train_accuracy\":" << train_accuracy << ",\"test_accuracy\":" << test_accuracy
    << ",\"test_loss\":" << test_loss << ",\"uplink_bytes\":" << uplink_bytes << ",\"downlink_bytes\":" << downlink_bytes
    << ",\"wall_seconds\":" << wall_seconds << "}";
  return o.str();
}

InProcessSplit::InProcessSplit(SplitModel& model, SplitTrainConfig config, std::vector<float> params)
    : model_(model), cfg_((config.validate(), std::move(config))) {
  up_ = makeActivationCodec(cfg_.up);
  down_ = makeActivationCodec(cfg_.down);
  std::tie(bottom_, top_) = model.cutParameters(params);
}

std::vector<float> InProcessSplit::params() const {
  std::vector<float> p = bottom_;
  p.insert(p.end(), top_.begin(), top_.end());
  return p;
}

namespace {
void gatherBatch(const data::Dataset& d, std::span<const size_t> which, std::vector<float>& x, std::vector<uint8_t>& y) {
  const size_t f = d.features();
  x.resize(which.size() * f);
  y.resize(which.size());
  for (size_t i = 0; i < which.size(); ++i) {
    std::copy_n(d.images.begin() + static_cast<std::ptrdiff_t>(which[i] * f), f,
                x.begin() + static_cast<std::ptrdiff_t>(i * f));
    y[i] = d.labels[which[i]];
  }
}
}  // namespace

EpochRecord InProcessSplit::runEpoch(const data::Dataset& train, std::span<const size_t> idx, const data::Dataset* test,
                                     std::span<const size_t> test_idx) {
  STARLING_CHECK_ARG(train.features() == model_.features(), "split: the data has ", train.features(),
                     " features per example, the model ", model_.features());
  STARLING_CHECK_ARG(!idx.empty(), "split: no training examples");
  const auto t0 = std::chrono::steady_clock::now();
  EpochRecord rec;
  rec.epoch = ++epoch_;
  std::vector<size_t> order(idx.begin(), idx.end());
  RngStream rng(StreamKey{cfg_.seed, epoch_, kAnyClient, StreamPurpose::kTraining, 0});
  data::shuffleInPlace(std::span<size_t>(order), rng);
  const size_t a = model_.activationSize();
  double loss_sum = 0;
  size_t correct = 0;
  for (size_t start = 0; start < order.size(); start += cfg_.batch_size) {
    const size_t n = std::min<size_t>(cfg_.batch_size, order.size() - start);
    gatherBatch(train, std::span<const size_t>(order).subspan(start, n), x_, y_);
    // Edge forward; the activations cross the cut.
    const std::vector<float> act = model_.edgeForward(bottom_, x_, n);
    const std::vector<uint8_t> up = up_->encode(act, n, a, up_state_);
    rec.uplink_bytes += up.size();
    act_.resize(n * a);
    decodeActivation(up, n, a, act_);
    // Cloud step; the gradient crosses back.
    const SplitModel::CloudResult c = model_.cloudStep(top_, act_, y_, n);
    for (size_t i = 0; i < top_.size(); ++i) top_[i] -= static_cast<float>(cfg_.lr) * c.grad_top[i];
    loss_sum += c.loss;
    correct += c.correct;
    ++rec.steps;
    if (!cfg_.train_bottom) continue;  // nothing comes down for a frozen bottom
    const std::vector<uint8_t> down = down_->encode(c.grad_activations, n, a, down_state_);
    rec.downlink_bytes += down.size();
    grad_.resize(n * a);
    decodeActivation(down, n, a, grad_);
    const std::vector<float> gb = model_.edgeBackward(grad_);
    for (size_t i = 0; i < bottom_.size(); ++i) bottom_[i] -= static_cast<float>(cfg_.lr) * gb[i];
  }
  rec.train_loss = loss_sum / static_cast<double>(rec.steps);
  rec.train_accuracy = static_cast<double>(correct) / static_cast<double>(order.size());
  if (test && !test_idx.empty()) std::tie(rec.test_loss, rec.test_accuracy) = evaluate(*test, test_idx);
  rec.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rec;
}

std::pair<double, double> InProcessSplit::evaluate(const data::Dataset& d, std::span<const size_t> idx) {
  STARLING_CHECK_ARG(d.features() == model_.features(), "split: the test data has ", d.features(),
                     " features per example, the model ", model_.features());
  constexpr size_t kBatch = 256;
  double loss = 0;
  size_t correct = 0;
  for (size_t start = 0; start < idx.size(); start += kBatch) {
    const size_t n = std::min(kBatch, idx.size() - start);
    gatherBatch(d, idx.subspan(start, n), x_, y_);
    const auto r = model_.evaluate(bottom_, top_, x_, y_, n);
    loss += r.loss * static_cast<double>(n);
    correct += r.correct;
  }
  const auto total = static_cast<double>(idx.size());
  return {loss / total, static_cast<double>(correct) / total};
}

}  // namespace starling::split
