// starling-client: one lightweight client of a federation (no LibTorch; runs on arm64 edge
// devices). It trains an Eigen model on its own data, compresses its update with its own
// error-feedback state (persisted in --state.file), and talks to a starling-server over ZeroMQ
// with CurveZMQ. For the demo federation its data is one shard of Fashion-MNIST, chosen by its
// id among --data.num_clients with the partitioner and seed the other clients use.
#include <algorithm>
#include <cstdio>

#include "apps/common.h"
#include "client/runtime.h"
#include "client/trainer.h"
#include "core/error.h"
#include "data/idx.h"
#include "data/partition.h"

using namespace starling;

namespace {

struct Config {
  std::string server = "tcp://127.0.0.1:7700";
  uint64_t id = 0;
  apps::NetOptions net;
  std::string model = "softmax";
  std::string data_dir = data::kDefaultFashionMnistDir;
  size_t num_clients = 10;
  std::string partition = "iid";
  uint64_t seed = 1;
  std::string state_file;
  uint32_t delay_ms = 0;
  std::string log_level = "info";
};

int runClient(const Config& c) {
  auto log = apps::makeLogger("client-" + std::to_string(c.id), c.log_level, c.net.insecure);
  const auto partitioner = data::makePartitioner(c.partition);
  client::RuntimeConfig rc;
  rc.server = c.server;
  rc.client_id = c.id;
  rc.security = c.net.security(/*server_side=*/false, /*needs_upstream=*/true);
  rc.limits = c.net.limits();
  rc.state_file = c.state_file;
  rc.delay_ms = c.delay_ms;
  rc.validate();
  STARLING_CHECK_ARG(c.id < c.num_clients, "client.id ", c.id, " must be below data.num_clients ", c.num_clients);
  // Its training shard (the same split every client computes, from the labels) and an IID share of
  // the test set: only those examples are kept, never the whole data set (issue 20). A shard
  // drawn with replacement may repeat an example: the file's example is kept once and the view
  // names it as often as the shard does.
  std::vector<size_t> train_shard, test_shard;
  const auto shard = [&](const data::Partitioner& p, std::vector<size_t>& out) {
    return [&p, &c, &out](const std::vector<uint8_t>& labels, uint32_t classes) {
      out = p.split(labels, classes, c.num_clients, c.seed)[c.id];
      return out;
    };
  };
  const auto iid = data::makePartitioner("iid");
  const data::Dataset train =
      data::loadFashionMnistSubset(c.data_dir, "train", shard(*partitioner, train_shard));
  const data::Dataset test =
      data::loadFashionMnistSubset(c.data_dir, "t10k", shard(*iid, test_shard));
  const std::vector<size_t> train_idx = data::subsetPositions(train_shard),
                            test_idx = data::subsetPositions(test_shard);
  auto trainer = client::makeTrainer(c.model, train);
  const client::DataView tv{&train, train_idx}, ev{&test, test_idx};
  log->info("model {} | {} training and {} test examples | server {}", trainer->spec(), tv.size(), ev.size(), c.server);
  transport::Context ctx;
  client::ClientRuntime runtime(ctx, rc, *trainer, tv, ev, log);
  apps::installStopHandlers();
  const bool finished = runtime.run(apps::stopFlag());
  const auto& s = runtime.stats();
  log->info("{}: {} tasks, {} updates ({} resent), up {:.1f} KB, down {:.1f} KB", finished ? "done" : "stopped", s.tasks,
            s.updates_sent, s.resent, s.uplink_bytes / 1024.0, s.downlink_bytes / 1024.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  apps::Options o("starling-client",
                  "starling-client: a lightweight Starling client (Eigen models, no LibTorch).\n"
                  "Every key can be set in a TOML file (--config) or on the command line (which wins).");
  o.add("client.server", &c.server, "the server (root or aggregator) endpoint");
  o.add("client.id", &c.id, "this client's id (its key's id on the server's allow-list)", 0, ~0ull);
  c.net.add(o);
  o.add("model.spec", &c.model, "model spec (must match the server's):" + client::trainers().help());
  o.add("data.dir", &c.data_dir, "folder with the Fashion-MNIST IDX .gz files (Debian package dataset-fashion-mnist)");
  o.add("data.num_clients", &c.num_clients, "number of shards the data set is split into", 1, 60000);
  o.add("data.partition", &c.partition, "how the data set is split:" + data::partitioners().help());
  o.add("data.seed", &c.seed, "seed of the split (the same for every client)", 0, ~0ull);
  o.add("state.file", &c.state_file, "file keeping the compressor state across restarts (written atomically)");
  o.add("client.delay_ms", &c.delay_ms, "wait this long before answering each training task (simulates a slow device)",
        0, 3600000);
  o.add("log.level", &c.log_level, "trace, debug, info, warn, error");
  if (const int rc = o.parse(argc, argv); rc >= 0) return rc;
  try {
    return runClient(c);
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "starling-client: %s\n", e.what());
    return 2;
  }
}
