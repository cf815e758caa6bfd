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
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "aggregation/rule.h"
#include "aggregation/server_optimizer.h"
#include "apps/engine_settings.h"
#include "apps/settings.h"
#include "client/algorithm.h"
#include "client/trainer.h"
#include "compression/registry.h"
#include "core/error.h"
#include "data/idx.h"
#include "data/partition.h"
#include "data/source.h"
#include "data/stats.h"
#include "server/async_server.h"
#include "server/engine.h"
#include "simulator/async_sim.h"
#include "simulator/collectives.h"
#include "simulator/launch.h"
#include "simulator/sim_fleet.h"
#include "simulator/state_store.h"
#include "torch_trainer/device.h"
#include "torch_trainer/device_round.h"
#include "torch_trainer/threads.h"
#include "torch_trainer/torch_trainer.h"

using namespace starling;
namespace sim = starling::simulator;

namespace {

std::string eta(double seconds) {
  char buf[32];
  const int s = static_cast<int>(seconds);
  std::snprintf(buf, sizeof buf, "%d:%02d", s / 60, s % 60);
  return buf;
}

// sim.device_round: whether the clients' updates are formed and compressed on the trainer's
// device (auto: when that is a GPU).
bool deviceRoundOn(apps::DeviceRound setting, const torch_trainer::Device& device) {
  return setting == apps::DeviceRound::kOn ||
         (setting == apps::DeviceRound::kAuto && device.cuda());
}

// The end of a run's summary line: how many updates the round on the device made.
std::string deviceRoundNote(const client::DeviceUpdate* d) {
  return d ? "; " + std::to_string(d->updates()) + " updates formed on the device" : "";
}

int runAsync(const apps::Settings& c, const server::EngineConfig& ec,
             const sim::SimClients& clients, client::Trainer& trainer, sim::ClientStateStore& store,
             const data::Dataset* test, client::DeviceUpdate* device_update,
             sim::Collectives& workers, bool lead) {
  const auto layout = std::make_shared<const ParamLayout>(trainer.layout());
  std::vector<float> init(layout->numel());
  trainer.initParameters(init, c.model.seed);
  server::AsyncServer server(layout, apps::asyncServerConfig(c, ec), std::move(init));
  sim::AsyncSimConfig ac;
  ac.steps = ec.rounds;
  ac.concurrency = c.async.concurrency ? c.async.concurrency : c.sampling.clients_per_round;
  if (c.round.mode == apps::RoundMode::kSemisync) ac.round_seconds = c.round.deadline_seconds;
  ac.reference_seconds_per_example = c.sim.reference_spe;
  ac.seed = c.model.seed;
  ac.fit = ec.fit;
  ac.eval_every = ec.eval_every;
  ac.metrics_file = ec.metrics;
  ac.checkpoint = ec.checkpoint;
  ac.device_update = device_update;
  ac.workers = &workers;  // only the first one writes metrics and checkpoints
  sim::AsyncSimulation simulation(ac, clients, trainer, store, server, test);
  if (!lead) {  // the first worker reports
    simulation.run();
    return 0;
  }
  if (simulation.resumed())
    std::printf(
        "resumed at step %llu (model version %llu, %llu updates buffered, %.1f simulated s)\n",
        static_cast<unsigned long long>(server.steps() + 1),
        static_cast<unsigned long long>(server.version()),
        static_cast<unsigned long long>(server.buffered()), simulation.now());
  if (ac.round_seconds > 0)
    std::printf(
        "semi-synchronous rounds of %g simulated s: up to %llu clients training at once, late "
        "updates weighted by staleness %s up to %llu\n",
        ac.round_seconds, static_cast<unsigned long long>(ac.concurrency),
        c.async.staleness.c_str(), static_cast<unsigned long long>(c.async.max_staleness));
  else
    std::printf(
        "async (FedBuff): %llu clients training at once, a step every %llu updates, staleness %s "
        "up to %llu\n",
        static_cast<unsigned long long>(ac.concurrency),
        static_cast<unsigned long long>(c.async.buffer_size), c.async.staleness.c_str(),
        static_cast<unsigned long long>(c.async.max_staleness));
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = isatty(STDOUT_FILENO);
  std::optional<double> last_acc;
  const auto metric = [](const server::RoundRecord& r, const char* name) {
    const auto it = r.metrics.find(name);
    return it == r.metrics.end() ? 0.0 : it->second;  // a round where nothing arrived has none
  };
  simulation.run([&](const server::RoundRecord& r) {
    if (r.test_accuracy) last_acc = r.test_accuracy;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double left =
        elapsed / static_cast<double>(r.round) * static_cast<double>(ac.steps - r.round);
    char acc[32] = "";
    if (last_acc) std::snprintf(acc, sizeof acc, "  acc %5.1f%%", 100 * *last_acc);
    std::printf(
        "%sstep %4llu/%llu%s  loss %.4f  staleness %.1f (max %.0f)  refused %llu  sim %.1f s  ETA "
        "%s%s",
        tty ? "\r" : "", static_cast<unsigned long long>(r.round),
        static_cast<unsigned long long>(ac.steps), acc, r.train_loss.value_or(0.0),
        metric(r, "staleness_mean"), metric(r, "staleness_max"),
        static_cast<unsigned long long>(r.updates_rejected), simulation.now(), eta(left).c_str(),
        tty ? "" : "\n");
    if (tty && r.test_accuracy) std::printf("\n");
    std::fflush(stdout);
  });
  std::printf(
      "\nstarling-sim: %llu steps in %.1f s (%.1f simulated s); final test accuracy %s; %llu "
      "clients trained%s\n",
      static_cast<unsigned long long>(ac.steps),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
      simulation.now(),
      last_acc ? (std::to_string(100 * *last_acc).substr(0, 5) + "%").c_str() : "n/a",
      static_cast<unsigned long long>(simulation.clientsTrained()),
      deviceRoundNote(device_update).c_str());
  return 0;
}

int runSim(int argc, char** argv, apps::Settings& c) {
  // Every spec and value is checked before data is loaded or a worker started.
  server::EngineConfig ec = apps::engineConfig(c);
  // Every worker steps alike, and a simulation keeps no secret: its noise and sample come from
  // the run seed (privacy/dp.h).
  ec.dp.seeded_noise = true;
  ec.dp.population = c.data.num_clients;
  compression::makeCompressor(ec.scheme.compressor);
  aggregation::makeRule(ec.scheme.rule);
  aggregation::makeServerOptimizer(ec.server_opt, 1);
  data::makePartitioner(c.data.partition);
  c.data.source.validate();
  const sim::SchedulePolicy policy = sim::parseSchedulePolicy(c.sim.schedule);
  const sim::DeviceDistributions devices{c.devices.speed_median, c.devices.speed_sigma,
                                         c.devices.bandwidth_median, c.devices.bandwidth_sigma,
                                         c.devices.availability};
  devices.validate();
  const uint64_t num_clients = c.data.num_clients;
  STARLING_CHECK_ARG(c.sampling.poisson_rate > 0 || (c.sampling.clients_per_round >= 1 &&
                                                     c.sampling.clients_per_round <= num_clients),
                     "sampling.clients_per_round (", c.sampling.clients_per_round,
                     ") must be in [1, data.num_clients = ", num_clients, "]");
  // FedScale's semantics: this many per round, or every available client if fewer are available.
  // Every simulated client is registered: no waiting, a round needs one result, and the engine's
  // real-time deadline is the simulated deadline's (round.deadline_seconds) to enforce.
  ec.sampling.min_clients = 1;
  ec.sampling.min_available = 1;
  ec.completion.min_results = 1;
  ec.completion.min_completion_rate = 0;
  ec.round_deadline_ms = 3'600'000;
  ec.validate();
  sim::LaunchInfo launch = sim::launchInfoFromEnvironment();
  const uint64_t world =
      launch.world_size > 1 ? static_cast<uint64_t>(launch.world_size) : c.sim.workers;
  const bool async = buffered(c.round.mode);  // FedBuff or semisync: simulator/async_sim.h
  apps::checkRoundMode(c, apps::kSim, ec);
  // A robust rule needs every update in one place: across workers only streaming rules add up
  // (asynchronous workers each add every update).
  if (world > 1 && !async && !aggregation::makeRule(ec.scheme.rule)->streaming())
    STARLING_THROW(ConfigError, "aggregation.rule = '", ec.scheme.rule,
                   "' is not a streaming rule and cannot be split among ", world,
                   " workers; use sim.workers = 1 or a streaming rule (fedavg)");
  // The device is checked before workers start: a setting no worker can meet fails once, here.
  torch_trainer::WorkerPlacement placement{launch.local_rank, launch.local_world_size,
                                           static_cast<int>(c.sim.workers_per_gpu)};
  if (launch.world_size == 1) placement.local_workers = static_cast<int>(c.sim.workers);
  const torch_trainer::Device device = torch_trainer::chooseDevice(c.sim.device, placement);
  if (device.cuda()) torch_trainer::useReproducibleCuda();  // a GPU run is the CPU run's experiment
  // NCCL takes one rank per GPU, the local rank's (simulator/nccl_collectives.cc): workers sharing
  // a GPU, or pinned to one, need Gloo.
  if (c.sim.backend == "nccl" && (c.sim.workers_per_gpu > 1 || c.sim.device.rfind("cuda:", 0) == 0))
    STARLING_THROW(
        ConfigError,
        "sim.backend = nccl takes one worker per GPU (the GPU of its local rank): with ",
        c.sim.workers_per_gpu > 1 ? "sim.workers_per_gpu > 1" : "sim.device = " + c.sim.device,
        " use sim.backend = gloo");
  // Without a launcher, this process is rank 0 of sim.workers and starts the others.
  sim::LocalWorld local;
  if (launch.world_size == 1 && c.sim.workers > 1) {
    local = sim::startLocalWorld(static_cast<int>(c.sim.workers),
                                 std::vector<std::string>(argv + 1, argv + argc));
    launch = local.self;
  }
  // When this rank 0 stops on an error, the workers it started are given a moment to say theirs
  // (they die with it): each reports what it found, a worker that waits on rank 0 is killed then.
  const struct ChildrenOnError {
    const sim::LocalWorld& world;
    int uncaught = std::uncaught_exceptions();
    ~ChildrenOnError() {
      if (!world.children.empty() && std::uncaught_exceptions() > uncaught)
        sim::waitRanks(world.children, std::chrono::seconds(20));
    }
  } children_on_error{local};
  const bool lead = launch.rank == 0;
  torch_trainer::setThreads(c.sim.threads);

  // Every worker holds the data set: as bytes where the file has them (the LibTorch trainer reads
  // them as value / 255, the values of floats exactly), a quarter of the memory.
  data::DataSource source = c.data.source;
  source.keep_bytes = true;
  const data::LoadedData loaded = data::loadData(source);
  const data::Dataset& train = loaded.train;
  const data::Dataset* test = loaded.test ? &*loaded.test : nullptr;  // none: no evaluation
  sim::SimClients clients;
  clients.train = &train;
  clients.shards = data::makePartitioner(c.data.partition)
                       ->split(train.labels, train.num_classes, num_clients, c.model.seed);
  clients.devices = c.devices.trace.empty()
                        ? sim::DevicePopulation::sample(num_clients, devices, c.model.seed)
                        : sim::DevicePopulation::fromCsv(c.devices.trace, num_clients);
  if (!c.devices.availability_trace.empty())
    clients.devices.loadWindows(c.devices.availability_trace);
  std::unique_ptr<client::Trainer> trainer;
  try {
    trainer = torch_trainer::makeTorchTrainer(c.model.spec, train, device);
  } catch (const InvalidArgument& e) {  // the model does not fit the data's shape or classes
    STARLING_THROW(ConfigError, "model.spec = '", c.model.spec, "' does not fit data.train (",
                   loaded.train_path, ": ", data::describe(train), "): ", e.what(),
                   train.rows == 1 ? " (the examples are flat: data.shape = ROWSxCOLS views them "
                                     "as images; logreg and mlp "
                                     "take any shape)"
                                   : "");
  }
  const auto layout = std::make_shared<const ParamLayout>(trainer->layout());
  std::unique_ptr<client::DeviceUpdate> device_round;
  if (deviceRoundOn(c.sim.device_round, device))
    device_round = torch_trainer::makeDeviceUpdate(*trainer);
  // SCAFFOLD is the round engine's, as in a deployment: c lives in the engine (and its
  // checkpoint), N is the simulated population.
  if (ec.scheme.scaffold) client::checkScaffoldTrainer(*trainer);
  ec.scaffold_population = ec.scheme.scaffold ? num_clients : 0;
  if (lead) {
    std::printf(
        "starling-sim: %s (%zu parameters) | %llu clients, %s | %s | %s | %s | %d "
        "worker%s (%s, %s) on %s\n",
        trainer->spec().c_str(), layout->numel(), static_cast<unsigned long long>(num_clients),
        c.data.partition.c_str(),
        (c.sampling.poisson_rate > 0
             ? "each client sampled with probability " + std::to_string(c.sampling.poisson_rate)
             : std::to_string(c.sampling.clients_per_round) + " per round")
            .c_str(),
        ec.scheme.compressor.c_str(), ec.scheme.rule.c_str(), launch.world_size,
        launch.world_size == 1 ? "" : "s", c.sim.backend.c_str(), launch.source.c_str(),
        device.cuda() ? (device.str() + (launch.world_size > 1 ? " (rank 0)" : "")).c_str()
                      : "cpu");
    std::printf("data: train %s (%s); test %s\n", data::describe(train).c_str(),
                loaded.train_path.c_str(),
                test ? (data::describe(*test) + " (" + loaded.test_path + ")").c_str() : "none");
    if (device_round)
      std::printf(
          "round on the device (sim.device_round = %s): %s\n", apps::name(c.sim.device_round),
          device_round->serves(*compression::makeCompressor(ec.scheme.compressor))
              ? (ec.scheme.scaffold ? "each update formed and compressed where it trains, "
                                      "with SCAFFOLD's control change"
                                    : "each update formed and compressed where it trains")
              : "this compressor is compressed on the host (top-k, stc, rand-k, random-block, "
                "sign, QSGD, PowerSGD and ACP-SGD are served)");
    if (c.data.stats || !c.data.stats_file.empty()) {
      const data::PartitionStats st =
          data::partitionStats(train.labels, train.num_classes, clients.shards);
      if (c.data.stats) std::printf("%s\n", data::summary(st).c_str());
      if (!c.data.stats_file.empty()) data::writeStatsCsv(st, c.data.stats_file);
    }
    if (!c.data.split_file.empty())
      data::writeSplit(clients.shards, train.size(),
                       "partition " + c.data.partition + ", model.seed " +
                           std::to_string(c.model.seed) + ", train " + loaded.train_path,
                       c.data.split_file);
    std::fflush(stdout);
  }

  sim::CollectiveOptions co;
  co.bucket_bytes = c.sim.bucket_bytes;
  auto coll =
      launch.world_size == 1 ? sim::makeLocal() : sim::makeCollectives(c.sim.backend, launch, co);
  const bool sharded = c.sim.sharded_step && launch.world_size > 1;
  sim::StateStoreOptions so;
  so.memory_bytes = c.state.memory_bytes;
  // With a checkpoint the client states must survive a crash too (error-feedback residuals,
  // SCAFFOLD's c_i): they are kept beside it unless state.dir says where.
  std::string state_dir = c.state.dir;
  if (state_dir.empty() && !ec.checkpoint.empty()) state_dir = ec.checkpoint + ".states";
  // Asynchronous workers keep every state in the first one's store (simulator/async_sim.h).
  if (async && !lead) state_dir.clear();
  if (!state_dir.empty()) {
    so.spill_dir = state_dir + "/worker-" + std::to_string(launch.rank);
    const bool stored = sim::ClientStateStore::holdsStore(so.spill_dir);
    if (async) {
      // An asynchronous run reopens whatever store is there: its checkpoint names the step its
      // states are at (AsyncSimulation refuses a pair that does not match, and a store killed
      // before its first checkpoint reopens empty).
      so.resume = !ec.checkpoint.empty() && stored;
    } else {
      // A resumed run reopens the states its workers flushed at the checkpoint; one without its
      // checkpoint reopens the folder too (so a run still using it is refused by its lock), and is
      // checked below.
      so.resume = stored || (!ec.checkpoint.empty() && std::filesystem::exists(ec.checkpoint) &&
                             std::filesystem::exists(so.spill_dir));
    }
  }
  sim::ClientStateStore store(so, layout->fingerprint());
  // States that no checkpoint resumes, said in the settings' words: a store never flushed (a run
  // killed before its first checkpoint) reopens empty and the run starts over; flushed states whose
  // checkpoint is gone, or an earlier run's without one, stop it.
  if (!async && so.resume && store.stats().clients > 0 &&
      (ec.checkpoint.empty() || !std::filesystem::exists(ec.checkpoint)))
    STARLING_THROW(ConfigError, "the client-state folder ", so.spill_dir, " holds ",
                   store.stats().clients, " clients' states of an earlier run, ",
                   ec.checkpoint.empty()
                       ? "and no state.checkpoint resumes them: remove it, or set state.dir to "
                         "another folder"
                       : "and its checkpoint " + ec.checkpoint +
                             " is missing: restore the checkpoint, or remove " + state_dir +
                             " to start over");
  const auto waitWorkers = [&](int rc) {
    for (const auto& [pid, status] : sim::waitLocalWorld(local)) {
      std::fprintf(stderr, "starling-sim: worker %d failed (%s %d)\n", pid,
                   status < 0 ? "signal" : "exit status", status < 0 ? -status : status);
      rc = 1;
    }
    return rc;
  };
  if (async)
    return waitWorkers(
        runAsync(c, ec, clients, *trainer, store, test, device_round.get(), *coll, lead));
  sim::SimFleetConfig fc{policy, c.sim.reference_spe, c.round.deadline_seconds, c.model.seed, {},
                         sharded};
  if (!state_dir.empty()) fc.homes_file = so.spill_dir + "/homes.bin";
  fc.durable_states = !ec.checkpoint.empty();
  fc.device_update = device_round.get();
  sim::SimFleet fleet(fc, clients, *trainer, store, *coll, test);

  std::vector<float> init(layout->numel());
  trainer->initParameters(init, c.model.seed);
  ec.write_files = lead;
  if (sharded) {
    ec.shard_rank = static_cast<uint32_t>(launch.rank);
    ec.shard_count = static_cast<uint32_t>(launch.world_size);
    if (!ec.checkpoint.empty())
      ec.optimizer_shard_file = ec.checkpoint + ".optimizer-" + std::to_string(launch.rank) +
                                "-of-" + std::to_string(launch.world_size);
  }
  server::RoundEngine engine(layout, ec, std::move(init));
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = isatty(STDOUT_FILENO);
  const uint64_t first = engine.nextRound();
  if (lead && engine.resumed())
    std::printf("resumed at round %llu\n", static_cast<unsigned long long>(first));
  if (const privacy::CentralDp* dp = engine.dp(); lead && dp)
    std::printf(
        "central DP: clip %g, noise multiplier %.4f, epsilon %.3f after %llu rounds "
        "(delta %g; noise from the run seed)\n",
        dp->config().clip, dp->noiseMultiplier(), dp->epsilon(ec.rounds),
        static_cast<unsigned long long>(ec.rounds), dp->config().delta);
  std::optional<double> last_acc;
  while (!engine.done()) {
    const server::RoundRecord r = engine.runRound(fleet);
    if (!lead) continue;
    if (r.test_accuracy) last_acc = r.test_accuracy;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double per_round = elapsed / static_cast<double>(r.round - first + 1);
    const double left = per_round * static_cast<double>(ec.rounds - r.round);
    char acc[32] = "", ef[80] = "";
    if (last_acc) std::snprintf(acc, sizeof acc, "  acc %5.1f%%", 100 * *last_acc);
    if (auto g = r.metrics.find("ef_gain"); g != r.metrics.end())
      std::snprintf(ef, sizeof ef, "  EF gain %.2f", g->second);
    if (r.dp_epsilon)
      std::snprintf(ef + std::strlen(ef), sizeof ef - std::strlen(ef), "  epsilon %.3f",
                    *r.dp_epsilon);
    std::printf(
        "%sround %4llu/%llu%s  loss %.4f%s  up %6.1f KB/client  makespan %.2f s  sim %.1f s  ETA "
        "%s%s",
        tty ? "\r" : "", static_cast<unsigned long long>(r.round),
        static_cast<unsigned long long>(ec.rounds), acc, r.train_loss.value_or(0.0), ef,
        r.clients_completed ? static_cast<double>(r.uplink_bytes) / 1024.0 /
                                  static_cast<double>(r.clients_completed)
                            : 0.0,
        r.makespan_seconds.value_or(0.0), r.sim_seconds.value_or(0.0), eta(left).c_str(),
        tty ? "" : "\n");
    if (tty && r.test_accuracy) std::printf("\n");
    std::fflush(stdout);
  }
  if (lead) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "\nstarling-sim: %llu rounds in %.1f s; final test accuracy %s; %llu clients trained on "
        "this worker; "
        "%llu client states moved between workers%s\n",
        static_cast<unsigned long long>(ec.rounds - first + 1), secs,
        last_acc ? (std::to_string(100 * *last_acc).substr(0, 5) + "%").c_str() : "n/a",
        static_cast<unsigned long long>(fleet.clientsTrained()),
        static_cast<unsigned long long>(fleet.statesMigrated()),
        deviceRoundNote(device_round.get()).c_str());
  }
  return waitWorkers(0);
}

}  // namespace

int main(int argc, char** argv) {
  apps::Settings c;
  apps::Options o(
      "starling-sim",
      "starling-sim: federated training of many simulated clients on few worker processes\n"
      "(FedML Parrot style: sequential training per worker, local then global aggregation over "
      "c10d).\n"
      "Every key can be set in a TOML file (--config) or on the command line (which wins); the\n"
      "same file runs as a deployment (docs/configuration.md).\n"
      "docs/simulation.md explains the configuration, the launch modes and the outputs.");
  apps::declareSettings(
      o, c, apps::kSim,
      {torch_trainer::torchTrainers().help(), compression::compressors().help(),
       aggregation::aggregationRules().help(), aggregation::serverOptimizers().help(), ""});
  if (const int rc = o.parse(argc, argv); rc >= 0) return rc;
  try {
    apps::resolveSettings(o, c, apps::kSim);
    return runSim(argc, argv, c);
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "starling-sim: %s\n", e.what());
    return 2;
  }
}
