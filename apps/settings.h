#pragma once
// One configuration for every Starling program: a TOML file that runs in starling-sim
// runs unchanged as a deployment (starling-server as root or edge aggregator, starling-client on
// each device), and the other way round. Every key is declared once, here (declareSettings), with
// its type, bounds, default and explanation, and with the programs that use it:
// - the experiment (model.*, data.*, train.*, sampling.clients_per_round, compression.*,
//   aggregation.*, bounds.*, downlink.*, eval.every, state.checkpoint, state.metrics) means the
//   same in the simulation and the deployment, with the same defaults;
// - sim.*, devices.* and the simulated clock's keys are starling-sim's; server.*, security.*,
//   net.*, client.* and the deployment's waits are the deployment's;
// - starling-split's own keys (role, device, split.*, cloud.*, edge.*, ...) are its, and it shares
//   model.*, data.dir, train.epochs/batch_size/lr, state.metrics, sim.threads, log.level and the
//   connection's keys with the others.
// A program checks every key of the file (type, range) and ignores those it does not use; on its
// command line a key it does not use is an error (apps/options.h). docs/configuration.md lists
// the keys by program.
//
// Plain values only: the edge build (no server, no simulator) compiles this too.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "apps/options.h"
#include "data/source.h"
#include "protocol/control.h"

