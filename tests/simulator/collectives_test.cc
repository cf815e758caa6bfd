// The simulator's collectives (simulator/collectives.h) and launch conventions
// (simulator/launch.h).
//
// Multi-process cases run real Gloo groups: this binary spawns itself 2 or 3 times with the hidden
// first argument --collectives-worker ROLE ... (its own main, below), as rank r of W on 127.0.0.1
// with a TCPStore on a free port, and waits for the ranks with a deadline (then kills them by pid).
// posix_spawn rather than fork(): a forked child of a process that has started LibTorch's or
// OpenMP's threads may deadlock. Each worker checks its own results and reports through its exit
// status (and stderr, captured to a file when a test reads it).
#define CATCH_CONFIG_RUNNER
#include "simulator/collectives.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../catch_session.h"
#include "core/error.h"
#include "simulator/launch.h"
#include "tests/temp_dir.h"
#include "tests/wait_for.h"

namespace sim = starling::simulator;
namespace fs = std::filesystem;
using starling::testing::waitForExit;
using starling::testing::waitForFiles;
using namespace std::chrono_literals;

namespace {

// ---- worker side ----------------------------------------------------------------------------

constexpr int kFailedCheck = 1, kIoError = 2, kConfigError = 3, kOtherError = 4;

#define WORKER_CHECK(cond, ...)                                                             \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::cerr << "rank check failed: " #cond " " << starling::detail::concat(__VA_ARGS__) \
                << "\n";                                                                    \
      std::exit(kFailedCheck);                                                              \
    }                                                                                       \
  } while (0)

// Small integers, so every sum is exact whatever the reduction order.
float valueAt(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 17) - 8);
}

// The FedAdam-like elementwise server step the decoupled path applies to its shard only.
void serverStep(std::span<float> x) {
  for (float& v : x) v = 0.5f * v + 0.25f * v * v / (std::abs(v) + 1.0f);
}

