// starling-split: split fine-tuning between an edge device and the cloud (docs/split.md).
//
//   --role pretrain   trains the whole model on the public part of Fashion-MNIST and writes its
//                     parameters to split.pretrained (the project's own pre-trained checkpoint)
//   --role inproc     fine-tunes it split at split.cut on the private part, edge and cloud in one
//                     process: every activation and gradient goes through its codec's encoding,
//                     and the bytes that would cross are counted per epoch
//   --role cloud      serves the top part over ZeroMQ (split/net.h) to edge devices, CURVE by
//   default
//   --role edge       fine-tunes its bottom part on its shard of the private part through the cloud
//
// Public and private parts (data.shift): "classes" (public: classes 0-4, private: classes 5-9,
// both splits), "noise" (public: the clean images, private: the same task with Gaussian noise of
// data.noise added) or "rotate" (private: the images turned 90 degrees).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "apps/common.h"
#include "apps/options.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "data/idx.h"
#include "split/net.h"
#include "split/trainer.h"
#include "torch_trainer/device.h"
#include "torch_trainer/threads.h"
#include "torch_trainer/torch_trainer.h"

using namespace starling;

namespace {

constexpr uint32_t kMagic = 0x53504c54;  // "TLPS" little-endian: a pre-trained checkpoint
constexpr uint32_t kVersion = 1;

enum class Role { kPretrain, kInproc, kCloud, kEdge };
enum class Shift { kClasses, kNoise, kRotate };
const apps::Spellings<Shift>& shifts() {
  static const apps::Spellings<Shift> t{
      {"classes", Shift::kClasses}, {"noise", Shift::kNoise}, {"rotate", Shift::kRotate}};
  return t;
}
const char* name(Shift x) { return apps::spellingOf(shifts(), x); }

struct Config {
  Role role = Role::kInproc;
  std::string device = "auto";
  std::string data_dir = data::kDefaultFashionMnistDir;
  Shift shift = Shift::kClasses;
  double noise = 0.5;
  uint64_t max_train = 0, max_test = 0;
  std::string model = "cnn";
  std::string cut = "conv2";
  uint32_t weight_rank = 0;
  bool skip = true;
  uint64_t edges = 1;
  uint64_t seed = 1;
  std::string pretrained = "split-pretrained.bin";
  uint32_t pretrain_epochs = 1;
  uint32_t epochs = 3;
  split::SplitTrainConfig train;
  std::string metrics;
  int threads = 2;
  apps::Settings::Net net;
  std::string bind = "tcp://127.0.0.1:5700";
  std::string cloud = "tcp://127.0.0.1:5700";
  std::string checkpoint = "split-cloud.bin";
  uint64_t checkpoint_every = 50;
  uint64_t edge_timeout_ms = 60000;
  uint64_t exit_after = 0;
  uint32_t splitfed_edges = 0;
  uint64_t max_sessions = 64;
  uint64_t max_batch = 1024;
  uint64_t splitfed_wait_ms = 300000;
  uint64_t edge_id = 1;
  uint64_t shard = 0;
  uint64_t step_timeout_ms = 10000;
  uint32_t tries = 6;
  std::string log_level = "info";
};

// The examples of `d` in the public (private = false) or private part, at most `max` (0: all).
std::vector<size_t> part(const data::Dataset& d, const Config& c, bool priv, uint64_t max) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < d.size(); ++i) {
    if (c.shift == Shift::kClasses && (d.labels[i] >= 5) != priv) continue;
    idx.push_back(i);
    if (max && idx.size() == max) break;
  }
  return idx;
}