namespace starling::apps {

enum Program : unsigned { kSim = 1, kServer = 2, kClient = 4, kSplit = 8 };

// round.mode: rounds that wait for their clients (the round engine), FedBuff's buffered steps, or
// rounds that close at a deadline with whatever arrived (the buffered step on a clock).
enum class RoundMode { kSync, kAsync, kSemisync };
const char* name(RoundMode m);  // its spelling in the configuration
inline bool buffered(RoundMode m) { return m != RoundMode::kSync; }
// server.role: the root runs the rounds; an edge aggregator relays a subtree to its upstream.
enum class ServerRole { kRoot, kAggregator };
const char* name(ServerRole r);
// sim.device_round: a client's update formed where its model trains (auto: on a GPU).
enum class DeviceRound { kAuto, kOn, kOff };
const char* name(DeviceRound d);
// privacy.dp: no differential privacy, or client-level DP with a trusted server (privacy/dp.h).
enum class DpMode { kOff, kCentral, kDistributed };
const char* name(DpMode m);
// secagg.threat: what secure aggregation defends against (docs/privacy.md): a server that follows
// the protocol while it looks (semi-honest), or one that may swap clients' keys or invent clients
// (malicious-server: the advertised keys are signed and certified by the federation authority).
enum class SecAggThreat { kSemiHonest, kMaliciousServer };
const char* name(SecAggThreat t);
// privacy.accountant: privacy::DpAccountant's spellings (pld, the tight one; rdp).
enum class DpAccountantKind { kPld, kRdp };
const char* name(DpAccountantKind a);

// log.format: the programs' log lines as text, or one JSON object each (apps/common.h).
enum class LogFormat { kText, kJson };
const char* name(LogFormat f);

// starling-split's role: pretrain (writes the pre-trained model), inproc (edge and cloud in one
// process), cloud (serves the top part over ZeroMQ) or edge (fine-tunes through a cloud).
enum class SplitRole { kPretrain, kInproc, kCloud, kEdge };
const char* name(SplitRole r);
// data.shift: starling-split's public and private parts of Fashion-MNIST.
enum class SplitShift { kClasses, kNoise, kRotate };
const char* name(SplitShift s);

struct Settings {
  struct Model {
    std::string spec = "cnn";
    uint64_t seed = 1;
    // The server's view of the clients' examples; 0: from data.* (the server reads the files'
    // shapes and labels when it can, resolveModelShape).
    uint64_t rows = 0, cols = 0;
    uint32_t classes = 0;
  } model;
  struct Data {
    data::DataSource source;
    uint64_t num_clients = 100;
    std::string partition = "dirichlet:alpha=0.5";
    bool stats = false;
    std::string stats_file;
    std::string split_file;
  } data;
  struct Train {
    uint64_t rounds = 50;
    protocol::FitSettings fit{1, 32, 0.05f, 0.0f};
    bool scaffold = false;
    uint64_t scaffold_population = 0;  // 0: data.num_clients when given, else the registered peers
  } train;
  struct Sampling {
    uint64_t clients_per_round = 10;  // FedScale's: this many, or all available if fewer
    double fraction = 1.0;            // deployment: instead of clients_per_round when given
    uint64_t min_clients = 1;
    uint64_t min_available = 0;  // 0: clients_per_round when sampling by count, else 1
    double overcommit = 1.0;
    uint32_t wait_ms = 60000;
    double poisson_rate = 0.0;  // > 0: Poisson sampling instead of the two above
  } sampling;
  struct Compression {
    std::string compressor = "topk:density=0.01";
    bool diagnostics = false;
  } compression;
  struct Aggregation {
    std::string rule = "fedavg", server_opt = "fedavg";
    std::vector<std::string> metrics{"train_loss"};
    double resparsify = 0.0;   // edge aggregator
    uint64_t min_clients = 1;  // edge aggregator: its clients before it joins upstream
    std::string metrics_file;  // edge aggregator: its JSON Lines file (aggregator.metrics)
  } aggregation;
  // aggregation::ValidationBounds' defaults (a test holds them equal).
  struct Bounds {
    double max_abs = 1e4, max_norm = 1e5;
    uint64_t max_examples = 10'000'000;
  } bounds;
  struct Downlink {
    std::string mode = "dense";
    double density = 0.01;
    uint64_t history = 4;
    uint64_t copies = 1000;  // the mirrored downlinks: the clients' copies kept
  } downlink;
  uint32_t eval_every = 5;
  // Differential privacy (docs/privacy.md; privacy::DpConfig's defaults).
  struct Privacy {
    DpMode dp = DpMode::kOff;
    DpAccountantKind accountant = DpAccountantKind::kPld;
    double clip = 0.0, noise_multiplier = 0.0, target_epsilon = 0.0, delta = 1e-5;
    bool seeded_noise = false;   // the root's; a simulation's noise is always seeded
    uint64_t min_clients = 0;    // distributed: 0 derives it (privacy::DpConfig)
    bool adaptive_clip = false;  // central: the clip follows a quantile (privacy::DpConfig)
    double target_quantile = 0.5, clip_lr = 0.2, clip_count_noise = 0.0;
  } privacy;
  // Secure aggregation (SecAgg+; server/secure_round.h): synchronous rounds of the simulator.
  struct SecAgg {
    bool enabled = false;
    uint32_t neighbours = 0, threshold = 0, bits = 32;
    double clip = 0.0;  // 0 under privacy.dp: privacy.clip
    SecAggThreat threat = SecAggThreat::kSemiHonest;
    std::string authority;     // the authority's public key file (malicious-server; deployed)
    double min_noise = 0;      // a client's floor on distributed DP's noise (client::SecAggTrust)
    uint64_t min_clients = 0;  // a client's floor on the clients of a sum (client::SecAggTrust)
  } secagg;
  struct Round {
    uint32_t deadline_ms = 60000;  // deployment: how long a phase waits
    double min_completion_rate = 0.0;
    double deadline_seconds = 0.0;  // simulation: the simulated clock's deadline
    RoundMode mode = RoundMode::kSync;
    // round.mode = semisync under privacy.dp, resolved (resolveSettings) to synchronous rounds
    // that close at the deadline with what their Poisson sample delivered, late updates dropped:
    // mode is then kSync, and this says why (the programs log it).
    bool semisync_under_dp = false;
  } round;
  // Buffered asynchronous aggregation (round.mode = async; aggregation/async_buffer.h).
  struct Async {
    uint64_t buffer_size = 10, max_staleness = 20;
    uint64_t concurrency = 0;  // 0: sampling.clients_per_round
    std::string staleness = "polynomial:a=0.5";
  } async;
  struct State {
    std::string checkpoint, metrics;
    std::string dir;                              // simulation: spilled client states
    uint64_t memory_bytes = uint64_t{256} << 20;  // simulation: per worker
    std::string file;                             // client: its compressor and SCAFFOLD state
  } state;
  struct Sim {
    uint64_t workers = 2;
    std::string backend = "gloo", device = "auto";
    DeviceRound device_round = DeviceRound::kAuto;  // torch_trainer/device_round.h
    uint64_t workers_per_gpu = 1;
    int threads = 1;
    std::string schedule = "lpt";
    bool sharded_step = true;
    uint64_t bucket_bytes = uint64_t{16} << 20;
    uint64_t secagg_batch_bytes = uint64_t{256} << 20;  // simulator::SimFleetConfig's
    double reference_spe = 1e-3;
  } sim;
  struct Devices {
    std::string trace;
    std::string availability_trace;  // windows of time (FedScale's behaviour traces)
    double speed_median = 1.0, speed_sigma = 0.0;
    double bandwidth_median = 1.25e6, bandwidth_sigma = 0.0;
    double availability = 1.0;
  } devices;
  struct Server {
    ServerRole role = ServerRole::kRoot;
    std::string bind = "tcp://127.0.0.1:7700", upstream;
    uint64_t id = 0;
    std::vector<std::string> aggregator_ids;
    uint32_t heartbeat_ms = 1000, silence_ms = 5000;
  } server;
  struct Net {
    bool insecure = false;
    std::string key, clients, server_key;
    uint64_t chunk_bytes = uint64_t{1} << 20;
    uint64_t max_message_bytes = uint64_t{1} << 30;
    uint64_t max_reassembly_bytes = uint64_t{1} << 30;
    double rate = 10000, burst = 2000;  // transport::TransportLimits' defaults (why: there)
    uint32_t server_silence_ms = 15000;
  } net;
  struct Client {
    std::string server = "tcp://127.0.0.1:7700";
    uint64_t id = 0;
  } client;
  std::string log_level = "info";
  LogFormat log_format = LogFormat::kText;
  // The operator's HTTP endpoint (ops/status_server.h): off unless status.listen is given.
  struct Status {
    std::string listen;      // HOST:PORT
    std::string token_file;  // a bearer token; required off loopback
  } status;
  // The root's control socket for starling-admin (server/admin.h); empty: none.
  std::string admin_socket;
  // starling-split's own keys (docs/split.md); it shares model.spec, model.seed, data.dir,
  // train.epochs, train.batch_size, train.lr, state.metrics, sim.threads, log.level, security.*
  // and net.* with the other programs.
  struct Split {
    SplitRole role = SplitRole::kInproc;
    std::string device = "auto";  // the cloud's part and pre-training
    SplitShift shift = SplitShift::kClasses;
    double noise = 0.5;
    uint64_t max_train = 0, max_test = 0;
    std::string cut = "conv2";
    uint32_t weight_rank = 0;
    bool skip = true;
    uint64_t edges = 1;
    std::string up = "none", down = "none";  // split::SplitTrainConfig's defaults
    bool train_bottom = true, splitfed = false;
    std::string pretrained = "split-pretrained.bin";
    uint32_t pretrain_epochs = 1;
    uint64_t splitfed_wait_ms = 300000;
    struct Cloud {
      std::string bind = "tcp://127.0.0.1:5700";
      std::string checkpoint = "split-cloud.bin";
      uint64_t checkpoint_every = 50, edge_timeout_ms = 60000, exit_after = 0;
      uint32_t splitfed_edges = 0;
      uint64_t max_sessions = 64, max_batch = 1024;
    } cloud;
    struct Edge {
      std::string cloud = "tcp://127.0.0.1:5700";
      uint64_t id = 1, shard = 0, step_timeout_ms = 10000;
      uint32_t tries = 6;
    } edge;
  } split;
};

// The registries' --help texts (each program has its own models; the edge build has no
// aggregation): empty for what `self` does not use.
struct RegistryHelp {
  std::string models, compressors, rules, server_optimizers;
  std::string split_codecs;  // starling-split's activation codecs
};

// Declares every key on `o`, bound to `s`; the keys `self` does not use are foreign.
void declareSettings(Options& o, Settings& s, Program self, const RegistryHelp& help);

// After parse: the defaults that follow other keys (sampling.min_available,
// train.scaffold_population), and the checks between keys of the experiment that need no file.
// ConfigError naming the keys.
void resolveSettings(const Options& o, Settings& s, Program self);

}  // namespace starling::apps
