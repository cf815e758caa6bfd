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
//   starling_phase_duration_seconds{step}                  histogram of each phase's (fit,
//                                                          evaluate, secure, roster): the
//                                                          clients' work and the streaming
//                                                          aggregation
//   starling_phase, starling_phase_tasks{state}            the phase running: its number, tasks
//                                                          sent / accepted / wanted / open
//   starling_subtree_clients{aggregator,state}             an edge aggregator's clients, as told
//   starling_updates_total{result}                         accepted / refused by the round
//   starling_round_bytes_total{direction}                  the rounds' update bytes, up / down
//   starling_clients{state}                                registered / online / in_round /
//                                                          revoked
//   starling_revoked_tasks_total                           open tasks failed by a revocation
//   starling_revoked_connections_total                     connections closed by a revocation
//   starling_refused_messages_total{code}                  every refused message, by error code
//   starling_transport_bytes_total{direction}              every byte in / out of the socket
//   starling_transport_messages_total{direction}
//   starling_connections_total{event}                      accepted, handshake, refused_mechanism,
//                                                          refused_protocol, refused_auth,
//                                                          failed_handshake, dropped
//   starling_eval_accuracy, starling_eval_loss             the last evaluation (NaN before one)
//   starling_train_loss                                    the last round's mean training loss
//   starling_dp_epsilon                                    DP: epsilon spent so far
//   starling_dp_clip                                       adaptive clipping: the last round's clip
//   starling_staleness{stat}                               asynchronous steps: mean / max
//   starling_last_round_timestamp_seconds                  when the last record came (Unix time)
//   starling_eta_seconds                                   starling-sim: the time left, estimated
//
// And the status page's facts (statusJson(), served as GET /status.json by ops::StatusServer):
// the fleet's peers (ZmqFleet::peers: online, last seen, updates taken, refusals), the phase
// running and its progress, the counts, refusals by code, and each recorded round (accuracy,
// loss, bytes up and down and their running total, wall time; the last kMaxRounds kept). Written
// on the rounds' thread into a snapshot under a mutex, rendered on the status server's threads:
// an HTTP client never reaches the fleet.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ops/metrics.h"
#include "server/engine.h"
#include "server/zmq_fleet.h"

namespace starling::server {

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

  // The run's length (rounds or asynchronous steps), shown beside the round; 0: not known.
  void setPlannedRounds(uint64_t rounds);
  // The simulator's (there is no fleet to observe): its pool of simulated clients and how many a
  // round (or at once) trains, and the estimated seconds left (starling_eta_seconds).
  void setSimulated(uint64_t pool, uint64_t per_round);
  void setEta(double seconds);
  // GET /status.json: any thread. The fields are documented in docs/deployment.md ("The status
  // page"); no key, update or client data is in it. Rendered from what the rounds' thread last
  // published, outside the lock (the rounds' thread only ever waits for pointers to be swapped).
  std::string statusJson() const;
  // The rounds kept: the last kMaxRounds (up to kRoundChunk - 1 more).
  static constexpr size_t kMaxRounds = 10'000, kRoundChunk = 256;
  // An edge aggregator's clients count as offline once its subtree is older than this (it tells
  // it every 2 s), or when the aggregator is offline.
  static constexpr double kSubtreeStaleSeconds = 6.0;

 private:
  struct RoundPoint {
    uint64_t round = 0;
    bool applied = false;
    std::optional<double> accuracy, loss, train_loss;
    uint64_t updates = 0, refused = 0, up = 0, down = 0;
    uint64_t total_bytes = 0;  // up and down, every round so far (this one included)
    double seconds = 0, unix_time = 0;
  };
  // The fleet as last observed: replaced whole, never changed once published.
  struct Snapshot {
    std::vector<ZmqFleet::PeerView> peers;
    ZmqFleet::Progress progress;
    size_t registered = 0, online = 0, in_round = 0;
    std::map<std::string, uint64_t> refusals;
    uint64_t bytes_in = 0, bytes_out = 0;
    double observed_at = 0;
  };
  using Chunk = std::vector<RoundPoint>;  // at most kRoundChunk; a full one is never changed
  const std::string role_, model_, fingerprint_;
  mutable std::mutex mu_;  // guards what follows: the rounds' thread writes, HTTP threads read
  std::shared_ptr<const Snapshot> snapshot_ = std::make_shared<const Snapshot>();
  std::vector<std::shared_ptr<const Chunk>> rounds_;
  uint64_t planned_ = 0, round_now_ = 0, total_bytes_ = 0;
  std::optional<double> eta_;
  uint64_t phases_seen_ = 0;  // the rounds' thread's only (observe)

  std::shared_ptr<ops::Registry> registry_;
  ops::Gauge& round_;
  ops::Gauge& version_;
  ops::Histogram& duration_;
};

}  // namespace starling::server
