// starling-server's main (apps/server_run.h): the root of a federation (--server.role root, the
// default) or an edge aggregator (--server.role aggregator --server.upstream tcp://HOST:PORT).
// docs/deployment.md shows how to run one; docs/protocol.md what travels.
#include "apps/server_run.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <span>

#include "aggregation/rule.h"
#include "aggregation/server_optimizer.h"
#include "apps/common.h"
#include "apps/deploy_models.h"
#include "apps/engine_settings.h"
#include "client/algorithm.h"
#include "client/trainer.h"
#include "compression/registry.h"
#include "core/error.h"
#include "data/source.h"
#include "ops/status_server.h"
#include "server/admin.h"
#include "server/aggregator.h"
#include "server/async_root.h"
#include "server/engine.h"
#include "server/fleet_metrics.h"
#include "server/zmq_fleet.h"
#include "transport/keys.h"

namespace starling::apps {
namespace {

// The model's input shape and classes: model.rows / model.cols / model.classes, each 0 taken from
// the data.* files (the clients' data), which the server reads for their shapes and labels only.
struct ModelShape {
  size_t rows = 0, cols = 0;
  uint32_t classes = 0;
};

ModelShape modelShape(const apps::Settings& c) {
  ModelShape m{c.model.rows, c.model.cols, c.model.classes};
  if (m.rows != 0 && m.cols != 0 && m.classes != 0) return m;
  data::LoadedData d;
  try {
    d = data::loadDataShapes(c.data.source);
  } catch (const starling::Error& e) {
    STARLING_THROW(ConfigError,
                   "model.rows, model.cols and model.classes (the clients' examples) are not all "
                   "set and the data.* files cannot be read here to take them from: ",
                   e.what());
  }
  if (m.rows == 0) m.rows = d.train.rows;
  if (m.cols == 0) m.cols = d.train.cols;
  if (m.classes == 0) m.classes = d.train.num_classes;
  return m;
}

// eval.every in asynchronous rounds: the clients are busy training, so the root evaluates the
// broadcast model itself on data.test (rc.eval_every, rc.evaluate), checked on the starting model
// first. The returned object holds the test set rc.evaluate reads: keep it while the root runs.
struct RootEvaluation {
  std::optional<data::Dataset> test;
  std::vector<size_t> idx;
};

std::unique_ptr<RootEvaluation> setUpRootEvaluation(const apps::Settings& c,
                                                    client::Trainer& trainer,
                                                    std::span<const float> init,
                                                    server::AsyncRootConfig& rc,
                                                    spdlog::logger& log) {
  auto held = std::make_unique<RootEvaluation>();
  std::optional<data::Dataset>& test = held->test;
  std::vector<size_t>& test_idx = held->idx;
  if (c.eval_every != 0) {
    try {
      const auto none = [](const std::vector<uint8_t>&, uint32_t) { return std::vector<size_t>{}; };
      const auto all = [](const std::vector<uint8_t>& labels, uint32_t) {
        std::vector<size_t> i(labels.size());
        std::iota(i.begin(), i.end(), size_t{0});
        return i;
      };
      test = data::loadDataSubset(c.data.source, none, all).test;
    } catch (const starling::Error& e) {
      log.warn(
          "eval.every = {}: the root cannot read data.test to evaluate the model ({}); "
          "each step's metrics carry the training loss only",
          c.eval_every, e.what());
    }
    if (test && test->size() > 0) {
      test_idx.resize(test->size());
      std::iota(test_idx.begin(), test_idx.end(), size_t{0});
      // The starting model, on the whole test set: one that does not fit the model (another
      // shape, a label beyond model.classes) is said now, not at the first evaluation.
      client::EvalResult first;
      try {
        first = trainer.evaluate(init, client::DataView{&*test, test_idx});
      } catch (const starling::Error& e) {
        STARLING_THROW(ConfigError, "eval.every = ", c.eval_every,
                       ": the root evaluates the model on data.test, which does not fit the "
                       "model: ",
                       e.what());
      }
      rc.eval_every = c.eval_every;
      rc.evaluate = [&trainer, &log, h = held.get()](
                        std::span<const float> model) -> std::optional<std::pair<double, double>> {
        try {
          const client::EvalResult r = trainer.evaluate(model, client::DataView{&*h->test, h->idx});
          return std::pair<double, double>(r.loss, r.accuracy);
        } catch (const starling::Error& e) {
          log.warn("the root's evaluation failed: {}", e.what());
          return std::nullopt;
        }
      };
      log.info(
          "the root evaluates the model on {} ({} examples) every {} steps (federated "
          "evaluation runs in synchronous rounds only); at the start: test accuracy {:.2f}%",
          c.data.source.test, test->size(), c.eval_every, 100.0 * first.accuracy);
    } else if (test) {
      log.warn("eval.every = {}: data.test has no examples; nothing is evaluated", c.eval_every);
    } else if (c.data.source.test.empty()) {
      log.warn("eval.every = {}: no data.test for the root to evaluate on", c.eval_every);
    }
  }
  return held;
}

int runAsyncRoot(const apps::Settings& c, const server::EngineConfig& ec,
                 const std::shared_ptr<const ParamLayout>& layout, std::vector<float> init,
                 client::Trainer& trainer, server::ZmqFleet& fleet, spdlog::logger& log,
                 server::FleetMetrics* metrics, server::Admin* admin) {
  server::AsyncRootConfig rc;
  rc.steps = ec.rounds;
  rc.fleet.concurrency = c.async.concurrency ? c.async.concurrency : c.sampling.clients_per_round;
  rc.fleet.min_available = ec.sampling.min_available;
  rc.aggregators = !c.server.aggregator_ids.empty();
  const bool semisync = c.round.mode == apps::RoundMode::kSemisync;
  if (semisync) {
    // round.deadline_ms is the round's length; a task is failed after async.max_staleness + 1
    // rounds, when its update would most likely be refused as too stale anyway.
    rc.round_ms = ec.round_deadline_ms;
    rc.fleet.task_deadline_ms = static_cast<uint32_t>(
        std::min<uint64_t>(uint64_t{rc.round_ms} * (c.async.max_staleness + 1), 86'400'000));
  } else {
    rc.fleet.task_deadline_ms = ec.round_deadline_ms;
  }
  rc.fit = ec.fit;
  rc.checkpoint = ec.checkpoint;
  rc.metrics = ec.metrics;
  const auto evaluation = setUpRootEvaluation(c, trainer, init, rc, log);
  server::AsyncRoot root(layout, apps::asyncServerConfig(c, ec), rc, std::move(init));
  const server::AsyncServer& srv = root.server();
  if (root.resumed())
    log.info(
        "resumed from {} at step {} (model version {}) with {} buffered updates ({} taken again "
        "from its journal)",
        rc.checkpoint, srv.steps() + 1, srv.version(), srv.buffered(), root.replayed());
  if (root.tornBytes() > 0)
    log.warn(
        "the journal's last record was cut short by the crash ({} bytes dropped): its update is "
        "lost",
        root.tornBytes());
  if (rc.checkpoint.empty())
    log.warn(
        "round.mode = {} without state.checkpoint: a crash of the root loses the run and the "
        "updates in its buffer",
        apps::name(c.round.mode));
  if (semisync)
    log.info(
        "semi-synchronous rounds of {} ms: up to {} tasks open at once, late updates "
        "weighted by staleness {} up to {} rounds | compressor {} | server optimizer {} | "
        "downlink {} | {} rounds",
        rc.round_ms, rc.fleet.concurrency, c.async.staleness, c.async.max_staleness,
        srv.scheme().compressor().spec(), ec.server_opt, c.downlink.mode, rc.steps);
  else
    log.info(
        "async (FedBuff): {} tasks open at once, a step every {} updates, staleness {} up "
        "to {} versions | compressor {} | server optimizer {} | downlink {} | {} steps",
        rc.fleet.concurrency, c.async.buffer_size, c.async.staleness, c.async.max_staleness,
        srv.scheme().compressor().spec(), ec.server_opt, c.downlink.mode, rc.steps);
  try {
    root.run(fleet, [&](const server::RoundRecord& r) {
      const ScopedLogFields in_step(r.round, std::nullopt);  // the step's line says which
      if (metrics) {
        metrics->roundRecorded(r);
        metrics->roundStarted(r.round + 1);
      }
      if (admin) admin->setRound(r.round + 1);
      const auto m = [&](const char* k) {
        const auto it = r.metrics.find(k);
        return it == r.metrics.end() ? 0.0 : it->second;
      };
      const std::string acc =
          r.test_accuracy ? fmt::format("  test acc {:.2f}%", 100.0 * *r.test_accuracy) : "";
      if (r.applied)
        log.info(
            "step {:4}/{}  {} updates  staleness mean {:.1f} max {:.0f}  loss {:.4f}{}  {} tasks "
            "sent, {} failed  up {:.1f} KB  down {:.1f} KB  {:.2f} s",
            r.round, rc.steps, r.clients_completed, m("staleness_mean"), m("staleness_max"),
            r.train_loss.value_or(0.0), acc, r.clients_selected, r.clients_failed,
            r.uplink_bytes / 1024.0, r.downlink_bytes / 1024.0, r.wall_seconds);
      else
        log.warn("step {:4}/{}  not applied: {}", r.round, rc.steps, r.reason);
    });
  } catch (const server::Stopped&) {
    if (admin && admin->draining())
      log.warn(
          "drained: every open task finished; stopping at step {} with {} buffered updates{}; "
          "clients wait for the root to come back",
          srv.steps() + 1, srv.buffered(),
          rc.checkpoint.empty() ? " (no state.checkpoint: they are lost)"
                                : ", kept in the checkpoint's journal");
    else
      log.info("stopped at step {} with {} buffered updates{}", srv.steps() + 1, srv.buffered(),
               rc.checkpoint.empty() ? " (no state.checkpoint: they are lost)"
                                     : ", kept in the checkpoint's journal");
  }
  return 0;
}

// Every spec and value checked before anything is bound, each refusal once: the root's rounds
// (central DP's budget among them; an edge aggregator runs no engine), or what an aggregator
// cannot relay.
server::EngineConfig checkServer(const apps::Settings& c) {
  const bool aggregator = c.server.role == apps::ServerRole::kAggregator;
  const bool async = buffered(c.round.mode);  // FedBuff or semi-synchronous: the buffered step
  server::EngineConfig ec = apps::engineConfig(c);
  // The malicious-server threat model: the adverts' credentials are checked against the authority.
  if (ec.secagg.enabled && c.secagg.threat == apps::SecAggThreat::kMaliciousServer)
    ec.secagg.authority = transport::loadAuthorityKey(c.secagg.authority);
  apps::checkRoundMode(c, apps::kServer, ec);
  if (!aggregator && !async) ec.validate();
  if (aggregator && server::wholeModelQuantised(ec.downlink))
    STARLING_THROW(ConfigError, "downlink.mode = ", c.downlink.mode,
                   " is the root's: an edge aggregator relays the model it holds (dense, fp16 or "
                   "delta; the root sends it the broadcast model dense)");
  compression::makeCompressor(ec.scheme.compressor);
  aggregation::makeRule(ec.scheme.rule);
  aggregation::makeServerOptimizer(ec.server_opt, 1);
  return ec;
}

// The model the clients train (model.spec on their examples' shape), and what SCAFFOLD needs of it
// and of the settings at the root; an aggregator relays what the root's tasks carry.
std::unique_ptr<client::Trainer> serverTrainer(const apps::Settings& c,
                                               const server::EngineConfig& ec,
                                               spdlog::logger& log) {
  const bool aggregator = c.server.role == apps::ServerRole::kAggregator;
  const ModelShape shape = modelShape(c);
  auto trainer = apps::makeDeployedTrainer(c.model.spec, shape.rows, shape.cols, shape.classes);
  if (c.secagg.enabled && aggregator)
    log.info(
        "secagg.enabled is the root's setting: this aggregator relays the root's secure "
        "aggregation (its steps to its clients, their masked inputs' ring sum up)");
  if (c.privacy.dp != apps::DpMode::kOff && aggregator)
    log.info(
        "privacy.dp is the root's setting: the root samples this aggregator's clients one by "
        "one in its secure rounds, and adds or asks for the noise");
  if (ec.scheme.scaffold && aggregator) {
    // One file serves the root, its aggregators and its clients: the setting is the
    // root's, and an aggregator relays what the root's tasks carry.
    log.info(
        "train.scaffold is the root's setting: this aggregator relays SCAFFOLD's control "
        "variates when the root's tasks carry them");
  } else if (ec.scheme.scaffold) {
    client::checkScaffoldTrainer(*trainer);
    // N must count clients: behind edge aggregators the registered peers are aggregators.
    if (!c.server.aggregator_ids.empty() && ec.scaffold_population == 0)
      STARLING_THROW(ConfigError,
                     "train.scaffold with edge aggregators (security.aggregator_ids) "
                     "needs the number of clients: data.num_clients or "
                     "train.scaffold_population");
    // sampling.overcommit > 1 is fine: a client refused as late is not acknowledged and drops
    // the c_i+ it computed (client/algorithm.h), so c stays the mean of the c_i.
    if (ec.checkpoint.empty())
      log.warn(
          "train.scaffold without state.checkpoint: a restarted root starts c at zero while its "
          "clients keep their c_i (docs/protocol.md, SCAFFOLD over the protocol)");
  } else if (c.train.scaffold_population != 0) {
    STARLING_THROW(ConfigError, "train.scaffold_population is set without train.scaffold");
  }
  return trainer;
}

// The ZeroMQ fleet's settings: endpoint, security, limits, liveness and the aggregators' ids.
server::FleetConfig fleetConfig(const apps::Settings& c, const server::EngineConfig& ec) {
  server::FleetConfig fc;
  fc.bind = c.server.bind;
  fc.security = apps::security(c.net, /*server_side=*/true, /*needs_upstream=*/false);
  fc.limits = apps::transportLimits(c.net);
  fc.heartbeat_ms = c.server.heartbeat_ms;
  fc.silence_ms = c.server.silence_ms;
  fc.max_examples = ec.scheme.bounds.max_examples;
  fc.downlink_copies = c.downlink.copies;
  fc.downlink_density = c.downlink.density;
  for (const auto& s : c.server.aggregator_ids) {
    size_t used = 0;
    uint64_t id = 0;
    try {
      id = std::stoull(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != s.size())
      STARLING_THROW(ConfigError, "security.aggregator_ids: '", s, "' is not an id");
    fc.aggregator_ids.insert(id);
  }
  return fc;
}

// An edge aggregator: relays its root's tasks to its clients until the root ends the federation.
int runAggregator(const apps::Settings& c, const server::EngineConfig& ec, transport::Context& ctx,
                  server::ZmqFleet& fleet, const std::shared_ptr<const ParamLayout>& layout,
                  const std::shared_ptr<spdlog::logger>& log) {
  server::AggregatorConfig ac;
  ac.upstream = c.server.upstream;
  ac.id = c.server.id;
  ac.security = apps::security(c.net, /*server_side=*/false, /*needs_upstream=*/true);
  ac.limits = apps::transportLimits(c.net);
  ac.rule = ec.scheme.rule;
  ac.bounds = ec.scheme.bounds;
  ac.metrics = ec.scheme.metrics;
  ac.metrics_file = c.aggregation.metrics_file;
  ac.downlink = ec.downlink;
  ac.resparsify_density = c.aggregation.resparsify;
  ac.min_clients = c.aggregation.min_clients;
  ac.upstream_silence_ms = c.net.server_silence_ms;
  server::EdgeAggregator agg(ctx, ac, fleet, layout, log);
  log->info("aggregator {} relaying to {}", c.server.id, c.server.upstream);
  const bool finished = agg.run(apps::stopFlag());
  log->info("{}; {} partials sent", finished ? "upstream ended the federation" : "stopped",
            agg.partialsSent());
  return 0;
}

// The root's synchronous rounds: the round engine over the ZeroMQ fleet, a line per round.
int runRoot(const apps::Settings& c, const server::EngineConfig& ec,
            const std::shared_ptr<const ParamLayout>& layout, std::vector<float> init,
            server::ZmqFleet& fleet, spdlog::logger& log, server::FleetMetrics* metrics,
            server::Admin* admin) {
  server::RoundEngine engine(layout, ec, std::move(init));
  if (engine.resumed())
    log.info("resumed from {} at round {} (model version {})", ec.checkpoint, engine.nextRound(),
             engine.model().version());
  if (server::downlinkMirrored(ec.downlink))
    log.info(
        "downlink {}: up to {} clients' copies of the model kept, {:.0f} MB", c.downlink.mode,
        c.downlink.copies,
        static_cast<double>(c.downlink.copies) * 4.0 * static_cast<double>(layout->numel()) / 1e6);
  log.info("compressor {} | rule {} | server optimizer {} | downlink {} | {} rounds{}",
           engine.scheme().compressor().spec(), engine.scheme().rule().spec(), ec.server_opt,
           c.downlink.mode, ec.rounds,
           !ec.scheme.scaffold ? std::string()
           : ec.scaffold_population
               ? fmt::format(" | SCAFFOLD on (N = {} clients)", ec.scaffold_population)
               : std::string(" | SCAFFOLD on (N = the clients available each round)"));
  if (ec.sampling.poisson_rate > 0)
    log.info(
        "Poisson sampling: each client with probability {}; each round waits for {} "
        "registered",
        ec.sampling.poisson_rate, ec.sampling.min_available);
  else if (ec.sampling.clients_per_round > 0)
    log.info("sampling {} clients per round; each round waits for {} registered",
             ec.sampling.clients_per_round, ec.sampling.min_available);
  if (ec.secagg.enabled)
    log.info("secure aggregation (SecAgg+): clip {}, ring of {} bits, threat model {}",
             ec.secagg.clip, ec.secagg.bits,
             ec.secagg.authority
                 ? "malicious-server (adverts signed, certified by " + c.secagg.authority + ")"
                 : std::string("semi-honest"));
  if (c.round.semisync_under_dp)
    log.info(
        "round.mode = semisync under DP: each round's Poisson sample, the round closing at "
        "round.deadline_ms ({} ms) with what arrived; a late update is dropped, not carried into "
        "a later round (docs/privacy.md)",
        c.round.deadline_ms);
  if (const privacy::ClientDp* dp = engine.dp())
    log.info("{} DP: clip {}, noise multiplier {:.4f}, epsilon {:.3f} after {} rounds (delta {}){}",
             dp->distributed() ? "distributed" : "central", dp->config().clip,
             dp->noiseMultiplier(), dp->epsilon(ec.rounds), ec.rounds, dp->config().delta,
             dp->distributed()
                 ? " | each client adds its noise in the ring; a sum holds at least " +
                       std::to_string(dp->minClients()) + " clients' noise"
             : dp->config().seeded_noise ? " | seeded noise: anyone with model.seed can remove it"
                                         : "");
  if (const privacy::ClientDp* dp = engine.dp(); dp && dp->config().adaptive_clip)
    log.info(
        "adaptive clipping: the clip ({:.4g} now) follows the {} quantile of the update norms, "
        "steps of {}; the count's noise {:.4g}, the sum's noise multiplier {:.4f}",
        dp->clip(), dp->config().target_quantile, dp->config().clip_lr, dp->countNoise(),
        dp->sumNoiseMultiplier());
  if (const privacy::ClientDp* dp = engine.dp(); dp && dp->distributed()) {
    // The epsilon above is against the models' recipients; the root drew the sample.
    const auto expected =
        static_cast<uint64_t>(std::ceil(dp->q() * static_cast<double>(ec.rounds)));
    log.info(
        "distributed DP against this root, which knows who took part: epsilon {:.3f} for a "
        "client in {} rounds (the expected count), {:.3f} in {} (docs/privacy.md); clients may "
        "hold the root to its noise with secagg.min_noise = {} and, in signed rounds, to its m "
        "with secagg.min_clients = {}",
        dp->epsilonKnownSample(expected), expected, dp->epsilonKnownSample(2 * expected),
        2 * expected, privacy::minNoiseText(*dp), dp->minClients());
  }
  while (!engine.done() && !apps::stopFlag().load()) {
    server::RoundRecord r;
    const uint64_t round = engine.nextRound();
    if (admin) {
      // An operator's drain or pause (starling-admin) takes effect between rounds; while paused
      // the fleet is served (heartbeats, registrations, the operator's commands).
      admin->setRound(round);
      try {
        while (admin->paused() && !admin->draining() && !apps::stopFlag().load()) {
          admin->setParked(true);
          fleet.service(std::chrono::milliseconds(200));
        }
        admin->setParked(false);
      } catch (const server::Stopped&) {
        log.info("stopped while paused before round {}", round);
        return 0;
      }
      if (admin->draining()) {
        log.warn(
            "drained: stopping before round {} (the checkpoint holds round {}); clients "
            "wait for the root to come back",
            round, round - 1);
        return 0;
      }
    }
    if (metrics) metrics->roundStarted(round);
    const ScopedLogFields in_round(round, std::nullopt);  // every line of the round says which
    try {
      r = engine.runRound(fleet);
    } catch (const server::Stopped&) {
      if (admin && admin->draining() && engine.nextRound() == round) {
        log.warn(
            "drained: round {} was waiting for its clients and had not started; it runs "
            "when the root is back (the checkpoint holds round {}); clients wait for it",
            round, round - 1);
        return 0;
      }
      if (engine.nextRound() > round)  // stopped in its evaluation: the round was applied and kept
        log.info(
            "stopped during round {}'s evaluation: the round was recorded (without test metrics); "
            "a restart goes on at round {}{}",
            round, engine.nextRound(),
            ec.checkpoint.empty() ? " (no state.checkpoint: from round 1)"
                                  : " from its checkpoint");
      else
        log.info(
            "stopped during round {}: it was not recorded and runs again when the server "
            "restarts{}",
            round,
            ec.checkpoint.empty() ? " (no state.checkpoint: from round 1)"
                                  : " from its checkpoint");
      return 0;
    }
    if (metrics) metrics->roundRecorded(r);
    std::string acc =
        r.test_accuracy ? fmt::format("  test accuracy {:5.1f}%", 100 * *r.test_accuracy) : "";
    if (r.applied)
      log.info(
          "round {:4}/{}  {} updates from {} of {} sampled  loss {:.4f}{}  up {:.1f} KB  down "
          "{:.1f} KB  {:.2f} s{}",
          r.round, ec.rounds, r.clients_completed, r.clients_selected - r.clients_failed,
          r.clients_selected, r.train_loss.value_or(0.0), acc, r.uplink_bytes / 1024.0,
          r.downlink_bytes / 1024.0, r.wall_seconds,
          r.dp_epsilon ? fmt::format("  epsilon {:.3f}", *r.dp_epsilon) : "");
    else
      log.warn("round {:4}/{}  not applied: {}", r.round, ec.rounds, r.reason);
  }
  if (engine.done()) fleet.finish("all " + std::to_string(ec.rounds) + " rounds done");
  return 0;
}

int runServer(const apps::Settings& c) {
  const bool aggregator = c.server.role == apps::ServerRole::kAggregator;
  auto log = apps::makeLogger(aggregator ? "aggregator" : "server", c.log_level, c.net.insecure,
                              c.log_format);
  if (c.net.insecure)
    log->warn(
        "!!! INSECURE: CURVE is off; anyone who reaches {} can join and read every message !!!",
        c.server.bind);
  const server::EngineConfig ec = checkServer(c);
  const ops::StatusConfig status_config{c.status.listen, c.status.token_file};
  status_config.validate();  // before anything is bound
  const std::unique_ptr<client::Trainer> trainer = serverTrainer(c, ec, *log);
  const auto layout = std::make_shared<const ParamLayout>(trainer->layout());
  // The operator's metrics (status.listen): read from the fleet on this thread, served on the
  // status server's; the control socket (admin.socket) for starling-admin, answered on this
  // thread. All outlive the fleet, which holds the observer.
  std::unique_ptr<server::FleetMetrics> metrics;
  std::unique_ptr<ops::StatusServer> status;
  std::unique_ptr<ops::ControlSocket> control;
  std::unique_ptr<server::Admin> admin;
  if (!c.admin_socket.empty()) control = std::make_unique<ops::ControlSocket>(c.admin_socket);
  transport::Context ctx;
  server::ZmqFleet fleet(ctx, fleetConfig(c, ec), layout, log);
  log->info("listening on {} | model {} ({} parameters, fingerprint {})", fleet.endpoint(),
            trainer->spec(), layout->numel(), hexFingerprint(layout->fingerprint()));
  if (!c.status.listen.empty()) {
    auto registry = std::make_shared<ops::Registry>();
    metrics = std::make_unique<server::FleetMetrics>(registry, aggregator ? "aggregator" : "root",
                                                     trainer->spec(),
                                                     hexFingerprint(layout->fingerprint()));
    if (!aggregator) metrics->setPlannedRounds(ec.rounds);
    status = std::make_unique<ops::StatusServer>(
        status_config, registry,
        fmt::format("starling-server {} on {}", aggregator ? "edge aggregator" : "root",
                    fleet.endpoint()),
        log, [m = metrics.get()] { return m->statusJson(); });
  }
  apps::installStopHandlers();
  // SIGINT / SIGTERM end a wait or a phase within about 100 ms (server::Stopped), not when it
  // times out, and the round in progress is left for the restart.
  fleet.setStopFlag(&apps::stopFlag());
  if (control) {
    admin = std::make_unique<server::Admin>(fleet, c.net.insecure ? std::string() : c.net.clients,
                                            buffered(c.round.mode), log, aggregator);
    log->info("admin: starling-admin --socket {} takes status, reload, revoke ID{}",
              control->path(),
              aggregator ? " (drain and pause are the root's)" : ", drain, pause, resume");
  }
  if (metrics || control)
    fleet.setObserver(
        [m = metrics.get(), ctl = control.get(), adm = admin.get()](const server::ZmqFleet& f) {
          if (m) m->observe(f);
          if (ctl)
            ctl->poll([adm](const std::string& line, const ops::Caller& who) {
              return adm->handle(line, who);
            });
        });
  if (aggregator) return runAggregator(c, ec, ctx, fleet, layout, log);
  std::vector<float> init(layout->numel());
  trainer->initParameters(init, c.model.seed);
  if (buffered(c.round.mode))
    return runAsyncRoot(c, ec, layout, std::move(init), *trainer, fleet, *log, metrics.get(),
                        admin.get());
  return runRoot(c, ec, layout, std::move(init), fleet, *log, metrics.get(), admin.get());
}

}  // namespace

int serverMain(int argc, char** argv) {
  apps::Settings c;
  apps::Options o(
      "starling-server",
      "starling-server: the root of a Starling federation, or an edge aggregator.\n"
      "Every key can be set in a TOML file (--config) or on the command line (which wins); the "
      "file may be the simulation's (docs/configuration.md).\n"
      "docs/deployment.md walks through keys, config, ports and what to do after a crash.");
  apps::declareSettings(
      o, c, apps::kServer,
      {apps::deployedModelsHelp(), compression::compressors().help(),
       aggregation::aggregationRules().help(), aggregation::serverOptimizers().help(), ""});
  if (const int rc = o.parse(argc, argv); rc >= 0) return rc;
  try {
    apps::resolveSettings(o, c, apps::kServer);
    return runServer(c);
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "starling-server: %s\n", e.what());
    return 2;
  }
}

}  // namespace starling::apps
