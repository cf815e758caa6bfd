// starling-demo: a real federated training on Fashion-MNIST with compressed updates.
//
// A softmax-regression model (784 x 10 + 10), N clients holding IID or Dirichlet label-skewed
// shards of the training set. Each round every client trains locally from the global model,
// compresses its update (client - global) with error feedback, and encodes it on the wire; the
// server decodes each message with the hostile-input decoder, aggregates through the aggregation
// library, applies the server optimizer, and evaluates on the test set. Everything the
// federated pipeline does here is Starling's library code; only the tiny model is demo code
// (the LibTorch simulator will replace it).
#include <CLI/CLI.hpp>
#include <Eigen/Core>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>

#include "aggregation/aggregator.h"
#include "aggregation/lowrank_round.h"
#include "aggregation/server_optimizer.h"
#include "compression/lowrank.h"
#include "compression/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "examples/fmnist.h"
#include "protocol/codec.h"

using namespace starling;
namespace cz = starling::compression;
namespace ag = starling::aggregation;
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

struct Options {
  std::string data_dir = examples::kDefaultFashionMnistDir;
  size_t clients = 10;
  size_t rounds = 20;
  size_t local_epochs = 1;
  size_t batch = 32;
  double lr = 0.1;
  std::string compressor = "topk:density=0.05";
  std::string aggregator = "fedavg";
  std::string server_opt = "fedavg";
  double dirichlet = 0.0;  // 0 = IID
  uint64_t seed = 1;
};

double gammaSample(RngStream& r, double a) {  // Marsaglia-Tsang
  if (a < 1.0) return gammaSample(r, a + 1.0) * std::pow(std::max(r.uniform(), 1e-300), 1.0 / a);
  const double d = a - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = r.normal();
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = r.uniform();
    if (u < 1 - 0.0331 * x * x * x * x || std::log(std::max(u, 1e-300)) < 0.5 * x * x + d * (1 - v + std::log(v)))
      return d * v;
  }
}

// Indices of each client's shard: IID (shuffled, equal) or per-class Dirichlet(alpha) proportions.
std::vector<std::vector<size_t>> partition(const examples::Dataset& d, const Options& o) {
  RngStream r(StreamKey{o.seed, 0, kAnyClient, StreamPurpose::kDataPartition, 0});
  std::vector<std::vector<size_t>> shards(o.clients);
  if (o.dirichlet <= 0) {
    std::vector<size_t> idx(d.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), r);
    for (size_t i = 0; i < idx.size(); ++i) shards[i % o.clients].push_back(idx[i]);
    return shards;
  }
  for (uint8_t c = 0; c < 10; ++c) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < d.size(); ++i)
      if (d.labels[i] == c) idx.push_back(i);
    std::shuffle(idx.begin(), idx.end(), r);
    std::vector<double> p(o.clients);
    double total = 0;
    for (double& x : p) total += (x = gammaSample(r, o.dirichlet));
    size_t start = 0;
    double acc = 0;
    for (size_t k = 0; k < o.clients; ++k) {
      acc += p[k] / total;
      const size_t end = k + 1 == o.clients ? idx.size() : static_cast<size_t>(acc * static_cast<double>(idx.size()));
      for (size_t i = start; i < end; ++i) shards[k].push_back(idx[i]);
      start = std::max(start, end);
    }
  }
  return shards;
}

// One local epoch pass of minibatch SGD on softmax regression; returns the mean loss.
double trainLocal(const examples::Dataset& d, const std::vector<size_t>& shard, std::vector<float>& params,
                  const Options& o, RngStream& rng) {
  const Eigen::Index f = static_cast<Eigen::Index>(d.features());
  Eigen::Map<RowMatrix> w(params.data(), 10, f);
  Eigen::Map<Eigen::VectorXf> b(params.data() + 10 * f, 10);
  std::vector<size_t> order = shard;
  double loss = 0;
  size_t seen = 0;
  RowMatrix x(static_cast<Eigen::Index>(o.batch), f), g;
  for (size_t e = 0; e < o.local_epochs; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t s = 0; s < order.size(); s += o.batch) {
      const size_t n = std::min(o.batch, order.size() - s);
      x.resize(static_cast<Eigen::Index>(n), f);
      for (size_t i = 0; i < n; ++i)
        x.row(static_cast<Eigen::Index>(i)) = Eigen::Map<const Eigen::RowVectorXf>(&d.images[order[s + i] * d.features()], f);
      RowMatrix logits = (x * w.transpose()).rowwise() + b.transpose();
      for (Eigen::Index i = 0; i < logits.rows(); ++i) {
        const float mx = logits.row(i).maxCoeff();
        logits.row(i) = (logits.row(i).array() - mx).exp();
        const float z = logits.row(i).sum();
        logits.row(i) /= z;
        const uint8_t y = d.labels[order[s + static_cast<size_t>(i)]];
        loss -= std::log(std::max(logits(i, y), 1e-12f));
        logits(i, y) -= 1.0f;
      }
      seen += n;
      const float scale = static_cast<float>(o.lr / static_cast<double>(n));
      w.noalias() -= scale * (logits.transpose() * x);
      b -= scale * logits.colwise().sum().transpose();
    }
  }
  return loss / static_cast<double>(std::max<size_t>(seen, 1));
}