uint64_t fnv(std::span<const float> v) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size_bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// allReduceSum equals the exact sum; reduce-scatter leaves the exact sum on the shard; all-gather
// (over a buffer whose non-shard part is NaN) rebuilds the all-reduce's bits; the sharded step +
// all-gather equals all-reduce + the full step. Then non-integer values: every rank writes a hash
// of its results, which the test compares across ranks.
// Buffers of more than 300 buckets are left out (each bucket is a round trip of its own; tiny
// buckets on a 100k buffer would take minutes and test nothing more).
void roleSums(sim::Collectives& c, size_t bucket_bytes, const fs::path& out) {
  const int w = c.size(), r = c.rank();
  const size_t max_n = 300 * (bucket_bytes / sizeof(float));
  std::ostringstream hashes;
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{1000},
                   size_t{12345}, size_t{100003}}) {
    if (n > max_n) continue;
    std::vector<float> x(n), expected(n, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      x[i] = valueAt(r, i);
      for (int j = 0; j < w; ++j) expected[i] += valueAt(j, i);
    }
    std::vector<float> a = x;
    c.allReduceSum(a);
    WORKER_CHECK(a == expected, "allReduceSum n=", n);

    std::vector<float> b = x;
    c.reduceScatterSum(b);
    const auto [lo, hi] = c.shard(n);
    for (size_t i = lo; i < hi; ++i)
      WORKER_CHECK(b[i] == expected[i], "reduceScatterSum n=", n, " i=", i);
    for (size_t i = 0; i < n; ++i) {
      if (i < lo || i >= hi) b[i] = std::numeric_limits<float>::quiet_NaN();
    }
    std::vector<float> stepped = b;
    c.allGather(b);
    WORKER_CHECK((n == 0 || std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0),
                 "allGather bits n=", n);

    serverStep(std::span<float>(stepped).subspan(lo, hi - lo));
    c.allGather(stepped);
    serverStep(a);
    WORKER_CHECK((n == 0 || std::memcmp(a.data(), stepped.data(), n * sizeof(float)) == 0),
                 "sharded step n=", n);
  }
  // Non-integer values: no exactness, but every rank must end with the same bits.
  const size_t n = std::min<size_t>(54321, max_n);
  std::vector<float> a(n);
  for (size_t i = 0; i < n; ++i)
    a[i] = std::sin(0.001f * static_cast<float>(i) + 0.37f * static_cast<float>(r));
  std::vector<float> b = a;
  c.allReduceSum(a);
  c.reduceScatterSum(b);
  c.allGather(b);
  for (size_t i = 0; i < n; ++i)
    WORKER_CHECK(std::abs(a[i] - b[i]) <= 1e-5f * (1 + std::abs(a[i])), "i=", i);
  hashes << fnv(a) << " " << fnv(b) << "\n";
  // allGatherBytes: every rank's bytes (rank 1 none, the others of lengths that are not multiples
  // of four, bytes 0 to 255, and words that are a signalling and a quiet NaN's bits), through
  // all-gather windows of one word a rank, of 7 / W words and of everything; in the last, rank 2's
  // 70,001 bytes need the second 16-bit piece of the sizes' all-reduce (in windows of one word
  // they would take 17,501 all-gathers).
  const auto bytesOf = [](int rank, bool big) {
    std::vector<uint8_t> v(rank == 1            ? 0
                           : (rank == 2 && big) ? 70001
                                                : 1000 + 7 * static_cast<size_t>(rank) + 1);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 131 + 17 * rank + 255);
    const uint8_t nans[8] = {0x01, 0x00, 0x80, 0x7f, 0x00, 0x00, 0xc0, 0xff};
    if (!v.empty()) std::memcpy(v.data(), nans, sizeof nans);
    return v;
  };
  for (size_t batch : {size_t{4}, size_t{28}, size_t{32} << 20}) {
    const bool big = batch > 28;
    const auto all = sim::allGatherBytes(c, bytesOf(r, big), batch);
    WORKER_CHECK(all.size() == static_cast<size_t>(w), "allGatherBytes ranks ", all.size());
    for (int q = 0; q < w; ++q)
      WORKER_CHECK(all[static_cast<size_t>(q)] == bytesOf(q, big), "allGatherBytes rank ", q,
                   " batch ", batch);
  }
  c.barrier();
  std::ofstream(out / ("rank" + std::to_string(r) + ".txt")) << hashes.str();
}

void touch(const fs::path& p) { std::ofstream(p) << "ready\n"; }

int runWorker(int argc, char** argv) {
  // argv: self --collectives-worker ROLE BUCKET_BYTES TIMEOUT_MS OUTDIR
  if (argc != 6) return kOtherError;
  const std::string role = argv[2];
  const fs::path out = argv[5];
  try {
    const sim::LaunchInfo info = sim::launchInfoFromEnvironment();
    WORKER_CHECK(info.source == "spawned", "source ", info.source);
    sim::CollectiveOptions o;
    o.bucket_bytes = std::stoull(argv[3]);
    o.timeout = std::chrono::milliseconds(std::stoll(argv[4]));
    if (role == "mismatch" && info.rank == 1) o.bucket_bytes += 4;
    auto c = sim::makeGloo(info, o);
    WORKER_CHECK(c->rank() == info.rank && c->size() == info.world_size, "rank/size");
    WORKER_CHECK(c->backend() == "gloo", "backend ", c->backend());
    if (role == "sums") {
      roleSums(*c, o.bucket_bytes, out);
    } else if (role == "dead" || role == "silent") {
      // Rank 0 all-reduces while rank 1 never joins: the test kills rank 1 ("dead") or leaves it
      // asleep ("silent"). Rank 0 must fail with an IoError (exit kIoError) in bounded time.
      touch(out / ("ready" + std::to_string(info.rank)));
      if (info.rank != 0) {
        std::this_thread::sleep_for(600s);
        return 0;
      }
      std::vector<float> v(1000, 1.0f);
      for (int i = 0; i < 1000; ++i) c->allReduceSum(v);
      return 0;  // not reached: rank 1 never participates
    }
    return 0;
  } catch (const starling::IoError& e) {
    std::cerr << "IoError: " << e.what() << "\n";
    return kIoError;
  } catch (const starling::ConfigError& e) {
    std::cerr << "ConfigError: " << e.what() << "\n";
    return kConfigError;
  } catch (const std::exception& e) {
    std::cerr << "other exception: " << e.what() << "\n";
    return kOtherError;
  }
}

