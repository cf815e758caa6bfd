// One configuration for every program (apps/settings.h): the same file parsed as starling-sim,
// starling-server and starling-client gives each the same experiment; a key of another program is
// checked in the file and refused on the command line; the defaults that follow other keys.
#include "apps/settings.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "aggregation/bounds.h"
#include "apps/engine_settings.h"
#include "core/error.h"
#include "temp_dir.h"

using namespace starling;
using apps::Program;
using apps::Settings;

namespace {

struct Parsed {
  int rc = 0;
  Settings s;
  std::unique_ptr<apps::Options> o;
};

// Parses `args` (after the program name) as `self` would.
Parsed parse(Program self, std::vector<std::string> args) {
  Parsed p;
  p.o = std::make_unique<apps::Options>("prog", "test");
  apps::declareSettings(*p.o, p.s, self, {});
  std::vector<char*> argv{const_cast<char*>("prog")};
  for (auto& a : args) argv.push_back(a.data());
  p.rc = p.o->parse(static_cast<int>(argv.size()), argv.data());
  return p;
}

// Parses, resolves, converts and checks `args` as `self` does before reading data: the error, or
// "" when accepted.
std::string refusal(Program self, std::vector<std::string> args) {
  auto p = parse(self, std::move(args));
  REQUIRE(p.rc == -1);
  try {
    apps::resolveSettings(*p.o, p.s, self);
    const server::EngineConfig e = apps::engineConfig(p.s);
    apps::checkRoundMode(p.s, self, e);
    // An edge aggregator runs no engine (starling-server's checkServer validates the root's).
    if (!(self == apps::kServer && p.s.server.role == apps::ServerRole::kAggregator)) e.validate();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return {};
}

std::string write(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = (dir.path / name).string();
  std::ofstream(path) << text;
  return path;
}

// Every shared key away from its default, and a key of each program's own.
const char* kShared = R"(
[model]
spec = "mlp:hidden=16"
seed = 77
rows = 28
[data]
dir = "/srv/data"
train = "a.idx"
train_labels = "a.labels"
test = ""
num_classes = 7
shape = "4x196"
num_clients = 33
partition = "iid"
stats = true
[train]
rounds = 9
epochs = 3
batch_size = 8
lr = 0.25
prox_mu = 0.5
[sampling]
clients_per_round = 6
overcommit = 1.5
min_clients = 2
[compression]
compressor = "qsgd:levels=4"
diagnostics = true
[aggregation]
rule = "median"
server_opt = "fedadam"
metrics = ["train_loss", "grad_norm"]
resparsify_density = 0.1
[bounds]
max_abs = 77.0
max_norm = 88.0
max_examples = 12345
[downlink]
mode = "delta"
density = 0.2
history = 7
[eval]
every = 4
[round]
deadline_ms = 4321
deadline_seconds = 12.5
[state]
checkpoint = "run.ckpt"
metrics = "run.jsonl"
memory_bytes = 2097152
file = "client.state"
[sim]
workers = 3
device = "cpu"
[devices]
speed_sigma = 0.5
[server]
bind = "tcp://127.0.0.1:9999"
[security]
aggregator_ids = ["100"]
insecure = true
[net]
heartbeat_ms = 300
chunk_bytes = 65536
[client]
id = 5
[log]
level = "warn"
)";

}  // namespace

TEST_CASE("one file, three programs: the experiment's keys mean the same in each",
          "[apps][settings]") {
  testing::TempDir dir("settings");
  const std::string file = write(dir, "f.toml", kShared);
  auto sim = parse(apps::kSim, {"--config", file});
  auto server = parse(apps::kServer, {"--config", file});
  auto client = parse(apps::kClient, {"--config", file});
  REQUIRE(sim.rc == -1);
  REQUIRE(server.rc == -1);
  REQUIRE(client.rc == -1);
  for (const Settings* s : {&sim.s, &server.s, &client.s}) {
    CHECK(s->model.spec == "mlp:hidden=16");
    CHECK(s->model.seed == 77);
    CHECK(s->data.source.dir == "/srv/data");
    CHECK(s->data.source.train == "a.idx");
    CHECK(s->data.source.train_labels == "a.labels");
    CHECK(s->data.source.test.empty());
    CHECK(s->data.source.num_classes == 7);
    CHECK(s->data.source.shape == "4x196");
    CHECK(s->data.num_clients == 33);
    CHECK(s->data.partition == "iid");
    // A key of another program is read (checked) too; the program does not use it.
    CHECK(s->sim.workers == 3);
    CHECK(s->server.bind == "tcp://127.0.0.1:9999");
    CHECK(s->client.id == 5);
  }
  // The rounds: the simulation's engine and the root's engine get the same configuration.
  const server::EngineConfig a = apps::engineConfig(sim.s), b = apps::engineConfig(server.s);
  for (const server::EngineConfig* e : {&a, &b}) {
    CHECK(e->rounds == 9);
    CHECK(e->fit.epochs == 3);
    CHECK(e->fit.batch_size == 8);
    CHECK(e->fit.lr == 0.25f);
    CHECK(e->fit.prox_mu == 0.5f);
    CHECK(e->scheme.compressor == "qsgd:levels=4");
    CHECK(e->scheme.rule == "median");
    CHECK(e->scheme.run_seed == 77);
    CHECK(e->scheme.bounds.max_abs_value == 77.0);
    CHECK(e->scheme.bounds.max_update_norm == 88.0);
    CHECK(e->scheme.bounds.max_examples == 12345);
    // compression.diagnostics adds error feedback's metrics to the declared ones.
    CHECK(e->scheme.metrics == std::vector<std::string>{"train_loss", "grad_norm", "ef_gain",
                                                        "ef_residual_ratio", "ef_residual_age"});
    CHECK(e->server_opt == "fedadam");
    CHECK(e->sampling.clients_per_round == 6);
    CHECK(e->sampling.overcommit == 1.5);
    CHECK(e->eval_every == 4);
    CHECK(e->downlink == server::Downlink::kDelta);
    CHECK(e->downlink_density == 0.2);
    CHECK(e->delta_history == 7);
    CHECK(e->checkpoint == "run.ckpt");
    CHECK(e->metrics == "run.jsonl");
  }
  // The deployment's own keys reach the root.
  CHECK(b.round_deadline_ms == 4321);
  CHECK(b.sampling.min_clients == 2);
  CHECK(b.completion.min_results == 2);
}