// The private part's distribution shift applied to a copy of the data set.
data::Dataset shifted(const data::Dataset& d, const Config& c, uint64_t stream) {
  data::Dataset s = d;
  if (c.shift == Shift::kNoise) {
    RngStream rng(StreamKey{c.seed, stream, kAnyClient, StreamPurpose::kDataPartition, 1});
    for (float& x : s.images) x += static_cast<float>(c.noise * rng.normal());
  } else if (c.shift == Shift::kRotate) {
    const size_t r = d.rows, k = d.cols, f = d.features();
    STARLING_CHECK_ARG(r == k, "data.shift rotate needs square images, got ", r, "x", k);
    for (size_t e = 0; e < d.size(); ++e)
      for (size_t i = 0; i < r; ++i)
        for (size_t j = 0; j < k; ++j)
          s.images[e * f + j * r + (r - 1 - i)] = d.images[e * f + i * k + j];
  }
  return s;
}

void savePretrained(const std::string& path, const ParamLayout& layout, std::span<const float> p) {
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  w.u32(kMagic);
  w.u32(kVersion);
  w.u64(layout.fingerprint());
  w.floats(p);
  writeFileAtomic(path, bytes);
}

std::vector<float> loadPretrained(const std::string& path, const ParamLayout& layout) {
  if (!std::filesystem::exists(path))
    STARLING_THROW(IoError, "split.pretrained '", path,
                   "' does not exist: write it first with --role pretrain");
  const auto bytes = readFile(path, uint64_t{4} << 30);
  ByteReader r(bytes, "pre-trained checkpoint " + path);
  if (r.u32() != kMagic) r.fail("not a Starling pre-trained checkpoint");
  if (const uint32_t v = r.u32(); v != kVersion) r.fail("version ", v, " is not ", kVersion);
  if (r.u64() != layout.fingerprint())
    r.fail("it is of another model (layout fingerprint differs)");
  std::vector<float> p;
  r.floats(p);
  r.finish();
  if (p.size() != layout.numel()) r.fail(p.size(), " parameters, the model has ", layout.numel());
  for (float x : p)
    if (!std::isfinite(x)) r.fail("a parameter is not finite");
  return p;
}

// --role cloud: the top part served over ZeroMQ until SIGINT / SIGTERM (or cloud.exit_after
// goodbyes); its checkpoint is loaded at start when it exists.
int runCloud(Config& c, split::SplitModel& sm) {
  apps::installStopHandlers();
  auto log = apps::makeLogger("split-cloud", c.log_level, c.net.insecure);
  const uint64_t fp = split::sessionFingerprint(sm, c.train.up, c.train.down);
  std::vector<float> top;
  uint64_t steps_done = 0;
  if (auto ck = split::loadCloudCheckpoint(c.checkpoint, fp, sm.top().numel())) {
    top = std::move(ck->top);
    steps_done = ck->steps;
    log->info("resumed from {} after {} training steps", c.checkpoint, steps_done);
  } else {
    top = sm.cutParameters(loadPretrained(c.pretrained, sm.full())).second;
    log->info("the top part from the pre-trained model {}", c.pretrained);
  }
  split::SplitCloud cloud(sm, std::move(top), c.train.down, c.train.lr,
                          split::SplitCloud::Limits{.max_batch = c.max_batch, .max_abs = 1e6});
  split::CloudServerConfig cfg;
  cfg.bind = c.bind;
  cfg.security = apps::security(c.net, true, false);
  cfg.limits = apps::transportLimits(c.net);
  cfg.fingerprint = fp;
  cfg.up = c.train.up;
  cfg.down = c.train.down;
  cfg.edge_timeout = std::chrono::milliseconds(c.edge_timeout_ms);
  cfg.checkpoint = c.checkpoint;
  cfg.checkpoint_every = c.checkpoint_every;
  cfg.steps_done = steps_done;
  cfg.splitfed_edges = c.splitfed_edges;
  cfg.max_sessions = c.max_sessions;
  cfg.splitfed_wait = std::chrono::milliseconds(c.splitfed_wait_ms);
  cfg.log = [&](const std::string& s) { log->info("{}", s); };
  transport::Context ctx;
  split::SplitCloudServer server(ctx, cloud, cfg);
  log->info("{}; serving on {} (up {}, down {}{}), the top part on {}", sm.describe(),
            server.endpoint(), c.train.up, c.train.down,
            c.net.insecure ? ", INSECURE: no authentication or encryption" : ", CURVE",
            sm.cloudDevice().str());
  auto last = std::chrono::steady_clock::now();
  uint64_t last_steps = server.stats().steps;
  while (!apps::stopFlag().load() &&
         (c.exit_after == 0 || server.stats().goodbyes < c.exit_after)) {
    server.poll(std::chrono::milliseconds(200));
    const auto now = std::chrono::steady_clock::now();
    if (now - last >= std::chrono::seconds(10) && server.stats().steps != last_steps) {
      const auto& st = server.stats();
      log->info(
          "{} training steps, {} evaluation steps, {} edge(s) connected, {:.2f} ms of compute per "
          "step",
          st.steps, st.evaluations, server.sessions(),
          1e3 * st.compute_seconds /
              std::max<double>(1.0, double(st.steps - steps_done + st.evaluations)));
      last = now;
      last_steps = st.steps;
    }
  }
  server.saveCheckpoint();
  const auto& st = server.stats();
  log->info(
      "stopped after {} training steps ({} this run), {} evaluation steps; refused {}, duplicates "
      "{}, replies "
      "dropped {}, sessions timed out {}; checkpoint {}",
      st.steps, st.steps - steps_done, st.evaluations, st.refused, st.duplicates,
      st.replies_dropped, st.timed_out, c.checkpoint);
  return 0;
}