// ---- test side ------------------------------------------------------------------------------

std::string self_exe;

using TempDir = starling::testing::TempDir;

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> workerArgs(const std::string& role, size_t bucket, int timeout_ms,
                                    const fs::path& out) {
  return {"--collectives-worker", role, std::to_string(bucket), std::to_string(timeout_ms),
          out.string()};
}

std::vector<std::string> stderrFiles(const fs::path& dir, int w) {
  std::vector<std::string> v;
  for (int r = 0; r < w; ++r) v.push_back((dir / ("stderr" + std::to_string(r) + ".txt")).string());
  return v;
}

using Env = std::map<std::string, std::string>;
sim::EnvLookup lookup(const Env& env) {
  return [env](std::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

std::string configError(const Env& env) {
  try {
    sim::parseLaunchInfo(lookup(env));
  } catch (const starling::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("shardRange covers 0..n-1 exactly once, in rank order, sizes within one",
          "[simulator][collectives]") {
  for (int w = 1; w <= 9; ++w) {
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{2}, size_t{5}, size_t{8}, size_t{9}, size_t{1000003}}) {
      size_t next = 0, lo = n, hi = 0;
      for (int r = 0; r < w; ++r) {
        const auto [b, e] = sim::Collectives::shardRange(n, r, w);
        INFO("n=" << n << " w=" << w << " r=" << r);
        CHECK(b == next);
        CHECK(e >= b);
        next = e;
        lo = std::min(lo, e - b);
        hi = std::max(hi, e - b);
      }
      CHECK(next == n);
      CHECK(hi - lo <= 1);
    }
  }
  CHECK_THROWS_AS(sim::Collectives::shardRange(10, 2, 2), starling::InvalidArgument);
  CHECK_THROWS_AS(sim::Collectives::shardRange(10, -1, 2), starling::InvalidArgument);
  CHECK_THROWS_AS(sim::Collectives::shardRange(10, 0, 0), starling::InvalidArgument);
}

TEST_CASE("a local group of one leaves buffers unchanged", "[simulator][collectives]") {
  auto c = sim::makeLocal();
  CHECK(c->rank() == 0);
  CHECK(c->size() == 1);
  std::vector<float> v{1.5f, -2.0f, 3.0f};
  const std::vector<float> orig = v;
  c->allReduceSum(v);
  c->reduceScatterSum(v);
  c->allGather(v);
  c->barrier();
  CHECK(v == orig);
  const std::vector<uint8_t> bytes{0, 255, 1, 128, 7};
  const auto all = sim::allGatherBytes(*c, bytes);
  REQUIRE(all.size() == 1);
  CHECK(all[0] == bytes);
  // A world of one needs no store: gloo gives a local group too.
  CHECK(sim::makeGloo(sim::LaunchInfo{})->backend() == "local");
  CHECK(sim::makeCollectives("local", sim::LaunchInfo{})->size() == 1);
}

TEST_CASE("bad collective options and backends are ConfigErrors naming them",
          "[simulator][collectives]") {
  sim::CollectiveOptions o;
  o.bucket_bytes = 0;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("bucket_bytes"));
  o = {};
  o.timeout = 0ms;
  CHECK_THROWS_WITH(o.validate(), Catch::Contains("timeout"));
  CHECK_THROWS_WITH(sim::makeCollectives("mpi", sim::LaunchInfo{}),
                    Catch::Contains("unknown collectives backend 'mpi'"));
  sim::LaunchInfo two{0, 2, 0, 2, "127.0.0.1", 29500, "torchrun"};
  CHECK_THROWS_WITH(sim::makeCollectives("local", two),
                    Catch::Contains("'local' is a group of one"));
}

TEST_CASE("launch info from torchrun, SLURM and a single process", "[simulator][launch]") {
  SECTION("nothing set: a single process") {
    const sim::LaunchInfo i = sim::parseLaunchInfo(lookup({}));
    CHECK(i.source == "single");
    CHECK(i.rank == 0);
    CHECK(i.world_size == 1);
  }
  SECTION("torchrun") {
    const sim::LaunchInfo i = sim::parseLaunchInfo(lookup({{"RANK", "3"},
                                                           {"WORLD_SIZE", "8"},
                                                           {"LOCAL_RANK", "1"},
                                                           {"MASTER_ADDR", "10.0.0.1"},
                                                           {"MASTER_PORT", "29500"}}));
    CHECK(i.source == "torchrun");
    CHECK(i.rank == 3);
    CHECK(i.world_size == 8);
    CHECK(i.local_rank == 1);
    CHECK(i.master_addr == "10.0.0.1");
    CHECK(i.master_port == 29500);
  }
  SECTION("torchrun's variables win over SLURM's (srun torchrun ...)") {
    const sim::LaunchInfo i = sim::parseLaunchInfo(lookup({{"RANK", "5"},
                                                           {"WORLD_SIZE", "6"},
                                                           {"MASTER_ADDR", "h"},
                                                           {"MASTER_PORT", "1"},
                                                           {"SLURM_PROCID", "0"},
                                                           {"SLURM_NTASKS", "2"}}));
    CHECK(i.source == "torchrun");
    CHECK(i.rank == 5);
    CHECK(i.local_rank == 0);
  }
  SECTION("slurm, master address from SLURM_LAUNCH_NODE_IPADDR") {
    const sim::LaunchInfo i = sim::parseLaunchInfo(lookup({{"SLURM_PROCID", "2"},
                                                           {"SLURM_NTASKS", "4"},
                                                           {"SLURM_LOCALID", "0"},
                                                           {"SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"},
                                                           {"MASTER_PORT", "12345"}}));
    CHECK(i.source == "slurm");
    CHECK(i.rank == 2);
    CHECK(i.world_size == 4);
    CHECK(i.master_addr == "10.1.2.3");
    CHECK(i.master_port == 12345);
  }
  SECTION("slurm, MASTER_ADDR wins over the launch node") {
    const sim::LaunchInfo i = sim::parseLaunchInfo(lookup({{"SLURM_PROCID", "0"},
                                                           {"SLURM_NTASKS", "2"},
                                                           {"MASTER_ADDR", "node7"},
                                                           {"SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"},
                                                           {"MASTER_PORT", "1"}}));
    CHECK(i.master_addr == "node7");
  }
  SECTION("spawned: spawnEnvironment round-trips") {
    const sim::LaunchInfo in{1, 3, 1, 3, "127.0.0.1", 4242, "spawned"};
    Env env;
    for (const std::string& kv : sim::spawnEnvironment(in))
      env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
    const sim::LaunchInfo i = sim::parseLaunchInfo(lookup(env));
    CHECK(i.source == "spawned");
    CHECK(i.rank == 1);
    CHECK(i.world_size == 3);
    CHECK(i.local_world_size == 3);
    CHECK(i.master_port == 4242);
  }
  SECTION(
      "workers on this machine: LOCAL_WORLD_SIZE, a plain SLURM_STEP_TASKS_PER_NODE, else "
      "unknown") {
    CHECK(sim::parseLaunchInfo(lookup({})).local_world_size == 1);
    CHECK(sim::parseLaunchInfo(lookup({{"RANK", "5"},
                                       {"WORLD_SIZE", "8"},
                                       {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "4"},
                                       {"MASTER_ADDR", "h"},
                                       {"MASTER_PORT", "1"}}))
              .local_world_size == 4);
    CHECK(sim::parseLaunchInfo(
              lookup(
                  {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}))
              .local_world_size == 0);
    const Env slurm{{"SLURM_PROCID", "3"},
                    {"SLURM_NTASKS", "6"},
                    {"SLURM_LOCALID", "1"},
                    {"SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"},
                    {"MASTER_PORT", "1"}};
    Env per_node = slurm;
    per_node["SLURM_STEP_TASKS_PER_NODE"] = "2";
    CHECK(sim::parseLaunchInfo(lookup(per_node)).local_world_size == 2);
    per_node["SLURM_STEP_TASKS_PER_NODE"] =
        "2(x3)";  // srun's form for several nodes: not one number
    CHECK(sim::parseLaunchInfo(lookup(per_node)).local_world_size == 0);
    CHECK(sim::parseLaunchInfo(lookup(slurm)).local_world_size == 0);
  }
}

TEST_CASE("inconsistent launch variables are ConfigErrors naming the variable",
          "[simulator][launch]") {
  const Env master{{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto with = [&](Env e) {
    e.insert(master.begin(), master.end());
    return e;
  };
  CHECK_THAT(configError(with({{"RANK", "2"}, {"WORLD_SIZE", "2"}})),
             Catch::Contains("RANK=2 is not below WORLD_SIZE=2"));
  CHECK_THAT(configError(with({{"RANK", "x1"}, {"WORLD_SIZE", "2"}})),
             Catch::Contains("RANK='x1'"));
  CHECK_THAT(configError(with({{"RANK", "1"}, {"WORLD_SIZE", "2 "}})),
             Catch::Contains("WORLD_SIZE='2 '"));
  CHECK_THAT(configError(with({{"RANK", "-1"}, {"WORLD_SIZE", "2"}})), Catch::Contains("RANK"));
  CHECK_THAT(configError(with({{"RANK", "0"}, {"WORLD_SIZE", "0"}})),
             Catch::Contains("WORLD_SIZE=0 is out of range"));
  CHECK_THAT(configError(with({{"RANK", "0"}})),
             Catch::Contains("RANK is set but WORLD_SIZE is not"));
  CHECK_THAT(configError(with({{"WORLD_SIZE", "2"}})),
             Catch::Contains("WORLD_SIZE is set but RANK is not"));
  CHECK_THAT(configError(with({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}})),
             Catch::Contains("LOCAL_RANK=2"));
  CHECK_THAT(
      configError(with(
          {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})),
      Catch::Contains("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"));
  CHECK_THAT(configError(with({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "two"}})),
             Catch::Contains("LOCAL_WORLD_SIZE='two'"));
  CHECK_THAT(configError({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}),
             Catch::Contains("MASTER_ADDR is not set"));
  CHECK_THAT(configError({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}),
             Catch::Contains("MASTER_PORT is not set"));
  CHECK_THAT(
      configError(
          {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}),
      Catch::Contains("MASTER_PORT=70000 is out of range"));
  CHECK_THAT(configError({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
             Catch::Contains("SLURM_PROCID=4 is not below SLURM_NTASKS=4"));
  CHECK_THAT(configError({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"MASTER_PORT", "1"}}),
             Catch::Contains("nor is SLURM_LAUNCH_NODE_IPADDR"));
  CHECK_THAT(configError(
                 {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LAUNCH_NODE_IPADDR", "h"}}),
             Catch::Contains("MASTER_PORT is not set"));
  CHECK_THAT(configError({{"SLURM_NTASKS", "2"}}),
             Catch::Contains("SLURM_NTASKS is set but SLURM_PROCID is not"));
  // A world of one needs no master.
  CHECK(sim::parseLaunchInfo(lookup({{"RANK", "0"}, {"WORLD_SIZE", "1"}})).world_size == 1);
}

TEST_CASE("Gloo: all-reduce, reduce-scatter and all-gather give exact sums across real processes",
          "[simulator][collectives][integration]") {
  // Bucket sizes: the default (every buffer fits one bucket), 40 bytes (10 floats: many buckets,
  // slices of 5 or 3 floats per rank, so a bucket can hold nothing of a short shard; buffers up to
  // 1000 floats) and 4000 bytes.
  const int world = GENERATE(2, 3);
  const size_t bucket = GENERATE(size_t{4} << 20, size_t{40}, size_t{4000});
  TempDir dir;
  INFO("world " << world << ", bucket " << bucket << " bytes");
  const auto t0 = std::chrono::steady_clock::now();
  const auto pids =
      sim::spawnLocalRanks(self_exe, workerArgs("sums", bucket, 30000, dir.path), world,
                           sim::freeLoopbackPort(), stderrFiles(dir.path, world));
  const std::vector<int> st = sim::waitRanks(pids, 120s);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << " stderr: " << slurp(dir.path / ("stderr" + std::to_string(r) + ".txt")));
    CHECK(st[static_cast<size_t>(r)] == 0);
  }
  const std::string h0 = slurp(dir.path / "rank0.txt");
  CHECK_FALSE(h0.empty());
  for (int r = 1; r < world; ++r)
    CHECK(slurp(dir.path / ("rank" + std::to_string(r) + ".txt")) == h0);
  std::cerr << "gloo sums, world " << world << ", bucket " << bucket << ": "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
            << " s\n";
}

TEST_CASE("Gloo: a rank killed mid-collective makes its peer fail with an IoError in bounded time",
          "[simulator][collectives][integration]") {
  // "dead": SIGKILL rank 1 while rank 0 waits in an all-reduce for it (a broken connection);
  // "silent": rank 1 stays alive but never joins (the timeout, 2 s here).
  const std::string role = GENERATE(std::string("dead"), std::string("silent"));
  INFO(role);
  TempDir dir;
  const int timeout_ms = role == "dead" ? 60000 : 2000;  // "dead" must not need the timeout
  const auto pids = sim::spawnLocalRanks(self_exe, workerArgs(role, 4 << 20, timeout_ms, dir.path),
                                         2, sim::freeLoopbackPort(), stderrFiles(dir.path, 2));
  // Both ranks are connected once both have written their ready files; rank 0 writes its own
  // just before its all-reduces. Whether the kill lands before its first all-reduce or inside one,
  // the pair's connection is broken and the next read fails: "dead" never waits for the timeout.
  REQUIRE(starling::testing::waitForFiles(
      dir.path, [&] { return fs::exists(dir.path / "ready0") && fs::exists(dir.path / "ready1"); },
      60s));
  const auto t0 = std::chrono::steady_clock::now();
  if (role == "dead") kill(pids[1], SIGKILL);
  const std::vector<int> st0 = sim::waitRanks({pids[0]}, 30s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sim::waitRanks({pids[1]}, 0ms);  // kills the silent one; reaps the dead one
  const std::string err = slurp(dir.path / "stderr0.txt");
  INFO("rank 0 took " << seconds << " s; stderr: " << err);
  CHECK(st0[0] == kIoError);
  CHECK_THAT(err, Catch::Contains("gloo allReduceSum") && Catch::Contains("rank 0 of 2"));
  CHECK(seconds < 10.0);
  std::cerr << "gloo " << role << ": rank 0 failed after " << seconds << " s\n";
}

TEST_CASE("Gloo: rendezvous failures are errors, not hangs",
          "[simulator][collectives][integration]") {
  SECTION("ranks with different bucket sizes: ConfigError naming the option") {
    TempDir dir;
    const auto pids = sim::spawnLocalRanks(self_exe, workerArgs("mismatch", 4096, 20000, dir.path),
                                           2, sim::freeLoopbackPort(), stderrFiles(dir.path, 2));
    // Rank 1 refuses at once; rank 0 would wait for it until its timeout, so it is killed then.
    const std::vector<int> st1 = sim::waitRanks({pids[1]}, 60s);
    sim::waitRanks({pids[0]}, 0ms);
    const std::string err1 = slurp(dir.path / "stderr1.txt");
    INFO(err1);
    CHECK(st1[0] == kConfigError);
    CHECK_THAT(err1, Catch::Contains("bucket_bytes differs between ranks"));
  }
  SECTION("rank 0 never comes: rank 1 fails within the timeout") {
    TempDir dir;
    const int port = sim::freeLoopbackPort();
    // Spawn a world of 2 and kill rank 0 at once: rank 1 has no store to connect to.
    const auto pids = sim::spawnLocalRanks(self_exe, workerArgs("sums", 4096, 2000, dir.path), 2,
                                           port, stderrFiles(dir.path, 2));
    kill(pids[0], SIGKILL);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int> st = sim::waitRanks(pids, 30s);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string err1 = slurp(dir.path / "stderr1.txt");
    INFO("took " << seconds << " s; " << err1);
    CHECK(st[1] == kIoError);
    CHECK(seconds < 15.0);
  }
}

// --spawn-worker OUTDIR: writes its launch variables to OUTDIR/rankR.txt (whole, by a rename) and
// sleeps (to be killed).
// --spawner OUTDIR: becomes rank 0 of a local world of 3 (startLocalWorld, as starling-sim does),
// whose ranks 1 and 2 are --spawn-worker children that die with it; writes their pids and its own
// launch variables to OUTDIR/pids.txt, then sleeps until the test kills it.
int runSpawnRole(int argc, char** argv) {
  if (argc != 3) return kOtherError;
  const fs::path out = argv[2];
  if (std::string(argv[1]) == "--spawn-worker") {
    const sim::LaunchInfo i = sim::launchInfoFromEnvironment();
    // Written whole, then renamed: the test waits for the file to exist and reads it at once.
    const std::string name = "rank" + std::to_string(i.rank);
    std::ofstream(out / (name + ".tmp")) << i.source << " " << i.rank << " " << i.world_size << " "
                                         << i.local_rank << " " << i.local_world_size << "\n";
    fs::rename(out / (name + ".tmp"), out / (name + ".txt"));
    for (;;) pause();  // until the test's or the kernel's SIGKILL
  }
  // As starling-sim without a launcher: rank 0 of a local world of 3.
  const sim::LocalWorld world = sim::startLocalWorld(3, {"--spawn-worker", out.string()});
  {
    std::ofstream f(out / "pids.tmp");
    for (int p : world.children) f << p << "\n";
    f << "self " << world.self.source << " " << world.self.rank << " " << world.self.world_size
      << " " << world.self.local_rank << " " << world.self.local_world_size << "\n";
  }
  fs::rename(out / "pids.tmp", out / "pids.txt");
  for (;;) pause();  // until the test kills it
}

TEST_CASE(
    "spawned workers: only the ranks asked for, their launch variables, and they die with their "
    "spawner",
    "[simulator][launch]") {
  TempDir dir;
  const auto spawner = sim::spawnLocalRanks(self_exe, {"--spawner", dir.path.string()}, 1, 0);
  waitForFiles(
      dir.path,
      [&] {
        return fs::exists(dir.path / "pids.txt") && fs::exists(dir.path / "rank1.txt") &&
               fs::exists(dir.path / "rank2.txt");
      },
      30s);
  std::vector<int> workers;
  std::string self;
  {
    std::ifstream f(dir.path / "pids.txt");
    for (int p; f >> p;) workers.push_back(p);
    f.clear();
    std::getline(f, self);
  }
  REQUIRE(workers.size() == 2);
  CHECK(self == "self spawned 0 3 0 3");
  // The workers are this very binary, named by its path (what ps shows), not /proc/self/exe.
  for (int p : workers) {
    const std::string cmdline = slurp("/proc/" + std::to_string(p) + "/cmdline");
    CHECK(cmdline.substr(0, cmdline.find('\0')) == self_exe);
  }
  CHECK_FALSE(fs::exists(dir.path / "rank0.txt"));  // rank 0 is the spawner itself
  CHECK(slurp(dir.path / "rank1.txt") == "spawned 1 3 1 3\n");
  CHECK(slurp(dir.path / "rank2.txt") == "spawned 2 3 2 3\n");
  for (int p : workers) CHECK(kill(p, 0) == 0);  // alive while the spawner lives
  kill(spawner[0], SIGKILL);
  sim::waitRanks(spawner, 10s);
  // The orphans get SIGKILL from the kernel: each one's pidfd becomes readable as it ends (a
  // zombie counts as ended: a PID 1 that does not reap would leave them so).
  const bool gone = waitForExit(workers, 20s);
  if (!gone)
    for (int p : workers) kill(p, SIGKILL);  // ours, by pid: leave nothing behind on failure
  CHECK(gone);
}

TEST_CASE("a local world's failed workers are reported with their statuses",
          "[simulator][launch]") {
  // Rank 2 exits with 7, rank 1 with 0 (the --exit-by-rank role).
  const sim::LocalWorld world = sim::startLocalWorld(3, {"--exit-by-rank"});
  CHECK(world.self.rank == 0);
  CHECK(world.self.world_size == 3);
  CHECK(world.self.source == "spawned");
  CHECK(world.self.master_port > 0);
  REQUIRE(world.children.size() == 2);
  const auto failed = sim::waitLocalWorld(world);
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].first == world.children[1]);
  CHECK(failed[0].second == 7);
  CHECK(sim::startLocalWorld(1, {}).children.empty());  // one worker: nothing to start
}

TEST_CASE("spawning: bad options are InvalidArgument, a program that cannot start an IoError",
          "[simulator][launch]") {
  CHECK_THROWS_AS(
      sim::spawnLocalRanks(
          self_exe, {}, 2, 1,
          sim::SpawnOptions{
              .first_rank = 3, .die_with_parent = false, .stderr_paths = {}, .argv0 = {}}),
      starling::InvalidArgument);
  CHECK_THROWS_AS(
      sim::spawnLocalRanks(
          self_exe, {}, 2, 1,
          sim::SpawnOptions{
              .first_rank = 1, .die_with_parent = false, .stderr_paths = {"a", "b"}, .argv0 = {}}),
      starling::InvalidArgument);
  // die_with_parent from another thread than the main one: the kernel would kill the children when
  // that thread ends.
  std::exception_ptr err;
  std::vector<int> started;
  std::thread([&] {
    try {
      started = sim::spawnLocalRanks(
          self_exe, {"--spawn-worker", "/nonexistent"}, 2, 1,
          sim::SpawnOptions{
              .first_rank = 1, .die_with_parent = true, .stderr_paths = {}, .argv0 = {}});
    } catch (...) {
      err = std::current_exception();
    }
  }).join();
  for (int p : started) kill(p, SIGKILL);  // ours, by pid, if the refusal failed
  sim::waitRanks(started, 10s);
  REQUIRE(err);
  CHECK_THROWS_AS(std::rethrow_exception(err), starling::InvalidArgument);
  CHECK_THROWS_WITH(sim::spawnLocalRanks("/nonexistent/starling-sim", {}, 2, 1),
                    Catch::Contains("spawning rank 0 of 2") && Catch::Contains("No such file"));
}

int main(int argc, char** argv) {
  self_exe = fs::read_symlink("/proc/self/exe").string();
  if (argc > 1 && std::string(argv[1]) == "--collectives-worker") return runWorker(argc, argv);
  if (argc > 1 && (std::string(argv[1]) == "--spawner" || std::string(argv[1]) == "--spawn-worker"))
    return runSpawnRole(argc, argv);
  if (argc > 1 && std::string(argv[1]) == "--exit-by-rank")
    return sim::launchInfoFromEnvironment().rank == 2 ? 7 : 0;
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  starling::testing::failEmptyTests(session);
  return session.run();
}
