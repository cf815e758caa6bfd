#include "split/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <sstream>

#include "aggregation/partial.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/sampling.h"

namespace starling::split {

void SplitTrainConfig::validate() const {
  makeActivationCodec(up);
  makeActivationCodec(down);
  if (batch_size == 0) STARLING_THROW(ConfigError, "train.batch_size must be at least 1");
  if (!(lr > 0.0 && std::isfinite(lr)))
    STARLING_THROW(ConfigError, "train.lr must be a positive number, got ", lr);
}

std::string EpochRecord::json() const {
  std::ostringstream o;
  o.precision(9);
  o << "{\"round\":" << epoch << ",\"epoch\":" << epoch << ",\"steps\":" << steps
    << ",\"train_loss\":" << train_loss << ",\"train_accuracy\":" << train_accuracy
    << ",\"test_accuracy\":" << test_accuracy << ",\"test_loss\":" << test_loss
    << ",\"uplink_bytes\":" << uplink_bytes << ",\"downlink_bytes\":" << downlink_bytes
    << ",\"eval_bytes\":" << eval_bytes << ",\"cloud_seconds\":" << cloud_seconds
    << ",\"wall_seconds\":" << wall_seconds << "}";
  return o.str();
}

InProcessSplit::InProcessSplit(SplitModel& model, SplitTrainConfig config,
                               std::vector<float> params, size_t edges)
    : model_(model), cfg_((config.validate(), std::move(config))) {
  STARLING_CHECK_ARG(edges >= 1, "split: at least one edge device");
  auto [bottom, top] = model.cutParameters(params);
  cloud_ = std::make_unique<SplitCloud>(model, std::move(top), cfg_.down, cfg_.lr);
  for (size_t e = 0; e < edges; ++e)
    edges_.push_back(std::make_unique<SplitEdge>(model, bottom, cfg_.up, cfg_.lr));
}

void gatherBatch(const data::Dataset& d, std::span<const size_t> which, std::vector<float>& x,
                 std::vector<uint8_t>& y) {
  const size_t f = d.features();
  x.resize(which.size() * f);
  y.resize(which.size());
  for (size_t i = 0; i < which.size(); ++i) {
    std::copy_n(d.images.begin() + static_cast<std::ptrdiff_t>(which[i] * f), f,
                x.begin() + static_cast<std::ptrdiff_t>(i * f));
    y[i] = d.labels[which[i]];
  }
}

EpochRecord InProcessSplit::runEpoch(const data::Dataset& train, std::span<const size_t> idx,
                                     const data::Dataset* test, std::span<const size_t> test_idx) {
  STARLING_CHECK_ARG(edges_.size() == 1, "split: ", edges_.size(), " edges need one shard each");
  return runEpoch(train, std::vector<std::vector<size_t>>{{idx.begin(), idx.end()}}, test,
                  test_idx);
}

EpochRecord InProcessSplit::runEpoch(const data::Dataset& train,
                                     const std::vector<std::vector<size_t>>& shards,
                                     const data::Dataset* test, std::span<const size_t> test_idx) {
  STARLING_CHECK_ARG(train.features() == model_.features(), "split: the data has ",
                     train.features(), " features per example, the model ", model_.features());
  STARLING_CHECK_ARG(shards.size() == edges_.size(), "split: ", shards.size(), " shards for ",
                     edges_.size(), " edges");
  const auto t0 = std::chrono::steady_clock::now();
  EpochRecord rec;
  rec.epoch = ++epoch_;
  std::vector<std::vector<size_t>> order = shards;
  size_t total = 0, longest = 0;
  for (size_t e = 0; e < order.size(); ++e) {
    STARLING_CHECK_ARG(!order[e].empty(), "split: edge ", e, " has no training examples");
    RngStream rng(StreamKey{cfg_.seed, epoch_, e, StreamPurpose::kTraining, 0});
    data::shuffleInPlace(std::span<size_t>(order[e]), rng);
    total += order[e].size();
    longest = std::max(longest, order[e].size());
  }
  double loss_sum = 0;
  size_t correct = 0;
  for (size_t start = 0; start < longest; start += cfg_.batch_size)
    for (size_t e = 0; e < edges_.size(); ++e) {
      if (start >= order[e].size()) continue;
      const size_t n = std::min<size_t>(cfg_.batch_size, order[e].size() - start);
      gatherBatch(train, std::span<const size_t>(order[e]).subspan(start, n), x_, y_);
      const std::vector<uint8_t> up = edges_[e]->forward(x_, n);
      rec.uplink_bytes += up.size();
      const auto c0 = std::chrono::steady_clock::now();
      const SplitCloud::Reply r = cloud_->step(e, up, y_, n, cfg_.train_bottom);
      rec.cloud_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
      loss_sum += r.loss;
      correct += r.correct;
      ++rec.steps;
      if (!cfg_.train_bottom) continue;  // nothing comes down for a frozen bottom
      rec.downlink_bytes += r.gradient.size();
      edges_[e]->backward(r.gradient);
    }
  if (cfg_.splitfed && edges_.size() > 1 && cfg_.train_bottom) {
    // SplitFed: the bottoms averaged by the aggregation library's streaming FedAvg (each edge's
    // bottom an update weighted by its examples), and the mean given back to every edge.
    auto layout = std::make_shared<const aggregation::AggregateLayout>(
        std::make_shared<const ParamLayout>(model_.bottom()), rec.epoch, 0, nullptr,
        std::vector<std::string>{});
    aggregation::PartialAggregate sum(layout);
    for (size_t e = 0; e < edges_.size(); ++e) {
      const auto b = edges_[e]->bottom();
      compression::UpdateView u;
      u.header = {model_.bottom().fingerprint(), rec.epoch, 0, e, shards[e].size(), 0};
      for (const auto& t : model_.bottom().tensors())
        u.tensors.push_back(compression::DenseF32View{b.subspan(t.offset, t.numel)});
      sum.addValidated(u, static_cast<double>(shards[e].size()));
    }
    const std::vector<float> mean = sum.mean();
    for (auto& edge : edges_) edge->setBottom(mean);
  }
  rec.train_loss = loss_sum / static_cast<double>(rec.steps);
  rec.train_accuracy = static_cast<double>(correct) / static_cast<double>(total);
  if (test && !test_idx.empty()) {
    for (size_t e = 0; e < edges_.size(); ++e) {
      const auto [l, a] = evaluate(*test, test_idx, e);
      rec.test_loss += l / static_cast<double>(edges_.size());
      rec.test_accuracy += a / static_cast<double>(edges_.size());
    }
  }
  rec.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rec;
}

std::pair<double, double> InProcessSplit::evaluate(const data::Dataset& d,
                                                   std::span<const size_t> idx, size_t edge) {
  STARLING_CHECK_ARG(d.features() == model_.features(), "split: the test data has ", d.features(),
                     " features per example, the model ", model_.features());
  constexpr size_t kBatch = 256;
  double loss = 0;
  size_t correct = 0;
  const auto b = edges_.at(edge)->bottom();
  for (size_t start = 0; start < idx.size(); start += kBatch) {
    const size_t n = std::min(kBatch, idx.size() - start);
    gatherBatch(d, idx.subspan(start, n), x_, y_);
    const auto r = model_.evaluate(b, cloud_->top(), x_, y_, n);
    loss += r.loss * static_cast<double>(n);
    correct += r.correct;
  }
  const auto total = static_cast<double>(idx.size());
  return {loss / total, static_cast<double>(correct) / total};
}

}  // namespace starling::split
