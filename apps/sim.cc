// starling-sim: a federated training of many simulated clients on few workers, in the style of
// FedML Parrot (simulator/sim_fleet.h): W worker processes, each training its share of every
// round's clients one after another on one model replica, aggregating them locally, then all
// workers aggregating globally through c10d (Gloo on CPU). The round loop is the server's
// RoundEngine; docs/simulation.md explains the configuration and the launch modes.
//
// Launch: `starling-sim --config FILE --sim.workers W` starts W-1 more processes of itself on this
// machine; under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or srun
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) each process is one worker and --sim.workers is
// ignored.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "aggregation/rule.h"
#include "aggregation/server_optimizer.h"
#include "apps/options.h"
#include "client/algorithm.h"
#include "client/trainer.h"
#include "compression/registry.h"
#include "core/error.h"
#include "data/idx.h"
#include "data/partition.h"
#include "data/source.h"
#include "data/stats.h"
#include "server/engine.h"
#include "simulator/collectives.h"
#include "simulator/launch.h"
#include "simulator/sim_fleet.h"
#include "simulator/state_store.h"
#include "torch_trainer/device.h"
#include "torch_trainer/threads.h"
#include "torch_trainer/torch_trainer.h"

using namespace starling;
namespace sim = starling::simulator;

namespace {

struct Config {
  uint64_t workers = 2;
  std::string backend = "gloo";
  std::string device = "auto";
  uint64_t workers_per_gpu = 1;
  int threads = 1;
  data::DataSource data;  // the data.* keys (format, files, classes, shape)
  uint64_t num_clients = 100;
  std::string partition = "dirichlet:alpha=0.5";
  std::string model = "cnn";
  uint64_t seed = 1;
  uint64_t clients_per_round = 10;
  server::EngineConfig engine;
  std::string schedule = "lpt";
  bool sharded_step = true;
  bool scaffold = false;
  uint64_t bucket_bytes = uint64_t{16} << 20;
  double reference_spe = 1e-3;
  double deadline_seconds = 0;
  std::string trace;
  std::string downlink = "dense";
  bool diagnostics = false;
  sim::DeviceDistributions devices;
  uint64_t state_memory = uint64_t{256} << 20;
  std::string state_dir;
  bool stats = false;
  std::string stats_file;
};

// This program's own path: the workers' argv[0], so that ps shows its name.
std::string selfExe() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

std::string eta(double seconds) {
  char buf[32];
  const int s = static_cast<int>(seconds);
  std::snprintf(buf, sizeof buf, "%d:%02d", s / 60, s % 60);
  return buf;
}

int runSim(int argc, char** argv, Config& c) {
  // Every spec and value is checked before data is loaded or a worker started.
  compression::makeCompressor(c.engine.scheme.compressor);
  aggregation::makeRule(c.engine.scheme.rule);
  aggregation::makeServerOptimizer(c.engine.server_opt, 1);
  data::makePartitioner(c.partition);
  c.data.validate();
  const sim::SchedulePolicy policy = sim::parseSchedulePolicy(c.schedule);
  c.devices.validate();
  STARLING_CHECK_ARG(c.clients_per_round >= 1 && c.clients_per_round <= c.num_clients, "sampling.clients_per_round (",
                     c.clients_per_round, ") must be in [1, data.num_clients = ", c.num_clients, "]");
  c.engine.scheme.run_seed = c.seed;
  // FedScale's semantics: this many per round, or every available client if fewer are available.
  c.engine.sampling.clients_per_round = c.clients_per_round;
  c.engine.sampling.min_clients = 1;
  c.engine.sampling.min_available = 1;
  c.engine.completion.min_results = 1;
  c.engine.downlink = server::parseDownlink(c.downlink);
  if (c.diagnostics)
    for (const char* m : {"ef_gain", "ef_residual_ratio", "ef_residual_age"})
      if (std::find(c.engine.scheme.metrics.begin(), c.engine.scheme.metrics.end(), m) == c.engine.scheme.metrics.end())
        c.engine.scheme.metrics.push_back(m);
  c.engine.validate();

  sim::LaunchInfo launch = sim::launchInfoFromEnvironment();
  const uint64_t world = launch.world_size > 1 ? static_cast<uint64_t>(launch.world_size) : c.workers;
  // A robust rule needs every update in one place: across workers only streaming rules add up.
  if (world > 1 && !aggregation::makeRule(c.engine.scheme.rule)->streaming())
    STARLING_THROW(ConfigError, "aggregation.rule = '", c.engine.scheme.rule, "' is not a streaming rule and cannot be split among ",
                   world, " workers; use sim.workers = 1 or a streaming rule (fedavg)");
  // The device is checked before workers start: a setting no worker can meet fails once, here.
  torch_trainer::WorkerPlacement placement{launch.local_rank, launch.local_world_size,
                                           static_cast<int>(c.workers_per_gpu)};
  if (launch.world_size == 1) placement.local_workers = static_cast<int>(c.workers);
  const torch_trainer::Device device = torch_trainer::chooseDevice(c.device, placement);
  if (device.cuda()) torch_trainer::useReproducibleCuda();  // a GPU run is the CPU run's experiment
  // NCCL takes one rank per GPU, the local rank's (simulator/nccl_collectives.cc): workers sharing
  // a GPU, or pinned to one, need Gloo.
  if (c.backend == "nccl" && (c.workers_per_gpu > 1 || c.device.rfind("cuda:", 0) == 0))
    STARLING_THROW(ConfigError,
                   "sim.backend = nccl takes one worker per GPU (the GPU of its local rank): with ",
                   c.workers_per_gpu > 1 ? "sim.workers_per_gpu > 1" : "sim.device = " + c.device,
                   " use sim.backend = gloo");
  std::vector<int> children;
  if (launch.world_size == 1 && c.workers > 1) {
    const int port = sim::freeLoopbackPort();
    // /proc/self/exe: this very binary, even if its file was replaced since it started.
    children = sim::spawnLocalRanks(
        "/proc/self/exe", std::vector<std::string>(argv + 1, argv + argc),
        static_cast<int>(c.workers), port,
        sim::SpawnOptions{
            .first_rank = 1, .die_with_parent = true, .stderr_paths = {}, .argv0 = selfExe()});
    const int w = static_cast<int>(c.workers);
    launch = sim::LaunchInfo{0, w, 0, w, "127.0.0.1", port, "spawned"};
  }
  const bool lead = launch.rank == 0;
  torch_trainer::setThreads(c.threads);

  const data::LoadedData loaded = data::loadData(c.data);
  const data::Dataset& train = loaded.train;
  const data::Dataset* test = loaded.test ? &*loaded.test : nullptr;  // none: no evaluation
  sim::SimClients clients;
  clients.train = &train;
  clients.shards = data::makePartitioner(c.partition)->split(train.labels, train.num_classes, c.num_clients, c.seed);
  clients.devices = c.trace.empty() ? sim::DevicePopulation::sample(c.num_clients, c.devices, c.seed)
                                    : sim::DevicePopulation::fromCsv(c.trace, c.num_clients);
  std::unique_ptr<client::Trainer> trainer;
  try {
    trainer = torch_trainer::makeTorchTrainer(c.model, train, device);
  } catch (const InvalidArgument& e) {  // the model does not fit the data's shape or classes
    STARLING_THROW(ConfigError, "model.spec = '", c.model, "' does not fit data.train (", loaded.train_path, ": ",
                   data::describe(train), "): ", e.what(),
                   train.rows == 1 ? " (the examples are flat: data.shape = ROWSxCOLS views them as images; logreg and mlp "
                                     "take any shape)"
                                   : "");
  }
  const auto layout = std::make_shared<const ParamLayout>(trainer->layout());
  // SCAFFOLD is the round engine's, as in a deployment: c lives in the engine (and its
  // checkpoint), N is the simulated population.
  if (c.scaffold) client::checkScaffoldTrainer(*trainer);
  c.engine.scheme.scaffold = c.scaffold;
  c.engine.scaffold_population = c.scaffold ? c.num_clients : 0;
  if (lead) {
    std::printf(
        "starling-sim: %s (%zu parameters) | %llu clients, %s | %llu per round | %s | %s | %d "
        "worker%s (%s, %s) on %s\n",
        trainer->spec().c_str(), layout->numel(), static_cast<unsigned long long>(c.num_clients),
        c.partition.c_str(), static_cast<unsigned long long>(c.clients_per_round),
        c.engine.scheme.compressor.c_str(), c.engine.scheme.rule.c_str(), launch.world_size,
        launch.world_size == 1 ? "" : "s", c.backend.c_str(), launch.source.c_str(),
        device.cuda() ? (device.str() + (launch.world_size > 1 ? " (rank 0)" : "")).c_str()
                      : "cpu");
    std::printf("data: train %s (%s); test %s\n", data::describe(train).c_str(), loaded.train_path.c_str(),
                test ? (data::describe(*test) + " (" + loaded.test_path + ")").c_str() : "none");
    if (c.stats || !c.stats_file.empty()) {
      const data::PartitionStats st = data::partitionStats(train.labels, train.num_classes, clients.shards);
      if (c.stats) std::printf("%s\n", data::summary(st).c_str());
      if (!c.stats_file.empty()) data::writeStatsCsv(st, c.stats_file);
    }
    std::fflush(stdout);
  }

  sim::CollectiveOptions co;
  co.bucket_bytes = c.bucket_bytes;
  auto coll = launch.world_size == 1 ? sim::makeLocal() : sim::makeCollectives(c.backend, launch, co);
  const bool sharded = c.sharded_step && launch.world_size > 1;
  sim::StateStoreOptions so;
  so.memory_bytes = c.state_memory;
  // With a checkpoint the client states must survive a crash too (error-feedback residuals,
  // SCAFFOLD's c_i): they are kept beside it unless state.dir says where.
  if (c.state_dir.empty() && !c.engine.checkpoint.empty()) c.state_dir = c.engine.checkpoint + ".states";
  if (!c.state_dir.empty()) {
    // A resumed run reopens the states its workers flushed at the checkpoint.
    so.spill_dir = c.state_dir + "/worker-" + std::to_string(launch.rank);
    so.resume = !c.engine.checkpoint.empty() && std::filesystem::exists(c.engine.checkpoint) &&
                std::filesystem::exists(so.spill_dir);
  }
  sim::ClientStateStore store(so, layout->fingerprint());
  sim::SimFleetConfig fc{policy, c.reference_spe, c.deadline_seconds, c.seed, {}, sharded};
  if (!c.state_dir.empty()) fc.homes_file = so.spill_dir + "/homes.bin";
  fc.durable_states = !c.engine.checkpoint.empty();
  sim::SimFleet fleet(fc, clients, *trainer, store, *coll, test);

  std::vector<float> init(layout->numel());
  trainer->initParameters(init, c.seed);
  server::EngineConfig ec = c.engine;
  ec.write_files = lead;
  if (sharded) {
    ec.shard_rank = static_cast<uint32_t>(launch.rank);
    ec.shard_count = static_cast<uint32_t>(launch.world_size);
    if (!ec.checkpoint.empty())
      ec.optimizer_shard_file = ec.checkpoint + ".optimizer-" + std::to_string(launch.rank) + "-of-" +
                                std::to_string(launch.world_size);
  }
  server::RoundEngine engine(layout, ec, std::move(init));
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = isatty(STDOUT_FILENO);
  const uint64_t first = engine.nextRound();
  if (lead && engine.resumed()) std::printf("resumed at round %llu\n", static_cast<unsigned long long>(first));
  std::optional<double> last_acc;
  while (!engine.done()) {
    const server::RoundRecord r = engine.runRound(fleet);
    if (!lead) continue;
    if (r.test_accuracy) last_acc = r.test_accuracy;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double per_round = elapsed / static_cast<double>(r.round - first + 1);
    const double left = per_round * static_cast<double>(c.engine.rounds - r.round);
    char acc[32] = "", ef[48] = "";
    if (last_acc) std::snprintf(acc, sizeof acc, "  acc %5.1f%%", 100 * *last_acc);
    if (auto g = r.metrics.find("ef_gain"); g != r.metrics.end()) std::snprintf(ef, sizeof ef, "  EF gain %.2f", g->second);
    std::printf("%sround %4llu/%llu%s  loss %.4f%s  up %6.1f KB/client  makespan %.2f s  sim %.1f s  ETA %s%s",
                tty ? "\r" : "", static_cast<unsigned long long>(r.round),
                static_cast<unsigned long long>(c.engine.rounds), acc, r.train_loss.value_or(0.0), ef,
                r.clients_completed ? static_cast<double>(r.uplink_bytes) / 1024.0 / static_cast<double>(r.clients_completed) : 0.0,
                r.makespan_seconds.value_or(0.0), r.sim_seconds.value_or(0.0), eta(left).c_str(),
                tty ? "" : "\n");
    if (tty && r.test_accuracy) std::printf("\n");
    std::fflush(stdout);
  }
  if (lead) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("\nstarling-sim: %llu rounds in %.1f s; final test accuracy %s; %llu clients trained on this worker; "
                "%llu client states moved between workers\n",
                static_cast<unsigned long long>(c.engine.rounds - first + 1), secs,
                last_acc ? (std::to_string(100 * *last_acc).substr(0, 5) + "%").c_str() : "n/a",
                static_cast<unsigned long long>(fleet.clientsTrained()),
                static_cast<unsigned long long>(fleet.statesMigrated()));
  }
  for (int p : children) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::fprintf(stderr, "starling-sim: worker %d failed\n", p);
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  c.engine.rounds = 50;
  c.engine.scheme.compressor = "topk:density=0.01";
  c.engine.scheme.metrics = {"train_loss"};
  c.engine.fit = protocol::FitSettings{1, 32, 0.05f};
  c.engine.eval_every = 5;
  c.engine.round_deadline_ms = 3'600'000;
  apps::Options o("starling-sim",
                  "starling-sim: federated training of many simulated clients on few worker processes\n"
                  "(FedML Parrot style: sequential training per worker, local then global aggregation over c10d).\n"
                  "Every key can be set in a TOML file (--config) or on the command line (which wins).\n"
                  "docs/simulation.md explains the configuration, the launch modes and the outputs.");
  o.add("sim.workers", &c.workers, "worker processes to start on this machine (ignored under torchrun or srun)", 1, 256);
  o.add("sim.backend", &c.backend, "collectives: gloo (CPU) or nccl (GPU builds)");
  o.add("sim.threads", &c.threads, "LibTorch threads per worker", 1, 256);
  o.add("sim.device", &c.device,
        "where workers train: auto (a GPU when LibTorch sees one, else the CPU), cpu, cuda (each "
        "worker its GPU: "
        "local rank / sim.workers_per_gpu among CUDA_VISIBLE_DEVICES) or cuda:N. docs/gpu.md");
  o.add(
      "sim.workers_per_gpu", &c.workers_per_gpu,
      "workers sharing one GPU (each its own model replica); must divide the workers on a machine",
      1, 256);
  o.add("sim.schedule", &c.schedule, "assigning clients to workers: lpt (by estimated cost) or round_robin");
  o.add("sim.sharded_step", &c.sharded_step,
        "global aggregation as reduce-scatter, server optimizer on each worker's shard, all-gather (else all-reduce "
        "and every worker steps the whole model)");
  o.add("sim.bucket_bytes", &c.bucket_bytes, "largest single collective, bytes", 1024, uint64_t{1} << 34);
  o.add("sim.reference_seconds_per_example", &c.reference_spe,
        "the simulated clock's reference device: seconds per example at speed 1", 1e-9, 1e3);
  o.add("data.format", &c.data.format,
        "idx (a features file and a label file per split) or csv (one file per split: label,feature1,...). "
        "docs/simulation.md, section Data, gives both formats");
  o.add("data.dir", &c.data.dir, "folder of the data files (relative names below are taken in it); the default holds "
        "Fashion-MNIST (Debian package dataset-fashion-mnist)");
  o.add("data.train", &c.data.train, "training split: the IDX features file (2+ dimensions: examples x d1 x ...; "
        "unsigned bytes are scaled by 1/255, other types taken as they are), or the CSV file; gzip or plain");
  o.add("data.train_labels", &c.data.train_labels, "idx only: the training labels file (1 dimension, integers 0..255)");
  o.add("data.test", &c.data.test, "test split for evaluation, as data.train (empty: no test set, no accuracy)");
  o.add("data.test_labels", &c.data.test_labels, "idx only: the test labels file");
  o.add("data.num_classes", &c.data.num_classes, "classes (0: the largest label in the data + 1; else labels must be below it)",
        0, 256);
  o.add("data.shape", &c.data.shape, "view each example as an image ROWSxCOLS, e.g. 28x28 (for the cnn on flat "
        "CSV rows; must multiply to the feature count). Empty: IDX files give the image shape, CSV rows are flat");
  o.add("data.num_clients", &c.num_clients, "clients in the pool", 1, 10'000'000);
  o.add("data.partition", &c.partition, "how the data set is split:" + data::partitioners().help());
  o.add("data.stats", &c.stats, "print a summary of the per-client data statistics at start");
  o.add("data.stats_file", &c.stats_file, "write every client's statistics to this CSV file at start "
        "(client,examples,classes_held,label_skew,class_0,...)");
  o.add("model.spec", &c.model, "LibTorch model:" + torch_trainer::torchTrainers().help());
  o.add("model.seed", &c.seed, "run seed: split, initial model, sampling, compression, devices", 0, ~0ull);
  o.add("train.rounds", &c.engine.rounds, "federated rounds", 1, 10'000'000);
  o.add("train.epochs", &c.engine.fit.epochs, "local epochs per round", 1, 1000);
  o.add("train.batch_size", &c.engine.fit.batch_size, "local minibatch size", 1, 1u << 20);
  o.add("train.lr", &c.engine.fit.lr, "client learning rate", 1e-7, 100);
  o.add("train.prox_mu", &c.engine.fit.prox_mu, "FedProx's proximal term mu (0: FedAvg's local SGD)", 0, 1e4);
  o.add("train.scaffold", &c.scaffold,
        "SCAFFOLD: clients correct their steps by the server's minus their own control variate (kept in the state "
        "store); doubles the uplink and the downlink");
  o.add("sampling.clients_per_round", &c.clients_per_round, "clients sampled each round", 1, 10'000'000);
  o.add("sampling.overcommit", &c.engine.sampling.overcommit, "sample this many times more; the fastest are kept", 1, 10);
  o.add("compression.compressor", &c.engine.scheme.compressor, "compressor spec:" + compression::compressors().help());
  o.add("compression.diagnostics", &c.diagnostics,
        "clients also report error feedback's diagnostics (docs/compression.md): ef_gain, ef_residual_ratio and "
        "ef_residual_age, averaged per round into the metrics file (a few bytes more per update)");
  o.add("aggregation.rule", &c.engine.scheme.rule, "aggregation rule (streaming rules across workers):" + aggregation::aggregationRules().help());
  o.add("aggregation.server_opt", &c.engine.server_opt, "server optimizer:" + aggregation::serverOptimizers().help());
  o.add("devices.trace", &c.trace, "CSV client,speed,bandwidth,availability (instead of the distributions below)");
  o.add("devices.speed_median", &c.devices.speed_median, "median relative compute speed", 1e-6, 1e6);
  o.add("devices.speed_sigma", &c.devices.speed_sigma, "log-normal sigma of the speed", 0, 5);
  o.add("devices.bandwidth_median", &c.devices.bandwidth_median, "median bandwidth, bytes/s", 1, 1e12);
  o.add("devices.bandwidth_sigma", &c.devices.bandwidth_sigma, "log-normal sigma of the bandwidth", 0, 5);
  o.add("devices.availability", &c.devices.availability, "probability a client can be sampled in a round", 1e-6, 1);
  o.add("round.deadline_seconds", &c.deadline_seconds, "simulated deadline dropping stragglers (0: none)", 0, 1e9);
  o.add("downlink.mode", &c.downlink,
        "how tasks carry the model: dense, fp16, delta (the changes since the version a client holds) or topk "
        "(lossy: only the downlink.density largest changes, the rest kept as the server's error feedback)");
  o.add("downlink.density", &c.engine.downlink_density, "topk downlink: fraction of the model refreshed per round",
        1e-6, 1);
  o.add("downlink.history", &c.engine.delta_history, "model versions kept for delta and topk downlinks (a client "
        "holding an older one gets the whole model)", 1, 64);
  o.add("eval.every", &c.engine.eval_every, "test-set evaluation every N rounds (0: never)", 0, 1u << 30);
  o.add("state.memory_bytes", &c.state_memory, "client-state memory per worker before spilling to LMDB", 1 << 20,
        uint64_t{1} << 40);
  o.add("state.dir", &c.state_dir,
        "folder for spilled client states (default: CHECKPOINT.states with state.checkpoint, else a temporary folder)");
  o.add("state.checkpoint", &c.engine.checkpoint, "checkpoint file, written after every round; resumed from at start");
  o.add("state.metrics", &c.engine.metrics, "per-round metrics, JSON Lines (appended)");
  if (const int rc = o.parse(argc, argv); rc >= 0) return rc;
  try {
    return runSim(argc, argv, c);
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "starling-sim: %s\n", e.what());
    return 2;
  }
}
