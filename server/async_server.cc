#include "server/async_server.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/finite.h"

namespace starling::server {

AsyncServer::AsyncServer(std::shared_ptr<const ParamLayout> layout, AsyncServerConfig config,
                         std::vector<float> initial)
    : config_(std::move(config)),
      scheme_(layout, config_.scheme),
      optimizer_(aggregation::makeServerOptimizer(config_.server_opt, layout->numel())),
      model_(layout,
             config_.downlink == Downlink::kDelta || config_.downlink == Downlink::kTopK
                 ? config_.history
                 : 0,
             config_.downlink == Downlink::kTopK ? config_.density : 0.0),
      buffer_(scheme_, config_.async, 1) {
  STARLING_CHECK_ARG(initial.size() == layout->numel(), "initial model of ", initial.size(),
                     " values, the layout has ", layout->numel());
  model_.set(std::move(initial), 1);
}

void AsyncServer::add(const compression::UpdateView& u, const aggregation::ClientLimits& limits) {
  buffer_.add(u, limits);
  const uint64_t tau = version() - u.header.round;  // add() checked 1 <= round <= version
  staleness_sum_ += static_cast<double>(tau);
  staleness_max_ = std::max(staleness_max_, tau);
}

RoundRecord AsyncServer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  RoundRecord rec;
  rec.round = ++steps_;
  const uint64_t count = buffer_.size();
  aggregation::RoundResult result = buffer_.take();  // InvalidArgument when empty
  rec.clients_completed = result.count;
  rec.updates_rejected = result.rejected;
  if (auto it = result.metrics.find("train_loss"); it != result.metrics.end())
    rec.train_loss = it->second;
  for (const auto& [name, value] : result.metrics)
    if (name != "train_loss") rec.metrics[name] = value;
  rec.metrics["staleness_mean"] = count ? staleness_sum_ / static_cast<double>(count) : 0.0;
  rec.metrics["staleness_max"] = static_cast<double>(staleness_max_);
  staleness_sum_ = 0.0;
  staleness_max_ = 0;
  std::vector<float> next(model_.server().begin(), model_.server().end());
  try {
    optimizer_->step(next, result.delta);
  } catch (const InvalidArgument& e) {  // a non-finite delta: the model is untouched
    rec.reason = e.what();
  }
  if (rec.reason.empty() && !allFinite(next))
    rec.reason = "the server optimizer's step made the model non-finite; the step is not applied";
  if (rec.reason.empty()) {
    model_.set(std::move(next), model_.version() + 1);
    buffer_.advance();
    rec.applied = true;
  }
  rec.model_version = model_.version();
  rec.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rec;
}

RoundRecord AsyncServer::skip(const std::string& reason) {
  RoundRecord rec;
  rec.round = ++steps_;
  rec.reason = reason;
  rec.updates_rejected = buffer_.takeRejected();
  rec.model_version = model_.version();
  return rec;
}

}  // namespace starling::server
