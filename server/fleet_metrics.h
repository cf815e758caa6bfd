#pragma once
// What a root or an edge aggregator tells its operator's Prometheus (ops/metrics.h): read on the
// thread that runs the rounds (the fleet's observer, every 250 ms, and each round's record) into
// a registry the status server renders on its own threads. Names, by Prometheus's conventions:
//
//   starling_info{role,model,fingerprint}                  1
//   starling_round                                         the round (or step) running or next
//   starling_model_version                                 the model's version after the last
//   starling_rounds_total{applied}                         rounds recorded, applied or not
//   starling_round_duration_seconds                        histogram of a round's wall time
//   starling_updates_total{result}                         accepted / refused by the round
//   starling_round_bytes_total{direction}                  the rounds' update bytes, up / down
//   starling_clients{state}                                registered / online / in_round /
//                                                          revoked
//   starling_revoked_tasks_total                           open tasks failed by a revocation
//   starling_refused_messages_total{code}                  every refused message, by error code
//   starling_transport_bytes_total{direction}              every byte in / out of the socket
//   starling_transport_messages_total{direction}
//   starling_connections_total{event}                      accepted, handshake, refused_mechanism,
//                                                          refused_protocol, refused_auth,
//                                                          failed_handshake, dropped
//   starling_eval_accuracy, starling_eval_loss             the last evaluation (NaN before one)
//   starling_train_loss                                    the last round's mean training loss
//   starling_dp_epsilon                                    central DP: epsilon spent so far
//   starling_staleness{stat}                               asynchronous steps: mean / max
//   starling_last_round_timestamp_seconds                  when the last record came (Unix time)
#include <memory>
#include <string>

#include "ops/metrics.h"
#include "server/engine.h"

namespace starling::server {

class ZmqFleet;

class FleetMetrics {
 public:
  // `role`: "root" or "aggregator"; `model` and `fingerprint` label starling_info.
  FleetMetrics(std::shared_ptr<ops::Registry> registry, const std::string& role,
               const std::string& model, const std::string& fingerprint);

  // The fleet's counts now (refusals, transport, connections, clients).
  void observe(const ZmqFleet& fleet);
  // A round (or server step) is about to run.
  void roundStarted(uint64_t round);
  // Its record (applied or not).
  void roundRecorded(const RoundRecord& r);

  ops::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<ops::Registry> registry_;
  ops::Gauge& round_;
  ops::Gauge& version_;
  ops::Histogram& duration_;
};

}  // namespace starling::server