TEST_CASE("a key of another program is checked in the file and refused on the command line",
          "[apps][settings]") {
  testing::TempDir dir("settings-foreign");
  SECTION("a wrong type or range fails every program, not only the one that uses it") {
    const std::string bad_type = write(dir, "t.toml", "[sim]\nworkers = \"two\"\n");
    const std::string bad_range = write(dir, "r.toml", "[net]\nheartbeat_ms = 1\n");
    const std::string unknown = write(dir, "u.toml", "[sim]\nwrokers = 2\n");
    for (Program p : {apps::kSim, apps::kServer, apps::kClient}) {
      CHECK(parse(p, {"--config", bad_type}).rc == 2);
      CHECK(parse(p, {"--config", bad_range}).rc == 2);
      CHECK(parse(p, {"--config", unknown}).rc == 2);
    }
  }
  SECTION("on the command line a key the program does not use is an error") {
    CHECK(parse(apps::kServer, {"--sim.workers", "3"}).rc == 2);
    CHECK(parse(apps::kClient, {"--train.rounds", "3"}).rc == 2);
    CHECK(parse(apps::kSim, {"--server.bind", "tcp://127.0.0.1:1"}).rc == 2);
    CHECK(parse(apps::kSim, {"--client.id", "1"}).rc == 2);
    // Its own keys are taken.
    CHECK(parse(apps::kServer, {"--server.bind", "tcp://127.0.0.1:1"}).rc == -1);
    CHECK(parse(apps::kClient, {"--client.id", "1"}).rc == -1);
    CHECK(parse(apps::kSim, {"--sim.workers", "3"}).rc == -1);
  }
  SECTION("the command line wins over the file") {
    const std::string file = write(dir, "w.toml", "[train]\nrounds = 4\n");
    auto p = parse(apps::kServer, {"--config", file, "--train.rounds", "6"});
    REQUIRE(p.rc == -1);
    CHECK(p.s.train.rounds == 6);
  }
}

TEST_CASE("given(): set by the file or the command line, not by a default", "[apps][settings]") {
  testing::TempDir dir("settings-given");
  const std::string file = write(dir, "g.toml", "[data]\nnum_clients = 12\n");
  auto p = parse(apps::kServer, {"--config", file, "--train.rounds", "3"});
  REQUIRE(p.rc == -1);
  CHECK(p.o->given("data.num_clients"));
  CHECK(p.o->given("train.rounds"));
  CHECK_FALSE(p.o->given("train.epochs"));
  CHECK_THROWS_AS(p.o->given("no.such_key"), InvalidArgument);
}

TEST_CASE(
    "the root samples the shared count, or a fraction when given, and waits for what it samples",
    "[apps][settings]") {
  testing::TempDir dir("settings-sampling");
  const auto resolved = [&](std::vector<std::string> args) {
    auto p = parse(apps::kServer, std::move(args));
    REQUIRE(p.rc == -1);
    apps::resolveSettings(*p.o, p.s, apps::kServer);
    return apps::engineConfig(p.s);
  };
  SECTION("by count: it waits for clients_per_round clients, at most the population") {
    const auto e = resolved({"--sampling.clients_per_round", "7"});
    CHECK(e.sampling.clients_per_round == 7);
    CHECK(e.sampling.min_available == 7);
    CHECK(resolved({"--sampling.clients_per_round", "7", "--data.num_clients", "5"})
              .sampling.min_available == 5);
    CHECK(resolved({"--sampling.clients_per_round", "7", "--sampling.min_available", "3"})
              .sampling.min_available == 3);
  }
  SECTION("behind edge aggregators it waits for its aggregators") {
    const auto e = resolved({"--security.aggregator_ids", "100,101,102"});
    CHECK(e.sampling.min_available == 3);
  }
  SECTION("by fraction when the deployment gives one") {
    const auto e = resolved({"--sampling.fraction", "0.5", "--sampling.min_clients", "2"});
    CHECK(e.sampling.clients_per_round == 0);
    CHECK(e.sampling.fraction == 0.5);
    CHECK(e.sampling.min_available == 2);
  }
  SECTION("both given is an error naming both") {
    auto p =
        parse(apps::kServer, {"--sampling.fraction", "0.5", "--sampling.clients_per_round", "4"});
    REQUIRE(p.rc == -1);
    CHECK_THROWS_AS(apps::resolveSettings(*p.o, p.s, apps::kServer), ConfigError);
  }
  SECTION("SCAFFOLD's N is data.num_clients when the file gives it") {
    auto p = parse(apps::kServer, {"--train.scaffold", "true", "--data.num_clients", "40"});
    REQUIRE(p.rc == -1);
    apps::resolveSettings(*p.o, p.s, apps::kServer);
    CHECK(apps::engineConfig(p.s).scaffold_population == 40);
    auto q = parse(apps::kServer, {"--train.scaffold", "true"});
    REQUIRE(q.rc == -1);
    apps::resolveSettings(*q.o, q.s, apps::kServer);
    CHECK(apps::engineConfig(q.s).scaffold_population == 0);  // the registered clients
  }
}

