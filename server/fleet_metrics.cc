#include "server/fleet_metrics.h"

#include <chrono>
#include <cmath>
#include <limits>

#include "server/zmq_fleet.h"

namespace starling::server {

FleetMetrics::FleetMetrics(std::shared_ptr<ops::Registry> registry, const std::string& role,
                           const std::string& model, const std::string& fingerprint)
    : registry_(std::move(registry)),
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
  const char* clients_help =
      "Peers registered, online (heard from within net.silence_ms) and in the round (holding an "
      "open task).";
  r.gauge("starling_clients", clients_help, {{"state", "registered"}})
      .set(static_cast<double>(fleet.registeredCount()));
  r.gauge("starling_clients", clients_help, {{"state", "online"}})
      .set(static_cast<double>(fleet.onlineCount()));
  r.gauge("starling_clients", clients_help, {{"state", "in_round"}})
      .set(static_cast<double>(fleet.openTasks()));
  r.gauge("starling_clients", clients_help, {{"state", "revoked"}})
      .set(static_cast<double>(fleet.revokedIds().size()));
  r.counter("starling_revoked_tasks_total",
            "Open tasks failed because an operator revoked their client (an answer on its way is "
            "refused when it comes).")
      .raiseTo(static_cast<double>(fleet.revokedInFlight()));
}

void FleetMetrics::roundStarted(uint64_t round) { round_.set(static_cast<double>(round)); }

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
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  r.gauge("starling_last_round_timestamp_seconds", "When the last round was recorded (Unix time).")
      .set(now);
}

}  // namespace starling::server