double accuracy(const examples::Dataset& d, const std::vector<float>& params) {
  const Eigen::Index f = static_cast<Eigen::Index>(d.features());
  Eigen::Map<const RowMatrix> w(params.data(), 10, f);
  Eigen::Map<const Eigen::VectorXf> b(params.data() + 10 * f, 10);
  Eigen::Map<const RowMatrix> x(d.images.data(), static_cast<Eigen::Index>(d.size()), f);
  RowMatrix logits = (x * w.transpose()).rowwise() + b.transpose();
  size_t correct = 0;
  for (Eigen::Index i = 0; i < logits.rows(); ++i) {
    Eigen::Index arg;
    logits.row(i).maxCoeff(&arg);
    correct += static_cast<size_t>(arg) == d.labels[static_cast<size_t>(i)];
  }
  return static_cast<double>(correct) / static_cast<double>(d.size());
}

int run(const Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::printf("starling-demo: loading Fashion-MNIST from %s\n", o.data_dir.c_str());
  const examples::Dataset train = examples::loadFashionMnist(o.data_dir, "train");
  const examples::Dataset test = examples::loadFashionMnist(o.data_dir, "t10k");
  ParamLayout layout;
  layout.add("fc.weight", {10, static_cast<int64_t>(train.features())});
  layout.add("fc.bias", {10});

  auto compressor = cz::makeCompressor(o.compressor);
  const bool acp = compressor->name() == "acpsgd";
  const auto agg_opts = ag::AggregatorOptions::parse(o.aggregator);
  if (acp && !agg_opts.streaming())
    STARLING_THROW(ConfigError, "acpsgd aggregates in factor space and needs --aggregator fedavg");
  auto server_opt = ag::makeServerOptimizer(o.server_opt, layout.numel());
  const auto shards = partition(train, o);
  std::vector<cz::ClientState> states;
  for (size_t c = 0; c < o.clients; ++c) states.push_back(compressor->initialState(layout));
  cz::SharedFactors shared;
  if (acp) shared = cz::initialSharedFactors(layout, dynamic_cast<cz::AcpSgdCompressor&>(*compressor).options(), o.seed);

  std::printf("model: softmax regression, %zu parameters; %zu clients (%s), %zu rounds\n", layout.numel(), o.clients,
              o.dirichlet > 0 ? ("Dirichlet " + std::to_string(o.dirichlet)).c_str() : "IID", o.rounds);
  std::printf("compressor %s | aggregator %s | server optimizer %s\n\n", compressor->spec().c_str(),
              o.aggregator.c_str(), server_opt->options().spec().c_str());
  std::vector<float> global(layout.numel(), 0.0f);
  const size_t dense_bytes = [&] {
    cz::Update u;
    u.layout_fingerprint = layout.fingerprint();
    for (size_t t = 0; t < layout.size(); ++t) u.tensors.push_back(cz::DenseF32{std::vector<float>(layout[t].numel)});
    return protocol::encodedSize(u);
  }();
  size_t total_bytes = 0;
  double acc = accuracy(test, global);
  std::printf("round   0/%zu  test accuracy %5.1f%%\n", o.rounds, 100 * acc);
  for (size_t round = 1; round <= o.rounds; ++round) {
    auto agg = ag::makeAggregator(agg_opts, layout, acp ? &shared : nullptr);
    std::optional<ag::AcpSgdRound> acp_round;
    if (acp) acp_round.emplace(layout, shared);
    size_t round_bytes = 0;
    for (size_t c = 0; c < o.clients; ++c) {
      if (shards[c].empty()) continue;
      std::vector<float> local = global;
      RngStream rng(StreamKey{o.seed, round, c, StreamPurpose::kTraining, 0});
      const double loss = trainLocal(train, shards[c], local, o, rng);
      for (size_t i = 0; i < local.size(); ++i) local[i] -= global[i];  // the update: client - global
      cz::Update u;
      u.layout_fingerprint = layout.fingerprint();
      u.round = round;
      u.client_id = c;
      u.num_examples = shards[c].size();
      u.tensors = compressor->compress(layout, local, states[c], cz::RoundContext{o.seed, round, c, &shared});
      u.metrics = {{"train_loss", loss}};
      const auto wire = protocol::encodeUpdate(u);  // what a deployed client would send
      round_bytes += wire.size();
      const cz::Update received = protocol::decodeUpdate(wire, layout, acp ? &shared : nullptr);
      if (acp) acp_round->add(received, static_cast<double>(received.num_examples));
      else agg->add(received);
    }
    std::vector<float> delta;
    std::map<std::string, double> metrics;
    if (acp) {
      cz::SharedFactors next;
      delta = acp_round->finish(&next);
      metrics = acp_round->partial().metricMeans();
      shared = std::move(next);
    } else {
      auto r = agg->finish();
      delta = std::move(r.delta);
      metrics = std::move(r.metrics);
    }
    server_opt->step(global, delta);
    total_bytes += round_bytes;
    acc = accuracy(test, global);
    const double per_client = static_cast<double>(round_bytes) / static_cast<double>(o.clients);
    std::printf("round %3zu/%zu  train loss %.4f  test accuracy %5.1f%%  uplink %7.1f KB/client (dense %.1f KB, %.1fx less)\n",
                round, o.rounds, metrics["train_loss"], 100 * acc, per_client / 1024.0, dense_bytes / 1024.0,
                static_cast<double>(dense_bytes) / per_client);
    std::fflush(stdout);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\nfinal test accuracy %.1f%% after %zu rounds; uplink %.2f MB in total (dense would be %.2f MB); %.1f s\n",
              100 * acc, o.rounds, total_bytes / 1e6, static_cast<double>(dense_bytes * o.clients * o.rounds) / 1e6, secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "starling-demo: federated training of a softmax-regression model on Fashion-MNIST with compressed\n"
      "updates. Every client's update is compressed (with error feedback), encoded on the wire, decoded by\n"
      "the server's hostile-input decoder, aggregated and applied by the server optimizer."};
  app.add_option("--data-dir", o.data_dir, "folder with the Fashion-MNIST IDX .gz files")->capture_default_str();
  app.add_option("--clients", o.clients, "number of clients")->capture_default_str()->check(CLI::Range(1, 10000));
  app.add_option("--rounds", o.rounds, "federated rounds")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--local-epochs", o.local_epochs, "local epochs per round")->capture_default_str()->check(CLI::Range(1, 100));
  app.add_option("--batch", o.batch, "local minibatch size")->capture_default_str()->check(CLI::Range(1, 60000));
  app.add_option("--lr", o.lr, "client learning rate")->capture_default_str()->check(CLI::Range(1e-6, 10.0));
  std::string compressors;
  for (const auto& c : cz::compressorCatalog()) compressors += "\n  " + c.name + ": " + c.summary;
  app.add_option("--compressor", o.compressor, "compressor spec NAME[:key=value,...]; registered:" + compressors)
      ->capture_default_str();
  app.add_option("--aggregator", o.aggregator,
                 "aggregation rule: fedavg, median, trimmed_mean[:beta=], krum[:f=], multikrum[:f=,m=], bulyan[:f=];\n"
                 "options weight=examples|uniform, clip=<L2 norm>")
      ->capture_default_str();
  app.add_option("--server-opt", o.server_opt,
                 "server optimizer: fedavg, fedavgm, fedadagrad, fedadam, fedyogi [:eta=,beta1=,beta2=,tau=]")
      ->capture_default_str();
  app.add_option("--dirichlet", o.dirichlet, "label skew: Dirichlet alpha per class (0 = IID)")
      ->capture_default_str()->check(CLI::Range(0.0, 1e6));
  app.add_option("--seed", o.seed, "run seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "starling-demo: %s\n", e.what());
    return 2;
  }
}
