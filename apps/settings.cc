#include "apps/settings.h"

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "data/partition.h"

namespace starling::apps {

namespace {
// Each mode's spellings, once: parsed by declareSettings, named by name().
const Spellings<RoundMode>& roundModes() {
  static const Spellings<RoundMode> t{
      {"sync", RoundMode::kSync}, {"async", RoundMode::kAsync}, {"semisync", RoundMode::kSemisync}};
  return t;
}
const Spellings<ServerRole>& serverRoles() {
  static const Spellings<ServerRole> t{{"root", ServerRole::kRoot},
                                       {"aggregator", ServerRole::kAggregator}};
  return t;
}
const Spellings<DeviceRound>& deviceRounds() {
  static const Spellings<DeviceRound> t{
      {"auto", DeviceRound::kAuto}, {"on", DeviceRound::kOn}, {"off", DeviceRound::kOff}};
  return t;
}
const Spellings<DpMode>& dpModes() {
  static const Spellings<DpMode> t{
      {"off", DpMode::kOff}, {"central", DpMode::kCentral}, {"distributed", DpMode::kDistributed}};
  return t;
}
const Spellings<SecAggThreat>& secaggThreats() {
  static const Spellings<SecAggThreat> t{{"semi-honest", SecAggThreat::kSemiHonest},
                                         {"malicious-server", SecAggThreat::kMaliciousServer}};
  return t;
}
const Spellings<DpAccountantKind>& dpAccountants() {
  static const Spellings<DpAccountantKind> t{{"pld", DpAccountantKind::kPld},
                                             {"rdp", DpAccountantKind::kRdp}};
  return t;
}
const Spellings<LogFormat>& logFormats() {
  static const Spellings<LogFormat> t{{"text", LogFormat::kText}, {"json", LogFormat::kJson}};
  return t;
}
const Spellings<SplitRole>& splitRoles() {
  static const Spellings<SplitRole> t{{"pretrain", SplitRole::kPretrain},
                                      {"inproc", SplitRole::kInproc},
                                      {"cloud", SplitRole::kCloud},
                                      {"edge", SplitRole::kEdge}};
  return t;
}
const Spellings<SplitShift>& splitShifts() {
  static const Spellings<SplitShift> t{{"classes", SplitShift::kClasses},
                                       {"noise", SplitShift::kNoise},
                                       {"rotate", SplitShift::kRotate}};
  return t;
}
}  // namespace

const char* name(DpMode m) { return spellingOf(dpModes(), m); }
const char* name(SecAggThreat t) { return spellingOf(secaggThreats(), t); }
const char* name(DpAccountantKind a) { return spellingOf(dpAccountants(), a); }
const char* name(RoundMode m) { return spellingOf(roundModes(), m); }
const char* name(ServerRole r) { return spellingOf(serverRoles(), r); }
const char* name(DeviceRound d) { return spellingOf(deviceRounds(), d); }
const char* name(SplitRole r) { return spellingOf(splitRoles(), r); }
const char* name(SplitShift x) { return spellingOf(splitShifts(), x); }
const char* name(LogFormat f) { return spellingOf(logFormats(), f); }
namespace {

// The programs of `mask`.
std::vector<std::string> programs(unsigned mask) {
  std::vector<std::string> out;
  for (const auto& [bit, name] :
       {std::pair{kSim, "starling-sim"}, std::pair{kServer, "starling-server"},
        std::pair{kClient, "starling-client"}, std::pair{kSplit, "starling-split"}})
    if (mask & bit) out.emplace_back(name);
  return out;
}

// The security.* and net.* keys of a connection: the deployment's and starling-split's.
void declareNet(Options& o, Settings::Net& n, const std::function<void(unsigned)>& use) {
  constexpr unsigned kDeploy = kServer | kClient | kSplit;
  use(kDeploy);
  o.add("security.insecure", &n.insecure,
        "plain TCP without CURVE authentication or encryption (tests, trusted networks only; "
        "announced loudly)");
  o.add("security.key", &n.key, "this side's secret key file NAME.key_secret (starling-keygen)");
  use(kServer | kSplit);
  o.add("security.clients", &n.clients,
        "admitted client keys: a folder of NAME.key files or an 'id key' file");
  use(kDeploy);
  o.add("security.server_key", &n.server_key,
        "client / aggregator: the upstream server's public key file NAME.key");
  o.add("net.chunk_bytes", &n.chunk_bytes, "messages larger than this travel in chunks", 4096,
        uint64_t{1} << 30);
  o.add("net.max_message_bytes", &n.max_message_bytes, "largest message accepted", 1024,
        (uint64_t{2} << 30) - 1);
  o.add("net.max_reassembly_bytes", &n.max_reassembly_bytes,
        "memory for chunked uploads in flight, all peers together; beyond it peers are told to "
        "send again later",
        1024, uint64_t{1} << 40);
  o.add("net.rate", &n.rate, "messages per second a peer may send before it is rate-limited", 1,
        1e7);
  o.add("net.burst", &n.burst, "messages a peer may send in a burst", 1, 1e7);
}

}  // namespace

namespace {

// starling-split's own keys.
void declareSplit(Options& o, Settings::Split& c, const RegistryHelp& help) {
  o.add("role", &c.role,
        "starling-split: pretrain (write the pre-trained model), inproc (edge and cloud in one "
        "process), cloud (serve the top part over ZeroMQ) or edge (fine-tune through a cloud)",
        splitRoles());
  o.add("device", &c.device,
        "starling-split: where the cloud's part (--role cloud, inproc) and pre-training compute: "
        "auto (a GPU when LibTorch sees one), cpu, cuda or cuda:N; an edge's part runs on the CPU. "
        "docs/gpu.md");
  o.add("data.shift", &c.shift,
        "public and private parts: classes (public 0-4, private 5-9), noise (private: Gaussian "
        "noise added) or rotate (private: turned 90 degrees)",
        splitShifts());
  o.add("data.noise", &c.noise, "data.shift noise: the noise's standard deviation", 0, 10);
  o.add("data.max_train", &c.max_train, "at most this many training examples of the part (0: all)",
        0, 1u << 30);
  o.add("data.max_test", &c.max_test, "at most this many test examples of the part (0: all)", 0,
        1u << 30);
  o.add(
      "split.cut", &c.cut,
      "where the model is cut: conv1, conv2 or fc1 (cnn); layer1, layer2 or layer3 (resnet; "
      "layer2 when the cnn's default conv2 is left); embed, block1 or ffn2 (vit; ffn2 by default)");
  o.add("split.weight_rank", &c.weight_rank,
        "the paper's weight-side cut: the projection after the cut (fc1 after conv2, fc2 after "
        "fc1) is split by truncated SVD, S_r V_r^T on the edge and U_r in the cloud, so r values "
        "per example cross (0: off); vit at ffn2: the FFN's up-projection, r values per token "
        "(plus the skip's 64 unless split.skip = false)",
        0, 1u << 20);
  o.add("split.skip", &c.skip,
        "keep the skip connection across the cut (vit at ffn2: false removes it, the paper's "
        "eliminated link, so with split.weight_rank only r values per token cross)");
  o.add("split.up", &c.up, "activation codec, edge to cloud:" + help.split_codecs);
  o.add("split.down", &c.down, "gradient codec, cloud to edge (the same codecs)");
  o.add("split.train_bottom", &c.train_bottom,
        "fine-tune the edge's part too (false: only the cloud's)");
  o.add("split.edges", &c.edges,
        "edge devices sharing the one cloud part, served interleaved, each with its own codec "
        "state and bottom part (the private part dealt among them)",
        1, 1024);
  o.add("split.splitfed", &c.splitfed,
        "SplitFed: average the edges' bottom parts after each epoch (--role inproc; --role edge: "
        "through the cloud, which sets cloud.splitfed_edges)");
  o.add("split.pretrained", &c.pretrained,
        "the pre-trained model: written by --role pretrain, read by the other roles");
  o.add("split.splitfed_wait_ms", &c.splitfed_wait_ms,
        "SplitFed over the network: the cloud averages what it has this long after an epoch's "
        "first bottom; an edge waits this long plus twice edge.step_timeout_ms for the average",
        100, 86400000);
  o.add("pretrain.epochs", &c.pretrain_epochs, "epochs of pre-training", 1, 1000);
  o.add("cloud.bind", &c.cloud.bind, "--role cloud: the endpoint to serve edge devices on");
  o.add("cloud.checkpoint", &c.cloud.checkpoint,
        "--role cloud: the top part's checkpoint, written atomically every "
        "cloud.checkpoint_every training steps and at exit, and loaded at start when it exists "
        "(a restarted cloud goes on from it)");
  o.add("cloud.checkpoint_every", &c.cloud.checkpoint_every,
        "--role cloud: training steps between checkpoints", 1, ~0ull);
  o.add("cloud.edge_timeout_ms", &c.cloud.edge_timeout_ms,
        "--role cloud: an edge device silent this long loses its session and codec state", 100,
        86400000);
  o.add("cloud.exit_after", &c.cloud.exit_after,
        "--role cloud: exit after this many edge devices said goodbye (0: serve until SIGINT or "
        "SIGTERM)",
        0, ~0ull);
  o.add("cloud.max_sessions", &c.cloud.max_sessions,
        "--role cloud: edge devices served at once (each keeps its last reply for a repeated "
        "step); more are refused",
        1, 1u << 20);
  o.add("cloud.max_batch", &c.cloud.max_batch,
        "--role cloud: the most examples one step may carry (a larger one is refused); "
        "evaluation steps use 256",
        256, 1u << 20);
  o.add("cloud.splitfed_edges", &c.cloud.splitfed_edges,
        "--role cloud: SplitFed over the network: average this many edges' bottom parts after "
        "each epoch (0: off; the edges set split.splitfed = true)",
        0, 1u << 20);
  o.add("edge.cloud", &c.edge.cloud, "--role edge: the cloud's endpoint");
  o.add("edge.id", &c.edge.id,
        "--role edge: this edge device's id (under CURVE, its key's id on the cloud's allow-list)",
        0, ~0ull);
  o.add("edge.shard", &c.edge.shard,
        "--role edge: which part of the private data this edge holds: shard edge.shard of "
        "split.edges, dealt as in --role inproc",
        0, 1023);
  o.add("edge.step_timeout_ms", &c.edge.step_timeout_ms,
        "--role edge: how long to wait for the cloud's answer before sending a step again", 10,
        3600000);
  o.add("edge.tries", &c.edge.tries, "--role edge: tries per step (and per hello) before giving up",
        1, 1000);
}

}  // namespace

void declareSettings(Options& o, Settings& s, Program self, const RegistryHelp& help) {
  // The keys declared after use(mask) are used by the programs of `mask`.
  const auto use = [&](unsigned mask) {
    o.setOwners((mask & self) ? std::vector<std::string>{} : programs(mask));
  };
  constexpr unsigned kAll = kSim | kServer | kClient, kRound = kSim | kServer,
                     kDeploy = kServer | kClient;

  // The experiment.
  use(kAll | kSplit);
  o.add("model.spec", &s.model.spec,
        "model spec (the simulation's LibTorch model and the deployed clients' Eigen model are "
        "the same: layout, initialisation, step; starling-split's models have cut points):" +
            help.models);
  o.add("model.seed", &s.model.seed,
        "run seed: the data split, the initial model, sampling, compression streams, devices "
        "(starling-split: initialisation, shuffling and data.shift's noise)",
        0, ~0ull);
  use(kServer);
  o.add("model.rows", &s.model.rows,
        "image rows of the clients' examples (1: flat); 0: from the data.* files when the server "
        "can read them",
        0, 1u << 24);
  o.add("model.cols", &s.model.cols,
        "image columns of the clients' examples (the width of flat data); 0: from data.*", 0,
        1u << 24);
  o.add("model.classes", &s.model.classes, "number of classes; 0: from data.*", 0, 1u << 20);

  use(kAll);
  o.add("data.format", &s.data.source.format,
        "idx (a features file and a label file per split) or csv (one file per split: "
        "label,feature1,...). docs/simulation.md, section Data, gives both formats");
  use(kAll | kSplit);
  o.add("data.dir", &s.data.source.dir,
        "folder of the data files (relative names below are taken in it); the default holds "
        "Fashion-MNIST (Debian package dataset-fashion-mnist; starling-split reads its "
        "Fashion-MNIST files there)");
  use(kAll);
  o.add(
      "data.train", &s.data.source.train,
      "training split: the IDX features file (2+ dimensions: examples x d1 x ...; unsigned "
      "bytes are scaled by 1/255, other types taken as they are), or the CSV file; gzip or plain");
  o.add("data.train_labels", &s.data.source.train_labels,
        "idx only: the training labels file (1 dimension, integers 0..255)");
  o.add("data.test", &s.data.source.test,
        "test split for evaluation, as data.train (empty: no test set, no accuracy); a deployed "
        "client evaluates on its IID share of it");
  o.add("data.test_labels", &s.data.source.test_labels, "idx only: the test labels file");
  o.add("data.num_classes", &s.data.source.num_classes,
        "classes (0: the largest label in the data + 1; else labels must be below it)", 0, 256);
  o.add("data.shape", &s.data.source.shape,
        "view each example as an image ROWSxCOLS, e.g. 28x28 (for the cnn on flat CSV rows; must "
        "multiply to the feature count). Empty: IDX files give the image shape, CSV rows are flat");
  o.add("data.num_clients", &s.data.num_clients,
        "clients in the population: the data set is split into this many shards, client i "
        "holding shard i",
        1, 10'000'000);
  o.add("data.partition", &s.data.partition,
        "how the data set is split (the same split in every program, from model.seed):" +
            data::partitioners().help());
  use(kSim);
  o.add("data.stats", &s.data.stats, "print a summary of the per-client data statistics at start");
  o.add("data.stats_file", &s.data.stats_file,
        "write every client's statistics to this CSV file at start "
        "(client,examples,classes_held,label_skew,class_0,...)");
  o.add("data.split_file", &s.data.split_file,
        "write the split at start (line k: client k's example indices, rows of the training file), "
        "for another program to train on the same shards (bench/peers/)");

  use(kRound);
  o.add("train.rounds", &s.train.rounds, "federated rounds", 1, 10'000'000);
  use(kRound | kSplit);
  o.add("train.epochs", &s.train.fit.epochs,
        "local epochs per round (starling-split: epochs of split fine-tuning)", 1, 1000);
  o.add("train.batch_size", &s.train.fit.batch_size,
        "local minibatch size (starling-split: pre-training and fine-tuning)", 1, 1u << 20);
  o.add("train.lr", &s.train.fit.lr,
        "client learning rate (starling-split: SGD's, pre-training and fine-tuning)", 1e-7, 100);
  use(kRound);
  o.add("train.prox_mu", &s.train.fit.prox_mu, "FedProx's proximal term mu (0: FedAvg's local SGD)",
        0, 1e4);
  o.add("train.scaffold", &s.train.scaffold,
        "SCAFFOLD: clients correct their steps by the server's minus their own control variate; "
        "c travels in each phase-0 task, each update brings c_i+ - c_i (model-sized, dense), and "
        "c moves by their sum / N after each round (N: data.num_clients in the simulation)");
  use(kServer);
  o.add("train.scaffold_population", &s.train.scaffold_population,
        "SCAFFOLD's N on the root (0: data.num_clients when it is set, else the clients, or edge "
        "aggregators, registered when the round begins; behind edge aggregators N must be given "
        "one way or the other)",
        0, ~0ull);

  use(kRound);
  o.add("sampling.clients_per_round", &s.sampling.clients_per_round,
        "clients sampled each round, or every available one if fewer (a deployment given "
        "sampling.fraction samples by fraction instead)",
        1, 10'000'000);
  o.add("sampling.overcommit", &s.sampling.overcommit,
        "sample this many times the target, close the round at the target (the fastest)", 1, 10);
  use(kServer);
  o.add("sampling.fraction", &s.sampling.fraction,
        "fraction of the available clients sampled per round, instead of "
        "sampling.clients_per_round",
        1e-9, 1);
  o.add("sampling.min_clients", &s.sampling.min_clients, "results a round needs to be applied", 1,
        1u << 30);
  o.add("sampling.min_available", &s.sampling.min_available,
        "registered clients a round waits for (0: sampling.clients_per_round when sampling by "
        "count, else 1)",
        0, 1u << 30);
  o.add("sampling.wait_ms", &s.sampling.wait_ms,
        "how long a round waits for sampling.min_available clients", 1, 86400000);
  use(kRound);
  o.add("sampling.poisson_rate", &s.sampling.poisson_rate,
        "Poisson sampling: each available client is sampled on its own with this probability, "
        "instead of sampling.clients_per_round and sampling.fraction (0: off); what "
        "privacy.dp's accountant assumes",
        0, 1);
  o.add("privacy.dp", &s.privacy.dp,
        "differential privacy: off, or central (DP-FedAvg: each update clipped to privacy.clip, "
        "every update weighing alike, Gaussian noise of privacy.noise_multiplier x clip added to "
        "the sum at the root, which is trusted, divided by sampling.poisson_rate x "
        "data.num_clients; synchronous rounds with sampling.poisson_rate; docs/privacy.md), or "
        "distributed (the same, but under secagg.enabled each client adds its share of discrete "
        "Gaussian noise in the ring before masking, so that no party sees a sum without noise)",
        dpModes());
  o.add("privacy.min_clients", &s.privacy.min_clients,
        "privacy.dp = distributed: the fewest clients whose noise a round's sum holds; each adds "
        "noise_multiplier x its sensitivity / sqrt(min_clients) (about clip, plus its rounding), "
        "and a round with fewer masked inputs is "
        "stopped before its unmask (0: half of sampling.poisson_rate x data.num_clients, at "
        "least 3)",
        0, uint64_t{1} << 40);
  o.add("privacy.clip", &s.privacy.clip,
        "privacy.dp: the L2 norm every update is clipped to (the root clips what it decodes); "
        "with privacy.adaptive_clip, the first round's",
        0, 1e30);
  o.add("privacy.adaptive_clip", &s.privacy.adaptive_clip,
        "privacy.dp = central: the clip follows privacy.target_quantile of the update norms "
        "(Andrew et al. 2021): each round the root counts the updates within its clip, adds "
        "noise to the count, and moves the clip by privacy.clip_lr; part of the noise budget "
        "goes to the count (docs/privacy.md); not under secagg.enabled");
  o.add("privacy.target_quantile", &s.privacy.target_quantile,
        "privacy.adaptive_clip: the quantile of the update norms the clip follows", 1e-6, 1 - 1e-6);
  o.add("privacy.clip_lr", &s.privacy.clip_lr,
        "privacy.adaptive_clip: the clip's geometric step (C <- C exp(-clip_lr (b - quantile)))",
        1e-6, 10);
  o.add("privacy.clip_count_noise", &s.privacy.clip_count_noise,
        "privacy.adaptive_clip: the count's noise standard deviation (0: sampling.poisson_rate x "
        "data.num_clients / 20); it must exceed half the noise multiplier",
        0, 1e12);
  o.add("privacy.noise_multiplier", &s.privacy.noise_multiplier,
        "privacy.dp: the noise's standard deviation over privacy.clip (0: the smallest that keeps "
        "privacy.target_epsilon over train.rounds)",
        0, 1e4);
  o.add("privacy.target_epsilon", &s.privacy.target_epsilon,
        "privacy.dp: the run's budget; a run whose rounds would spend more is refused before "
        "round 1 (0: none, epsilon is reported in every round's record)",
        0, 1e6);
  o.add("privacy.delta", &s.privacy.delta, "privacy.dp: the delta of (epsilon, delta)", 1e-300,
        0.5);
  o.add("privacy.accountant", &s.privacy.accountant,
        "privacy.dp: pld (privacy loss distributions: the tight epsilon, less noise for a budget) "
        "or rdp (Renyi DP: an upper bound, as Opacus and TF Privacy report); privacy.dp = "
        "distributed is accounted by its own RDP bound, and takes rdp only (its default)",
        dpAccountants());
  o.add("secagg.enabled", &s.secagg.enabled,
        "secure aggregation (SecAgg+): each client masks its update, clipped to secagg.clip, in "
        "a ring, and the server learns only the sum (every update weighing alike; the compressor "
        "none; synchronous rounds; docs/privacy.md)");
  o.add("secagg.neighbours", &s.secagg.neighbours,
        "secagg: the neighbours each client masks and shares with (even; 0: the smallest even "
        "number >= 2 log2 of the round's clients, at least 4; all of them when fewer)",
        0, 1024);
  o.add("secagg.threshold", &s.secagg.threshold,
        "secagg: the shares that rebuild a client's secrets (0: half its neighbours and one); a "
        "client with fewer surviving neighbours cannot be unmasked",
        0, 1024);
  o.add("secagg.bits", &s.secagg.bits,
        "secagg: the ring Z_2^bits the masked updates travel in (bits per value); too few for the "
        "round's clients and the model are refused with the bits it takes",
        8, 64);
  o.add("secagg.clip", &s.secagg.clip,
        "secagg: the L2 norm each client clips its update to before masking (under privacy.dp: "
        "privacy.clip, its default)",
        0, 1e30);
  use(kAll);
  o.add("secagg.threat", &s.secagg.threat,
        "secagg: semi-honest (the root and aggregators follow the protocol while they look) or "
        "malicious-server (each client signs its advertised keys with a signing key the "
        "federation authority certified, and every party checks them: a root or aggregator "
        "that swaps a key or invents a client is caught; a client refuses rounds that do not "
        "sign, updates in the clear and a round run twice, and a dropped client's masks are "
        "removed with pairwise keys, not its rebuilt mask key; clients sign the round's "
        "survivors and reveal only under a list t neighbours signed alike, so a root that "
        "equivocates about dropouts reads at most one sum a round, over more than half of its "
        "clients: docs/privacy.md)",
        secaggThreats());
  use(kDeploy);
  o.add("secagg.authority", &s.secagg.authority,
        "secagg.threat = malicious-server: the federation authority's public key file "
        "(starling-keygen --new-authority; its .key_secret stays off the root)");
  use(kClient);
  o.add("secagg.min_noise", &s.secagg.min_noise,
        "a client's floor under privacy.dp = distributed: it refuses a secure round that asks it "
        "for less noise than this times its update's L2 sensitivity in the ring (the root's "
        "noise multiplier over sqrt(privacy.min_clients), which the root logs); 0: any, including "
        "none (docs/privacy.md)",
        0, 1e6);
  o.add("secagg.min_clients", &s.secagg.min_clients,
        "a client's floor on the clients of a sum it helps release (secagg.threat = "
        "malicious-server only): it refuses a secure round of fewer clients, and signs no "
        "survivors list that leaves fewer masked inputs, so no sum of fewer is unmasked with its "
        "help; set it to the root's privacy.min_clients under distributed DP (the root logs it); "
        "0: any (docs/privacy.md)",
        0, 100'000'000);
  use(kServer);
  o.add("privacy.seeded_noise", &s.privacy.seeded_noise,
        "privacy.dp at the root: draw the noise and the sample from the run seed (model.seed), "
        "reproducible as in the simulator, instead of the system's random source; anyone who "
        "knows the seed can then remove the noise (tests, comparisons with a simulation)");

  use(kRound);
  o.add("compression.compressor", &s.compression.compressor,
        "compressor spec (docs/compression.md):" + help.compressors);
  o.add("compression.diagnostics", &s.compression.diagnostics,
        "clients also report error feedback's diagnostics (docs/compression.md): ef_gain, "
        "ef_residual_ratio and ef_residual_age, averaged per round into the metrics file");
  o.add("aggregation.rule", &s.aggregation.rule,
        "aggregation rule spec (docs/aggregation.md; the simulator splits only streaming rules "
        "among workers):" +
            help.rules);
  o.add("aggregation.server_opt", &s.aggregation.server_opt,
        "server optimizer spec (docs/aggregation.md):" + help.server_optimizers);
  o.add("aggregation.metrics", &s.aggregation.metrics, "client metrics aggregated per round");
  use(kServer);
  o.add("aggregation.resparsify_density", &s.aggregation.resparsify,
        "aggregator: send the top fraction of each tensor up (gTop-k), keeping the rest as "
        "residual; 0 = exact dense",
        0, 1);
  o.add("aggregator.min_clients", &s.aggregation.min_clients,
        "aggregator: join upstream once this many of its clients registered", 1, 1u << 30);
  o.add("aggregator.metrics", &s.aggregation.metrics_file,
        "aggregator: its own JSON Lines file, a line per phase it relays (appended; "
        "docs/deployment.md)");
  use(kRound);
  o.add("bounds.max_abs", &s.bounds.max_abs, "refuse an update with a |value| above this", 1e-30,
        1e30);
  o.add("bounds.max_norm", &s.bounds.max_norm, "refuse an update with an L2 norm above this", 1e-30,
        1e30);
  o.add("bounds.max_examples", &s.bounds.max_examples,
        "most examples a client may register or claim", 1, 1000000000000000ull);
  o.add("downlink.mode", &s.downlink.mode,
        "how tasks carry the model: dense, fp16, delta (the changes since the version a client "
        "holds), topk (lossy: only the downlink.density largest changes, the rest kept as the "
        "server's error feedback), q8 or q4 (lossy: every version's change quantised to 8 or 4 "
        "bits per value with the server's error feedback; a client one version behind gets that "
        "refresh exactly, others the whole model quantised), stc (lossy: every version refreshes "
        "downlink.density of each tensor by +-mu, about a byte each; a client gets the refreshes "
        "since the version it holds, or the whole model in 8 bits when that is smaller), q3 or q2 "
        "(lossy, as q8: 3 or 2 bits a value with a power-of-two step per block of 64 values, "
        "3.125 or 2.125 bits a value in all), q3-mirror or q2-mirror (the same bytes as q3 and "
        "q2; the server keeps each client's copy and sends it the difference from it, so what a "
        "block's levels round away is sent the next time: a model's floats kept per client, "
        "downlink.copies of them at most), stc-mirror (as q2-mirror, the difference sent as stc's "
        "+-mu on downlink.density of each tensor, the largest first, and the whole model to a "
        "client without a copy in q3's blocks)");
  o.add("downlink.density", &s.downlink.density,
        "topk, stc and stc-mirror downlinks: fraction of the model refreshed per version (per "
        "task for stc-mirror)",
        1e-6, 1);
  o.add("downlink.copies", &s.downlink.copies,
        "q3-mirror, q2-mirror and stc-mirror: the most clients whose copy the server keeps (4 "
        "bytes a parameter each; past it the least recently sent is dropped and that client's "
        "next task carries the whole model)",
        1, 10'000'000);
  o.add("downlink.history", &s.downlink.history,
        "model versions kept for delta and topk downlinks, refreshes kept for stc (a client "
        "holding an older version gets the whole model)",
        1, 64);
  o.add("eval.every", &s.eval_every,
        "evaluation every N rounds (0: never): the simulation on data.test, a deployment "
        "federated, each client on its share of data.test (round.mode = async or semisync: the "
        "root on data.test, every N steps)",
        0, 1u << 30);
  use(kServer);
  o.add("round.deadline_ms", &s.round.deadline_ms,
        "how long a phase waits for updates (round.mode = async: a task; semisync: a round, and "
        "a task async.max_staleness + 1 rounds)",
        10, 86400000);
  o.add("round.min_completion_rate", &s.round.min_completion_rate,
        "fraction of sampled clients that must deliver", 0, 1);
  use(kSim);
  o.add("round.deadline_seconds", &s.round.deadline_seconds,
        "simulated deadline dropping stragglers (0: none)", 0, 1e9);
  use(kRound);
  o.add("async.buffer_size", &s.async.buffer_size,
        "round.mode = async: accepted updates per server step (FedBuff's K)", 1, 1000000);
  o.add("async.max_staleness", &s.async.max_staleness,
        "round.mode = async or semisync: an update trained more than this many model versions ago "
        "is refused",
        0, 1000000);
  o.add("async.staleness", &s.async.staleness,
        "round.mode = async or semisync: the weight of an update tau versions old: constant, "
        "polynomial:a=A ((1+tau)^-A) or hinge:a=A,b=B (1 up to B, then 1/(A(tau-B)+1))");
  o.add("async.concurrency", &s.async.concurrency,
        "round.mode = async or semisync: tasks open at once, an edge aggregator's one of them "
        "(0: sampling.clients_per_round)",
        0, 1000000);
  o.add("round.mode", &s.round.mode,
        "sync: rounds of sampling.clients_per_round clients, each waiting for its slowest; "
        "async: FedBuff, async.concurrency clients training at once and a server step every "
        "async.buffer_size updates, train.rounds steps (in starling-sim on one worker; at "
        "starling-server's root, an edge aggregator's partial counting its updates); "
        "semisync: rounds closing at round.deadline_seconds (starling-sim, simulated) or "
        "round.deadline_ms (the root) with whatever arrived, late updates joining a later round "
        "with their staleness weight (under privacy.dp, each round's Poisson sample, late updates "
        "dropped; docs/simulation.md, docs/deployment.md, docs/privacy.md)",
        roundModes());
  o.add("state.checkpoint", &s.state.checkpoint,
        "checkpoint file, written atomically after every round; resumed from at start");
  use(kRound | kSplit);
  o.add("state.metrics", &s.state.metrics,
        "per-round metrics, JSON Lines (appended; starling-split: per epoch)");
  use(kSim);
  o.add("state.memory_bytes", &s.state.memory_bytes,
        "client-state memory per worker before spilling to LMDB", 1 << 20, uint64_t{1} << 40);
  o.add("state.dir", &s.state.dir,
        "folder for spilled client states (default: CHECKPOINT.states with state.checkpoint, "
        "else a temporary folder)");
  use(kClient);
  o.add("state.file", &s.state.file,
        "file keeping the client's compressor and SCAFFOLD state across restarts (written "
        "atomically)");

  // The simulation.
  use(kSim);
  o.add("sim.workers", &s.sim.workers,
        "worker processes to start on this machine (ignored under torchrun or srun)", 1, 256);
  o.add("sim.backend", &s.sim.backend, "collectives: gloo (CPU) or nccl (GPU builds)");
  use(kSim | kSplit);
  o.add("sim.threads", &s.sim.threads, "LibTorch threads per worker (starling-split: its own)", 1,
        256);
  use(kSim);
  o.add("sim.device", &s.sim.device,
        "where workers train: auto (a GPU when LibTorch sees one, else the CPU), cpu, cuda (each "
        "worker its GPU: local rank / sim.workers_per_gpu among CUDA_VISIBLE_DEVICES) or cuda:N. "
        "docs/gpu.md");
  o.add("sim.device_round", &s.sim.device_round,
        "a client's update formed and compressed where its model trains, only the payload and the "
        "kept residual copied back (top-k, stc, rand-k, random-block, sign, QSGD, PowerSGD and "
        "ACP-SGD; the dense ones and SCAFFOLD stay on the host): auto (on a GPU), on, off. The "
        "same results "
        "either way. docs/gpu.md",
        deviceRounds());
  o.add("sim.workers_per_gpu", &s.sim.workers_per_gpu,
        "workers sharing one GPU (each its own model replica); must divide the workers on a "
        "machine",
        1, 256);
  o.add("sim.schedule", &s.sim.schedule,
        "assigning clients to workers: lpt (longest first by examples; reruns give the same "
        "bits), lpt_measured (by the workers' measured speeds, for workers of unlike speeds; the "
        "order of the sums then follows the machine's load) or round_robin");
  o.add("sim.sharded_step", &s.sim.sharded_step,
        "global aggregation as reduce-scatter, server optimizer on each worker's shard, "
        "all-gather (else all-reduce and every worker steps the whole model; under secagg.enabled "
        "every worker steps the whole model with the one unmasked sum)");
  o.add("sim.bucket_bytes", &s.sim.bucket_bytes, "largest single collective, bytes", 1024,
        uint64_t{1} << 34);
  o.add("sim.secagg_batch_bytes", &s.sim.secagg_batch_bytes,
        "secagg.enabled on several workers: the masked inputs (and their clients' states) gathered "
        "to every worker at once, all workers' together, at most (one client's a worker at "
        "least): the memory it takes against the number of collectives",
        1, uint64_t{1} << 40);
  o.add("sim.reference_seconds_per_example", &s.sim.reference_spe,
        "the simulated clock's reference device: seconds per example at speed 1", 1e-9, 1e3);
  o.add("devices.trace", &s.devices.trace,
        "CSV client,speed,bandwidth,availability (instead of the distributions below)");
  o.add("devices.availability_trace", &s.devices.availability_trace,
        "CSV client,period,start,end: when each client is online, in simulated seconds, "
        "repeating every period (instead of devices.availability; tools/fedscale_traces.py "
        "converts FedScale's traces)");
  o.add("devices.speed_median", &s.devices.speed_median, "median relative compute speed", 1e-6,
        1e6);
  o.add("devices.speed_sigma", &s.devices.speed_sigma, "log-normal sigma of the speed", 0, 5);
  o.add("devices.bandwidth_median", &s.devices.bandwidth_median, "median bandwidth, bytes/s", 1,
        1e12);
  o.add("devices.bandwidth_sigma", &s.devices.bandwidth_sigma, "log-normal sigma of the bandwidth",
        0, 5);
  o.add("devices.availability", &s.devices.availability,
        "probability a client can be sampled in a round", 1e-6, 1);

  // The deployment.
  use(kServer);
  o.add("server.role", &s.server.role,
        "root (runs the rounds) or aggregator (relays a subtree to an upstream)", serverRoles());
  o.add("server.bind", &s.server.bind, "endpoint to listen on for clients (and aggregators)");
  o.add("server.upstream", &s.server.upstream,
        "aggregator: the upstream server's endpoint, e.g. tcp://10.0.0.1:7700");
  o.add("server.id", &s.server.id,
        "aggregator: its id upstream (its key's id on the upstream's allow-list)", 0, ~0ull);
  o.add("security.aggregator_ids", &s.server.aggregator_ids,
        "ids that may register as edge aggregators (their partials weigh many clients); others "
        "are clients only");
  o.add("net.heartbeat_ms", &s.server.heartbeat_ms, "clients send a heartbeat this often", 10,
        600000);
  o.add("net.silence_ms", &s.server.silence_ms,
        "a client silent this long fails its task and is unlisted", 20, 3600000);
  use(kDeploy);
  o.add("net.server_silence_ms", &s.net.server_silence_ms,
        "client / edge aggregator: register again when nothing came from the server above this "
        "long (it answers every heartbeat, and is read while a fit or a relayed phase runs, so "
        "only a server gone quiet trips it)",
        100, 86'400'000);
  use(kServer);
  declareNet(o, s.net, use);
  use(kClient);
  o.add("client.server", &s.client.server, "the server (root or aggregator) endpoint");
  o.add("client.id", &s.client.id,
        "this client's id: its key's id on the server's allow-list, and its data shard", 0, ~0ull);
  use(kDeploy | kSplit);
  o.add("log.level", &s.log_level,
        "trace, debug, info, warn, error (starling-split: --role cloud and edge)");
  use(kDeploy | kSplit | kSim);
  o.add("log.format", &s.log_format,
        "text, or json: one object per line with ts, level, program, msg and, where known, round, "
        "peer and code (an error code's name: docs/errors.md)",
        logFormats());
  use(kServer | kSim | kClient);
  o.add("status.listen", &s.status.listen,
        "HOST:PORT on which to serve Prometheus metrics (GET /metrics) and, at the root, an edge "
        "aggregator or starling-sim, the status page (GET /, /status.json) while it runs, e.g. "
        "127.0.0.1:9464 (port 0: a free one, logged); empty: off. An address that is not "
        "loopback needs status.token_file (docs/deployment.md, Operating)");
  o.add("status.token_file", &s.status.token_file,
        "a file whose first line is a bearer token (at least 16 characters; chmod 600) that every "
        "request to status.listen must carry (Authorization: Bearer TOKEN)");
  use(kServer);
  o.add("admin.socket", &s.admin_socket,
        "a Unix socket path (made 0600) on which the root (or an edge aggregator) takes "
        "starling-admin's commands: status, reload (admit the keys added to security.clients), "
        "revoke ID, and at the root drain, pause, resume; empty: none (docs/deployment.md, "
        "Operating)");

  // Split fine-tuning (starling-split, docs/split.md).
  use(kSplit);
  declareSplit(o, s.split, help);
  o.setOwners({});
}

void resolveSettings(const Options& o, Settings& s, Program self) {
  // Semi-synchronous rounds under DP (docs/privacy.md): a round closes at its deadline with what
  // its sample delivered, and an update that comes later is dropped, not carried into a later
  // step: the accountant's subsampled Gaussian sums at most one clipped update of each client of
  // the step's own Poisson sample, and a carried update would be a client's data in a step that
  // did not sample it (the next to one that did). Without the carry, a semi-synchronous round is
  // a synchronous round with a deadline, which the round engine runs (round.deadline_seconds in
  // starling-sim, round.deadline_ms at the root); async.* size the buffered hand-out and the
  // carry, and do not apply.
  const bool relays = self == kServer && s.server.role != ServerRole::kRoot;
  if (self != kClient && !relays && s.privacy.dp != DpMode::kOff &&
      s.round.mode == RoundMode::kSemisync) {
    for (const char* k :
         {"async.concurrency", "async.buffer_size", "async.max_staleness", "async.staleness"})
      if (o.given(k))
        STARLING_THROW(ConfigError, k,
                       " is set, and round.mode = semisync under privacy.dp = ", name(s.privacy.dp),
                       " samples each round by Poisson (sampling.poisson_rate) and drops a late "
                       "update instead of carrying it into a later round (docs/privacy.md): "
                       "leave it out");
    if (self == kSim && !(s.round.deadline_seconds > 0))
      STARLING_THROW(ConfigError,
                     "round.mode = semisync needs round.deadline_seconds > 0: the simulated length "
                     "of each round");
    s.round.mode = RoundMode::kSync;
    s.round.semisync_under_dp = true;
  }
  if (self == kServer) {
    // Sampling by fraction or by count: a deployment's fraction wins over the shared default.
    if (o.given("sampling.fraction") && o.given("sampling.clients_per_round"))
      STARLING_THROW(ConfigError,
                     "sampling.fraction and sampling.clients_per_round are both set: a round "
                     "samples by one of them");
    const bool by_count = !o.given("sampling.fraction");
    // The round waits for the peers it would sample: its edge aggregators when it has some (each
    // relays a task to all of its clients), else clients_per_round of the population.
    if (s.sampling.min_available == 0)
      s.sampling.min_available =
          !s.server.aggregator_ids.empty()
              ? s.server.aggregator_ids.size()
              : (by_count ? std::min(s.sampling.clients_per_round, s.data.num_clients) : 1);
    s.sampling.min_available = std::max(s.sampling.min_available, s.sampling.min_clients);
    if (!by_count) s.sampling.clients_per_round = 0;
    if (s.train.scaffold && s.train.scaffold_population == 0 && o.given("data.num_clients"))
      s.train.scaffold_population = s.data.num_clients;
  }
  // Asynchronous steps run on one worker: its default there, so that a file need only say
  // round.mode = async (a sim.workers above 1 that it gives is refused).
  if (self == kSim && buffered(s.round.mode) && !o.given("sim.workers")) s.sim.workers = 1;
  if (self != kClient && s.sampling.poisson_rate > 0) {
    // (sampling.overcommit with it is the engine's refusal: EngineConfig::validate.)
    for (const char* k : {"sampling.clients_per_round", "sampling.fraction"})
      if (o.given(k))
        STARLING_THROW(ConfigError, "sampling.poisson_rate and ", k,
                       " are both set: Poisson sampling draws each client on its own");
    // A round samples from whoever is there: it waits for one client unless told otherwise.
    if (!o.given("sampling.min_available")) s.sampling.min_available = s.sampling.min_clients;
  }
  if (self != kClient && s.privacy.dp != DpMode::kOff) {
    if (!o.given("privacy.clip"))
      STARLING_THROW(ConfigError, "privacy.dp = ", name(s.privacy.dp),
                     " needs privacy.clip: the L2 norm each update is clipped to");
    if (self == kServer && !o.given("data.num_clients"))
      STARLING_THROW(ConfigError, "privacy.dp = ", name(s.privacy.dp),
                     " at the root needs data.num_clients: the public number of clients whose "
                     "sampled part (sampling.poisson_rate x data.num_clients) each round's sum is "
                     "divided by, whoever is online");
    if (s.aggregation.rule != "fedavg")
      STARLING_THROW(ConfigError, "privacy.dp = ", name(s.privacy.dp),
                     " sets the rule itself (fedavg with uniform weights and clip = privacy.clip): "
                     "leave aggregation.rule out (it is ",
                     s.aggregation.rule, ")");
  } else if (self != kClient) {
    for (const char* k : {"privacy.clip", "privacy.noise_multiplier", "privacy.target_epsilon",
                          "privacy.delta", "privacy.seeded_noise", "privacy.accountant",
                          "privacy.min_clients", "privacy.adaptive_clip", "privacy.target_quantile",
                          "privacy.clip_lr", "privacy.clip_count_noise"})
      if (o.given(k))
        STARLING_THROW(ConfigError, k,
                       " is set but privacy.dp is off: set privacy.dp = central or distributed "
                       "(or leave ",
                       k, " out)");
  }
  if (self != kClient && s.privacy.dp == DpMode::kDistributed) {
    if (!s.secagg.enabled)
      STARLING_THROW(ConfigError,
                     "privacy.dp = distributed has each client add its noise in secure "
                     "aggregation's ring: set secagg.enabled = true (or privacy.dp = central)");
    // Its accountant is its own RDP bound: rdp unless the file asks for pld (then refused by
    // the engine, with the reason).
    if (!o.given("privacy.accountant")) s.privacy.accountant = DpAccountantKind::kRdp;
    // Declared metrics travel in the clear beside each masked input: under distributed DP the
    // root, which it protects against, would read each client's. None, unless asked (refused).
    if (o.given("aggregation.metrics") && !s.aggregation.metrics.empty())
      STARLING_THROW(ConfigError,
                     "privacy.dp = distributed takes no aggregation.metrics: each client's "
                     "metrics travel in the clear beside its masked update, and the root would "
                     "read them (leave aggregation.metrics out; the records then carry no "
                     "train_loss)");
    s.aggregation.metrics.clear();
    if (s.compression.diagnostics)
      STARLING_THROW(ConfigError,
                     "privacy.dp = distributed takes no compression.diagnostics: they are "
                     "per-client metrics in the clear");
  }
  if (self != kClient && !s.privacy.adaptive_clip)
    for (const char* k : {"privacy.target_quantile", "privacy.clip_lr", "privacy.clip_count_noise"})
      if (o.given(k))
        STARLING_THROW(ConfigError, k,
                       " is set but privacy.adaptive_clip is not: set privacy.adaptive_clip = "
                       "true (or leave ",
                       k, " out)");
  if (self != kClient && s.privacy.dp == DpMode::kCentral && o.given("privacy.min_clients"))
    STARLING_THROW(ConfigError,
                   "privacy.min_clients is set but privacy.dp is central: it is the fewest "
                   "clients whose noise a sum holds under privacy.dp = distributed");
  // The masked words replace the update: the compressor none, unless a file says otherwise
  // (which the engine then refuses with the reason).
  if (s.secagg.enabled && !o.given("compression.compressor")) s.compression.compressor = "none";
  // One file serves the root, its aggregators and its clients: secagg.* are the root's (and the
  // simulator's); an edge aggregator relays whatever its root's rounds run (apps/server.cc says
  // so), as a client does (`relays`, above).
  if (self != kClient && !relays && s.secagg.enabled) {
    if (buffered(s.round.mode))
      STARLING_THROW(ConfigError,
                     "secagg.enabled runs in synchronous rounds only, not round.mode "
                     "= ",
                     name(s.round.mode), ": its steps need every sampled client of one round");
    if (!o.given("secagg.clip")) {
      if (s.privacy.dp == DpMode::kOff)
        STARLING_THROW(ConfigError,
                       "secagg.enabled needs secagg.clip: the L2 norm each client "
                       "clips its update to before masking (near the median update "
                       "norm of a run without it)");
      s.secagg.clip = s.privacy.clip;
    }
    if (s.aggregation.rule != "fedavg")
      STARLING_THROW(ConfigError,
                     "secagg.enabled sets the rule itself (fedavg with uniform "
                     "weights: the server sees only the sum): leave aggregation.rule "
                     "out (it is ",
                     s.aggregation.rule, ")");
    if (self == kServer && s.secagg.threat == SecAggThreat::kMaliciousServer &&
        s.secagg.authority.empty())
      STARLING_THROW(ConfigError,
                     "secagg.threat = malicious-server needs secagg.authority: the federation "
                     "authority's public key file (starling-keygen --new-authority), whose "
                     "certificates the clients' signing keys carry");
  } else if (self != kClient && !relays) {
    for (const char* k : {"secagg.neighbours", "secagg.threshold", "secagg.bits", "secagg.clip",
                          "secagg.threat", "secagg.authority"})
      if (o.given(k))
        STARLING_THROW(ConfigError, k, " is set but secagg.enabled is not (set it, or leave ", k,
                       " out)");
  }
  if (self == kClient && s.client.id >= s.data.num_clients)
    STARLING_THROW(ConfigError, "client.id ", s.client.id, " must be below data.num_clients ",
                   s.data.num_clients, " (client i trains shard i)");
}

}  // namespace starling::apps