// --role edge: fine-tunes this edge's bottom part on its shard of the private part through the
// cloud.
int runEdge(Config& c, split::SplitModel& sm, const data::Dataset& priv_train,
            const std::vector<size_t>& idx, const data::Dataset& priv_test,
            const std::vector<size_t>& test_idx) {
  apps::installStopHandlers();
  auto log = apps::makeLogger("split-edge", c.log_level, c.net.insecure);
  if (c.shard >= c.edges)
    STARLING_THROW(ConfigError, "edge.shard (", c.shard, ") must be below split.edges (", c.edges,
                   ")");
  std::vector<size_t> mine;
  for (size_t i = c.shard; i < idx.size(); i += c.edges)
    mine.push_back(idx[i]);  // dealt as in --role inproc
  if (mine.empty())
    STARLING_THROW(ConfigError, "edge.shard ", c.shard, " of ", c.edges, " holds no examples");
  const auto bottom = sm.cutParameters(loadPretrained(c.pretrained, sm.full())).first;
  split::SplitEdge edge(sm, bottom, c.train.up, c.train.lr);
  split::EdgeClientConfig cfg;
  cfg.cloud = c.cloud;
  cfg.security = apps::security(c.net, false, true);
  cfg.limits = apps::transportLimits(c.net);
  cfg.edge_id = c.edge_id;
  cfg.fingerprint = split::sessionFingerprint(sm, c.train.up, c.train.down);
  cfg.up = c.train.up;
  cfg.down = c.train.down;
  cfg.step_timeout = std::chrono::milliseconds(c.step_timeout_ms);
  cfg.tries = c.tries;
  // Longer than the cloud waits (from its first bottom) for an epoch's missing edges.
  cfg.splitfed_wait = std::chrono::milliseconds(c.splitfed_wait_ms + 2 * c.step_timeout_ms);
  cfg.log = [&](const std::string& s) { log->info("{}", s); };
  transport::Context ctx;
  split::SplitEdgeClient client(ctx, edge, cfg);
  client.connect();
  std::ofstream metrics;  // opened once the cloud took us: a refused edge leaves no file behind
  if (!c.metrics.empty()) {
    metrics.open(c.metrics, std::ios::app);
    if (!metrics) STARLING_THROW(IoError, "cannot open the metrics file '", c.metrics, "'");
  }
  log->info("{}; edge {} (shard {} of {}): {} private examples, {} epoch(s), up {}, down {}",
            sm.describe(), c.edge_id, c.shard, c.edges, mine.size(), c.epochs, c.train.up,
            c.train.down);
  uint64_t up = 0, down = 0;
  for (uint32_t e = 1; e <= c.epochs && !apps::stopFlag().load(); ++e) {
    auto shown = std::chrono::steady_clock::now();
    const split::EpochRecord rec =
        split::runEdgeEpoch(client, c.train, e, c.shard, priv_train, mine, priv_test, test_idx,
                            [&](size_t done, size_t all) {
                              const auto now = std::chrono::steady_clock::now();
                              if (now - shown < std::chrono::seconds(10)) return;
                              shown = now;
                              log->info("epoch {}/{}: step {}/{}", e, c.epochs, done, all);
                            });
    up += rec.uplink_bytes;
    down += rec.downlink_bytes;
    log->info(
        "epoch {}/{}  train loss {:.4f}  private test accuracy {:.1f}%  up {:.2f} MB  down {:.2f} "
        "MB  cloud "
        "{:.2f} ms/step  {:.1f} s",
        e, c.epochs, rec.train_loss, 100 * rec.test_accuracy, rec.uplink_bytes / 1e6,
        rec.downlink_bytes / 1e6, 1e3 * rec.cloud_seconds / static_cast<double>(rec.steps),
        rec.wall_seconds);
    if (metrics) metrics << rec.json() << '\n' << std::flush;
  }
  client.bye();
  const auto& st = client.stats();
  log->info(
      "traffic: {:.2f} MB up, {:.2f} MB down (codec bytes); {:.2f} MB up, {:.2f} MB down on the "
      "wire; {} "
      "session(s), {} step(s) sent again",
      up / 1e6, down / 1e6, st.wire_up / 1e6, st.wire_down / 1e6, st.sessions, st.resent);
  return apps::stopFlag().load() ? 1 : 0;
}

