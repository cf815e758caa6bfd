#include "server/fleet_metrics.h"

#include <chrono>
#include <cmath>
#include <iterator>
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
  // The phases that ended since the last look, their wall times; the one running, its tasks.
  const std::deque<ZmqFleet::PhaseTime>& times = fleet.phaseTimes();
  auto unseen = times.end();  // the first not yet observed, found from the back
  while (unseen != times.begin() && std::prev(unseen)->seq > phases_seen_) --unseen;
  for (auto it = unseen; it != times.end(); ++it) {
    const ZmqFleet::PhaseTime& pt = *it;
    r.histogram("starling_phase_duration_seconds",
                "Wall time of each phase (fit, evaluate, a secure aggregation step, the roster), "
                "in seconds: the clients' work and the streaming aggregation of their answers.",
                ops::exponentialBuckets(0.01, 2.0, 16), {{"step", pt.step}})
        .observe(pt.seconds);
    phases_seen_ = pt.seq;
  }
  const ZmqFleet::Progress progress = fleet.progress();
  const char* tasks_help =
      "The phase running: tasks sent, answers accepted, answers wanted, tasks open (0 between "
      "phases).";
  r.gauge("starling_phase_tasks", tasks_help, {{"state", "sent"}})
      .set(static_cast<double>(progress.sent));
  r.gauge("starling_phase_tasks", tasks_help, {{"state", "accepted"}})
      .set(static_cast<double>(progress.accepted));
  r.gauge("starling_phase_tasks", tasks_help, {{"state", "wanted"}})
      .set(static_cast<double>(progress.target));
  r.gauge("starling_phase_tasks", tasks_help, {{"state", "open"}})
      .set(static_cast<double>(progress.open));
  r.gauge("starling_phase", "The phase of the round running (0, or 1 for PowerSGD's second).")
      .set(static_cast<double>(progress.phase));
  {
    // The page's snapshot: built here, published whole, rendered on the status server's threads.
    auto snap = std::make_shared<Snapshot>();
    snap->peers = fleet.peers();
    for (size_t k = 0; k <= static_cast<size_t>(kLastErrc); ++k)
      if (const uint64_t n = fleet.refused(static_cast<Errc>(k)); n > 0)
        snap->refusals[errcLabel(static_cast<Errc>(k))] = n;
    snap->progress = progress;
    snap->registered = fleet.registeredCount();
    snap->online = fleet.onlineCount();
    snap->in_round = fleet.openTasks();
    snap->bytes_in = t.bytes_in;
    snap->bytes_out = t.bytes_out;
    snap->observed_at = unixNow();
    // Each edge aggregator's clients, as it last told (offline once that is stale).
    for (const ZmqFleet::PeerView& p : snap->peers) {
      if (!p.aggregator) continue;
      const bool stale = !p.online || p.subtree_seconds_ago > kSubtreeStaleSeconds;
      size_t online = 0, in_round = 0, all = p.subtree ? p.subtree->size() : 0;
      if (p.subtree && !stale)
        for (const protocol::SubtreePeer& sub : *p.subtree) {
          online += sub.online;
          in_round += sub.in_round;
        }
      const char* help =
          "An edge aggregator's clients as it last told: registered with it, online, in the round.";
      const std::string agg = std::to_string(p.id);
      r.gauge("starling_subtree_clients", help, {{"aggregator", agg}, {"state", "registered"}})
          .set(static_cast<double>(all));
      r.gauge("starling_subtree_clients", help, {{"aggregator", agg}, {"state", "online"}})
          .set(static_cast<double>(online));
      r.gauge("starling_subtree_clients", help, {{"aggregator", agg}, {"state", "in_round"}})
          .set(static_cast<double>(in_round));
    }
    const uint64_t running = snap->progress.round;
    const std::lock_guard lock(mu_);
    snapshot_ = std::move(snap);
    // An edge aggregator records no rounds: the round it relays is the one it shows.
    round_now_ = std::max(round_now_, running);
  }
  r.counter("starling_revoked_connections_total",
            "TCP connections closed because an operator revoked their client.")
      .raiseTo(static_cast<double>(fleet.revokedConnectionsCut()));
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
  auto snap = std::make_shared<Snapshot>(*snapshot_);
  snap->registered = snap->online = pool;
  snap->in_round = per_round;
  snapshot_ = std::move(snap);
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
    r.gauge("starling_dp_epsilon", "DP: the epsilon spent so far (against the models' recipients).")
        .set(*rec.dp_epsilon);
  if (rec.dp_clip)
    r.gauge("starling_dp_clip", "Adaptive clipping: the clip of the last round.").set(*rec.dp_clip);
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
  // Appended to the last chunk (a copy of at most kRoundChunk points: a reader may hold the old
  // one), or to a new one; the oldest chunk goes once the others hold kMaxRounds.
  if (rounds_.empty() || rounds_.back()->size() == kRoundChunk) {
    rounds_.push_back(std::make_shared<const Chunk>(Chunk{p}));
  } else {
    auto last = std::make_shared<Chunk>(*rounds_.back());
    last->push_back(p);
    rounds_.back() = std::move(last);
  }
  size_t kept = 0;
  for (const auto& c : rounds_) kept += c->size();
  if (kept - rounds_.front()->size() >= kMaxRounds) rounds_.erase(rounds_.begin());
  round_now_ = std::max(round_now_, rec.round);
}

