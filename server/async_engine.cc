#include "server/async_engine.h"

#include "core/error.h"

namespace starling::server {

AsyncEngine::AsyncEngine(AsyncServer& server, AsyncEngineConfig config, AsyncDurability* durability)
    : server_(server),
      config_(std::move(config)),
      durability_(durability),
      recorder_(RecorderConfig{config_.metrics, config_.lead, config_.eval_every,
                               config_.eval_applied_only}),
      broadcast_(server.broadcast(server.version())) {
  STARLING_CHECK_ARG(config_.concurrency >= 1, "the engine needs a concurrency of at least 1");
  STARLING_CHECK_ARG(config_.round_seconds >= 0.0, "a round's length is not negative");
  refreshTask();
}

void AsyncEngine::refreshTask() {
  const uint64_t v = server_.version();
  broadcast_ = server_.broadcast(v);
  // An asynchronous update's round field is the version it trained from.
  protocol::TaskMsg h =
      fitTaskHeader(server_.scheme(), v, v, config_.fit, config_.task_deadline_ms);
  // In place: a fleet holds the task's address across steps.
  task_.emplace(PhaseTask{broadcast_, std::move(h), server_.model(), server_.config().downlink});
}

bool AsyncEngine::mayStart(uint64_t client) const {
  return !server_.hasUpdate(client, server_.version());
}

void AsyncEngine::started(uint64_t bytes) {
  ++window_.started;
  window_.downlink += bytes;
}

// Added once durable (an IoError there ends the run: the disk failed); the server's refusal
// (InputError, nothing changed) is made durable too, so that a resumed step counts it.
void AsyncEngine::take(const AsyncArrival& a) {
  STARLING_CHECK_ARG((a.update == nullptr) != (a.partial == nullptr),
                     "an arrival is an update or a partial");
  ++window_.taken;
  window_.uplink += a.bytes;
  try {
    if (a.partial)
      server_.addPartial(*a.partial, a.client);
    else
      server_.add(*a.update, a.limits);
  } catch (const InputError&) {
    ++window_.refused;
    if (durability_ && config_.lead) durability_->refused(a);
    throw;
  } catch (const InvalidArgument&) {  // what the buffer cannot take at all: refused, not journaled
    ++window_.refused;
    throw;
  }
  ++window_.accepted;
  if (durability_ && config_.lead) durability_->taken(a);
  accepted_pending_ = true;
}

void AsyncEngine::failed(uint64_t /*client*/) { ++window_.failed; }

void AsyncEngine::run(AsyncFleet& fleet, const std::function<void(const RoundRecord&)>& progress,
                      const std::function<void()>& accepted) {
  const RunRecorder::Reporting reporting = recorder_.reportTo(progress);
  accepted_ = accepted;
  struct Forget {  // the caller's callback is not kept past run()
    std::function<void()>& callback;
    ~Forget() { callback = {}; }
  } forget{accepted_};
  if (done()) return;
  if (config_.round_seconds > 0.0)
    runRounds(fleet);
  else
    runBuffered(fleet);
}

size_t AsyncEngine::top(AsyncFleet& fleet) {
  const size_t open = fleet.open();
  return open < config_.concurrency ? fleet.start(config_.concurrency - open, *this) : 0;
}

void AsyncEngine::afterTaken(AsyncFleet& fleet) {
  // FedBuff steps every K accepted updates; a semi-synchronous round at its end.
  if (config_.round_seconds == 0.0 && server_.ready()) step(fleet);
  if (accepted_pending_) {
    accepted_pending_ = false;
    if (accepted_) accepted_();
  }
}

void AsyncEngine::drainNow(AsyncFleet& fleet) {
  while (!done() && fleet.next(fleet.now(), *this) == AsyncEvent::kTaken) afterTaken(fleet);
}

// FedBuff: every free slot is filled at once; every arrival of one instant is taken before the
// slots they free are filled (clients that finish together all hand in before anyone starts on
// what they produced).
void AsyncEngine::runBuffered(AsyncFleet& fleet) {
  // Resumed with a full buffer (a root killed after journaling the K-th update and before its
  // step): the step comes now, as it would have. A simulation resumed among the arrivals of one
  // instant takes the rest of them first.
  if (server_.ready()) step(fleet);
  drainNow(fleet);
  top(fleet);
  while (!done()) {
    const AsyncEvent e = fleet.next(AsyncFleet::kNever, *this);
    if (e == AsyncEvent::kStalled) stalled();
    if (e == AsyncEvent::kTaken) {
      afterTaken(fleet);
      drainNow(fleet);
    }
    if (!done()) top(fleet);
  }
}

// Semi-synchronous rounds: at each round's start the idle clients top the tasks open up to C; at
// its deadline the server steps with whatever was accepted, and the clients still training go
// on, their updates joining a later round with their staleness. A round's length includes its
// step.
void AsyncEngine::runRounds(AsyncFleet& fleet) {
  double round_start = fleet.now();
  bool live = !config_.wait_for_first_task || fleet.open() > 0 || server_.buffered() > 0;
  while (!done()) {
    const double at = fleet.now();
    const size_t started = top(fleet);  // the round's one hand-out
    if (!live) {
      if (started == 0 && fleet.open() == 0 && server_.buffered() == 0) {
        // Nothing to run a round on yet: wait a turn (registrations), then ask again.
        if (!fleet.canProgress()) stalled();
        const AsyncEvent e = fleet.next(at + 0.1, *this);
        if (e == AsyncEvent::kStalled) stalled();
        if (e == AsyncEvent::kTaken) afterTaken(fleet);
        continue;
      }
      live = true;
      round_start = at;
    }
    if (!fleet.canProgress()) stalled();
    const double deadline = round_start + config_.round_seconds;
    while (!done() && fleet.now() < deadline)
      if (fleet.next(deadline, *this) == AsyncEvent::kTaken) afterTaken(fleet);
    drainNow(fleet);  // what arrived at the deadline itself
    if (done()) break;
    round_start = fleet.now();
    step(fleet);
    live = !config_.wait_for_first_task || fleet.open() > 0;
  }
}

// The server steps now with what it buffered (a semi-synchronous round without an update is
// recorded as not applied), and the step's record goes out.
void AsyncEngine::step(AsyncFleet& fleet) {
  fleet.beforeStep();
  const Window w = window_;
  RoundRecord rec =
      server_.buffered() > 0
          ? server_.step()
          : server_.skip(w.taken + w.failed == 0
                             ? "no update arrived before the round's deadline"
                             : "no update was accepted before the round's deadline (" +
                                   std::to_string(w.failed) + " failed, " +
                                   std::to_string(w.refused) + " refused)");
  rec.clients_selected = w.started;
  rec.clients_failed = w.failed;
  rec.uplink_bytes = w.uplink;
  rec.downlink_bytes = w.downlink;
  window_ = Window{};
  fleet.record(rec);
  if (config_.lead && config_.evaluate && recorder_.evaluationDue(rec)) {
    if (const auto r = config_.evaluate(server_.model().current())) {
      rec.test_loss = r->first;
      rec.test_accuracy = r->second;
    }
  }
  // Durable, its line, then the next version's task (which progress sees).
  recorder_.close(
      rec,
      [&] {
        if (config_.lead && durability_) durability_->stepped(rec);
      },
      [&] { refreshTask(); });
}

// Nothing is in flight and no client can start on this version (every available one trained on
// it or an older one): the version can never move on. Only a simulated fleet stalls (a real one
// waits for clients to register), so the advice names the simulator's keys.
void AsyncEngine::stalled() const {
  const Window& w = window_;
  STARLING_THROW(
      Error, "the server cannot step at model version ", server_.version(), " (",
      server_.buffered(), " updates buffered",
      config_.round_seconds > 0
          ? ""
          : ", " + std::to_string(server_.config().async.buffer_size) + " needed",
      "): every available client trained on this version or an older one (since the last step: ",
      w.taken + w.failed, " arrived, ", w.failed, " failed to train, ", w.refused,
      " refused). Check train.lr (diverging clients, or a step that made the model non-finite), "
      "bounds.* (refused updates), devices.availability or devices.availability_trace (clients "
      "never online long enough to train), async.buffer_size and async.max_staleness");
}

}  // namespace starling::server
