#pragma once
// The round engine's configuration from the shared keys (apps/settings.h), for starling-server's
// root and starling-sim: one conversion, so the same file means the same rounds in both.
#include <algorithm>
#include <charconv>
#include <string>

#include "aggregation/rule.h"
#include "apps/settings.h"
#include "compression/registry.h"
#include "core/error.h"
#include "server/async_server.h"
#include "server/engine.h"

namespace starling::apps {

inline server::EngineConfig engineConfig(const Settings& s) {
  server::EngineConfig e;
  e.rounds = s.train.rounds;
  e.fit = s.train.fit;
  e.scheme.compressor = s.compression.compressor;
  e.scheme.rule = s.aggregation.rule;
  e.scheme.run_seed = s.model.seed;
  e.scheme.bounds.max_abs_value = s.bounds.max_abs;
  e.scheme.bounds.max_update_norm = s.bounds.max_norm;
  e.scheme.bounds.max_examples = s.bounds.max_examples;
  e.scheme.metrics = s.aggregation.metrics;
  if (s.compression.diagnostics)
    for (const char* m : {"ef_gain", "ef_residual_ratio", "ef_residual_age"})
      if (std::find(e.scheme.metrics.begin(), e.scheme.metrics.end(), m) == e.scheme.metrics.end())
        e.scheme.metrics.push_back(m);
  e.scheme.scaffold = s.train.scaffold;
  e.scaffold_population = s.train.scaffold_population;
  e.server_opt = s.aggregation.server_opt;
  e.sampling.clients_per_round = s.sampling.clients_per_round;
  e.sampling.fraction = s.sampling.fraction;
  e.sampling.min_clients = s.sampling.min_clients;
  e.sampling.min_available = std::max<uint64_t>(s.sampling.min_available, 1);
  e.sampling.overcommit = s.sampling.overcommit;
  e.sampling.wait_ms = s.sampling.wait_ms;
  e.sampling.poisson_rate = s.sampling.poisson_rate;
  if (s.privacy.dp != DpMode::kOff) {
    e.dp.enabled = true;
    e.dp.mechanism = s.privacy.dp == DpMode::kDistributed ? privacy::DpMechanism::kDistributed
                                                          : privacy::DpMechanism::kCentral;
    e.dp.min_clients = s.privacy.min_clients;
    e.dp.adaptive_clip = s.privacy.adaptive_clip;
    e.dp.target_quantile = s.privacy.target_quantile;
    e.dp.clip_lr = s.privacy.clip_lr;
    e.dp.count_noise = s.privacy.clip_count_noise;
    e.dp.clip = s.privacy.clip;
    e.dp.noise_multiplier = s.privacy.noise_multiplier;
    e.dp.target_epsilon = s.privacy.target_epsilon;
    e.dp.delta = s.privacy.delta;
    e.dp.accountant = s.privacy.accountant == DpAccountantKind::kRdp ? privacy::DpAccountant::kRdp
                                                                     : privacy::DpAccountant::kPld;
    e.dp.seeded_noise = s.privacy.seeded_noise;
    e.dp.population = s.data.num_clients;  // resolveSettings: given at the root
    // The rule DP-FedAvg calibrates its noise to (resolveSettings refused any other): every update
    // clipped to C, weighing alike. The clip in its shortest exact spelling, so that the rule's
    // clip is privacy.clip to the bit.
    char buf[32];
    const auto end = std::to_chars(buf, buf + sizeof buf, s.privacy.clip).ptr;
    e.scheme.rule = "fedavg:weight=uniform,clip=" + std::string(buf, end);
  }
  // An edge aggregator relays its root's secure aggregation: the keys are the root's.
  if (s.secagg.enabled && s.server.role == ServerRole::kRoot) {
    e.secagg = {true, s.secagg.neighbours, s.secagg.threshold, s.secagg.bits, s.secagg.clip, {}};
    // The server sees the sum only: every update weighs alike (clipped by its client; under
    // central DP the rule above says so already).
    if (s.privacy.dp == DpMode::kOff) e.scheme.rule = "fedavg:weight=uniform";
  }
  e.completion.min_results = s.sampling.min_clients;
  e.completion.min_completion_rate = s.round.min_completion_rate;
  e.round_deadline_ms = s.round.deadline_ms;
  e.eval_every = s.eval_every;
  e.downlink = server::parseDownlink(s.downlink.mode);
  e.downlink_density = s.downlink.density;
  e.delta_history = s.downlink.history;
  e.checkpoint = s.state.checkpoint;
  e.metrics = s.state.metrics;
  return e;
}

// round.mode, every refusal written once for starling-sim and starling-server (`self`), before
// anything is read or bound, naming the key: async.* is checked in any mode (a file's typo shows
// before it is run asynchronously); the buffered modes refuse what the buffered server step cannot
// take (aggregation::checkBufferable and AsyncOptions::checkWeightAtBound, which AsyncBuffer
// checks too) and what they do not run yet.
inline void checkRoundMode(const Settings& s, Program self, const server::EngineConfig& e) {
  aggregation::AsyncOptions{s.async.buffer_size, s.async.max_staleness, s.async.staleness}
      .validate();
  const bool sim = self == kSim;
  const char* mode = name(s.round.mode);
  if (e.dp.enabled) {
    // (round.mode = semisync is resolved to synchronous rounds that close at their deadline:
    // resolveSettings.)
    // (An edge aggregator given round.mode is told below that the mode is the root's.)
    if (buffered(s.round.mode) && (sim || s.server.role != ServerRole::kAggregator))
      STARLING_THROW(ConfigError, "privacy.dp = ", name(s.privacy.dp),
                     " runs in synchronous and semi-synchronous rounds only: round.mode = ", mode,
                     " steps on whatever arrived, mixing model versions, and samples "
                     "no one by Poisson, so the accountant could not say what it guarantees");
    if (!sim && !s.secagg.enabled &&
        (s.server.role == ServerRole::kAggregator || !s.server.aggregator_ids.empty()))
      STARLING_THROW(ConfigError, "privacy.dp = ", name(s.privacy.dp),
                     " through edge aggregators needs secagg.enabled = true: a plain round "
                     "relays each task to all of an aggregator's clients and takes their sum, "
                     "which the root can neither sample by Poisson nor clip; a secure round asks "
                     "each aggregator for its clients and samples each one (docs/privacy.md)");
  }
  if (!buffered(s.round.mode)) return;
  if (!sim && s.server.role == ServerRole::kAggregator)
    STARLING_THROW(ConfigError,
                   "round.mode is the root's setting: an edge aggregator relays the tasks it gets, "
                   "synchronous or not (leave round.mode out of the aggregator's configuration)");
  const auto no = [&](const std::string& what) {
    STARLING_THROW(ConfigError, "round.mode = ", mode, sim ? "" : " at the root", " does not run ",
                   what, " yet (", sim ? "docs/simulation.md" : "docs/deployment.md", ")");
  };
  // What the buffered step itself cannot take (the buffer checks the same, once built), SCAFFOLD
  // first.
  try {
    aggregation::checkBufferable(*compression::makeCompressor(e.scheme.compressor),
                                 *aggregation::makeRule(e.scheme.rule), e.scheme.scaffold);
  } catch (const ConfigError& x) {
    STARLING_THROW(ConfigError, "round.mode = ", mode, sim ? "" : " at the root", " ", x.what());
  }
  if (e.sampling.overcommit != 1.0) no("over-commitment (sampling.overcommit)");
  if (e.sampling.poisson_rate > 0) no("Poisson sampling (sampling.poisson_rate)");
  if (sim) {
    const bool semisync = s.round.mode == RoundMode::kSemisync;
    if (!semisync && s.round.deadline_seconds > 0)
      no("a round deadline (round.deadline_seconds): async.max_staleness bounds late updates, and "
         "round.mode = semisync closes rounds at a deadline");
    if (semisync && !(s.round.deadline_seconds > 0))
      STARLING_THROW(ConfigError,
                     "round.mode = semisync needs round.deadline_seconds > 0: the simulated length "
                     "of each round");
  } else if (s.async.concurrency == 0 && s.sampling.clients_per_round == 0) {
    STARLING_THROW(ConfigError, "round.mode = ", mode,
                   " needs async.concurrency (or sampling.clients_per_round): how many clients "
                   "train at once");
  }
  aggregation::AsyncOptions{s.async.buffer_size, s.async.max_staleness, s.async.staleness}
      .checkWeightAtBound();
}

// round.mode = async: the server step's configuration (the same in starling-sim and at the root).
inline server::AsyncServerConfig asyncServerConfig(const Settings& s,
                                                   const server::EngineConfig& e) {
  server::AsyncServerConfig a{
      e.scheme, e.server_opt, {s.async.buffer_size, s.async.max_staleness, s.async.staleness}};
  a.downlink = e.downlink;
  a.history = e.delta_history;
  a.density = e.downlink_density;
  return a;
}

}  // namespace starling::apps
