// The body of starling-client and starling-client-torch (apps/client_main.h): the settings, the
// client's shard of the data, its trainer (apps/deploy_models.h: Eigen or LibTorch, whichever the
// program links), and the client runtime until the federation ends or SIGTERM.
#include <algorithm>
#include <cstdio>

#include "apps/client_main.h"
#include "apps/common.h"
#include "apps/deploy_models.h"
#include "client/runtime.h"
#include "client/trainer.h"
#include "compression/registry.h"
#include "core/error.h"
#include "data/partition.h"
#include "data/source.h"

using namespace starling;

namespace {

int runClient(const apps::Settings& c, const apps::TrainerWrap& wrap) {
  auto log = apps::makeLogger("client-" + std::to_string(c.client.id), c.log_level, c.net.insecure,
                              c.log_format);
  const auto partitioner = data::makePartitioner(c.data.partition);
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
  rc.validate();
  // Its training shard (the same split every client computes, from the labels) and an IID share of
  // the test set: only those examples are kept, never the whole data set. A shard
  // drawn with replacement may repeat an example: the file's example is kept once and the view
  // names it as often as the shard does.
  std::vector<size_t> train_shard, test_shard;
  const auto shard = [&](const data::Partitioner& p, std::vector<size_t>& out) {
    return [&p, &c, &out](const std::vector<uint8_t>& labels, uint32_t classes) {
      out = p.split(labels, classes, c.data.num_clients, c.model.seed)[c.client.id];
      return out;
    };
  };
  const auto iid = data::makePartitioner("iid");
  const data::LoadedData loaded = data::loadDataSubset(
      c.data.source, shard(*partitioner, train_shard), shard(*iid, test_shard));
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
