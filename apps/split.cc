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
#include "core/framed_file.h"
#include "core/rng.h"
#include "data/idx.h"
#include "split/net.h"
#include "split/trainer.h"
#include "torch_trainer/device.h"
#include "torch_trainer/threads.h"
#include "torch_trainer/torch_trainer.h"

using namespace starling;

namespace {

// A pre-trained checkpoint; version 2 is version 1 in the files' frame (core/framed_file.h).
constexpr FileFormat kPretrainedFile{0x53504c54 /* "TLPS" */, "Starling pre-trained checkpoint", 1,
                                     2, 2};

using Shift = apps::SplitShift;
using Role = apps::SplitRole;
using Settings = apps::Settings;

// The training configuration of split/trainer.h from the shared keys.
split::SplitTrainConfig trainConfig(const Settings& c) {
  split::SplitTrainConfig t;
  t.up = c.split.up;
  t.down = c.split.down;
  t.batch_size = c.train.fit.batch_size;
  t.lr = c.train.fit.lr;
  t.train_bottom = c.split.train_bottom;
  t.splitfed = c.split.splitfed;
  t.seed = c.model.seed;
  t.validate();
  return t;
}

// The examples of `d` in the public (private = false) or private part, at most `max` (0: all).
std::vector<size_t> part(const data::Dataset& d, const Settings& c, bool priv, uint64_t max) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < d.size(); ++i) {
    if (c.split.shift == Shift::kClasses && (d.labels[i] >= 5) != priv) continue;
    idx.push_back(i);
    if (max && idx.size() == max) break;
  }
  return idx;
}

