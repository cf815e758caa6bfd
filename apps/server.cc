// starling-server: the root of a federation (--server.role root, the default) or an edge
// aggregator (--server.role aggregator --server.upstream tcp://HOST:PORT). docs/deployment.md
// shows how to run one; docs/protocol.md what travels.
#include <cstdio>
#include <filesystem>

#include "aggregation/rule.h"
#include "aggregation/server_optimizer.h"
#include "apps/common.h"
#include "client/algorithm.h"
#include "client/trainer.h"
#include "compression/registry.h"
#include "core/error.h"
#include "server/aggregator.h"
#include "server/engine.h"
#include "server/zmq_fleet.h"

using namespace starling;

namespace {

struct Config {
  std::string role = "root";
  std::string bind = "tcp://127.0.0.1:7700";
  std::string upstream;
  uint64_t id = 0;
  apps::NetOptions net;
  uint32_t heartbeat_ms = 1000, silence_ms = 5000;
  std::string model = "softmax";
  size_t rows = 28, cols = 28;  // the clients' images (a flat model reads rows x cols values)
  uint32_t classes = 10;
  uint64_t seed = 1;
  server::EngineConfig engine;
  double min_completion_rate = 0.0;
  std::string downlink = "dense";
  bool diagnostics = false;
  double resparsify = 0.0;
  size_t agg_min_clients = 1;
  std::vector<std::string> aggregator_ids;
  std::string log_level = "info";
};

int runServer(Config& c) {
  const bool aggregator = c.role == "aggregator";
  if (!aggregator && c.role != "root") STARLING_THROW(ConfigError, "server.role must be root or aggregator, got '", c.role, "'");
  auto log = apps::makeLogger(aggregator ? "aggregator" : "server", c.log_level, c.net.insecure);
  if (c.net.insecure)
    log->warn("!!! INSECURE: CURVE is off; anyone who reaches {} can join and read every message !!!", c.bind);
  // Every spec is checked before anything is bound.
  compression::makeCompressor(c.engine.scheme.compressor);
  aggregation::makeRule(c.engine.scheme.rule);
  aggregation::makeServerOptimizer(c.engine.server_opt, 1);
  c.engine.downlink = server::parseDownlink(c.downlink);
  if (c.diagnostics)
    for (const char* m : {"ef_gain", "ef_residual_ratio", "ef_residual_age"})
      if (std::find(c.engine.scheme.metrics.begin(), c.engine.scheme.metrics.end(), m) == c.engine.scheme.metrics.end())
        c.engine.scheme.metrics.push_back(m);
  c.engine.scheme.run_seed = c.seed;
  c.engine.completion.min_results = c.engine.sampling.min_clients;
  c.engine.completion.min_completion_rate = c.min_completion_rate;
  auto trainer = client::makeTrainer(c.model, c.rows, c.cols, c.classes);
  if (c.engine.scheme.scaffold) {
    if (aggregator)
      STARLING_THROW(ConfigError,
                     "train.scaffold is the root's setting: an edge aggregator follows "
                     "the tasks it relays");
    client::checkScaffoldTrainer(*trainer);
    // N must count clients: behind edge aggregators the registered peers are aggregators.
    if (!c.aggregator_ids.empty() && c.engine.scaffold_population == 0)
      STARLING_THROW(ConfigError,
                     "train.scaffold with edge aggregators (security.aggregator_ids) "
                     "needs train.scaffold_population, the number of clients");
    // A sampled client past the target trains, commits its c_i+ and is refused as late: c would
    // drift from the mean of the c_i.
    if (c.engine.sampling.overcommit > 1.0)
      STARLING_THROW(ConfigError, "train.scaffold needs sampling.overcommit = 1 (got ",
                     c.engine.sampling.overcommit,
                     "): a client refused as late keeps the control variate it computed");
  } else if (c.engine.scaffold_population != 0) {
    STARLING_THROW(ConfigError, "train.scaffold_population is set without train.scaffold");
  }
  const auto layout = std::make_shared<const ParamLayout>(trainer->layout());

  transport::Context ctx;
  server::FleetConfig fc;
  fc.bind = c.bind;
  fc.security = c.net.security(/*server_side=*/true, /*needs_upstream=*/false);
  fc.limits = c.net.limits();
  fc.heartbeat_ms = c.heartbeat_ms;
  fc.silence_ms = c.silence_ms;
  fc.max_examples = c.engine.scheme.bounds.max_examples;
  for (const auto& s : c.aggregator_ids) {
    size_t used = 0;
    uint64_t id = 0;
    try {
      id = std::stoull(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != s.size()) STARLING_THROW(ConfigError, "security.aggregator_ids: '", s, "' is not an id");
    fc.aggregator_ids.insert(id);
  }
  server::ZmqFleet fleet(ctx, fc, layout, log);
  log->info("listening on {} | model {} ({} parameters, fingerprint {:x})", fleet.endpoint(), trainer->spec(),
            layout->numel(), layout->fingerprint());
  apps::installStopHandlers();
  // SIGINT / SIGTERM end a wait or a phase within about 100 ms (server::Stopped), not when it
  // times out, and the round in progress is left for the restart.
  fleet.setStopFlag(&apps::stopFlag());

  if (aggregator) {
    server::AggregatorConfig ac;
    ac.upstream = c.upstream;
    ac.id = c.id;
    ac.security = c.net.security(/*server_side=*/false, /*needs_upstream=*/true);
    ac.limits = c.net.limits();
    ac.rule = c.engine.scheme.rule;
    ac.bounds = c.engine.scheme.bounds;
    ac.metrics = c.engine.scheme.metrics;
    ac.downlink = c.engine.downlink;
    ac.resparsify_density = c.resparsify;
    ac.min_clients = c.agg_min_clients;
    server::EdgeAggregator agg(ctx, ac, fleet, layout, log);
    log->info("aggregator {} relaying to {}", c.id, c.upstream);
    const bool finished = agg.run(apps::stopFlag());
    log->info("{}; {} partials sent", finished ? "upstream ended the federation" : "stopped", agg.partialsSent());
    return 0;
  }

  std::vector<float> init(layout->numel());
  trainer->initParameters(init, c.seed);
  server::RoundEngine engine(layout, c.engine, std::move(init));
  if (engine.resumed())
    log->info("resumed from {} at round {} (model version {})", c.engine.checkpoint, engine.nextRound(),
              engine.model().version());
  log->info("compressor {} | rule {} | server optimizer {} | downlink {} | {} rounds", engine.scheme().compressor().spec(),
            engine.scheme().rule().spec(), c.engine.server_opt, c.downlink, c.engine.rounds);
  while (!engine.done() && !apps::stopFlag().load()) {
    server::RoundRecord r;
    try {
      r = engine.runRound(fleet);
    } catch (const server::Stopped&) {
      log->info(
          "stopped during round {}: it was not recorded and runs again when the server restarts{}",
          engine.nextRound(),
          c.engine.checkpoint.empty() ? " (no state.checkpoint: from round 1)"
                                      : " from its checkpoint");
      return 0;
    }
    std::string acc = r.test_accuracy ? fmt::format("  test accuracy {:5.1f}%", 100 * *r.test_accuracy) : "";
    if (r.applied)
      log->info("round {:4}/{}  {} updates from {} of {} sampled  loss {:.4f}{}  up {:.1f} KB  down {:.1f} KB  {:.2f} s",
                r.round, c.engine.rounds, r.clients_completed, r.clients_selected - r.clients_failed, r.clients_selected,
                r.train_loss.value_or(0.0), acc,
                r.uplink_bytes / 1024.0, r.downlink_bytes / 1024.0, r.wall_seconds);
    else
      log->warn("round {:4}/{}  not applied: {}", r.round, c.engine.rounds, r.reason);
  }
  if (engine.done()) fleet.finish("all " + std::to_string(c.engine.rounds) + " rounds done");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  c.engine.scheme.compressor = "topk:density=0.01";
  c.engine.scheme.metrics = {"train_loss"};
  apps::Options o("starling-server",
                  "starling-server: the root of a Starling federation, or an edge aggregator.\n"
                  "Every key can be set in a TOML file (--config) or on the command line (which wins).\n"
                  "docs/deployment.md walks through keys, config, ports and what to do after a crash.");
  o.add("server.role", &c.role, "root (runs the rounds) or aggregator (relays a subtree to an upstream)");
  o.add("server.bind", &c.bind, "endpoint to listen on for clients (and aggregators)");
  o.add("server.upstream", &c.upstream, "aggregator: the upstream server's endpoint, e.g. tcp://10.0.0.1:7700");
  o.add("server.id", &c.id, "aggregator: its id upstream (its key's id on the upstream's allow-list)", 0, ~0ull);
  c.net.add(o);
  o.add("security.aggregator_ids", &c.aggregator_ids,
        "ids that may register as edge aggregators (their partials weigh many clients); others are clients only");
  o.add("net.heartbeat_ms", &c.heartbeat_ms, "clients send a heartbeat this often", 10, 600000);
  o.add("net.silence_ms", &c.silence_ms, "a client silent this long fails its task and is unlisted", 20, 3600000);
  o.add("model.spec", &c.model, "model spec:" + client::trainers().help());
  o.add("model.rows", &c.rows, "image rows of the clients' data (1 for flat data)", 1, 1u << 24);
  o.add("model.cols", &c.cols, "image columns of the clients' data (the width of flat data)", 1,
        1u << 24);
  o.add("model.classes", &c.classes, "number of classes", 2, 1u << 20);
  o.add("model.seed", &c.seed, "run seed: initial model, sampling, compression streams", 0, ~0ull);
  o.add("train.rounds", &c.engine.rounds, "federated rounds", 1, 10'000'000);
  o.add("train.epochs", &c.engine.fit.epochs, "local epochs per round", 1, 1000);
  o.add("train.batch_size", &c.engine.fit.batch_size, "local minibatch size", 1, 1u << 20);
  o.add("train.lr", &c.engine.fit.lr, "client learning rate", 1e-7, 100);
  o.add("train.prox_mu", &c.engine.fit.prox_mu, "FedProx's proximal term mu (0: FedAvg's local SGD)", 0, 1e4);
  o.add("train.scaffold", &c.engine.scheme.scaffold,
        "SCAFFOLD: clients correct their steps by the server's minus their own control variate; c "
        "travels in each phase-0 task, each update brings c_i+ - c_i (model-sized, dense), and c "
        "moves by their sum / train.scaffold_population after each round");
  o.add("train.scaffold_population", &c.engine.scaffold_population,
        "SCAFFOLD's N, the clients of the federation (0: the clients, or edge aggregators, "
        "registered when the round begins; with edge aggregators give the number of clients)",
        0, ~0ull);
  o.add("compression.compressor", &c.engine.scheme.compressor, "compressor spec:" + compression::compressors().help());
  o.add("aggregation.rule", &c.engine.scheme.rule, "aggregation rule spec:" + aggregation::aggregationRules().help());
  o.add("aggregation.server_opt", &c.engine.server_opt, "server optimizer spec:" + aggregation::serverOptimizers().help());
  o.add("aggregation.resparsify_density", &c.resparsify,
        "aggregator: send the top fraction of each tensor up (gTop-k), keeping the rest as residual; 0 = exact dense", 0, 1);
  o.add("aggregator.min_clients", &c.agg_min_clients, "aggregator: join upstream once this many of its clients registered",
        1, 1u << 30);
  o.add("aggregation.metrics", &c.engine.scheme.metrics, "client metrics aggregated per round");
  o.add("bounds.max_abs", &c.engine.scheme.bounds.max_abs_value, "refuse an update with a |value| above this", 1e-30, 1e30);
  o.add("bounds.max_norm", &c.engine.scheme.bounds.max_update_norm, "refuse an update with an L2 norm above this", 1e-30, 1e30);
  o.add("bounds.max_examples", &c.engine.scheme.bounds.max_examples, "most examples a client may register or claim", 1, 1000000000000000ull);
  o.add("sampling.fraction", &c.engine.sampling.fraction, "fraction of available clients sampled per round", 1e-9, 1);
  o.add("sampling.min_clients", &c.engine.sampling.min_clients, "results a round needs to be applied", 1, 1u << 30);
  o.add("sampling.min_available", &c.engine.sampling.min_available, "registered clients to wait for", 1, 1u << 30);
  o.add("sampling.overcommit", &c.engine.sampling.overcommit, "sample this many times the target, close at the target", 1, 10);
  o.add("sampling.wait_ms", &c.engine.sampling.wait_ms, "how long a round waits for min_available clients", 1, 86400000);
  o.add("round.deadline_ms", &c.engine.round_deadline_ms, "how long a phase waits for updates", 10, 86400000);
  o.add("round.min_completion_rate", &c.min_completion_rate, "fraction of sampled clients that must deliver", 0, 1);
  o.add("eval.every", &c.engine.eval_every, "federated evaluation every N rounds (0: never)", 0, 1u << 30);
  o.add("compression.diagnostics", &c.diagnostics,
        "clients also report error feedback's diagnostics (docs/compression.md): ef_gain, ef_residual_ratio and "
        "ef_residual_age, averaged per round into the metrics file");
  o.add("downlink.mode", &c.downlink,
        "how tasks carry the model: dense, fp16, delta (changes since the client's version) or topk (lossy: only the "
        "downlink.density largest changes, the rest kept as the server's error feedback)");
  o.add("downlink.density", &c.engine.downlink_density, "topk downlink: fraction of the model refreshed per round",
        1e-6, 1);
  o.add("downlink.history", &c.engine.delta_history, "model versions kept for delta and topk downlinks", 1, 64);
  o.add("state.checkpoint", &c.engine.checkpoint, "checkpoint file, written atomically after every round; resumed from at start");
  o.add("state.metrics", &c.engine.metrics, "per-round metrics, JSON Lines (appended)");
  o.add("log.level", &c.log_level, "trace, debug, info, warn, error");
  if (const int rc = o.parse(argc, argv); rc >= 0) return rc;
  try {
    return runServer(c);
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "starling-server: %s\n", e.what());
    return 2;
  }
}
