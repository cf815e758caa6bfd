// The body of starling-client and starling-client-torch (apps/client_main.h): the settings, the
// client's shard of the data, its trainer (apps/deploy_models.h: Eigen or LibTorch, whichever the
// program links), and the client runtime until the federation ends or SIGTERM.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "apps/client_main.h"
#include "apps/common.h"
#include "apps/deploy_models.h"
#include "client/runtime.h"
#include "client/trainer.h"
#include "compression/registry.h"
#include "core/error.h"
#include "data/partition.h"
#include "data/source.h"
#if defined(STARLING_CLIENT_STATUS)
#include "ops/status_server.h"
#endif

using namespace starling;

namespace {

#if defined(STARLING_CLIENT_STATUS)
// status.listen: the client's runtime statistics as Prometheus metrics, updated on the runtime's
// thread after every message it sends (a heartbeat at least every net.heartbeat_ms).
void exportStats(ops::Registry& r, const client::RuntimeStats& s) {
  const auto count = [&r](const char* name, const char* help, uint64_t v, ops::Labels labels = {}) {
    r.counter(name, help, std::move(labels)).raiseTo(static_cast<double>(v));
  };
  count("starling_client_tasks_total", "Tasks received (fit and evaluate).", s.tasks);
  count("starling_client_updates_total", "Updates sent (each once; resends not counted).",
        s.updates_sent);
  count("starling_client_evaluations_total", "Evaluations sent.", s.evaluations_sent);
  count("starling_client_resent_total", "Answers sent again (after Busy or a new session).",
        s.resent);
  count("starling_client_rejects_total", "Reject messages received from the server.", s.rejects);
  count("starling_client_registrations_total", "Register messages sent.", s.registrations);
  count("starling_client_heartbeats_total", "Heartbeats sent.", s.heartbeats);
  const char* bytes_help = "Bytes of every message sent (up) and received (down).";
  count("starling_client_bytes_total", bytes_help, s.uplink_bytes, {{"direction", "up"}});
  count("starling_client_bytes_total", bytes_help, s.downlink_bytes, {{"direction", "down"}});
  count("starling_client_update_bytes_total", "Bytes of the updates made, each counted once.",
        s.update_bytes);
  r.gauge("starling_client_round", "The last round this client trained for.")
      .set(static_cast<double>(s.last_round));
}
#endif

int runClient(const apps::Settings& c, const apps::TrainerWrap& wrap) {
  auto log = apps::makeLogger("client-" + std::to_string(c.client.id), c.log_level, c.net.insecure,
                              c.log_format);
  const std::shared_ptr<const data::Partitioner> partitioner =
      data::makePartitioner(c.data.partition);
  client::RuntimeConfig rc;
  rc.server = c.client.server;
  rc.client_id = c.client.id;
  rc.security = apps::security(c.net, /*server_side=*/false, /*needs_upstream=*/true);
  rc.limits = apps::transportLimits(c.net);
  rc.state_file = c.state.file;
  rc.server_silence_ms = c.net.server_silence_ms;
  // The rounds of secure aggregation it takes part in, and whose keys it trusts (its key file's
  // certified signing key, the authority's public key).
  rc.secagg_trust = client::loadSecAggTrust(
      c.secagg.threat == apps::SecAggThreat::kMaliciousServer, c.secagg.authority,
      c.net.insecure ? std::string() : c.net.key, c.client.id);
  rc.secagg_trust.min_noise = c.secagg.min_noise;
  rc.secagg_trust.min_clients = c.secagg.min_clients;
  rc.secagg_trust.validate(c.client.id);
  rc.validate();
#if defined(STARLING_CLIENT_STATUS)
  ops::StatusConfig{c.status.listen, c.status.token_file}.validate();  // before the data loads
#else
  if (!c.status.listen.empty())
    STARLING_THROW(ConfigError, "status.listen = '", c.status.listen,
                   "': this build of starling-client has no status server (the arm64 edge build "
                   "leaves out the operations library and its HTTP server)");
#endif
  // Its training shard (the same split every client computes, from the labels) and an IID share of
  // the test set: only those examples are kept, never the whole data set. A shard
  // drawn with replacement may repeat an example: the file's example is kept once and the view
  // names it as often as the shard does. A rule that draws each client's shard on its own
  // (sampled) draws this client's alone.
  std::vector<size_t> train_shard, test_shard;
  const auto shard = [&](const std::shared_ptr<const data::Partitioner>& p,
                         std::vector<size_t>& out) {
    return [&p, &c, &out](const std::vector<uint8_t>& labels, uint32_t classes) {
      const auto shards =
          data::ClientShards::make(p, labels, classes, c.data.num_clients, c.model.seed);
      std::vector<size_t> scratch;
      const std::span<const size_t> mine = shards.shard(c.client.id, scratch);
      out.assign(mine.begin(), mine.end());
      return out;
    };
  };
  const std::shared_ptr<const data::Partitioner> iid = data::makePartitioner("iid");
  const data::LoadedData loaded =
      data::loadDataSubset(c.data.source, shard(partitioner, train_shard), shard(iid, test_shard));
  const data::Dataset& train = loaded.train;
  const data::Dataset empty;
  const data::Dataset& test = loaded.test ? *loaded.test : empty;
  const std::vector<size_t> train_idx = data::subsetPositions(train_shard),
                            test_idx = data::subsetPositions(test_shard);
  std::unique_ptr<client::Trainer> trainer;
  try {
    trainer = apps::makeDeployedTrainer(c.model.spec, train);
  } catch (const InvalidArgument& e) {  // the model does not fit the data's shape or classes
    STARLING_THROW(ConfigError, "model.spec = '", c.model.spec, "' does not fit data.train (",
                   loaded.train_path, "): ", e.what());
  }
  if (wrap) trainer = wrap(std::move(trainer));
  const client::DataView tv{&train, train_idx}, ev{&test, test_idx};
  log->info("model {} (fingerprint {}) | {} training and {} test examples | server {}",
            trainer->spec(), hexFingerprint(trainer->layout().fingerprint()), tv.size(), ev.size(),
            c.client.server);
  // Its metrics (status.listen): declared before the runtime, whose callback writes them.
#if defined(STARLING_CLIENT_STATUS)
  std::unique_ptr<ops::StatusServer> status;
  if (!c.status.listen.empty()) {
    auto registry = std::make_shared<ops::Registry>();
    registry
        ->gauge("starling_client_info", "This client's id and model.",
                {{"id", std::to_string(c.client.id)},
                 {"model", trainer->spec()},
                 {"fingerprint", hexFingerprint(trainer->layout().fingerprint())}})
        .set(1);
    exportStats(*registry, client::RuntimeStats{});  // every family from the first scrape
    status = std::make_unique<ops::StatusServer>(
        ops::StatusConfig{c.status.listen, c.status.token_file}, registry,
        "starling-client " + std::to_string(c.client.id), log);
    rc.on_sent = [reg = registry](const client::RuntimeStats& st) { exportStats(*reg, st); };
  }
#endif
  transport::Context ctx;
  client::ClientRuntime runtime(ctx, rc, *trainer, tv, ev, log);
  apps::installStopHandlers();
  const bool finished = runtime.run(apps::stopFlag());
  const auto& s = runtime.stats();
  log->info("{}: {} tasks, {} updates ({} resent, {} update bytes), up {:.1f} KB, down {:.1f} KB",
            finished ? "done" : "stopped", s.tasks, s.updates_sent, s.resent, s.update_bytes,
            s.uplink_bytes / 1024.0, s.downlink_bytes / 1024.0);
  return 0;
}

}  // namespace

int apps::clientMain(int argc, char** argv, const TrainerWrap& wrap) {
  apps::Settings c;
  apps::Options o("starling-client",
                  "starling-client: a lightweight Starling client (Eigen models, no LibTorch).\n"
                  "Every key can be set in a TOML file (--config) or on the command line (which "
                  "wins); the file may be the simulation's (docs/configuration.md). Client i "
                  "trains shard i of the data.* files split as data.partition with model.seed.");
  apps::declareSettings(
      o, c, apps::kClient,
      {apps::deployedModelsHelp(), compression::compressors().help(), "", "", ""});
  if (const int rc = o.parse(argc, argv); rc >= 0) return rc;
  try {
    apps::resolveSettings(o, c, apps::kClient);
    return runClient(c, wrap);
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "starling-client: %s\n", e.what());
    return 2;
  }
}