namespace {

// One peer's fields of /status.json (a peer of this fleet, or a client behind an aggregator).
struct PeerFields {
  uint64_t id = 0;
  const char* role = "client";
  std::optional<bool> registered, revoked;  // not known of a client behind an aggregator
  bool online = false, in_round = false;
  double seen_seconds_ago = 0;
  uint64_t updates = 0, refused = 0;
  std::optional<Errc> last_refusal;
};

void appendPeer(std::string& o, const PeerFields& p) {
  const auto flag = [&o](bool v) { o += v ? "true" : "false"; };
  o += "{\"id\":\"";  // a string: JavaScript's numbers hold 53 bits, ids 64
  o += std::to_string(p.id);
  o += "\",\"role\":";
  appendJsonString(o, p.role);
  if (p.registered) {
    o += ",\"registered\":";
    flag(*p.registered);
  }
  o += ",\"online\":";
  flag(p.online);
  o += ",\"in_round\":";
  flag(p.in_round);
  if (p.revoked) {
    o += ",\"revoked\":";
    flag(*p.revoked);
  }
  o += ",\"seen_seconds_ago\":";
  appendJsonNumber(o, std::round(p.seen_seconds_ago * 10) / 10);
  o += ",\"updates\":" + std::to_string(p.updates);
  o += ",\"refused\":" + std::to_string(p.refused);
  o += ",\"last_refusal\":";
  if (p.last_refusal)
    appendJsonString(o, errcLabel(*p.last_refusal));
  else
    o += "null";
}

}  // namespace

std::string FleetMetrics::statusJson() const {
  // What the rounds' thread published, taken under the lock; rendered after it.
  std::shared_ptr<const Snapshot> snap;
  std::vector<std::shared_ptr<const Chunk>> rounds;
  uint64_t planned = 0, round_now = 0, total_bytes = 0;
  std::optional<double> eta;
  {
    const std::lock_guard lock(mu_);
    snap = snapshot_;
    rounds = rounds_;
    planned = planned_;
    round_now = round_now_;
    total_bytes = total_bytes_;
    eta = eta_;
  }
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
  size_t clients = snap->peers.size();
  for (const ZmqFleet::PeerView& p : snap->peers) clients += p.subtree ? p.subtree->size() : 0;
  o.reserve(512 + clients * 200 + rounds.size() * kRoundChunk * 220);
  o += "{\"role\":";
  str(role_);
  o += ",\"model\":";
  str(model_);
  o += ",\"fingerprint\":";
  str(fingerprint_);
  o += ",\"time\":";
  num(unixNow());
  o += ",\"observed\":";
  num(snap->observed_at);
  const ZmqFleet::Progress& pr = snap->progress;
  o += ",\"round\":{\"number\":";
  u(round_now);
  o += ",\"planned\":";
  u(planned);
  o += ",\"step\":";
  str(pr.step);
  o += ",\"step_round\":";
  u(pr.round);
  o += ",\"phase\":";
  u(pr.phase);
  o += ",\"sent\":";
  u(pr.sent);
  o += ",\"accepted\":";
  u(pr.accepted);
  o += ",\"target\":";
  u(pr.target);
  o += ",\"open\":";
  u(pr.open);
  o += ",\"seconds_left\":";
  num(pr.seconds_left);
  o += ",\"eta_seconds\":";
  opt(eta);
  o += "},\"clients\":{\"registered\":";
  u(snap->registered);
  o += ",\"online\":";
  u(snap->online);
  o += ",\"in_round\":";
  u(snap->in_round);
  o += "},\"bytes\":{\"in\":";
  u(snap->bytes_in);
  o += ",\"out\":";
  u(snap->bytes_out);
  o += ",\"rounds\":";
  u(total_bytes);
  o += "},\"refusals\":{";
  bool first = true;
  for (const auto& [code, n] : snap->refusals) {
    if (!first) o += ',';
    first = false;
    str(code);
    o += ':';
    u(n);
  }
  o += "},\"peers\":[";
  first = true;
  for (const ZmqFleet::PeerView& p : snap->peers) {
    if (!first) o += ',';
    first = false;
    appendPeer(o, PeerFields{.id = p.id,
                             .role = p.aggregator ? "aggregator" : "client",
                             .registered = p.registered,
                             .revoked = p.revoked,
                             .online = p.online,
                             .in_round = p.in_round,
                             .seen_seconds_ago = p.seen_seconds_ago,
                             .updates = p.updates,
                             .refused = p.refused,
                             .last_refusal = p.last_refusal});
    if (p.aggregator) {
      // Its clients as it last told; all offline once that is stale or the aggregator is.
      const bool stale = !p.online || p.subtree_seconds_ago > kSubtreeStaleSeconds;
      o += ",\"subtree_seconds_ago\":";
      num(std::round(p.subtree_seconds_ago * 10) / 10);
      o += ",\"subtree_stale\":";
      flag(stale);
      o += ",\"subtree\":[";
      bool first_client = true;
      if (p.subtree)
        for (const protocol::SubtreePeer& c : *p.subtree) {
          if (!first_client) o += ',';
          first_client = false;
          appendPeer(o, PeerFields{.id = c.id,
                                   .role = "client",
                                   .registered = std::nullopt,  // not known behind it
                                   .revoked = std::nullopt,
                                   .online = c.online && !stale,
                                   .in_round = c.in_round && !stale,
                                   .seen_seconds_ago = c.seen_ms / 1000.0 + p.subtree_seconds_ago,
                                   .updates = c.updates,
                                   .refused = c.refused,
                                   .last_refusal = protocol::refusalOf(c.last_refusal)});
          o += '}';
        }
      o += ']';
    }
    o += '}';
  }
  o += "],\"rounds\":[";
  first = true;
  for (const auto& chunk : rounds)
    for (const RoundPoint& p : *chunk) {
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
