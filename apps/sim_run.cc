// starling-sim's main (apps/sim_run.h): a simulation built from the settings, step by step.
#include "apps/sim_run.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "aggregation/rule.h"
#include "aggregation/server_optimizer.h"
#include "apps/common.h"
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
#include "ops/status_server.h"
#include "server/async_server.h"
#include "server/engine.h"
#include "server/fleet_metrics.h"
#include "simulator/async_sim.h"
#include "simulator/collectives.h"
#include "simulator/launch.h"
#include "simulator/sim_fleet.h"
#include "simulator/state_store.h"
#include "torch_trainer/device.h"
#include "torch_trainer/device_round.h"
#include "torch_trainer/threads.h"
#include "torch_trainer/torch_trainer.h"

namespace starling::apps {
namespace {
namespace sim = starling::simulator;

// log.format: what the simulator prints. Text (the default): as it is, on stdout, a round's line
// refreshed in place on a terminal. JSON: each line one object on stdout in the deployed programs'
// format (apps::JsonLogFormatter: ts, level, program "sim", msg, and round on a round's line).
std::shared_ptr<spdlog::logger>& jsonOut() {
  static std::shared_ptr<spdlog::logger> out;
  return out;
}

[[gnu::format(printf, 1, 2)]] void say(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::va_list again;
  va_copy(again, args);
  char small[1024];
  const int n = std::vsnprintf(small, sizeof small, format, args);
  va_end(args);
  std::string text;
  if (n >= 0 && static_cast<size_t>(n) < sizeof small) {
    text.assign(small, static_cast<size_t>(n));
  } else if (n >= 0) {
    text.resize(static_cast<size_t>(n) + 1);
    std::vsnprintf(text.data(), text.size(), format, again);
    text.resize(static_cast<size_t>(n));
  }
  va_end(again);
  const std::shared_ptr<spdlog::logger>& json = jsonOut();
  if (!json) {
    std::fputs(text.c_str(), stdout);
    return;
  }
  for (size_t at = 0; at <= text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    line.erase(std::remove(line.begin(), line.end(), '\r'), line.end());
    if (!line.empty()) json->info("{}", line);
    at = end + 1;
  }
}

std::string eta(double seconds) {
  char buf[32];
  const int s = static_cast<int>(seconds);
  std::snprintf(buf, sizeof buf, "%d:%02d", s / 60, s % 60);
  return buf;
}

// sim.device_round: whether the clients' updates are formed and compressed on the trainer's
// device (auto: when that is a GPU).
bool deviceRoundOn(DeviceRound setting, const torch_trainer::Device& device) {
  return setting == DeviceRound::kOn || (setting == DeviceRound::kAuto && device.cuda());
}

// The end of a run's summary line: how many updates the round on the device made.
std::string deviceRoundNote(const client::DeviceUpdate* d) {
  return d ? "; " + std::to_string(d->updates()) + " updates formed on the device" : "";
}

// The last test accuracy measured, at `measured` (a round or step); when that is not `now`, marked
// with it: a value carried over from an earlier evaluation is not this round's (the demo once
// printed "acc 65.6%" on rounds 15 to 19 as if each had measured it).
std::string accuracyNote(const std::optional<double>& acc, uint64_t measured, uint64_t now,
                         const char* unit) {
  if (!acc) return "n/a";
  char buf[64];
  if (measured == now)
    std::snprintf(buf, sizeof buf, "%.1f%%", 100 * *acc);
  else
    std::snprintf(buf, sizeof buf, "%.1f%% (%s %llu)", 100 * *acc, unit,
                  static_cast<unsigned long long>(measured));
  return buf;
}

// What a simulation is before anything is loaded: the round engine's configuration, the launch
// (this worker among how many), the device its trainer uses, the simulated devices.
struct SimPlan {
  server::EngineConfig ec;
  sim::LaunchInfo launch;
  uint64_t world = 1;
  bool buffered = false;  // FedBuff or semisync: simulator/async_sim.h
  torch_trainer::Device device;
  sim::SchedulePolicy policy = sim::SchedulePolicy::kLpt;
  sim::DeviceDistributions devices;
};

// Every spec and value checked before data is loaded or a worker started: each refusal once,
// naming its key.
SimPlan planSimulation(const Settings& c) {
  SimPlan p;
  server::EngineConfig& ec = p.ec;
  ec = engineConfig(c);
  // Every worker steps alike, and a simulation keeps no secret: its noise and sample come from
  // the run seed (privacy/dp.h).
  ec.dp.seeded_noise = true;
  ec.dp.population = c.data.num_clients;
  // The malicious-server threat model's signed keys, the simulation its own authority.
  if (ec.secagg.enabled && c.secagg.threat == SecAggThreat::kMaliciousServer)
    ec.secagg.authority = sim::simAuthority(c.model.seed).public_key;
  compression::makeCompressor(ec.scheme.compressor);
  aggregation::makeRule(ec.scheme.rule);
  aggregation::makeServerOptimizer(ec.server_opt, 1);
  data::makePartitioner(c.data.partition);
  c.data.source.validate();
  p.policy = sim::parseSchedulePolicy(c.sim.schedule);
  p.devices = sim::DeviceDistributions{c.devices.speed_median, c.devices.speed_sigma,
                                       c.devices.bandwidth_median, c.devices.bandwidth_sigma,
                                       c.devices.availability};
  p.devices.validate();
  STARLING_CHECK_ARG(
      c.sampling.poisson_rate > 0 ||
          (c.sampling.clients_per_round >= 1 && c.sampling.clients_per_round <= c.data.num_clients),
      "sampling.clients_per_round (", c.sampling.clients_per_round,
      ") must be in [1, data.num_clients = ", c.data.num_clients, "]");
  // FedScale's semantics: this many per round, or every available client if fewer are available.
  // Every simulated client is registered: no waiting, a round needs one result, and the engine's
  // real-time deadline is the simulated deadline's (round.deadline_seconds) to enforce.
  ec.sampling.min_clients = 1;
  ec.sampling.min_available = 1;
  ec.completion.min_results = 1;
  ec.completion.min_completion_rate = 0;
  ec.round_deadline_ms = 3'600'000;
  ec.validate();
  p.launch = sim::launchInfoFromEnvironment();
  p.world = p.launch.world_size > 1 ? static_cast<uint64_t>(p.launch.world_size) : c.sim.workers;
  p.buffered = buffered(c.round.mode);
  checkRoundMode(c, kSim, ec);
  // A mirrored downlink keeps each participant's copy through its round (Poisson sampling's
  // rounds are checked as they come: SimFleet).
  if (server::downlinkMirrored(ec.downlink) && !p.buffered && c.sampling.poisson_rate == 0) {
    const auto per_round = static_cast<uint64_t>(
        std::ceil(static_cast<double>(c.sampling.clients_per_round) * c.sampling.overcommit));
    if (per_round > c.downlink.copies)
      STARLING_THROW(ConfigError, "downlink.copies = ", c.downlink.copies,
                     " keeps fewer clients' copies than a round's ", per_round,
                     " participants (sampling.clients_per_round times sampling.overcommit): "
                     "raise it to at least that");
  }
  // A robust rule needs every update in one place: across workers only streaming rules add up
  // (asynchronous workers each add every update).
  if (p.world > 1 && !p.buffered && !aggregation::makeRule(ec.scheme.rule)->streaming())
    STARLING_THROW(ConfigError, "aggregation.rule = '", ec.scheme.rule,
                   "' is not a streaming rule and cannot be split among ", p.world,
                   " workers; use sim.workers = 1 or a streaming rule (fedavg)");
  // The device is checked before workers start: a setting no worker can meet fails once, here.
  torch_trainer::WorkerPlacement placement{p.launch.local_rank, p.launch.local_world_size,
                                           static_cast<int>(c.sim.workers_per_gpu)};
  if (p.launch.world_size == 1) placement.local_workers = static_cast<int>(c.sim.workers);
  p.device = torch_trainer::chooseDevice(c.sim.device, placement);
  // NCCL takes one rank per GPU, the local rank's (simulator/nccl_collectives.cc): workers sharing
  // a GPU, or pinned to one, need Gloo.
  if (c.sim.backend == "nccl" && (c.sim.workers_per_gpu > 1 || c.sim.device.rfind("cuda:", 0) == 0))
    STARLING_THROW(
        ConfigError,
        "sim.backend = nccl takes one worker per GPU (the GPU of its local rank): with ",
        c.sim.workers_per_gpu > 1 ? "sim.workers_per_gpu > 1" : "sim.device = " + c.sim.device,
        " use sim.backend = gloo");
  return p;
}

// The simulation's parts every worker holds: the data set, the clients (their shards and
// devices), the trainer and the round on the device. Not movable: the clients point at the data.
struct SimParts {
  data::LoadedData loaded;
  sim::SimClients clients;
  std::unique_ptr<client::Trainer> trainer;
  std::shared_ptr<const ParamLayout> layout;
  std::unique_ptr<client::DeviceUpdate> device_round;
  const data::Dataset* test() const { return loaded.test ? &*loaded.test : nullptr; }
  SimParts() = default;
  SimParts(SimParts&&) = delete;  // clients.train points at loaded.train
  SimParts& operator=(SimParts&&) = delete;
};

std::unique_ptr<SimParts> loadSimulation(const Settings& c, SimPlan& plan) {
  auto parts = std::make_unique<SimParts>();
  // Every worker holds the data set: as bytes where the file has them (the LibTorch trainer reads
  // them as value / 255, the values of floats exactly), a quarter of the memory.
  data::DataSource source = c.data.source;
  source.keep_bytes = true;
  parts->loaded = data::loadData(source);
  const data::Dataset& train = parts->loaded.train;
  const uint64_t n = c.data.num_clients;
  sim::SimClients& clients = parts->clients;
  clients.train = &train;
  // A rule that draws each client's shard on its own (sampled) holds nothing per client.
  clients.shards = data::ClientShards::make(data::makePartitioner(c.data.partition), train.labels,
                                            train.num_classes, n, c.model.seed);
  clients.devices = c.devices.trace.empty()
                        ? sim::DevicePopulation::sample(n, plan.devices, c.model.seed)
                        : sim::DevicePopulation::fromCsv(c.devices.trace, n);
  if (!c.devices.availability_trace.empty())
    clients.devices.loadWindows(c.devices.availability_trace);
  try {
    parts->trainer = torch_trainer::makeTorchTrainer(c.model.spec, train, plan.device);
  } catch (const InvalidArgument& e) {  // the model does not fit the data's shape or classes
    STARLING_THROW(ConfigError, "model.spec = '", c.model.spec, "' does not fit data.train (",
                   parts->loaded.train_path, ": ", data::describe(train), "): ", e.what(),
                   train.rows == 1 ? " (the examples are flat: data.shape = ROWSxCOLS views them "
                                     "as images; logreg and mlp "
                                     "take any shape)"
                                   : "");
  }
  parts->layout = std::make_shared<const ParamLayout>(parts->trainer->layout());
  if (deviceRoundOn(c.sim.device_round, plan.device))
    parts->device_round = torch_trainer::makeDeviceUpdate(*parts->trainer);
  // SCAFFOLD is the round engine's, as in a deployment: c lives in the engine (and its
  // checkpoint), N is the simulated population.
  if (plan.ec.scheme.scaffold) client::checkScaffoldTrainer(*parts->trainer);
  plan.ec.scaffold_population = plan.ec.scheme.scaffold ? n : 0;
  return parts;
}

// The most memory describe() spends on the pool's statistics or split file.
constexpr double kMaxDescribeBytes = 2e9;

// The first worker's account of the run before it starts, and the data files it was asked for.
void describe(const Settings& c, const SimPlan& plan, const SimParts& parts) {
  const server::EngineConfig& ec = plan.ec;
  const data::Dataset& train = parts.loaded.train;
  const int world = plan.launch.world_size;
  say("starling-sim: %s (%zu parameters) | %llu clients, %s | %s | %s | %s | %d "
      "worker%s (%s, %s) on %s\n",
      parts.trainer->spec().c_str(), parts.layout->numel(),
      static_cast<unsigned long long>(c.data.num_clients), c.data.partition.c_str(),
      (c.sampling.poisson_rate > 0
           ? "each client sampled with probability " + std::to_string(c.sampling.poisson_rate)
           : std::to_string(c.sampling.clients_per_round) + " per round")
          .c_str(),
      ec.scheme.compressor.c_str(), ec.scheme.rule.c_str(), world, world == 1 ? "" : "s",
      c.sim.backend.c_str(), plan.launch.source.c_str(),
      plan.device.cuda() ? (plan.device.str() + (world > 1 ? " (rank 0)" : "")).c_str() : "cpu");
  if (server::downlinkMirrored(ec.downlink)) {
    // A simulation has no more clients than its pool: the bound is the smaller of the two.
    const std::uint64_t kept = std::min<std::uint64_t>(c.downlink.copies, c.data.num_clients);
    say("downlink %s: up to %llu clients' copies of the model, %.0f MB on every worker (twice that "
        "with a checkpoint, which holds them all)\n",
        server::downlinkName(ec.downlink), static_cast<unsigned long long>(kept),
        static_cast<double>(kept) * 4.0 * static_cast<double>(parts.layout->numel()) / 1e6);
  }
  say("data: train %s (%s); test %s\n", data::describe(train).c_str(),
      parts.loaded.train_path.c_str(),
      parts.test() ? (data::describe(*parts.test()) + " (" + parts.loaded.test_path + ")").c_str()
                   : "none");
  if (parts.device_round)
    say("round on the device (sim.device_round = %s): %s\n", name(c.sim.device_round),
        parts.device_round->serves(*compression::makeCompressor(ec.scheme.compressor))
            ? (ec.scheme.scaffold ? "each update formed and compressed where it trains, "
                                    "with SCAFFOLD's control change"
                                  : "each update formed and compressed where it trains")
            : "this compressor is compressed on the host (top-k, stc, rand-k, random-block, "
              "sign, QSGD, PowerSGD and ACP-SGD are served)");
  // Both describe every client of the pool in memory: a drawn pool of millions is refused with
  // what it would take.
  const data::ClientShards& shards = parts.clients.shards;
  const auto refuseHuge = [&](const char* key, double bytes) {
    if (bytes > kMaxDescribeBytes)
      STARLING_THROW(ConfigError, key, " describes every client of the pool in memory: about ",
                     static_cast<uint64_t>(bytes / 1e6), " MB for ", shards.size(),
                     " clients (at most ", static_cast<uint64_t>(kMaxDescribeBytes / 1e6),
                     " MB); ask for it with a smaller data.num_clients (a drawn client's shard "
                     "depends only on model.seed and its id, not on the pool's size)");
  };
  const double clients = static_cast<double>(shards.size()),
               per_client = shards.size() ? static_cast<double>(shards.examples(0)) : 0.0;
  if (shards.drawn()) {
    if (c.data.stats || !c.data.stats_file.empty())
      refuseHuge(c.data.stats ? "data.stats" : "data.stats_file",
                 clients * (8.0 * train.num_classes + 80.0));
    if (!c.data.split_file.empty())
      refuseHuge("data.split_file", clients * (per_client * 7.0 + 1.0));
  }
  if (c.data.stats || !c.data.stats_file.empty()) {
    const data::PartitionStats st =
        data::partitionStats(train.labels, train.num_classes, parts.clients.shards);
    if (c.data.stats) say("%s\n", data::summary(st).c_str());
    if (!c.data.stats_file.empty()) data::writeStatsCsv(st, c.data.stats_file);
  }
  if (!c.data.split_file.empty())
    data::writeSplit(parts.clients.shards, train.size(),
                     "partition " + c.data.partition + ", model.seed " +
                         std::to_string(c.model.seed) + ", train " + parts.loaded.train_path,
                     c.data.split_file);
  std::fflush(stdout);
}

// status.listen: the status page and metrics of the run (rank 0 only), fed each round's record and
// the ETA; served on the status server's threads.
struct SimStatus {
  std::shared_ptr<ops::Registry> registry = std::make_shared<ops::Registry>();
  server::FleetMetrics metrics;
  ops::StatusServer server;
  SimStatus(const Settings& c, const SimParts& parts, uint64_t rounds)
      : metrics(registry, "simulation", parts.trainer->spec(),
                hexFingerprint(parts.layout->fingerprint())),
        server(ops::StatusConfig{c.status.listen, c.status.token_file}, registry,
               "starling-sim (" + parts.trainer->spec() + ")", nullptr,
               [this] { return metrics.statusJson(); }) {
    metrics.setPlannedRounds(rounds);
    // A round's clients; in buffered rounds, those training at once (async.concurrency).
    const uint64_t per_round = buffered(c.round.mode) && c.async.concurrency ? c.async.concurrency
                               : c.sampling.poisson_rate > 0
                                   ? static_cast<uint64_t>(c.sampling.poisson_rate *
                                                           static_cast<double>(c.data.num_clients))
                                   : c.sampling.clients_per_round;
    metrics.setSimulated(parts.clients.shards.size(), per_round);
    metrics.roundStarted(1);
    say("status: %s serves /metrics and the status page (/, /status.json)\n", server.url().c_str());
    std::fflush(stdout);
  }
  void record(const server::RoundRecord& r, double eta_seconds) {
    metrics.roundRecorded(r);
    metrics.roundStarted(r.round + 1);
    metrics.setEta(eta_seconds);
  }
};

// FedBuff or semi-synchronous rounds: the buffered engine on the simulated event clock.
void runBuffered(const Settings& c, const SimPlan& plan, SimParts& parts,
                 sim::ClientStateStore& store, sim::Collectives& workers, bool lead,
                 SimStatus* status) {
  const server::EngineConfig& ec = plan.ec;
  client::Trainer& trainer = *parts.trainer;
  std::vector<float> init(parts.layout->numel());
  trainer.initParameters(init, c.model.seed);
  server::AsyncServer server(parts.layout, asyncServerConfig(c, ec), std::move(init));
  sim::AsyncSimConfig ac;
  ac.steps = ec.rounds;
  ac.concurrency = c.async.concurrency ? c.async.concurrency : c.sampling.clients_per_round;
  if (c.round.mode == RoundMode::kSemisync) ac.round_seconds = c.round.deadline_seconds;
  ac.reference_seconds_per_example = c.sim.reference_spe;
  ac.seed = c.model.seed;
  ac.fit = ec.fit;
  ac.eval_every = ec.eval_every;
  ac.metrics_file = ec.metrics;
  ac.checkpoint = ec.checkpoint;
  ac.device_update = parts.device_round.get();
  ac.workers = &workers;  // only the first one writes metrics and checkpoints
  ac.downlink_copies = c.downlink.copies;
  sim::AsyncSimulation simulation(ac, parts.clients, trainer, store, server, parts.test());
  if (!lead) {  // the first worker reports
    simulation.run();
    return;
  }
  if (simulation.resumed())
    say("resumed at step %llu (model version %llu, %llu updates buffered, %.1f simulated s)\n",
        static_cast<unsigned long long>(server.steps() + 1),
        static_cast<unsigned long long>(server.version()),
        static_cast<unsigned long long>(server.buffered()), simulation.now());
  if (ac.round_seconds > 0)
    say("semi-synchronous rounds of %g simulated s: up to %llu clients training at once, late "
        "updates weighted by staleness %s up to %llu\n",
        ac.round_seconds, static_cast<unsigned long long>(ac.concurrency),
        c.async.staleness.c_str(), static_cast<unsigned long long>(c.async.max_staleness));
  else
    say("async (FedBuff): %llu clients training at once, a step every %llu updates, staleness %s "
        "up to %llu\n",
        static_cast<unsigned long long>(ac.concurrency),
        static_cast<unsigned long long>(c.async.buffer_size), c.async.staleness.c_str(),
        static_cast<unsigned long long>(c.async.max_staleness));
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = !jsonOut() && isatty(STDOUT_FILENO);
  std::optional<double> last_acc;
  uint64_t acc_at = 0, last_step = 0;
  const auto metric = [](const server::RoundRecord& r, const char* name) {
    const auto it = r.metrics.find(name);
    return it == r.metrics.end() ? 0.0 : it->second;  // a round where nothing arrived has none
  };
  simulation.run([&](const server::RoundRecord& r) {
    if (r.test_accuracy) {
      last_acc = r.test_accuracy;
      acc_at = r.round;
    }
    last_step = r.round;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double left =
        elapsed / static_cast<double>(r.round) * static_cast<double>(ac.steps - r.round);
    if (status) status->record(r, left);
    const ScopedLogFields in_step(r.round, std::nullopt);  // JSON: the line's round
    const std::string acc =
        last_acc ? "  acc " + accuracyNote(last_acc, acc_at, r.round, "step") : std::string();
    say("%sstep %4llu/%llu%s  loss %.4f  staleness %.1f (max %.0f)  refused %llu  sim %.1f s  ETA "
        "%s%s",
        tty ? "\r" : "", static_cast<unsigned long long>(r.round),
        static_cast<unsigned long long>(ac.steps), acc.c_str(), r.train_loss.value_or(0.0),
        metric(r, "staleness_mean"), metric(r, "staleness_max"),
        static_cast<unsigned long long>(r.updates_rejected), simulation.now(), eta(left).c_str(),
        tty ? "" : "\n");
    if (tty && r.test_accuracy) say("\n");
    std::fflush(stdout);
  });
  say("\nstarling-sim: %llu steps in %.1f s (%.1f simulated s); final test accuracy %s; %llu "
      "clients trained%s\n",
      static_cast<unsigned long long>(ac.steps),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
      simulation.now(), accuracyNote(last_acc, acc_at, last_step, "step").c_str(),
      static_cast<unsigned long long>(simulation.clientsTrained()),
      deviceRoundNote(parts.device_round.get()).c_str());
}

// Synchronous rounds: the round engine over the simulated fleet, each worker training its share.
void runSynchronous(const Settings& c, SimPlan& plan, SimParts& parts,
                    const sim::ClientStatesPlan& states, sim::ClientStateStore& store,
                    sim::Collectives& workers, bool lead, SimStatus* status) {
  server::EngineConfig& ec = plan.ec;
  const sim::LaunchInfo& launch = plan.launch;
  // Under secure aggregation every worker unmasks the one sum and steps the whole model with it.
  const bool sharded = c.sim.sharded_step && launch.world_size > 1 && !ec.secagg.enabled;
  sim::SimFleetConfig fc{
      plan.policy, c.sim.reference_spe, c.round.deadline_seconds, c.model.seed, {}, sharded};
  if (!states.folder.empty()) fc.homes_file = states.options.spill_dir + "/homes.bin";
  fc.durable_states = !ec.checkpoint.empty();
  fc.device_update = parts.device_round.get();
  fc.secure_batch_bytes = c.sim.secagg_batch_bytes;
  fc.secure_signed = ec.secagg.authority.has_value();
  fc.downlink = ec.downlink;
  fc.downlink_copies = c.downlink.copies;
  fc.downlink_density = c.downlink.density;
  sim::SimFleet fleet(fc, parts.clients, *parts.trainer, store, workers, parts.test());

  std::vector<float> init(parts.layout->numel());
  parts.trainer->initParameters(init, c.model.seed);
  ec.write_files = lead;
  if (sharded) {
    ec.shard_rank = static_cast<uint32_t>(launch.rank);
    ec.shard_count = static_cast<uint32_t>(launch.world_size);
    if (!ec.checkpoint.empty())
      ec.optimizer_shard_file = ec.checkpoint + ".optimizer-" + std::to_string(launch.rank) +
                                "-of-" + std::to_string(launch.world_size);
  }
  server::RoundEngine engine(parts.layout, ec, std::move(init));
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = !jsonOut() && isatty(STDOUT_FILENO);
  const uint64_t first = engine.nextRound();
  if (lead && engine.resumed())
    say("resumed at round %llu\n", static_cast<unsigned long long>(first));
  if (lead && c.round.semisync_under_dp)
    say("round.mode = semisync under DP: each round's Poisson sample, the round closing at "
        "round.deadline_seconds (%g simulated seconds) with what arrived; a late update is "
        "dropped, not carried into a later round (docs/privacy.md)\n",
        c.round.deadline_seconds);
  if (const privacy::ClientDp* dp = engine.dp(); lead && dp)
    say("%s DP: clip %g, noise multiplier %.4f, epsilon %.3f after %llu rounds "
        "(delta %g; noise from the run seed%s)\n",
        dp->distributed() ? "distributed" : "central", dp->config().clip, dp->noiseMultiplier(),
        dp->epsilon(ec.rounds), static_cast<unsigned long long>(ec.rounds), dp->config().delta,
        dp->distributed() ? ", each client's in the ring" : "");
  if (const privacy::ClientDp* dp = engine.dp(); lead && dp && dp->config().adaptive_clip)
    say("adaptive clipping: the clip (%.4g now) follows the %g quantile of the update norms, "
        "steps of %g; the count's noise %.4g, the sum's noise multiplier %.4f\n",
        dp->clip(), dp->config().target_quantile, dp->config().clip_lr, dp->countNoise(),
        dp->sumNoiseMultiplier());
  if (const privacy::ClientDp* dp = engine.dp(); lead && dp && dp->distributed()) {
    const auto expected =
        static_cast<unsigned long long>(std::ceil(dp->q() * static_cast<double>(ec.rounds)));
    say("distributed DP against the root, which knows who took part: epsilon %.3f for a client "
        "in %llu rounds (the expected count), %.3f in %llu\n",
        dp->epsilonKnownSample(expected), expected, dp->epsilonKnownSample(2 * expected),
        2 * expected);
  }
  std::optional<double> last_acc;
  uint64_t acc_at = 0, last_round = 0;
  while (!engine.done()) {
    const server::RoundRecord r = engine.runRound(fleet);
    if (!lead) continue;
    if (r.test_accuracy) {
      last_acc = r.test_accuracy;
      acc_at = r.round;
    }
    last_round = r.round;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double per_round = elapsed / static_cast<double>(r.round - first + 1);
    const double left = per_round * static_cast<double>(ec.rounds - r.round);
    if (status) status->record(r, left);
    const ScopedLogFields in_round(r.round, std::nullopt);  // JSON: the line's round
    const std::string acc =
        last_acc ? "  acc " + accuracyNote(last_acc, acc_at, r.round, "round") : std::string();
    char ef[80] = "";
    if (auto g = r.metrics.find("ef_gain"); g != r.metrics.end())
      std::snprintf(ef, sizeof ef, "  EF gain %.2f", g->second);
    if (r.dp_epsilon)
      std::snprintf(ef + std::strlen(ef), sizeof ef - std::strlen(ef), "  epsilon %.3f",
                    *r.dp_epsilon);
    say("%sround %4llu/%llu%s  loss %.4f%s  up %6.1f KB/client  makespan %.2f s  sim %.1f s  ETA "
        "%s%s",
        tty ? "\r" : "", static_cast<unsigned long long>(r.round),
        static_cast<unsigned long long>(ec.rounds), acc.c_str(), r.train_loss.value_or(0.0), ef,
        r.clients_completed ? static_cast<double>(r.uplink_bytes) / 1024.0 /
                                  static_cast<double>(r.clients_completed)
                            : 0.0,
        r.makespan_seconds.value_or(0.0), r.sim_seconds.value_or(0.0), eta(left).c_str(),
        tty ? "" : "\n");
    if (tty && r.test_accuracy) say("\n");
    std::fflush(stdout);
  }
  if (lead) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    say("\nstarling-sim: %llu rounds in %.1f s; final test accuracy %s; %llu clients trained on "
        "this worker; "
        "%llu client states moved between workers%s\n",
        static_cast<unsigned long long>(ec.rounds - first + 1), secs,
        accuracyNote(last_acc, acc_at, last_round, "round").c_str(),
        static_cast<unsigned long long>(fleet.clientsTrained()),
        static_cast<unsigned long long>(fleet.statesMigrated()),
        deviceRoundNote(parts.device_round.get()).c_str());
  }
}

int runSim(int argc, char** argv, const Settings& c) {
  SimPlan plan = planSimulation(c);
  ops::StatusConfig{c.status.listen, c.status.token_file}.validate();  // before the data loads
  if (c.log_format == LogFormat::kJson) {
    jsonOut() = spdlog::stdout_logger_mt("sim");
    jsonOut()->set_formatter(std::make_unique<JsonLogFormatter>(false));
    jsonOut()->flush_on(spdlog::level::info);
  }
  sim::LaunchInfo& launch = plan.launch;
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
  if (plan.device.cuda())
    torch_trainer::useReproducibleCuda();  // a GPU run is the CPU run's experiment
  torch_trainer::setThreads(c.sim.threads);

  const std::unique_ptr<SimParts> parts = loadSimulation(c, plan);
  if (lead) describe(c, plan, *parts);

  sim::CollectiveOptions co;
  co.bucket_bytes = c.sim.bucket_bytes;
  auto workers =
      launch.world_size == 1 ? sim::makeLocal() : sim::makeCollectives(c.sim.backend, launch, co);
  const sim::ClientStatesSite site{c.state.dir, plan.ec.checkpoint,  launch.rank, plan.buffered,
                                   lead,        c.state.memory_bytes};
  const sim::ClientStatesPlan states = sim::planClientStates(site);
  sim::ClientStateStore store(states.options, parts->layout->fingerprint());
  sim::checkClientStates(site, states, store);
  std::unique_ptr<SimStatus> page;
  if (lead && !c.status.listen.empty())
    page = std::make_unique<SimStatus>(c, *parts, plan.ec.rounds);
  if (plan.buffered)
    runBuffered(c, plan, *parts, store, *workers, lead, page.get());
  else
    runSynchronous(c, plan, *parts, states, store, *workers, lead, page.get());
  int rc = 0;
  for (const auto& [pid, status] : sim::waitLocalWorld(local)) {
    std::fprintf(stderr, "starling-sim: worker %d failed (%s %d)\n", pid,
                 status < 0 ? "signal" : "exit status", status < 0 ? -status : status);
    rc = 1;
  }
  return rc;
}

}  // namespace

int simMain(int argc, char** argv) {
  Settings c;
  Options o(
      "starling-sim",
      "starling-sim: federated training of many simulated clients on few worker processes\n"
      "(FedML Parrot style: sequential training per worker, local then global aggregation over "
      "c10d).\n"
      "Every key can be set in a TOML file (--config) or on the command line (which wins); the\n"
      "same file runs as a deployment (docs/configuration.md).\n"
      "docs/simulation.md explains the configuration, the launch modes and the outputs.");
  declareSettings(
      o, c, kSim,
      {torch_trainer::torchTrainers().help(), compression::compressors().help(),
       aggregation::aggregationRules().help(), aggregation::serverOptimizers().help(), ""});
  if (const int rc = o.parse(argc, argv); rc >= 0) return rc;
  try {
    resolveSettings(o, c, kSim);
    return runSim(argc, argv, c);
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "starling-sim: %s\n", e.what());
    return 2;
  }
}

}  // namespace starling::apps