TEST_CASE("a client's id must name one of data.num_clients shards", "[apps][settings]") {
  auto p = parse(apps::kClient, {"--client.id", "10", "--data.num_clients", "10"});
  REQUIRE(p.rc == -1);
  CHECK_THROWS_AS(apps::resolveSettings(*p.o, p.s, apps::kClient), ConfigError);
  auto q = parse(apps::kClient, {"--client.id", "9", "--data.num_clients", "10"});
  REQUIRE(q.rc == -1);
  CHECK_NOTHROW(apps::resolveSettings(*q.o, q.s, apps::kClient));
}

TEST_CASE("the shared defaults are the libraries' own", "[apps][settings]") {
  const Settings s;
  const aggregation::ValidationBounds vb;
  CHECK(s.bounds.max_abs == vb.max_abs_value);
  CHECK(s.bounds.max_norm == vb.max_update_norm);
  CHECK(s.bounds.max_examples == vb.max_examples);
  const protocol::FitSettings fit;
  CHECK(s.train.fit.epochs == fit.epochs);
  CHECK(s.train.fit.batch_size == fit.batch_size);
  CHECK(s.train.fit.lr == fit.lr);
  CHECK(s.train.fit.prox_mu == fit.prox_mu);
  const server::EngineConfig e;
  CHECK(s.downlink.history == e.delta_history);
  CHECK(s.downlink.density == e.downlink_density);
  CHECK(s.sampling.overcommit == e.sampling.overcommit);
  CHECK(s.sampling.wait_ms == e.sampling.wait_ms);
  CHECK(s.sampling.fraction == e.sampling.fraction);
  const data::DataSource d;
  CHECK(s.data.source.format == d.format);
  CHECK(s.data.source.dir == d.dir);
  CHECK(s.data.source.train == d.train);
  CHECK(s.data.source.test == d.test);
}

TEST_CASE(
    "examples/edge/federation.toml is read by every program as the same ten-client federation",
    "[apps][settings]") {
  const std::string file = std::string(STARLING_SOURCE_DIR) + "/examples/edge/federation.toml";
  for (Program p : {apps::kSim, apps::kServer, apps::kClient}) {
    auto r = parse(p, {"--config", file});
    REQUIRE(r.rc == -1);
    CHECK(r.s.model.spec == "cnn");
    CHECK(r.s.data.num_clients == 10);
    CHECK(r.s.data.partition == "dirichlet:alpha=0.5");
    CHECK(r.s.sampling.clients_per_round == 10);
    CHECK(r.s.server.aggregator_ids == std::vector<std::string>{"100", "101"});
  }
  // run.sh's root waits for its two aggregators.
  auto root = parse(apps::kServer, {"--config", file});
  apps::resolveSettings(*root.o, root.s, apps::kServer);
  CHECK(apps::engineConfig(root.s).sampling.min_available == 2);
}

