// starling-demo: a real federated training on Fashion-MNIST with compressed updates, driven by the
// generic round loop (aggregation/round_scheme.h): the same loop runs every compressor (one phase,
// or PowerSGD's two) and every aggregation rule, with no compressor names and no casts.
//
// Each round the server samples clients; each client trains locally from the global model with
// the shared client algorithm (client/algorithm.h), compresses its update with its own error
// feedback state, and encodes it on the wire; the server decodes each message into views over
// the bytes (protocol::Decoder), validates it against the round's bounds and adds it
// (PhaseAggregator::add), finishes the round, applies the server optimizer and evaluates on the
// test set. Only the command line is demo code.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>

#include "aggregation/round_scheme.h"
#include "aggregation/server_optimizer.h"
#include "client/algorithm.h"
#include "client/trainer.h"
#include "compression/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/idx.h"
#include "data/partition.h"
#include "data/sampling.h"
#include "data/stats.h"
#include "protocol/codec.h"

using namespace starling;
namespace ag = starling::aggregation;
namespace cz = starling::compression;

namespace {

struct Options {
  std::string data_dir = data::kDefaultFashionMnistDir;
  std::string model = "softmax";
  size_t clients = 10;
  double fraction = 1.0;
  size_t rounds = 20;
  client::FitConfig fit;
  std::string compressor = "topk:density=0.05";
  std::string aggregator = "fedavg";
  std::string server_opt = "fedavg";
  std::string partition = "iid";
  uint64_t seed = 1;
  bool diagnostics = false;
  ag::ValidationBounds bounds;
};

// The clients of round r: ceil(fraction * n) of them, drawn from the round's sampling stream.
std::vector<uint64_t> sampleClients(size_t n, double fraction, uint64_t seed, uint64_t round) {
  std::vector<uint64_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  const auto m = static_cast<size_t>(std::ceil(fraction * static_cast<double>(n) - 1e-9));
  if (m >= n) return ids;
  RngStream rng(StreamKey{seed, round, kAnyClient, StreamPurpose::kClientSampling, 0});
  data::shuffleInPlace(std::span<uint64_t>(ids), rng);
  ids.resize(std::max<size_t>(m, 1));
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

int run(const Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  // Every spec and bound is checked before the data set is read, so a typo fails at once.
  cz::makeCompressor(o.compressor);
  ag::makeRule(o.aggregator);
  ag::makeServerOptimizer(o.server_opt, 1);
  data::makePartitioner(o.partition);
  o.bounds.validate();
  std::printf("starling-demo: loading Fashion-MNIST from %s\n", o.data_dir.c_str());
  const data::Dataset train = data::loadFashionMnist(o.data_dir, "train");
  const data::Dataset test = data::loadFashionMnist(o.data_dir, "t10k");
  STARLING_CHECK_ARG(o.clients <= train.size(), "--clients ", o.clients, " exceeds the ",
                     train.size(), " training examples");
  auto trainer = client::makeTrainer(o.model, train);
  const auto layout = std::make_shared<const ParamLayout>(trainer->layout());

  ag::RoundSchemeOptions so;
  so.compressor = o.compressor;
  so.rule = o.aggregator;
  so.run_seed = o.seed;
  so.bounds = o.bounds;
  so.metrics = {"train_loss", "train_accuracy"};
  // Error feedback's diagnostics travel only when asked for: they cost bytes on the uplink.
  if (o.diagnostics)
    so.metrics.insert(so.metrics.end(), {"ef_gain", "ef_residual_ratio", "ef_residual_age"});
  const ag::RoundScheme scheme(layout, so);
  auto server_opt = ag::makeServerOptimizer(o.server_opt, layout->numel());

  const auto partitioner = data::makePartitioner(o.partition);
  const data::Partition shards =
      partitioner->split(train.labels, train.num_classes, o.clients, o.seed);
  std::printf("model %s: %zu parameters | %s\n", trainer->spec().c_str(), layout->numel(),
              data::summary(data::partitionStats(train.labels, train.num_classes, shards)).c_str());
  std::printf("compressor %s (%u phase%s per round) | aggregation %s | server optimizer %s\n",
              scheme.compressor().spec().c_str(), scheme.phases(), scheme.phases() == 1 ? "" : "s",
              scheme.rule().spec().c_str(), server_opt->options().spec().c_str());
  std::printf(
      "bounds: %s | %zu clients, %.0f%% per round, %zu rounds, %u local epoch(s), batch %u, lr "
      "%g\n\n",
      o.bounds.describe().c_str(), o.clients, 100 * o.fraction, o.rounds, o.fit.epochs,
      o.fit.batch_size, o.fit.lr);

  client::ClientAlgorithm algorithm(scheme.compressor(), *trainer, o.fit);
  std::vector<ClientState> states;
  states.reserve(o.clients);
  for (size_t c = 0; c < o.clients; ++c) states.emplace_back(layout->fingerprint());
  protocol::Decoder decoder(*layout);

  std::vector<float> global(layout->numel());
  trainer->initParameters(global, o.seed);
  std::vector<size_t> all_test(test.size());
  std::iota(all_test.begin(), all_test.end(), 0);
  const client::DataView test_view{&test, all_test};
  const size_t dense_bytes = [&] {
    cz::Update u;
    u.header.layout_fingerprint = layout->fingerprint();
    for (const auto& t : layout->tensors())
      u.tensors.push_back(cz::DenseF32{std::vector<float>(t.numel)});
    return protocol::encodedSize(u);
  }();

  ag::RoundCarry carry = scheme.initialCarry();
  std::vector<uint64_t> last_change(o.diagnostics ? layout->numel() : 0,
                                    0);  // round 0: the initial model
  size_t total_bytes = 0, total_updates = 0, skipped = 0;
  double acc = trainer->evaluate(global, test_view).accuracy;
  std::printf("round %4d/%zu  test accuracy %5.1f%%\n", 0, o.rounds, 100 * acc);
  for (uint64_t r = 1; r <= o.rounds; ++r) {
    const auto sampled = sampleClients(o.clients, o.fraction, o.seed, r);
    auto round = scheme.begin(r, carry);
    size_t round_bytes = 0, rejected = 0;
    std::vector<uint64_t> active;  // clients taking part in the current phase
    for (uint64_t c : sampled)
      if (!shards[c].empty()) active.push_back(c);
    for (;;) {
      const cz::PhaseBroadcast& b = round->broadcast();
      std::vector<uint64_t> accepted;  // only they continue into the next phase
      for (uint64_t c : active) {
        const client::DataView view{&train, shards[c]};
        const client::TurnRequest turn{b, global, so.metrics};
        client::PhaseResult res = algorithm.takeTurn(turn, c, view, states[c]);
        const std::vector<uint8_t> wire =
            protocol::encodeUpdate(res.update);  // what a client sends
        round_bytes += wire.size();
        try {
          // What the server does with it; it knows each client's data size from registration.
          round->current().add(decoder.decodeUpdate(wire), ag::ClientLimits{shards[c].size()});
          accepted.push_back(c);
        } catch (const InputError& e) {
          ++rejected;
          std::fprintf(stderr, "round %llu: update of client %llu rejected: %s\n",
                       static_cast<unsigned long long>(r), static_cast<unsigned long long>(c),
                       e.what());
        }
      }
      if (round->lastPhase() || accepted.empty()) break;
      round->nextPhase();
      active = std::move(accepted);
    }
    ag::RoundResult result;
    try {
      result = round->finish();
    } catch (const InvalidArgument& e) {
      ++skipped;
      std::printf("round %4llu/%zu  skipped: %s\n", static_cast<unsigned long long>(r), o.rounds,
                  e.what());
      continue;
    }
    server_opt->step(global, result.delta);
    // How many rounds each coordinate the round changed had waited since its previous change.
    double waited = 0;
    size_t changed = 0;
    if (o.diagnostics) {
      for (size_t i = 0; i < result.delta.size(); ++i)
        if (result.delta[i] != 0.0f) {
          waited += static_cast<double>(r - last_change[i]);
          last_change[i] = r;
          ++changed;
        }
    }
    carry = std::move(result.next);
    total_bytes += round_bytes;
    total_updates += sampled.size();
    acc = trainer->evaluate(global, test_view).accuracy;
    const double per_client =
        static_cast<double>(round_bytes) / static_cast<double>(sampled.size());
    // Error feedback's diagnostics (docs/compression.md): what was sent against the fresh update on
    // the same coordinates, and the residual kept against the update.
    std::string ef;
    if (result.metrics.count("ef_gain"))
      ef = "  EF gain " + fmt(result.metrics["ef_gain"]) + ", residual/update " +
           fmt(result.metrics["ef_residual_ratio"]);
    if (o.diagnostics && changed > 0)
      ef += ", " +
            fmt(100.0 * static_cast<double>(changed) / static_cast<double>(result.delta.size())) +
            "% of the model changed after waiting " + fmt(waited / static_cast<double>(changed)) +
            " rounds";
    std::printf(
        "round %4llu/%zu  train loss %.4f  test accuracy %5.1f%%  uplink %7.1f KB/client (dense "
        "%.1f KB, %.1fx less)%s%s\n",
        static_cast<unsigned long long>(r), o.rounds, result.metrics["train_loss"], 100 * acc,
        per_client / 1024.0, static_cast<double>(dense_bytes) / 1024.0,
        static_cast<double>(dense_bytes) / per_client, ef.c_str(),
        rejected ? (" [" + std::to_string(rejected) + " rejected]").c_str() : "");
    std::fflush(stdout);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "\nfinal test accuracy %.1f%% after %zu rounds (%zu skipped); uplink %.2f MB in total (dense "
      "would be "
      "%.2f MB); %.1f s\n",
      100 * acc, o.rounds, skipped, static_cast<double>(total_bytes) / 1e6,
      static_cast<double>(dense_bytes * total_updates) / 1e6, secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "starling-demo: federated training on Fashion-MNIST with compressed updates. Every client's "
      "update is\n"
      "compressed with its own error-feedback state, encoded on the wire, decoded by the server "
      "into views over\n"
      "the bytes, validated against the round's bounds, aggregated, and applied by the server "
      "optimizer."};
  app.add_option(
         "--data-dir", o.data_dir,
         "folder with the Fashion-MNIST IDX .gz files (Debian package dataset-fashion-mnist)")
      ->capture_default_str();
  app.add_option("--model", o.model, "model spec:" + client::trainers().help())
      ->capture_default_str();
  app.add_option("--clients", o.clients, "number of clients")
      ->capture_default_str()
      ->check(CLI::Range(1, 60000));
  app.add_option("--fraction", o.fraction, "fraction of the clients sampled each round")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  app.add_option("--rounds", o.rounds, "federated rounds")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--local-epochs", o.fit.epochs, "local epochs per round")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--batch", o.fit.batch_size, "local minibatch size")
      ->capture_default_str()
      ->check(CLI::Range(1, 60000));
  app.add_option("--lr", o.fit.lr, "client learning rate")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 10.0));
  app.add_option("--compressor", o.compressor,
                 "compressor spec NAME[:key=value,...]:" + cz::compressors().help())
      ->capture_default_str();
  app.add_option("--aggregator", o.aggregator,
                 "aggregation rule spec:" + ag::aggregationRules().help())
      ->capture_default_str();
  app.add_option("--server-opt", o.server_opt,
                 "server optimizer spec:" + ag::serverOptimizers().help())
      ->capture_default_str();
  app.add_option("--partition", o.partition,
                 "how the training set is split among clients:" + data::partitioners().help())
      ->capture_default_str();
  app.add_option("--seed", o.seed, "run seed (data split, initial model, sampling, compression)")
      ->capture_default_str();
  app.add_flag("--diagnostics", o.diagnostics,
               "clients also report error feedback's diagnostics (docs/compression.md), printed "
               "per round: the EF gain "
               "(what was sent against the client's own displacement on the same coordinates), "
               "residual/update, and how many "
               "rounds the coordinates the round changed had waited");
  app.add_option("--max-abs", o.bounds.max_abs_value,
                 "reject an update with a decoded |value| above this")
      ->capture_default_str();
  app.add_option("--max-norm", o.bounds.max_update_norm,
                 "reject an update with an L2 norm above this")
      ->capture_default_str();
  app.add_option("--max-examples", o.bounds.max_examples,
                 "reject an update claiming more examples than this")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "starling-demo: %s\n", e.what());
    return 2;
  }
}