int run(Config& c) {
  c.train.validate();
  c.train.seed = c.seed;
  if (c.model != "cnn" &&
      c.cut == "conv2") {  // the default names a cnn layer: take the model's middle cut
    const auto cuts = split::SplitModel::cutPoints(c.model);
    c.cut = c.model == "vit" ? "ffn2" : cuts[1];
  }
  split::SplitModel sm(c.model, c.cut, 28, 28, 10, c.weight_rank, c.skip);
  // The cloud's part (and pre-training) may run on a GPU; an edge device trains on its CPU.
  torch_trainer::Device device;
  if (c.role == Role::kEdge) {
    if (c.device.rfind("cuda", 0) == 0)
      STARLING_THROW(ConfigError, "--device ", c.device,
                     ": an edge device runs its part on the CPU; --device applies to "
                     "--role cloud, inproc (the cloud's part) and pretrain");
    if (c.device != "auto")
      torch_trainer::chooseDevice(c.device);  // refuses a setting that is none of them
  } else {
    device = torch_trainer::chooseDevice(c.device);
    if (device.cuda()) torch_trainer::useReproducibleCuda();
    sm.setCloudDevice(device);
  }
  torch_trainer::setThreads(c.threads);
  if (c.role == Role::kCloud) return runCloud(c, sm);  // no data set needed
  std::printf("starling-split: loading Fashion-MNIST from %s\n", c.data_dir.c_str());
  const data::Dataset train = data::loadFashionMnist(c.data_dir, "train");
  const data::Dataset test = data::loadFashionMnist(c.data_dir, "t10k");

  if (c.role == Role::kPretrain) {
    const auto idx = part(train, c, false, c.max_train);
    const auto test_idx = part(test, c, false, c.max_test);
    std::vector<float> p = sm.initParameters(c.seed);
    std::printf("pre-training %s on the public part (%s): %zu examples, %u epoch(s)\n",
                c.model.c_str(), name(c.shift), idx.size(), c.pretrain_epochs);
    if (c.model != "vit") {  // torch_trainer's model and trainer
      auto whole = torch_trainer::makeTorchTrainer(c.model, train, device);
      for (uint32_t e = 1; e <= c.pretrain_epochs; ++e) {
        RngStream rng(StreamKey{c.seed, e, kAnyClient, StreamPurpose::kTraining, 0});
        const client::FitConfig fit{
            .epochs = 1, .batch_size = c.train.batch_size, .lr = c.train.lr};
        const auto r = whole->fit(p, client::DataView{&train, idx}, fit, rng);
        const auto ev = whole->evaluate(p, client::DataView{&test, test_idx});
        std::printf("epoch %u/%u  train loss %.4f  public test accuracy %.1f%%\n", e,
                    c.pretrain_epochs, r.metrics.empty() ? 0.0 : r.metrics[0].value,
                    100 * ev.accuracy);
        std::fflush(stdout);
      }
    } else {  // split/'s own models: uncompressed split steps are the whole model's steps (tested)
      split::SplitModel whole(c.model, split::SplitModel::cutPoints(c.model)[0], 28, 28, 10);
      whole.setCloudDevice(device);
      split::SplitTrainConfig cfg;
      cfg.batch_size = c.train.batch_size;
      cfg.lr = c.train.lr;
      cfg.seed = c.seed;
      split::InProcessSplit run(whole, cfg, p);
      for (uint32_t e = 1; e <= c.pretrain_epochs; ++e) {
        const auto r = run.runEpoch(train, idx, &test, test_idx);
        std::printf("epoch %u/%u  train loss %.4f  public test accuracy %.1f%%\n", e,
                    c.pretrain_epochs, r.train_loss, 100 * r.test_accuracy);
        std::fflush(stdout);
      }
      p.assign(run.bottom().begin(), run.bottom().end());
      p.insert(p.end(), run.top().begin(), run.top().end());
    }
    savePretrained(c.pretrained, sm.full(), p);
    std::printf("wrote %s\n", c.pretrained.c_str());
    return 0;
  }

  // Fine-tuning, split, on the private part.
  const std::vector<float> p = loadPretrained(c.pretrained, sm.full());
  const data::Dataset priv_train = shifted(train, c, 1), priv_test = shifted(test, c, 2);
  const auto idx = part(priv_train, c, true, c.max_train);
  const auto test_idx = part(priv_test, c, true, c.max_test);
  STARLING_CHECK_ARG(c.edges <= idx.size(), "split.edges (", c.edges, ") exceeds the ", idx.size(),
                     " private examples");
  if (c.role == Role::kEdge) return runEdge(c, sm, priv_train, idx, priv_test, test_idx);
  // The private part dealt round-robin among the edge devices (each sees every class).
  std::vector<std::vector<size_t>> shards(c.edges);
  for (size_t i = 0; i < idx.size(); ++i) shards[i % c.edges].push_back(idx[i]);
  split::InProcessSplit run(sm, c.train, p, c.edges);
  std::printf(
      "%s\nfine-tuning split on the private part (%s): %zu examples on %zu edge device(s)%s, %u "
      "epoch(s), "
      "up %s, down %s%s\n",
      sm.describe().c_str(), name(c.shift), idx.size(), static_cast<size_t>(c.edges),
      c.edges > 1 && c.train.splitfed ? " (SplitFed)" : "", c.epochs, c.train.up.c_str(),
      c.train.down.c_str(), c.train.train_bottom ? "" : ", bottom frozen");
  const auto [l0, a0] = run.evaluate(priv_test, test_idx);
  std::printf("epoch 0  private test accuracy %.1f%% (the pre-trained model)\n", 100 * a0);
  (void)l0;
  std::ofstream metrics;
  if (!c.metrics.empty()) {
    metrics.open(c.metrics, std::ios::app);
    if (!metrics) STARLING_THROW(IoError, "cannot open the metrics file '", c.metrics, "'");
  }
  uint64_t up = 0, down = 0;
  for (uint32_t e = 1; e <= c.epochs; ++e) {
    const split::EpochRecord rec = run.runEpoch(priv_train, shards, &priv_test, test_idx);
    up += rec.uplink_bytes;
    down += rec.downlink_bytes;
    std::printf(
        "epoch %u/%u  train loss %.4f  private test accuracy %.1f%%  up %.2f MB  down %.2f MB  "
        "%.1f s\n",
        e, c.epochs, rec.train_loss, 100 * rec.test_accuracy, rec.uplink_bytes / 1e6,
        rec.downlink_bytes / 1e6, rec.wall_seconds);
    std::fflush(stdout);
    if (metrics) metrics << rec.json() << '\n' << std::flush;
  }
  std::printf("\ntraffic: %.2f MB up, %.2f MB down, %.2f MB in all\n", up / 1e6, down / 1e6,
              (up + down) / 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  apps::Options o(
      "starling-split",
      "starling-split: split fine-tuning between an edge device and the cloud, with compressed "
      "activations\n"
      "going up and compressed gradients coming down (docs/split.md). --role pretrain writes the\n"
      "pre-trained model; --role inproc fine-tunes it split, edge and cloud in one process, "
      "counting the\n"
      "exact bytes that would cross. Every key can be set in a TOML file (--config) or on the "
      "command line.");
  o.add("role", &c.role,
        "pretrain (write the pre-trained model), inproc (edge and cloud in one process), cloud "
        "(serve the top part "
        "over ZeroMQ) or edge (fine-tune through a cloud)",
        {{"pretrain", Role::kPretrain},
         {"inproc", Role::kInproc},
         {"cloud", Role::kCloud},
         {"edge", Role::kEdge}});
  o.add("device", &c.device,
        "where the cloud's part (--role cloud, inproc) and pre-training compute: auto (a GPU when "
        "LibTorch sees one), "
        "cpu, cuda or cuda:N; an edge's part runs on the CPU. docs/gpu.md");
  o.add("data.dir", &c.data_dir, "Fashion-MNIST's folder (Debian package dataset-fashion-mnist)");
  o.add("data.shift", &c.shift,
        "public and private parts: classes (public 0-4, private 5-9), noise (private: Gaussian "
        "noise added) or "
        "rotate (private: turned 90 degrees)",
        shifts());
  o.add("data.noise", &c.noise, "data.shift noise: the noise's standard deviation", 0, 10);
  o.add("data.max_train", &c.max_train, "at most this many training examples of the part (0: all)",
        0, 1u << 30);
  o.add("data.max_test", &c.max_test, "at most this many test examples of the part (0: all)", 0,
        1u << 30);
  o.add("model.spec", &c.model,
        "the model (with cut points): cnn, resnet (ResNet-8), or vit (a small vision transformer "
        "over 4x4 patches)");
  o.add("model.seed", &c.seed, "initialization, shuffling and noise seed", 0, ~0ull);
  o.add(
      "split.cut", &c.cut,
      "where the model is cut: conv1, conv2 or fc1 (cnn); layer1, layer2 or layer3 (resnet; "
      "layer2 when the cnn's default conv2 is left); embed, block1 or ffn2 (vit; ffn2 by default)");
  o.add("split.weight_rank", &c.weight_rank,
        "the paper's weight-side cut: the projection after the cut (fc1 after conv2, fc2 after "
        "fc1) is split by "
        "truncated SVD, S_r V_r^T on the edge and U_r in the cloud, so r values per example cross "
        "(0: off); vit at "
        "ffn2: the FFN's up-projection, r values per token (plus the skip's 64 unless split.skip = "
        "false)",
        0, 1u << 20);
  o.add("split.skip", &c.skip,
        "keep the skip connection across the cut (vit at ffn2: false removes it, the paper's "
        "eliminated link, so with "
        "split.weight_rank only r values per token cross)");
  o.add("split.up", &c.train.up,
        "activation codec, edge to cloud:" + split::activationCodecs().help());
  o.add("split.down", &c.train.down, "gradient codec, cloud to edge (the same codecs)");
  o.add("split.train_bottom", &c.train.train_bottom,
        "fine-tune the edge's part too (false: only the cloud's)");
  o.add("split.edges", &c.edges,
        "edge devices sharing the one cloud part, served interleaved, each with its own "
        "codec state and bottom part (the private part dealt among them)",
        1, 1024);
  o.add("split.splitfed", &c.train.splitfed,
        "SplitFed: average the edges' bottom parts after each epoch (--role inproc; --role edge: "
        "through the cloud, "
        "which sets cloud.splitfed_edges)");
  o.add("split.pretrained", &c.pretrained,
        "the pre-trained model: written by --role pretrain, read by --role inproc");
  o.add("pretrain.epochs", &c.pretrain_epochs, "epochs of pre-training", 1, 1000);
  o.add("train.epochs", &c.epochs, "epochs of split fine-tuning", 1, 100000);
  o.add("train.batch_size", &c.train.batch_size, "minibatch size (pre-training and fine-tuning)", 1,
        1u << 20);
  o.add("train.lr", &c.train.lr, "SGD learning rate (pre-training and fine-tuning)", 1e-7, 100);
  o.add("state.metrics", &c.metrics,
        "per-epoch metrics, JSON Lines (appended; tools/plot_runs.py draws them)");
  o.add("sim.threads", &c.threads, "LibTorch threads", 1, 256);
  o.add("cloud.bind", &c.bind, "--role cloud: the endpoint to serve edge devices on");
  o.add("cloud.checkpoint", &c.checkpoint,
        "--role cloud: the top part's checkpoint, written atomically every cloud.checkpoint_every "
        "training steps and at "
        "exit, and loaded at start when it exists (a restarted cloud goes on from it)");
  o.add("cloud.checkpoint_every", &c.checkpoint_every,
        "--role cloud: training steps between checkpoints", 1, ~0ull);
  o.add("cloud.edge_timeout_ms", &c.edge_timeout_ms,
        "--role cloud: an edge device silent this long loses its session and codec state", 100,
        86400000);
  o.add("cloud.exit_after", &c.exit_after,
        "--role cloud: exit after this many edge devices said goodbye (0: serve until SIGINT or "
        "SIGTERM)",
        0, ~0ull);
  o.add("cloud.max_sessions", &c.max_sessions,
        "--role cloud: edge devices served at once (each keeps its last reply for a repeated "
        "step); more are refused",
        1, 1u << 20);
  o.add("cloud.max_batch", &c.max_batch,
        "--role cloud: the most examples one step may carry (a larger one is refused); evaluation "
        "steps use 256",
        256, 1u << 20);
  o.add("cloud.splitfed_edges", &c.splitfed_edges,
        "--role cloud: SplitFed over the network: average this many edges' bottom parts after each "
        "epoch (0: off; "
        "the edges set split.splitfed = true)",
        0, 1u << 20);
  o.add("split.splitfed_wait_ms", &c.splitfed_wait_ms,
        "SplitFed over the network: the cloud averages what it has this long after an epoch's "
        "first bottom; an edge "
        "waits this long plus twice edge.step_timeout_ms for the average",
        100, 86400000);
  o.add("edge.cloud", &c.cloud, "--role edge: the cloud's endpoint");
  o.add("edge.id", &c.edge_id,
        "--role edge: this edge device's id (under CURVE, its key's id on the cloud's allow-list)",
        0, ~0ull);
  o.add("edge.shard", &c.shard,
        "--role edge: which part of the private data this edge holds: shard edge.shard of "
        "split.edges, dealt as in "
        "--role inproc",
        0, 1023);
  o.add("edge.step_timeout_ms", &c.step_timeout_ms,
        "--role edge: how long to wait for the cloud's answer before sending a step again", 10,
        3600000);
  o.add("edge.tries", &c.tries, "--role edge: tries per step (and per hello) before giving up", 1,
        1000);
  o.add("log.level", &c.log_level, "--role cloud and edge: trace, debug, info, warn or error");
  apps::declareNet(o, c.net, [](unsigned) {});
  if (const int rc = o.parse(argc, argv); rc >= 0) return rc;
  try {
    return run(c);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "starling-split: %s\n", e.what());
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "starling-split: %s\n", e.what());
    return 1;
  }
}