TEST_CASE("starling-split takes the shared keys: one file, read alike by it and the others",
          "[apps][settings]") {
  testing::TempDir dir("settings-split");
  // The shared keys away from their defaults, and keys of starling-split's own.
  const std::string file = write(dir, "s.toml", R"(
role = "cloud"
device = "cpu"
[model]
spec = "vit"
seed = 9
[data]
dir = "/srv/fmnist"
shift = "rotate"
max_train = 600
[train]
epochs = 4
batch_size = 16
lr = 0.125
[state]
metrics = "split.jsonl"
[sim]
threads = 3
[split]
cut = "ffn2"
up = "lowrank:rank=8"
edges = 2
[cloud]
exit_after = 2
[edge]
shard = 1
[security]
insecure = true
[log]
level = "warn"
)");
  auto split = parse(apps::kSplit, {"--config", file});
  REQUIRE(split.rc == -1);
  const Settings& c = split.s;
  CHECK(c.split.role == apps::SplitRole::kCloud);
  CHECK(c.split.device == "cpu");
  CHECK(c.split.shift == apps::SplitShift::kRotate);
  CHECK(c.split.max_train == 600);
  CHECK(c.split.cut == "ffn2");
  CHECK(c.split.up == "lowrank:rank=8");
  CHECK(c.split.edges == 2);
  CHECK(c.split.cloud.exit_after == 2);
  CHECK(c.split.edge.shard == 1);
  // The shared keys land where every program reads them.
  for (Program p : {apps::kSplit, apps::kSim, apps::kServer, apps::kClient}) {
    auto r = parse(p, {"--config", file});
    REQUIRE(r.rc == -1);
    CHECK(r.s.model.spec == "vit");
    CHECK(r.s.model.seed == 9);
    CHECK(r.s.data.source.dir == "/srv/fmnist");
    CHECK(r.s.train.fit.epochs == 4);
    CHECK(r.s.train.fit.batch_size == 16);
    CHECK(r.s.train.fit.lr == 0.125f);
    CHECK(r.s.state.metrics == "split.jsonl");
    CHECK(r.s.sim.threads == 3);
    CHECK(r.s.net.insecure);
    CHECK(r.s.log_level == "warn");
    CHECK(r.s.split.edges == 2);  // read (checked) by every program, used by starling-split
  }
  // One range for every program: a value starling-split once took (train.epochs up to 100,000)
  // is refused by it as by the others, and a split key out of range fails the simulation's file.
  CHECK(parse(apps::kSplit, {"--train.epochs", "5000"}).rc == 2);
  CHECK(parse(apps::kSim, {"--train.epochs", "5000"}).rc == 2);
  const std::string bad = write(dir, "b.toml", "[split]\nedges = 0\n");
  for (Program p : {apps::kSplit, apps::kSim, apps::kServer, apps::kClient})
    CHECK(parse(p, {"--config", bad}).rc == 2);
  const std::string role = write(dir, "r.toml", "role = \"fog\"\n");
  CHECK(parse(apps::kSim, {"--config", role}).rc == 2);
  // On the command line, each program takes its own keys only.
  CHECK(parse(apps::kSplit, {"--sampling.clients_per_round", "3"}).rc == 2);
  CHECK(parse(apps::kSplit, {"--sim.workers", "2"}).rc == 2);
  CHECK(parse(apps::kSim, {"--split.cut", "conv1"}).rc == 2);
  CHECK(parse(apps::kServer, {"--role", "edge"}).rc == 2);
  CHECK(parse(apps::kSplit, {"--role", "edge", "--edge.id", "4", "--sim.threads", "2"}).rc == -1);
}

TEST_CASE("round.mode and server.role are choices: another spelling is refused, listing them",
          "[apps][settings]") {
  testing::TempDir dir("settings-choices");
  // Parsed once, to an enum, in the file and on the command line (the command line wins).
  const std::string file = write(dir, "m.toml", "[round]\nmode = \"semisync\"\n");
  auto from_file = parse(apps::kSim, {"--config", file});
  REQUIRE(from_file.rc == -1);
  CHECK(from_file.s.round.mode == apps::RoundMode::kSemisync);
  auto both = parse(apps::kSim, {"--config", file, "--round.mode", "async"});
  REQUIRE(both.rc == -1);
  CHECK(both.s.round.mode == apps::RoundMode::kAsync);
  auto none = parse(apps::kServer, {});
  REQUIRE(none.rc == -1);
  CHECK(none.s.round.mode == apps::RoundMode::kSync);
  CHECK(none.s.server.role == apps::ServerRole::kRoot);
  auto agg = parse(apps::kServer, {"--server.role", "aggregator"});
  REQUIRE(agg.rc == -1);
  CHECK(agg.s.server.role == apps::ServerRole::kAggregator);
  CHECK(std::string(apps::name(apps::RoundMode::kSemisync)) == "semisync");
  // A misspelling: exit 2, in the file or on the command line.
  CHECK(parse(apps::kSim, {"--round.mode", "Async"}).rc == 2);
  CHECK(parse(apps::kServer, {"--server.role", "edge"}).rc == 2);
  const std::string bad = write(dir, "bad.toml", "[round]\nmode = \"fedbuff\"\n");
  CHECK(parse(apps::kSim, {"--config", bad}).rc == 2);
  const std::string wrong_type = write(dir, "type.toml", "[round]\nmode = 3\n");
  CHECK(parse(apps::kSim, {"--config", wrong_type}).rc == 2);
}

