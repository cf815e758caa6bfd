#include "server/async_root.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace starling::server {

void AsyncRootConfig::validate() const {
  if (steps == 0 || steps > 10'000'000)
    STARLING_THROW(ConfigError, "train.rounds (server steps) must be in [1, 10^7], got ", steps);
  if (fleet.concurrency == 0) STARLING_THROW(ConfigError, "async.concurrency must be at least 1");
  if (fleet.min_available == 0)
    STARLING_THROW(ConfigError, "sampling.min_available must be at least 1");
  if (fleet.task_deadline_ms < 10)
    STARLING_THROW(ConfigError, "round.deadline_ms must be at least 10, got ",
                   fleet.task_deadline_ms);
  if (round_ms != 0 && round_ms < 10)
    STARLING_THROW(ConfigError,
                   "round.deadline_ms (a semi-synchronous round) must be at least 10, "
                   "got ",
                   round_ms);
  if (fit.epochs == 0 || fit.epochs > 1000)
    STARLING_THROW(ConfigError, "fit.epochs must be in [1, 1000], got ", fit.epochs);
  if (fit.batch_size == 0) STARLING_THROW(ConfigError, "fit.batch_size must be positive");
  if (!(fit.lr > 0.0f && fit.lr <= 100.0f))
    STARLING_THROW(ConfigError, "fit.lr must be in (0, 100], got ", fit.lr);
}

AsyncRoot::AsyncRoot(std::shared_ptr<const ParamLayout> layout, AsyncServerConfig server,
                     AsyncRootConfig config, std::vector<float> initial)
    : config_((config.validate(), std::move(config))),
      server_(std::move(layout), std::move(server), std::move(initial)),
      broadcast_(server_.broadcast(1)),
      since_(std::chrono::steady_clock::now()) {
  if (config_.round_ms == 0 && !config_.aggregators &&
      config_.fleet.min_available < server_.config().async.buffer_size)
    STARLING_THROW(ConfigError, "async.buffer_size = ", server_.config().async.buffer_size,
                   " needs at least as many clients (each sends one update per model version): "
                   "set sampling.min_available to at least that, got ",
                   config_.fleet.min_available);
  if (!config_.checkpoint.empty() && std::filesystem::exists(config_.checkpoint)) {
    server_.loadCheckpoint(config_.checkpoint);
    resumed_ = true;
  }
  refreshTask();
}

void AsyncRoot::refreshTask() {
  const uint64_t v = server_.version();
  broadcast_ = server_.broadcast(v);
  protocol::TaskMsg h;
  h.kind = protocol::TaskKind::kFit;
  h.round = v;  // an asynchronous update's round field is the version it trained from
  h.phase = 0;
  h.run_seed = server_.scheme().options().run_seed;
  h.compressor = server_.scheme().compressor().spec();
  h.model_version = v;
  h.fit = config_.fit;
  h.deadline_ms = config_.fleet.task_deadline_ms;
  h.metrics = server_.scheme().options().metrics;
  // In place: the fleet holds the task's address across steps.
  task_.emplace(PhaseTask{broadcast_, std::move(h), server_.model(), server_.config().downlink});
}

bool AsyncRoot::mayStart(uint64_t client) const {
  return !server_.hasUpdate(client, server_.version());
}

void AsyncRoot::checkpoint() const {
  if (!config_.checkpoint.empty()) server_.saveCheckpoint(config_.checkpoint);
}

void AsyncRoot::sent(uint64_t bytes) {
  ++started_;
  downlink_ += bytes;
}

void AsyncRoot::failed(uint64_t /*client*/, const char* /*why*/) { ++failed_; }

void AsyncRoot::add(const compression::UpdateView& u, const aggregation::ClientLimits& limits,
                    uint64_t bytes) {
  server_.add(u, limits);  // InputError: refused, nothing changed
  uplink_ += bytes;
}

void AsyncRoot::addPartial(const compression::PartialView& p, uint64_t source, uint64_t bytes) {
  server_.addPartial(p, source);  // InputError: refused, nothing changed
  uplink_ += bytes;
}

void AsyncRoot::added() {
  // FedBuff steps every K updates; a semi-synchronous round steps at its end (tick()).
  if (config_.round_ms != 0 || !server_.ready()) {
    checkpoint();
    if (accepted_) accepted_();
    return;
  }
  stepped(server_.step(), true);
}

size_t AsyncRoot::tick(std::chrono::steady_clock::time_point now, size_t open) {
  const size_t c = config_.fleet.concurrency, room = open < c ? c - open : 0;
  if (config_.round_ms == 0) return room;  // FedBuff: a free slot is filled at once
  last_tick_ = now;
  if (!round_live_) {
    // Nothing open and nothing buffered: the round starts with its first task (handedOut). With
    // updates buffered (one that came back before this turn, or a resumed checkpoint's), now.
    if (open == 0 && server_.buffered() == 0) return room;
    round_live_ = true;
    round_start_ = now;
  }
  if (now - round_start_ >= std::chrono::milliseconds(config_.round_ms)) {
    stepped(server_.buffered() > 0 ? server_.step()
                                   : server_.skip("no update was accepted in the round"),
            false);
    round_start_ = now;  // the round's length includes its step (and evaluation)
    round_live_ = open > 0;
    handing_out_ = true;
  }
  // A round hands tasks out once, at its start; a root waiting for its first task keeps asking.
  return (handing_out_ || !round_live_) ? room : 0;
}

void AsyncRoot::handedOut(size_t sent) {
  if (config_.round_ms == 0) return;
  if (sent > 0 && !round_live_) {  // the round's first task: its clock starts
    round_live_ = true;
    round_start_ = last_tick_;
  }
  // Once a live round had its turn, a client that finishes early, or registers late, waits for
  // the next round.
  if (round_live_) handing_out_ = false;
}

void AsyncRoot::stepped(RoundRecord rec, bool on_update) {
  rec.clients_selected = started_;
  rec.clients_failed = failed_;
  rec.uplink_bytes = uplink_;
  rec.downlink_bytes = downlink_;
  const auto now = std::chrono::steady_clock::now();
  rec.wall_seconds = std::chrono::duration<double>(now - since_).count();
  since_ = now;
  started_ = downlink_ = uplink_ = failed_ = 0;
  checkpoint();
  // After the checkpoint: an evaluation that fails loses nothing of the step.
  if (rec.applied && config_.eval_every != 0 && config_.evaluate &&
      rec.round % config_.eval_every == 0) {
    if (const auto r = config_.evaluate(server_.model().current())) {
      rec.test_loss = r->first;
      rec.test_accuracy = r->second;
    }
  }
  if (!config_.metrics.empty()) {
    std::ofstream out(config_.metrics, std::ios::app);
    out << rec.json() << '\n';
    if (!out) STARLING_THROW(IoError, "cannot append to the metrics file ", config_.metrics);
  }
  refreshTask();
  if (on_update && accepted_) accepted_();
  if (progress_) progress_(rec);
}

void AsyncRoot::run(ZmqFleet& fleet, const std::function<void(const RoundRecord&)>& progress,
                    const std::function<void()>& accepted) {
  progress_ = progress;
  accepted_ = accepted;
  if (!done()) fleet.runAsync(*this, config_.fleet);
  fleet.finish("all " + std::to_string(config_.steps) + " steps done");
}

}  // namespace starling::server
