#include "server/fleet_metrics.h"

#include <chrono>
#include <cmath>
#include <limits>

#include "core/json_text.h"

namespace starling::server {

namespace {
constexpr const char* kClientsHelp =
    "Peers registered, online (heard from within net.silence_ms) and in the round (holding an "
    "open task).";
double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

FleetMetrics::FleetMetrics(std::shared_ptr<ops::Registry> registry, const std::string& role,
                           const std::string& model, const std::string& fingerprint)
    : role_(role),
      model_(model),
      fingerprint_(fingerprint),
      registry_(std::move(registry)),
      round_(
          registry_->gauge("starling_round", "The round (or asynchronous step) running or next.")),
      version_(registry_->gauge("starling_model_version",
                                "The global model's version after the last applied round.")),
      duration_(registry_->histogram("starling_round_duration_seconds",
                                     "Wall time of each recorded round (or step), in seconds.",
                                     ops::exponentialBuckets(0.05, 2.0, 14))) {
  registry_
      ->gauge("starling_info", "This program's role and model.",
              {{"role", role}, {"model", model}, {"fingerprint", fingerprint}})
      .set(1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  registry_->gauge("starling_eval_accuracy", "The last evaluation's accuracy (0..1).").set(nan);
  registry_->gauge("starling_eval_loss", "The last evaluation's mean loss.").set(nan);
  registry_->gauge("starling_train_loss", "The last round's mean training loss.").set(nan);
  for (const char* applied : {"true", "false"})
    registry_->counter("starling_rounds_total", "Rounds (or steps) recorded.",
                       {{"applied", applied}});
  for (const char* result : {"accepted", "refused"})
    registry_->counter("starling_updates_total", "Client updates accepted or refused by the round.",
                       {{"result", result}});
}

void FleetMetrics::observe(const ZmqFleet& fleet) {
  ops::Registry& r = *registry_;
  for (size_t c = 0; c <= static_cast<size_t>(kLastErrc); ++c) {
    const Errc code = static_cast<Errc>(c);
    const uint64_t n = fleet.refused(code);
    if (n == 0) continue;  // a family of every code would be 60 lines of zeros
    r.counter("starling_refused_messages_total",
              "Messages refused (answered with a Reject, or dropped unread), by error code.",
              {{"code", errcLabel(code)}})
        .raiseTo(static_cast<double>(n));
  }
  const transport::TransportStats& t = fleet.transportStats();
  const char* bytes_help = "Bytes received and sent on the fleet's socket (messages, whole).";
  r.counter("starling_transport_bytes_total", bytes_help, {{"direction", "in"}})
      .raiseTo(static_cast<double>(t.bytes_in));
  r.counter("starling_transport_bytes_total", bytes_help, {{"direction", "out"}})
      .raiseTo(static_cast<double>(t.bytes_out));
  const char* msg_help = "Messages received and sent on the fleet's socket.";
  r.counter("starling_transport_messages_total", msg_help, {{"direction", "in"}})
      .raiseTo(static_cast<double>(t.messages_in));
  r.counter("starling_transport_messages_total", msg_help, {{"direction", "out"}})
      .raiseTo(static_cast<double>(t.messages_out));
  const transport::ConnectionCounts& c = fleet.connections();
  const char* conn_help =
      "The socket's connections, by event (ZeroMQ's; dropped: established connections that "
      "closed).";
  const std::pair<const char*, uint64_t> events[] = {{"accepted", c.accepted},
                                                     {"handshake", c.handshakes},
                                                     {"refused_mechanism", c.refused_mechanism},
                                                     {"refused_protocol", c.refused_protocol},
                                                     {"refused_auth", c.refused_auth},
                                                     {"failed_handshake", c.failed_handshake},
                                                     {"dropped", c.dropped()}};
  for (const auto& [event, n] : events)
    r.counter("starling_connections_total", conn_help, {{"event", event}})
        .raiseTo(static_cast<double>(n));
  r.gauge("starling_clients", kClientsHelp, {{"state", "registered"}})
      .set(static_cast<double>(fleet.registeredCount()));
  r.gauge("starling_clients", kClientsHelp, {{"state", "online"}})
      .set(static_cast<double>(fleet.onlineCount()));
  r.gauge("starling_clients", kClientsHelp, {{"state", "in_round"}})
      .set(static_cast<double>(fleet.openTasks()));
  r.gauge("starling_clients", kClientsHelp, {{"state", "revoked"}})
      .set(static_cast<double>(fleet.revokedIds().size()));
  {
    // The page's snapshot: copied here, rendered on the status server's threads.
    std::vector<ZmqFleet::PeerView> peers = fleet.peers();
    std::map<std::string, uint64_t> refusals;
    for (size_t k = 0; k <= static_cast<size_t>(kLastErrc); ++k)
      if (const uint64_t n = fleet.refused(static_cast<Errc>(k)); n > 0)
        refusals[errcLabel(static_cast<Errc>(k))] = n;
    const std::lock_guard lock(mu_);
    peers_ = std::move(peers);
    refusals_ = std::move(refusals);
    progress_ = fleet.progress();
    registered_ = fleet.registeredCount();
    online_ = fleet.onlineCount();
    in_round_ = fleet.openTasks();
    bytes_in_ = t.bytes_in;
    bytes_out_ = t.bytes_out;
    observed_at_ = unixNow();
  }
  r.counter("starling_revoked_tasks_total",
            "Open tasks failed because an operator revoked their client (an answer on its way is "
            "refused when it comes).")
      .raiseTo(static_cast<double>(fleet.revokedInFlight()));
}

void FleetMetrics::roundStarted(uint64_t round) {
  round_.set(static_cast<double>(round));
  const std::lock_guard lock(mu_);
  round_now_ = round;
}

void FleetMetrics::setSimulated(uint64_t pool, uint64_t per_round) {
  registry_->gauge("starling_clients", kClientsHelp, {{"state", "registered"}})
      .set(static_cast<double>(pool));
  registry_->gauge("starling_clients", kClientsHelp, {{"state", "in_round"}})
      .set(static_cast<double>(per_round));
  const std::lock_guard lock(mu_);
  registered_ = online_ = pool;
  in_round_ = per_round;
}

void FleetMetrics::setEta(double seconds) {
  registry_->gauge("starling_eta_seconds", "starling-sim: the seconds left, estimated.")
      .set(seconds);
  const std::lock_guard lock(mu_);
  eta_ = seconds;
}

void FleetMetrics::setPlannedRounds(uint64_t rounds) {
  const std::lock_guard lock(mu_);
  planned_ = rounds;
}

void FleetMetrics::roundRecorded(const RoundRecord& rec) {
  ops::Registry& r = *registry_;
  round_.set(static_cast<double>(rec.round));
  version_.set(static_cast<double>(rec.model_version));
  duration_.observe(rec.wall_seconds);
  r.counter("starling_rounds_total", "Rounds (or steps) recorded.",
            {{"applied", rec.applied ? "true" : "false"}})
      .inc();
  r.counter("starling_updates_total", "Client updates accepted or refused by the round.",
            {{"result", "accepted"}})
      .inc(static_cast<double>(rec.clients_completed));
  r.counter("starling_updates_total", "Client updates accepted or refused by the round.",
            {{"result", "refused"}})
      .inc(static_cast<double>(rec.updates_rejected));
  const char* bytes_help = "The rounds' update bytes: up (clients' answers) and down (tasks).";
  r.counter("starling_round_bytes_total", bytes_help, {{"direction", "up"}})
      .inc(static_cast<double>(rec.uplink_bytes));
  r.counter("starling_round_bytes_total", bytes_help, {{"direction", "down"}})
      .inc(static_cast<double>(rec.downlink_bytes));
  if (rec.test_accuracy)
    r.gauge("starling_eval_accuracy", "The last evaluation's accuracy (0..1).")
        .set(*rec.test_accuracy);
  if (rec.test_loss)
    r.gauge("starling_eval_loss", "The last evaluation's mean loss.").set(*rec.test_loss);
  if (rec.train_loss)
    r.gauge("starling_train_loss", "The last round's mean training loss.").set(*rec.train_loss);
  if (rec.dp_epsilon)
    r.gauge("starling_dp_epsilon", "Central DP: the epsilon spent so far.").set(*rec.dp_epsilon);
  for (const char* stat : {"mean", "max"}) {
    const auto it = rec.metrics.find(std::string("staleness_") + stat);
    if (it != rec.metrics.end())
      r.gauge("starling_staleness", "Asynchronous steps: the staleness of the last step's updates.",
              {{"stat", stat}})
          .set(it->second);
  }
  const double now = unixNow();
  r.gauge("starling_last_round_timestamp_seconds", "When the last round was recorded (Unix time).")
      .set(now);
  const std::lock_guard lock(mu_);
  RoundPoint p;
  p.round = rec.round;
  p.applied = rec.applied;
  p.accuracy = rec.test_accuracy;
  p.loss = rec.test_loss;
  p.train_loss = rec.train_loss;
  p.updates = rec.clients_completed;
  p.refused = rec.updates_rejected;
  p.up = rec.uplink_bytes;
  p.down = rec.downlink_bytes;
  total_bytes_ += rec.uplink_bytes + rec.downlink_bytes;
  p.total_bytes = total_bytes_;
  p.seconds = rec.wall_seconds;
  p.unix_time = now;
  rounds_.push_back(p);
  if (rounds_.size() > kMaxRounds) rounds_.pop_front();
  round_now_ = std::max(round_now_, rec.round);
}

std::string FleetMetrics::statusJson() const {
  std::string o;
  const auto num = [&o](double v) { appendJsonNumber(o, v); };
  const auto opt = [&o](const std::optional<double>& v) {
    if (v)
      appendJsonNumber(o, *v);
    else
      o += "null";
  };
  const auto str = [&o](std::string_view v) { appendJsonString(o, v); };
  const auto u = [&o](uint64_t v) { o += std::to_string(v); };
  const auto flag = [&o](bool v) { o += v ? "true" : "false"; };
  const std::lock_guard lock(mu_);
  o.reserve(512 + peers_.size() * 200 + rounds_.size() * 220);
  o += "{\"role\":";
  str(role_);
  o += ",\"model\":";
  str(model_);
  o += ",\"fingerprint\":";
  str(fingerprint_);
  o += ",\"time\":";
  num(unixNow());
  o += ",\"observed\":";
  num(observed_at_);
  o += ",\"round\":{\"number\":";
  u(round_now_);
  o += ",\"planned\":";
  u(planned_);
  o += ",\"step\":";
  str(progress_.step);
  o += ",\"step_round\":";
  u(progress_.round);
  o += ",\"phase\":";
  u(progress_.phase);
  o += ",\"sent\":";
  u(progress_.sent);
  o += ",\"accepted\":";
  u(progress_.accepted);
  o += ",\"target\":";
  u(progress_.target);
  o += ",\"open\":";
  u(progress_.open);
  o += ",\"seconds_left\":";
  num(progress_.seconds_left);
  o += ",\"eta_seconds\":";
  if (eta_)
    num(*eta_);
  else
    o += "null";
  o += "},\"clients\":{\"registered\":";
  u(registered_);
  o += ",\"online\":";
  u(online_);
  o += ",\"in_round\":";
  u(in_round_);
  o += "},\"bytes\":{\"in\":";
  u(bytes_in_);
  o += ",\"out\":";
  u(bytes_out_);
  o += ",\"rounds\":";
  u(total_bytes_);
  o += "},\"refusals\":{";
  bool first = true;
  for (const auto& [code, n] : refusals_) {
    if (!first) o += ',';
    first = false;
    str(code);
    o += ':';
    u(n);
  }
  o += "},\"peers\":[";
  first = true;
  for (const ZmqFleet::PeerView& p : peers_) {
    if (!first) o += ',';
    first = false;
    o += "{\"id\":\"";  // a string: JavaScript's numbers hold 53 bits, ids 64
    u(p.id);
    o += "\",\"role\":";
    str(p.aggregator ? "aggregator" : "client");
    o += ",\"registered\":";
    flag(p.registered);
    o += ",\"online\":";
    flag(p.online);
    o += ",\"in_round\":";
    flag(p.in_round);
    o += ",\"revoked\":";
    flag(p.revoked);
    o += ",\"seen_seconds_ago\":";
    num(std::round(p.seen_seconds_ago * 10) / 10);
    o += ",\"updates\":";
    u(p.updates);
    o += ",\"refused\":";
    u(p.refused);
    o += ",\"last_refusal\":";
    if (p.last_refusal)
      str(errcLabel(*p.last_refusal));
    else
      o += "null";
    if (p.aggregator) {
      // Its clients as it last told (their ids its own, so strings too).
      o += ",\"subtree_seconds_ago\":";
      num(std::round(p.subtree_seconds_ago * 10) / 10);
      o += ",\"subtree\":[";
      bool first_client = true;
      for (const protocol::SubtreePeer& c : p.subtree) {
        if (!first_client) o += ',';
        first_client = false;
        o += "{\"id\":\"";
        u(c.id);
        o += "\",\"online\":";
        flag(c.online);
        o += ",\"in_round\":";
        flag(c.in_round);
        o += ",\"seen_seconds_ago\":";
        num(c.seen_ms / 1000.0);
        o += ",\"updates\":";
        u(c.updates);
        o += ",\"refused\":";
        u(c.refused);
        o += ",\"last_refusal\":";
        if (c.last_refusal)
          str(errcLabel(static_cast<Errc>(c.last_refusal - 1)));
        else
          o += "null";
        o += '}';
      }
      o += ']';
    }
    o += '}';
  }
  o += "],\"rounds\":[";
  first = true;
  for (const RoundPoint& p : rounds_) {
    if (!first) o += ',';
    first = false;
    o += "{\"round\":";
    u(p.round);
    o += ",\"applied\":";
    flag(p.applied);
    o += ",\"accuracy\":";
    opt(p.accuracy);
    o += ",\"loss\":";
    opt(p.loss);
    o += ",\"train_loss\":";
    opt(p.train_loss);
    o += ",\"updates\":";
    u(p.updates);
    o += ",\"refused\":";
    u(p.refused);
    o += ",\"up\":";
    u(p.up);
    o += ",\"down\":";
    u(p.down);
    o += ",\"total_bytes\":";
    u(p.total_bytes);
    o += ",\"seconds\":";
    num(p.seconds);
    o += ",\"time\":";
    num(p.unix_time);
    o += '}';
  }
  o += "]}";
  return o;
}

}  // namespace starling::server