// The private part's distribution shift applied to a copy of the data set.
data::Dataset shifted(const data::Dataset& d, const Settings& c, uint64_t stream) {
  data::Dataset s = d;
  if (c.split.shift == Shift::kNoise) {
    RngStream rng(StreamKey{c.model.seed, stream, kAnyClient, StreamPurpose::kDataPartition, 1});
    for (float& x : s.images) x += static_cast<float>(c.split.noise * rng.normal());
  } else if (c.split.shift == Shift::kRotate) {
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
  w.u64(layout.fingerprint());
  w.floats(p);
  writeFramed(path, kPretrainedFile, bytes);
}

std::vector<float> loadPretrained(const std::string& path, const ParamLayout& layout) {
  if (!std::filesystem::exists(path))
    STARLING_THROW(IoError, "split.pretrained '", path,
                   "' does not exist: write it first with --role pretrain");
  const auto bytes = readFile(path, uint64_t{4} << 30);
  const std::string what = "pre-trained checkpoint " + path;
  ByteReader r(unframe(kPretrainedFile, bytes, what).payload, what);
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
int runCloud(const Settings& c, const split::SplitTrainConfig& t, split::SplitModel& sm) {
  apps::installStopHandlers();
  auto log = apps::makeLogger("split-cloud", c.log_level, c.net.insecure, c.log_format);
  const uint64_t fp = split::sessionFingerprint(sm, t.up, t.down);
  std::vector<float> top;
  uint64_t steps_done = 0;
  if (auto ck = split::loadCloudCheckpoint(c.split.cloud.checkpoint, fp, sm.top().numel())) {
    top = std::move(ck->top);
    steps_done = ck->steps;
    log->info("resumed from {} after {} training steps", c.split.cloud.checkpoint, steps_done);
  } else {
    top = sm.cutParameters(loadPretrained(c.split.pretrained, sm.full())).second;
    log->info("the top part from the pre-trained model {}", c.split.pretrained);
  }
  split::SplitCloud cloud(
      sm, std::move(top), t.down, t.lr,
      split::SplitCloud::Limits{.max_batch = c.split.cloud.max_batch, .max_abs = 1e6});
  split::CloudServerConfig cfg;
  cfg.bind = c.split.cloud.bind;
  cfg.security = apps::security(c.net, true, false);
  cfg.limits = apps::transportLimits(c.net);
  cfg.fingerprint = fp;
  cfg.up = t.up;
  cfg.down = t.down;
  cfg.edge_timeout = std::chrono::milliseconds(c.split.cloud.edge_timeout_ms);
  cfg.checkpoint = c.split.cloud.checkpoint;
  cfg.checkpoint_every = c.split.cloud.checkpoint_every;
  cfg.steps_done = steps_done;
  cfg.splitfed_edges = c.split.cloud.splitfed_edges;
  cfg.max_sessions = c.split.cloud.max_sessions;
  cfg.splitfed_wait = std::chrono::milliseconds(c.split.splitfed_wait_ms);
  cfg.log = [&](const std::string& s) { log->info("{}", s); };
  transport::Context ctx;
  split::SplitCloudServer server(ctx, cloud, cfg);
  log->info("{}; serving on {} (up {}, down {}{}), the top part on {}", sm.describe(),
            server.endpoint(), t.up, t.down,
            c.net.insecure ? ", INSECURE: no authentication or encryption" : ", CURVE",
            sm.cloudDevice().str());
  auto last = std::chrono::steady_clock::now();
  uint64_t last_steps = server.stats().steps;
  while (!apps::stopFlag().load() &&
         (c.split.cloud.exit_after == 0 || server.stats().goodbyes < c.split.cloud.exit_after)) {
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
      st.replies_dropped, st.timed_out, c.split.cloud.checkpoint);
  return 0;
}

// --role edge: fine-tunes this edge's bottom part on its shard of the private part through the
// cloud.
int runEdge(const Settings& c, const split::SplitTrainConfig& t, split::SplitModel& sm,
            const data::Dataset& priv_train, const std::vector<size_t>& idx,
            const data::Dataset& priv_test, const std::vector<size_t>& test_idx) {
  apps::installStopHandlers();
  auto log = apps::makeLogger("split-edge", c.log_level, c.net.insecure, c.log_format);
  if (c.split.edge.shard >= c.split.edges)
    STARLING_THROW(ConfigError, "edge.shard (", c.split.edge.shard, ") must be below split.edges (",
                   c.split.edges, ")");
  std::vector<size_t> mine;
  for (size_t i = c.split.edge.shard; i < idx.size(); i += c.split.edges)
    mine.push_back(idx[i]);  // dealt as in --role inproc
  if (mine.empty())
    STARLING_THROW(ConfigError, "edge.shard ", c.split.edge.shard, " of ", c.split.edges,
                   " holds no examples");
  const auto bottom = sm.cutParameters(loadPretrained(c.split.pretrained, sm.full())).first;
  split::SplitEdge edge(sm, bottom, t.up, t.lr);
  split::EdgeClientConfig cfg;
  cfg.cloud = c.split.edge.cloud;
  cfg.security = apps::security(c.net, false, true);
  cfg.limits = apps::transportLimits(c.net);
  cfg.edge_id = c.split.edge.id;
  cfg.fingerprint = split::sessionFingerprint(sm, t.up, t.down);
  cfg.up = t.up;
  cfg.down = t.down;
  cfg.step_timeout = std::chrono::milliseconds(c.split.edge.step_timeout_ms);
  cfg.tries = c.split.edge.tries;
  // Longer than the cloud waits (from its first bottom) for an epoch's missing edges.
  cfg.splitfed_wait =
      std::chrono::milliseconds(c.split.splitfed_wait_ms + 2 * c.split.edge.step_timeout_ms);
  cfg.log = [&](const std::string& s) { log->info("{}", s); };
  transport::Context ctx;
  split::SplitEdgeClient client(ctx, edge, cfg);
  client.connect();
  std::ofstream metrics;  // opened once the cloud took us: a refused edge leaves no file behind
  if (!c.state.metrics.empty()) {
    metrics.open(c.state.metrics, std::ios::app);
    if (!metrics) STARLING_THROW(IoError, "cannot open the metrics file '", c.state.metrics, "'");
  }
  log->info("{}; edge {} (shard {} of {}): {} private examples, {} epoch(s), up {}, down {}",
            sm.describe(), c.split.edge.id, c.split.edge.shard, c.split.edges, mine.size(),
            c.train.fit.epochs, t.up, t.down);
  uint64_t up = 0, down = 0;
  for (uint32_t e = 1; e <= c.train.fit.epochs && !apps::stopFlag().load(); ++e) {
    auto shown = std::chrono::steady_clock::now();
    const split::EpochRecord rec = split::runEdgeEpoch(
        client, t, e, c.split.edge.shard, priv_train, mine, priv_test, test_idx,
        [&](size_t done, size_t all) {
          const auto now = std::chrono::steady_clock::now();
          if (now - shown < std::chrono::seconds(10)) return;
          shown = now;
          log->info("epoch {}/{}: step {}/{}", e, c.train.fit.epochs, done, all);
        });
    up += rec.uplink_bytes;
    down += rec.downlink_bytes;
    log->info(
        "epoch {}/{}  train loss {:.4f}  private test accuracy {:.1f}%  up {:.2f} MB  down {:.2f} "
        "MB  cloud "
        "{:.2f} ms/step  {:.1f} s",
        e, c.train.fit.epochs, rec.train_loss, 100 * rec.test_accuracy, rec.uplink_bytes / 1e6,
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

// --role pretrain: the whole model trained on the public part, written to split.pretrained.
int runPretrain(const Settings& c, const split::SplitTrainConfig& t, split::SplitModel& sm,
                const torch_trainer::Device& device, const data::Dataset& train,
                const data::Dataset& test) {
  const auto idx = part(train, c, false, c.split.max_train);
  const auto test_idx = part(test, c, false, c.split.max_test);
  std::vector<float> p = sm.initParameters(c.model.seed);
  std::printf("pre-training %s on the public part (%s): %zu examples, %u epoch(s)\n",
              c.model.spec.c_str(), apps::name(c.split.shift), idx.size(), c.split.pretrain_epochs);
  if (c.model.spec != "vit") {  // torch_trainer's model and trainer
    auto whole = torch_trainer::makeTorchTrainer(c.model.spec, train, device);
    for (uint32_t e = 1; e <= c.split.pretrain_epochs; ++e) {
      RngStream rng(StreamKey{c.model.seed, e, kAnyClient, StreamPurpose::kTraining, 0});
      const client::FitConfig fit{.epochs = 1, .batch_size = t.batch_size, .lr = t.lr};
      const auto r = whole->fit(p, client::DataView{&train, idx}, fit, rng);
      const auto ev = whole->evaluate(p, client::DataView{&test, test_idx});
      std::printf("epoch %u/%u  train loss %.4f  public test accuracy %.1f%%\n", e,
                  c.split.pretrain_epochs, r.metrics.empty() ? 0.0 : r.metrics[0].value,
                  100 * ev.accuracy);
      std::fflush(stdout);
    }
  } else {  // split/'s own models: uncompressed split steps are the whole model's steps (tested)
    split::SplitModel whole(c.model.spec, split::SplitModel::cutPoints(c.model.spec)[0], 28, 28,
                            10);
    whole.setCloudDevice(device);
    split::SplitTrainConfig cfg;
    cfg.batch_size = t.batch_size;
    cfg.lr = t.lr;
    cfg.seed = c.model.seed;
    split::InProcessSplit run(whole, cfg, p);
    for (uint32_t e = 1; e <= c.split.pretrain_epochs; ++e) {
      const auto r = run.runEpoch(train, idx, &test, test_idx);
      std::printf("epoch %u/%u  train loss %.4f  public test accuracy %.1f%%\n", e,
                  c.split.pretrain_epochs, r.train_loss, 100 * r.test_accuracy);
      std::fflush(stdout);
    }
    p.assign(run.bottom().begin(), run.bottom().end());
    p.insert(p.end(), run.top().begin(), run.top().end());
  }
  savePretrained(c.split.pretrained, sm.full(), p);
  std::printf("wrote %s\n", c.split.pretrained.c_str());
  return 0;
}

// --role inproc and edge: fine-tuning, split, on the private part (edge: this edge's shard of it,
// through the cloud).
int runFineTuning(const Settings& c, const split::SplitTrainConfig& t, split::SplitModel& sm,
                  const data::Dataset& train, const data::Dataset& test) {
  const std::vector<float> p = loadPretrained(c.split.pretrained, sm.full());
  const data::Dataset priv_train = shifted(train, c, 1), priv_test = shifted(test, c, 2);
  const auto idx = part(priv_train, c, true, c.split.max_train);
  const auto test_idx = part(priv_test, c, true, c.split.max_test);
  STARLING_CHECK_ARG(c.split.edges <= idx.size(), "split.edges (", c.split.edges, ") exceeds the ",
                     idx.size(), " private examples");
  if (c.split.role == Role::kEdge) return runEdge(c, t, sm, priv_train, idx, priv_test, test_idx);
  // The private part dealt round-robin among the edge devices (each sees every class).
  std::vector<std::vector<size_t>> shards(c.split.edges);
  for (size_t i = 0; i < idx.size(); ++i) shards[i % c.split.edges].push_back(idx[i]);
  split::InProcessSplit run(sm, t, p, c.split.edges);
  std::printf(
      "%s\nfine-tuning split on the private part (%s): %zu examples on %zu edge device(s)%s, %u "
      "epoch(s), "
      "up %s, down %s%s\n",
      sm.describe().c_str(), apps::name(c.split.shift), idx.size(),
      static_cast<size_t>(c.split.edges), c.split.edges > 1 && t.splitfed ? " (SplitFed)" : "",
      c.train.fit.epochs, t.up.c_str(), t.down.c_str(), t.train_bottom ? "" : ", bottom frozen");
  const auto [l0, a0] = run.evaluate(priv_test, test_idx);
  std::printf("epoch 0  private test accuracy %.1f%% (the pre-trained model)\n", 100 * a0);
  (void)l0;
  std::ofstream metrics;
  if (!c.state.metrics.empty()) {
    metrics.open(c.state.metrics, std::ios::app);
    if (!metrics) STARLING_THROW(IoError, "cannot open the metrics file '", c.state.metrics, "'");
  }
  uint64_t up = 0, down = 0;
  for (uint32_t e = 1; e <= c.train.fit.epochs; ++e) {
    const split::EpochRecord rec = run.runEpoch(priv_train, shards, &priv_test, test_idx);
    up += rec.uplink_bytes;
    down += rec.downlink_bytes;
    std::printf(
        "epoch %u/%u  train loss %.4f  private test accuracy %.1f%%  up %.2f MB  down %.2f MB  "
        "%.1f s\n",
        e, c.train.fit.epochs, rec.train_loss, 100 * rec.test_accuracy, rec.uplink_bytes / 1e6,
        rec.downlink_bytes / 1e6, rec.wall_seconds);
    std::fflush(stdout);
    if (metrics) metrics << rec.json() << '\n' << std::flush;
  }
  std::printf("\ntraffic: %.2f MB up, %.2f MB down, %.2f MB in all\n", up / 1e6, down / 1e6,
              (up + down) / 1e6);
  return 0;
}

int run(Settings& c) {
  const split::SplitTrainConfig t = trainConfig(c);
  if (c.model.spec != "cnn" &&
      c.split.cut == "conv2") {  // the default names a cnn layer: take the model's middle cut
    const auto cuts = split::SplitModel::cutPoints(c.model.spec);
    c.split.cut = c.model.spec == "vit" ? "ffn2" : cuts[1];
  }
  split::SplitModel sm(c.model.spec, c.split.cut, 28, 28, 10, c.split.weight_rank, c.split.skip);
  // The cloud's part (and pre-training) may run on a GPU; an edge device trains on its CPU.
  torch_trainer::Device device;
  if (c.split.role == Role::kEdge) {
    if (c.split.device.rfind("cuda", 0) == 0)
      STARLING_THROW(ConfigError, "--device ", c.split.device,
                     ": an edge device runs its part on the CPU; --device applies to "
                     "--role cloud, inproc (the cloud's part) and pretrain");
    if (c.split.device != "auto")
      torch_trainer::chooseDevice(c.split.device);  // refuses a setting that is none of them
  } else {
    device = torch_trainer::chooseDevice(c.split.device);
    if (device.cuda()) torch_trainer::useReproducibleCuda();
    sm.setCloudDevice(device);
  }
  torch_trainer::setThreads(c.sim.threads);
  if (c.split.role == Role::kCloud) return runCloud(c, t, sm);  // no data set needed
  std::printf("starling-split: loading Fashion-MNIST from %s\n", c.data.source.dir.c_str());
  const data::Dataset train = data::loadFashionMnist(c.data.source.dir, "train");
  const data::Dataset test = data::loadFashionMnist(c.data.source.dir, "t10k");

  if (c.split.role == Role::kPretrain) return runPretrain(c, t, sm, device, train, test);
  return runFineTuning(c, t, sm, train, test);
}

}  // namespace

int main(int argc, char** argv) {
  Settings c;
  apps::Options o(
      "starling-split",
      "starling-split: split fine-tuning between an edge device and the cloud, with compressed "
      "activations\n"
      "going up and compressed gradients coming down (docs/split.md). --role pretrain writes the\n"
      "pre-trained model; --role inproc fine-tunes it split, edge and cloud in one process, "
      "counting the\n"
      "exact bytes that would cross. Every key can be set in a TOML file (--config) or on the "
      "command line.");
  apps::RegistryHelp help;
  help.models = " cnn, resnet (ResNet-8), or vit (a small vision transformer over 4x4 patches)";
  help.split_codecs = split::activationCodecs().help();
  apps::declareSettings(o, c, apps::kSplit, help);
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
