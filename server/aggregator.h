#pragma once
// The edge aggregator role: a server to its clients (a ZmqFleet) and a client to its upstream (a
// root or another aggregator, over a transport::ClientSocket). For each task from upstream it
// relays the task down (its own nonces, its own downlink encoding), aggregates its subtree's
// updates as they stream in (aggregation::PhaseAggregator, the same checks as the root), and
// sends ONE PartialAggregate up with the upstream task's nonce: dense (exact: the root's model
// equals flat aggregation of the same updates) or, with resparsify_density > 0, the top entries
// of each tensor (the gTop-k merge), keeping what it dropped as its own residual for the next
// round. Two levels and more work the same way: an aggregator's upstream may be an aggregator.
//
// It registers upstream with role Aggregator and, as its weight cap, the examples its clients
// registered (again whenever that total changes). Its connection upstream is a client's
// (client/upstream_link.h): while a phase runs it keeps heartbeating and reading upstream, so a
// relayed phase of minutes is never taken for a silent upstream; a refusal for good
// (client::UpstreamRefused: its key, its id, its model) ends run(). A killed aggregator costs its
// subtree's updates for that round only: the root's deadline closes the round with the others. One
// thread runs it (the fleet's and the upstream socket's owner).
#include <atomic>
#include <memory>
#include <string>

#include "client/upstream_link.h"
#include "server/zmq_fleet.h"

namespace starling::server {

struct AggregatorConfig {
  std::string upstream;  // e.g. tcp://root:7700
  uint64_t id = 0;       // its id upstream (its key's id on the upstream's allow-list)
  transport::SecurityConfig security;  // client side: own key pair + the upstream's public key
  transport::TransportLimits limits;
  std::string rule = "fedavg";  // must match the root's (a streaming rule)
  aggregation::ValidationBounds bounds;
  std::vector<std::string> metrics = {"train_loss"};
  // aggregator.metrics: one JSON line per phase relayed (empty: none), written before the answer
  // is handed to the upstream link. Fields: aggregator (its id), round, phase, secure, relayed (its
  // clients sent the task or step), updates (in the partial or ring sum formed; 0: none was sent),
  // failed (did not deliver, or their masked input was refused), refused (updates its checks
  // refused; 0 under secure aggregation), sent (a partial or ring sum was handed to the link). A
  // line it cannot append is a warning in its log: the federation goes on; a file it cannot open
  // for appending at construction is a ConfigError.
  std::string metrics_file;
  Downlink downlink = Downlink::kDense;
  double resparsify_density = 0.0;  // 0: exact dense partials
  size_t min_clients = 1;           // registers upstream once this many of its clients registered
  double deadline_share = 0.8;      // of the upstream task's deadline spent waiting for clients
  uint32_t register_retry_ms = 1000;
  uint32_t upstream_silence_ms = 15000;  // register again when upstream was silent this long
  // Registration retries, upstream silence and back-offs (core/clock.h; a test moves it forward).
  // Its downstream ZmqFleet has its own (FleetConfig::clock).
  const Clock* clock = &steadyClock();
  void validate() const;
};

class EdgeAggregator {
 public:
  // `fleet` (its downstream) must outlive it.
  EdgeAggregator(transport::Context& ctx, AggregatorConfig config, ZmqFleet& fleet,
                 std::shared_ptr<const ParamLayout> layout, std::shared_ptr<spdlog::logger> log);
  ~EdgeAggregator();

  // Serves until upstream sends Shutdown (then tells its clients, returns true) or `stop`.
  bool run(const std::atomic<bool>& stop);
  uint64_t partialsSent() const;
  // Its connection upstream: registrations, heartbeats, bytes (read on run()'s thread, or after).
  const client::UpstreamStats& upstreamStats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::server
