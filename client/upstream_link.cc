#include "client/upstream_link.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "protocol/control.h"

namespace starling::client {
namespace pr = starling::protocol;
using std::chrono::milliseconds;

void UpstreamLinkConfig::validate() const {
  if (endpoint.empty()) STARLING_THROW(ConfigError, name, ": no server endpoint");
  security.validate(/*server_side=*/false);
  limits.validate();
  if (register_retry_ms < 10)
    STARLING_THROW(ConfigError, "register_retry_ms must be at least 10, got ", register_retry_ms);
  if (silence_ms < 100)
    STARLING_THROW(ConfigError, "net.server_silence_ms must be at least 100, got ", silence_ms);
  if (max_failed_handshakes == 0)
    STARLING_THROW(ConfigError, "max_failed_handshakes must be at least 1");
  if (handshake_failure_window_ms > 86'400'000)
    STARLING_THROW(ConfigError, "handshake_failure_window_ms is at most a day, got ",
                   handshake_failure_window_ms);
  if (clock == nullptr) STARLING_THROW(ConfigError, name, ": the clock is null");
}

namespace {
// A ZeroMQ endpoint's transport: tcp://, ipc:// or inproc:// (what a user writes without it,
// "127.0.0.1:7700", ZeroMQ refuses with only "Invalid argument").
void checkEndpoint(const std::string& endpoint, const std::string& name) {
  for (const char* scheme : {"tcp://", "ipc://", "inproc://"})
    if (endpoint.rfind(scheme, 0) == 0 && endpoint.size() > std::string(scheme).size()) return;
  STARLING_THROW(ConfigError, name, ": the server endpoint '", endpoint,
                 "' is not a ZeroMQ endpoint; write it as tcp://HOST:PORT (e.g. tcp://",
                 endpoint.empty() ? "127.0.0.1:7700" : endpoint, ")");
}
}  // namespace

UpstreamLink::UpstreamLink(transport::Context& ctx, UpstreamLinkConfig config,
                           std::function<std::optional<std::vector<uint8_t>>()> make_register,
                           std::function<std::vector<uint8_t>(uint64_t)> make_heartbeat,
                           std::shared_ptr<spdlog::logger> log, std::function<void()> on_sent)
    : config_((config.validate(), checkEndpoint(config.endpoint, config.name), std::move(config))),
      make_register_(std::move(make_register)),
      make_heartbeat_(std::move(make_heartbeat)),
      log_(log ? std::move(log) : spdlog::default_logger()),
      on_sent_(std::move(on_sent)),
      socket_(ctx, config_.endpoint, config_.security, config_.limits),
      session_({milliseconds(config_.register_retry_ms), milliseconds(config_.silence_ms)},
               config_.clock->now()),
      backoff_rng_(StreamKey{config_.seed, 0, config_.id, StreamPurpose::kBackoff, 0}) {}

UpstreamLink::~UpstreamLink() = default;

bool UpstreamLink::send(std::span<const uint8_t> bytes) {
  const bool ok = socket_.send(bytes);
  if (ok) stats_.uplink_bytes += bytes.size();
  if (on_sent_) on_sent_();
  return ok;
}

void UpstreamLink::registerNow() {
  const auto now = config_.clock->now();
  std::optional<std::vector<uint8_t>> m = make_register_();
  if (!m) {
    // Nothing to offer (an aggregator whose subtree emptied): no heartbeats for a session that
    // offers nothing, so that the server fails it and stops sampling it; asked again at the retry.
    session_.withdraw(now);
    return;
  }
  session_.registerSent(now);
  ++stats_.registrations;
  send(*m);
}

void UpstreamLink::answer(std::vector<uint8_t> bytes) {
  answer_ = std::move(bytes);
  resend_at_.reset();
  send(answer_);
}

void UpstreamLink::resendAnswer() {
  if (!answer_.empty()) send(answer_);
}

void UpstreamLink::checkHandshakes() {
  const transport::HandshakeReport& h = socket_.handshakes();
  using F = transport::HandshakeReport::Failure;
  if (h.failed == 0) {
    failing_since_.reset();
    failures_logged_ = 0;
    return;
  }
  const auto now = config_.clock->now();
  if (!failing_since_) failing_since_ = now;
  if (h.failed > failures_logged_) {
    failures_logged_ = h.failed;
    log_->warn("{}: a handshake with {} failed ({} in a row): {}", config_.name, config_.endpoint,
               h.failed, h.advice());
  }
  // A refused key is final (libzmq does not try again), CURVE against plain TCP fails the same
  // way every time; other failures may be a network's, and get tries over a while.
  const bool final = (h.last == F::kAuth && h.status == 400) || h.last == F::kMechanism;
  const bool long_enough =
      h.failed >= config_.max_failed_handshakes &&
      now - *failing_since_ >= std::chrono::milliseconds(config_.handshake_failure_window_ms);
  if (!final && !long_enough) return;
  STARLING_THROW(UpstreamRefused, config_.name, ": cannot connect to ", config_.endpoint, ": ",
                 h.failed, " handshake", h.failed == 1 ? "" : "s", " failed",
                 h.succeeded ? " since the last one that succeeded" : " and none succeeded", ": ",
                 h.advice());
}

void UpstreamLink::upkeep() {
  // What came first (the server's answers to heartbeats say it is alive), then what is due.
  while (std::optional<transport::Received> r = socket_.receive(milliseconds(0)))
    if (std::optional<transport::Received> mine = dispatch(std::move(*r))) keep(std::move(*mine));
  checkHandshakes();
  const auto now = config_.clock->now();
  const UpstreamSession::Due due = session_.tick(now);
  if (due.silent)
    log_->warn(
        "{}: the server has been silent for {} ms (net.server_silence_ms); registering again",
        config_.name, config_.silence_ms);
  if (due.register_now) registerNow();
  if (due.heartbeat) {
    ++stats_.heartbeats;
    send(make_heartbeat_(session_.session()));
    log_->debug("{}: heartbeat sent", config_.name);
    session_.heartbeatSent(now);
  }
  if (resend_at_ && now >= *resend_at_) {
    resend_at_.reset();
    ++stats_.resent_after_busy;
    resendAnswer();
  }
}

std::optional<transport::Received> UpstreamLink::next(milliseconds timeout) {
  if (!kept_.empty()) {
    transport::Received r = std::move(kept_.front());
    kept_.pop_front();
    return r;
  }
  std::optional<transport::Received> r = socket_.receive(timeout);
  if (!r) return std::nullopt;
  return dispatch(std::move(*r));
}

void UpstreamLink::keep(transport::Received r) {
  if (pr::peekKind(r.bytes()) == pr::MessageKind::kShutdown) {
    kept_.clear();  // the federation is over: nothing kept matters now
  } else if (kept_.size() >= kMaxKept) {
    log_->warn(
        "{}: {} messages from the server wait for the work in progress; the oldest is "
        "dropped (a server that sends tasks faster than they are done)",
        config_.name, kept_.size());
    kept_.pop_front();
  }
  kept_.push_back(std::move(r));
}

std::optional<transport::Received> UpstreamLink::dispatch(transport::Received r) {
  if (r.error) {
    log_->warn("{}: {}", config_.name, r.error->what());
    return std::nullopt;
  }
  const auto now = config_.clock->now();
  session_.heard(now);
  stats_.downlink_bytes += r.bytes().size();
  const auto kind = pr::peekKind(r.bytes());
  if (kind && *kind != pr::MessageKind::kReject) busy_backoff_ = milliseconds(200);
  try {
    if (!kind) failInput(Errc::kMalformed, "not a Starling message");
    switch (*kind) {
      case pr::MessageKind::kWelcome: {
        const auto w = pr::decodeWelcome(r.bytes());
        if (w.client_id != config_.id)
          failInput(Errc::kWrongSender, "a welcome for client ", w.client_id);
        // Registrations queued during an outage come back as several welcomes: log the first.
        if (session_.onWelcome(w.session, w.heartbeat_ms))
          log_->info("{}: registered (session {:x})", config_.name, w.session);
        return std::nullopt;
      }
      case pr::MessageKind::kHeartbeat: {
        if (session_.onServerHeartbeat(pr::decodeHeartbeat(r.bytes()).session)) {
          log_->warn("{}: the server restarted; registering again", config_.name);
          registerNow();
        }
        return std::nullopt;
      }
      case pr::MessageKind::kReject: {
        const auto j = pr::decodeReject(r.bytes());
        ++stats_.rejects;
        switch (j.kind) {
          case pr::RejectKind::kNotRegistered:
            // After a server restart every heartbeat queued during the outage draws one: one
            // registration in flight answers them all.
            if (session_.onNotRegistered(now)) registerNow();
            return std::nullopt;
          case pr::RejectKind::kBusy:
            // Nothing was wrong with the upload: send it again after a randomized back-off.
            if (!answer_.empty() && !resend_at_) {
              const auto wait =
                  busy_backoff_ + milliseconds(backoff_rng_.below(
                                      static_cast<uint64_t>(busy_backoff_.count()) + 1));
              resend_at_ = now + wait;
              busy_backoff_ = std::min(busy_backoff_ * 2, milliseconds(5000));
              log_->info("{}: the server is busy; sending the answer again in {} ms", config_.name,
                         wait.count());
            }
            return std::nullopt;
          case pr::RejectKind::kRegistrationRefused:
            // Only an answer to a Register of ours: a stale or stray one is logged, not believed.
            if (!session_.awaitingWelcome()) {
              log_->warn("{}: ignored a refusal of a registration it did not send: {}",
                         config_.name, j.message);
              return std::nullopt;
            }
            STARLING_THROW(UpstreamRefused, config_.name,
                           ": the server refused it for good: ", j.message);
          case pr::RejectKind::kRefused:
            return r;  // the owner's to log
        }
        return std::nullopt;
      }
      case pr::MessageKind::kTask:
      case pr::MessageKind::kShutdown:
      case pr::MessageKind::kSecAggSetup:  // secure aggregation's steps: the owner's
      case pr::MessageKind::kSecAggAdverts:
      case pr::MessageKind::kSecAggShares:
      case pr::MessageKind::kSecAggSurvivors:
      case pr::MessageKind::kSecAggUnmask:
      case pr::MessageKind::kSecAggRelay:  // an edge aggregator's relay of them
        return r;
      default:
        failInput(Errc::kUnexpectedMessage, "a server may not send ", pr::kindName(*kind));
    }
  } catch (const InputError& e) {
    log_->warn("{}: ignored a message from the server: {}", config_.name, e.what());
  }
  return std::nullopt;
}

}  // namespace starling::client