TEST_CASE("round.mode's refusals are written once for the simulation and the root",
          "[apps][settings]") {
  const auto refused = [](Program self, std::vector<std::string> args) -> std::string {
    auto p = parse(self, std::move(args));
    REQUIRE(p.rc == -1);
    apps::resolveSettings(*p.o, p.s, self);
    try {
      apps::checkRoundMode(p.s, self, apps::engineConfig(p.s));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return {};
  };
  using Catch::Matchers::Contains;
  // Synchronous rounds take anything the buffered step cannot; the async keys are still checked.
  CHECK(refused(apps::kSim, {"--train.scaffold", "true"}).empty());
  CHECK(refused(apps::kServer, {"--compression.compressor", "powersgd:rank=2"}).empty());
  CHECK_THAT(refused(apps::kSim, {"--async.staleness", "sometimes"}), Contains("staleness"));
  for (Program self : {apps::kSim, apps::kServer}) {
    INFO(self);
    CHECK_THAT(refused(self, {"--round.mode", "async", "--train.scaffold", "true"}),
               Contains("does not run SCAFFOLD"));
    std::vector<std::string> semisync{"--round.mode", "semisync", "--sampling.overcommit", "1.5"};
    if (self == apps::kSim) semisync.insert(semisync.end(), {"--round.deadline_seconds", "1"});
    CHECK_THAT(refused(self, semisync), Contains("over-commitment"));
    CHECK_THAT(
        refused(self, {"--round.mode", "async", "--compression.compressor", "powersgd:rank=2"}),
        Contains("several phases"));
    CHECK_THAT(refused(self, {"--round.mode", "async", "--aggregation.rule", "median"}),
               Contains("keeps every update"));
    // One phase, but factors shared across rounds: refused here too, before any data is read.
    CHECK_THAT(
        refused(self, {"--round.mode", "async", "--compression.compressor", "acpsgd:rank=1"}),
        Contains("shares factors across rounds"));
    CHECK(refused(self, {"--round.mode", "async", "--async.staleness", "constant",
                         "--async.max_staleness", "5"})
              .empty());
  }
  CHECK_THAT(refused(apps::kServer, {"--round.mode", "async", "--train.scaffold", "true"}),
             Contains("at the root") && Contains("same c"));
  CHECK_THAT(refused(apps::kServer, {"--round.mode", "async", "--sampling.overcommit", "2"}),
             Contains("at the root") && Contains("docs/deployment.md"));
  CHECK_THAT(refused(apps::kSim, {"--round.mode", "semisync"}),
             Contains("needs round.deadline_seconds > 0"));
  // The root's rounds are round.deadline_ms long: it needs no simulated length.
  CHECK(refused(apps::kServer, {"--round.mode", "semisync"}).empty());
  CHECK_THAT(refused(apps::kSim, {"--round.mode", "async", "--round.deadline_seconds", "3"}),
             Contains("a round deadline"));
  CHECK_THAT(refused(apps::kServer, {"--round.mode", "async", "--server.role", "aggregator"}),
             Contains("round.mode is the root's setting"));
  CHECK_THAT(refused(apps::kServer, {"--round.mode", "async", "--sampling.fraction", "0.5"}),
             Contains("needs async.concurrency"));
}

TEST_CASE("privacy.*: central DP composes its rule, and its refusals name the keys",
          "[apps][settings][dp]") {
  using Catch::Matchers::Contains;
  const auto refused = refusal;
  const std::vector<std::string> dp{"--privacy.dp",
                                    "central",
                                    "--privacy.clip",
                                    "0.3",
                                    "--privacy.noise_multiplier",
                                    "1.1",
                                    "--sampling.poisson_rate",
                                    "0.2",
                                    "--data.num_clients",
                                    "500"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = dp;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  for (Program self : {apps::kSim, apps::kServer}) {
    INFO(self);
    CHECK(refused(self, dp).empty());
    // The rule: fedavg, uniform, clipped at privacy.clip to the bit (0.1 + 0.2 is not 0.3).
    auto p = parse(self, {"--privacy.dp", "central", "--privacy.clip", "0.30000000000000004",
                          "--privacy.noise_multiplier", "1", "--sampling.poisson_rate", "0.5",
                          "--data.num_clients", "40"});
    apps::resolveSettings(*p.o, p.s, self);
    const server::EngineConfig e = apps::engineConfig(p.s);
    const auto rule = aggregation::makeRule(e.scheme.rule);
    CHECK(rule->clipNorm() == 0.1 + 0.2);
    CHECK_FALSE(rule->weightsByExamples());
    CHECK(e.dp.enabled);
    CHECK(e.sampling.poisson_rate == 0.5);
    CHECK(e.dp.population == 40);
    CHECK(e.dp.accountant == privacy::DpAccountant::kPld);  // the tight one by default
    auto r = parse(self, {"--privacy.dp", "central", "--privacy.clip", "1",
                          "--privacy.noise_multiplier", "1", "--sampling.poisson_rate", "0.5",
                          "--data.num_clients", "40", "--privacy.accountant", "rdp"});
    REQUIRE(r.rc == -1);
    apps::resolveSettings(*r.o, r.s, self);
    CHECK(apps::engineConfig(r.s).dp.accountant == privacy::DpAccountant::kRdp);
    CHECK(parse(self, {"--privacy.accountant", "moments"}).rc != -1);
    CHECK_NOTHROW(e.validate());

    CHECK_THAT(refused(self, {"--privacy.dp", "central", "--privacy.noise_multiplier", "1",
                              "--sampling.poisson_rate", "0.5"}),
               Contains("needs privacy.clip"));
    CHECK_THAT(refused(self, with({"--aggregation.rule", "median"})),
               Contains("leave aggregation.rule out"));
    CHECK_THAT(refused(self, {"--privacy.dp", "central", "--privacy.clip", "1",
                              "--privacy.noise_multiplier", "1", "--data.num_clients", "50"}),
               Contains("needs sampling.poisson_rate"));
    CHECK_THAT(refused(self, {"--privacy.clip", "1"}), Contains("privacy.dp is off"));
    CHECK_THAT(refused(self, {"--privacy.target_epsilon", "1"}), Contains("privacy.dp is off"));
    CHECK_THAT(refused(self, with({"--round.mode", "async"})), Contains("synchronous rounds only"));
    // Semi-synchronous rounds: each round's Poisson sample, closed at its deadline, late updates
    // dropped: the round engine's synchronous rounds with that deadline.
    std::vector<std::string> semisync{"--round.mode", "semisync"};
    if (self == apps::kSim) semisync.insert(semisync.end(), {"--round.deadline_seconds", "1"});
    CHECK(refused(self, with(semisync)).empty());
    {
      auto q = parse(self, with(semisync));
      REQUIRE(q.rc == -1);
      apps::resolveSettings(*q.o, q.s, self);
      CHECK(q.s.round.mode == apps::RoundMode::kSync);
      CHECK(q.s.round.semisync_under_dp);
      CHECK(apps::engineConfig(q.s).sampling.poisson_rate == 0.2);
      // Without DP it stays semi-synchronous (the buffered engine's, with its carry).
      auto plain = parse(self, semisync);
      REQUIRE(plain.rc == -1);
      apps::resolveSettings(*plain.o, plain.s, self);
      CHECK(plain.s.round.mode == apps::RoundMode::kSemisync);
      CHECK_FALSE(plain.s.round.semisync_under_dp);
    }
    for (const char* k : {"--async.concurrency", "--async.max_staleness"}) {
      auto more = semisync;
      more.insert(more.end(), {k, "4"});
      CHECK_THAT(refused(self, with(more)), Contains("late update instead of carrying it"));
    }
    if (self == apps::kSim)
      CHECK_THAT(refused(self, with({"--round.mode", "semisync"})),
                 Contains("round.deadline_seconds > 0"));
    CHECK_THAT(refused(self, with({"--compression.compressor", "powersgd:rank=2"})),
               Contains("several phases"));
    CHECK_THAT(refused(self, with({"--train.scaffold", "true"})), Contains("train.scaffold"));
    CHECK_THAT(refused(self, with({"--privacy.noise_multiplier", "0"})),
               Contains("epsilon would be infinite"));
    // A budget that 50 rounds at this noise would exceed, refused with what fits.
    CHECK_THAT(refused(self, with({"--privacy.target_epsilon", "1", "--train.rounds", "50"})),
               Contains("rounds fit that budget"));
    CHECK(refused(self, with({"--privacy.target_epsilon", "1", "--train.rounds", "50",
                              "--privacy.noise_multiplier", "0"}))
              .empty());
    CHECK_THAT(refused(self, with({"--sampling.overcommit", "2"})),
               Contains("sampling.overcommit"));
    CHECK_THAT(refused(self, with({"--sampling.poisson_rate", "0.001"})),
               Contains("fewer than one"));
    CHECK_THAT(refused(self, with({"--sampling.clients_per_round", "5"})),
               Contains("sampling.poisson_rate and sampling.clients_per_round are both set"));
  }
  for (Program self : {apps::kSim, apps::kServer})
    CHECK_THAT(refused(self, {"--round.mode", "async", "--sampling.poisson_rate", "0.5"}),
               Contains("does not run Poisson sampling"));
  // The root's denominator is public: data.num_clients, not whoever is online.
  CHECK_THAT(
      refused(apps::kServer, {"--privacy.dp", "central", "--privacy.clip", "1",
                              "--privacy.noise_multiplier", "1", "--sampling.poisson_rate", "0.5"}),
      Contains("needs data.num_clients"));
  CHECK_THAT(refused(apps::kServer, with({"--sampling.fraction", "0.5"})), Contains("both set"));
  // Through edge aggregators only in secure rounds (their clients then sampled one by one).
  CHECK_THAT(refused(apps::kServer, with({"--security.aggregator_ids", "7"})),
             Contains("through edge aggregators needs secagg.enabled = true"));
  CHECK_THAT(refused(apps::kServer, with({"--server.role", "aggregator"})),
             Contains("through edge aggregators needs secagg.enabled = true"));
  // A client ignores the privacy keys of a shared file (they are the root's and the simulator's).
  {
    testing::TempDir dir;
    const std::string file = write(dir, "dp.toml",
                                   "[privacy]\ndp = \"central\"\nclip = 0.5\n"
                                   "noise_multiplier = 1\n[sampling]\npoisson_rate = 0.5\n");
    auto c = parse(apps::kClient, {"--config", file});
    REQUIRE(c.rc == -1);
    CHECK_NOTHROW(apps::resolveSettings(*c.o, c.s, apps::kClient));
  }
  // The root waits for one registered client under Poisson sampling unless told otherwise.
  auto p = parse(apps::kServer, dp);
  apps::resolveSettings(*p.o, p.s, apps::kServer);
  CHECK(p.s.sampling.min_available == 1);
}

TEST_CASE("secagg.*: the simulator composes its rule, and the refusals name the keys",
          "[apps][settings][secagg]") {
  using Catch::Matchers::Contains;
  const auto refused = refusal;
  auto p = parse(Program::kSim, {"--secagg.enabled", "true", "--secagg.clip", "2"});
  REQUIRE(p.rc == -1);
  apps::resolveSettings(*p.o, p.s, Program::kSim);
  CHECK(p.s.sim.workers == Settings{}.sim.workers);  // several workers share its clients
  const server::EngineConfig e = apps::engineConfig(p.s);
  CHECK(e.secagg.enabled);
  CHECK(e.secagg.clip == 2.0);
  CHECK(e.scheme.rule == "fedavg:weight=uniform");
  CHECK(e.scheme.compressor == "none");  // the default's top-k would be refused
  // Under central DP the clip is privacy.clip's.
  auto d = parse(Program::kSim,
                 {"--secagg.enabled", "true", "--privacy.dp", "central", "--privacy.clip", "0.5",
                  "--privacy.noise_multiplier", "1", "--sampling.poisson_rate", "0.2"});
  REQUIRE(d.rc == -1);
  apps::resolveSettings(*d.o, d.s, Program::kSim);
  CHECK(apps::engineConfig(d.s).secagg.clip == 0.5);
  CHECK(refused(Program::kSim, {"--secagg.enabled", "true", "--secagg.clip", "2"}).empty());
  // The root runs it too (its clients are reached directly), with the same composed rule.
  CHECK(refused(Program::kServer, {"--secagg.enabled", "true", "--secagg.clip", "2"}).empty());
  auto r = parse(Program::kServer, {"--secagg.enabled", "true", "--secagg.clip", "2"});
  REQUIRE(r.rc == -1);
  apps::resolveSettings(*r.o, r.s, Program::kServer);
  CHECK(apps::engineConfig(r.s).scheme.rule == "fedavg:weight=uniform");
  CHECK(apps::engineConfig(r.s).scheme.compressor == "none");
  // Through edge aggregators (they relay its steps), with central or distributed DP too (the
  // root samples each of their clients by Poisson); an aggregator given the root's DP keys relays.
  CHECK(refused(Program::kServer, {"--secagg.enabled", "true", "--secagg.clip", "2",
                                   "--security.aggregator_ids", "100"})
            .empty());
  for (const char* mechanism : {"central", "distributed"}) {
    INFO(mechanism);
    const std::vector<std::string> dp_keys{"--secagg.enabled",
                                           "true",
                                           "--privacy.dp",
                                           mechanism,
                                           "--privacy.clip",
                                           "1",
                                           "--privacy.noise_multiplier",
                                           "1",
                                           "--sampling.poisson_rate",
                                           "0.5",
                                           "--data.num_clients",
                                           "10"};
    auto at = [&](std::vector<std::string> more) {
      more.insert(more.begin(), dp_keys.begin(), dp_keys.end());
      return refused(Program::kServer, more);
    };
    CHECK(at({"--security.aggregator_ids", "100"}).empty());
    CHECK(at({"--server.role", "aggregator", "--server.upstream", "tcp://127.0.0.1:7700"}).empty());
  }
  // An edge aggregator reading the root's file relays its secure aggregation: the keys are not
  // refused there (nor checked: the root's are).
  CHECK(
      refused(Program::kServer, {"--secagg.enabled", "true", "--secagg.clip", "2", "--server.role",
                                 "aggregator", "--server.upstream", "tcp://127.0.0.1:7700"})
          .empty());
  CHECK_THAT(refused(Program::kSim, {"--secagg.enabled", "true"}), Contains("needs secagg.clip"));
  CHECK(refused(Program::kSim,
                {"--secagg.enabled", "true", "--secagg.clip", "2", "--sim.workers", "3"})
            .empty());
  CHECK_THAT(refused(Program::kSim,
                     {"--secagg.enabled", "true", "--secagg.clip", "2", "--round.mode", "async"}),
             Contains("synchronous rounds only"));
  CHECK_THAT(refused(Program::kSim, {"--secagg.enabled", "true", "--secagg.clip", "2",
                                     "--aggregation.rule", "median"}),
             Contains("leave aggregation.rule out"));
  CHECK_THAT(refused(Program::kSim, {"--secagg.enabled", "true", "--secagg.clip", "2",
                                     "--compression.compressor", "stc:density=0.05"}),
             Contains("a coordinate only one client touched"));
  CHECK_THAT(refused(Program::kSim, {"--secagg.bits", "40"}), Contains("secagg.enabled is not"));
  // The malicious-server threat model: the root needs the authority's key; the simulator plays
  // the authority (its key the run seed's); a threat without secure aggregation is refused.
  CHECK_THAT(refused(Program::kServer, {"--secagg.enabled", "true", "--secagg.clip", "2",
                                        "--secagg.threat", "malicious-server"}),
             Contains("needs secagg.authority"));
  CHECK(refused(Program::kServer,
                {"--secagg.enabled", "true", "--secagg.clip", "2", "--secagg.threat",
                 "malicious-server", "--secagg.authority", "a.key"})
            .empty());
  CHECK(refused(Program::kSim, {"--secagg.enabled", "true", "--secagg.clip", "2", "--secagg.threat",
                                "malicious-server"})
            .empty());
  CHECK_THAT(refused(Program::kSim, {"--secagg.threat", "malicious-server"}),
             Contains("secagg.enabled is not"));
  CHECK(parse(Program::kServer, {"--secagg.threat", "paranoid"}).rc == 2);
  // A client reads the threat and the authority (which rounds it takes part in, whose keys it
  // trusts) from the shared file; the simulator has no authority file to read.
  auto client = parse(Program::kClient,
                      {"--secagg.threat", "malicious-server", "--secagg.authority", "a.key"});
  CHECK(client.s.secagg.threat == apps::SecAggThreat::kMaliciousServer);
  CHECK(client.s.secagg.authority == "a.key");
  CHECK(parse(Program::kSim, {"--secagg.authority", "a.key"}).rc == 2);
}

TEST_CASE("settings: privacy.dp = distributed runs under secure aggregation, accounted by RDP",
          "[apps][settings][ddg]") {
  using Catch::Matchers::Contains;
  const auto refused = refusal;
  const std::vector<std::string> base{"--secagg.enabled",
                                      "true",
                                      "--privacy.dp",
                                      "distributed",
                                      "--privacy.clip",
                                      "0.5",
                                      "--privacy.noise_multiplier",
                                      "1",
                                      "--sampling.poisson_rate",
                                      "0.2",
                                      "--data.num_clients",
                                      "100"};
  auto p = parse(Program::kSim, base);
  REQUIRE(p.rc == -1);
  apps::resolveSettings(*p.o, p.s, Program::kSim);
  const server::EngineConfig e = apps::engineConfig(p.s);
  CHECK(e.dp.enabled);
  CHECK(e.dp.mechanism == privacy::DpMechanism::kDistributed);
  CHECK(e.dp.accountant == privacy::DpAccountant::kRdp);  // its default, pld's elsewhere
  CHECK(e.secagg.clip == 0.5);
  CHECK(e.scheme.rule == "fedavg:weight=uniform,clip=0.5");
  CHECK(refused(Program::kSim, base).empty());
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = base;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  CHECK(refused(Program::kSim, with({"--privacy.min_clients", "10"})).empty());
  CHECK_THAT(refused(Program::kSim, with({"--privacy.min_clients", "30"})),
             Contains("privacy.min_clients = 30"));
  CHECK_THAT(refused(Program::kSim, with({"--privacy.accountant", "pld"})),
             Contains("privacy.accountant"));
  // No per-client metrics in the clear: none by default, refused when asked.
  CHECK(e.scheme.metrics.empty());
  CHECK_THAT(refused(Program::kSim, with({"--aggregation.metrics", "train_loss"})),
             Contains("takes no aggregation.metrics"));
  CHECK_THAT(
      refused(Program::kSim, {"--privacy.dp", "distributed", "--privacy.clip", "0.5",
                              "--privacy.noise_multiplier", "1", "--sampling.poisson_rate", "0.2"}),
      Contains("set secagg.enabled = true"));
  CHECK_THAT(refused(Program::kSim, with({"--round.mode", "async"})),
             Contains("synchronous rounds only"));
  // Through edge aggregators: their clients sampled one by one in the secure round.
  CHECK(refused(Program::kServer, with({"--security.aggregator_ids", "100"})).empty());
  CHECK_THAT(refused(Program::kSim, {"--privacy.min_clients", "10"}),
             Contains("privacy.dp is off"));
  // Adaptive clipping: central DP in the clear only; its knobs only with it.
  {
    auto a = parse(Program::kSim, {"--privacy.dp", "central", "--privacy.clip", "0.5",
                                   "--privacy.noise_multiplier", "1", "--sampling.poisson_rate",
                                   "0.2", "--privacy.adaptive_clip", "true",
                                   "--privacy.target_quantile", "0.7", "--privacy.clip_lr", "0.1"});
    REQUIRE(a.rc == -1);
    apps::resolveSettings(*a.o, a.s, Program::kSim);
    const server::EngineConfig ae = apps::engineConfig(a.s);
    CHECK(ae.dp.adaptive_clip);
    CHECK(ae.dp.target_quantile == 0.7);
    CHECK(ae.dp.clip_lr == 0.1);
    CHECK(ae.dp.count_noise == 0);  // derived: q N / 20
  }
  CHECK_THAT(refused(Program::kSim, with({"--privacy.adaptive_clip", "true"})),
             Contains("privacy.adaptive_clip needs privacy.dp = central"));
  // Under secure aggregation with central DP each client masks its count (docs/privacy.md).
  CHECK(
      refused(Program::kSim, {"--secagg.enabled", "true", "--privacy.dp", "central",
                              "--privacy.clip", "0.5", "--privacy.noise_multiplier", "1",
                              "--sampling.poisson_rate", "0.2", "--privacy.adaptive_clip", "true"})
          .empty());
  CHECK_THAT(refused(Program::kSim, {"--privacy.dp", "central", "--privacy.clip", "0.5",
                                     "--privacy.noise_multiplier", "1", "--sampling.poisson_rate",
                                     "0.2", "--privacy.clip_lr", "0.1"}),
             Contains("privacy.adaptive_clip is not"));
  // A client's floor on the noise it adds: the client's key, not the simulator's.
  auto client = parse(Program::kClient, {"--secagg.min_noise", "0.3"});
  REQUIRE(client.rc == -1);
  CHECK(client.s.secagg.min_noise == 0.3);
  CHECK(parse(Program::kSim, {"--secagg.min_noise", "0.3"}).rc == 2);
  CHECK(parse(Program::kClient, {"--secagg.min_noise", "-1"}).rc == 2);
  CHECK_THAT(refused(Program::kSim, {"--privacy.dp", "central", "--privacy.clip", "0.5",
                                     "--privacy.noise_multiplier", "1", "--sampling.poisson_rate",
                                     "0.2", "--privacy.min_clients", "10"}),
             Contains("privacy.dp is central"));
}
