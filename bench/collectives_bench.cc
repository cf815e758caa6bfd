// starling-collectives-bench: the simulator's global aggregation on this machine, two ranks over
// c10d Gloo on 127.0.0.1. docs/performance.md, section "Collectives", records the figures with the
// command.
//
//   allreduce_step/<n>/<b>MiB   allReduceSum of n floats in buckets of b MiB, then a FedAdam-like
//                               elementwise server step on the whole buffer (every rank keeps the
//                               whole optimizer state: m, v, x of n floats).
//   rs_step_ag/<n>/<b>MiB       the decoupled path (DeAR): reduceScatterSum, the same step on this
//                               rank's shard only (state of n / 2 floats), allGather of the model.
//   allreduce/<n>/<b>MiB        the collectives alone: one allReduceSum ...
//   rs_ag/<n>/<b>MiB            ... against reduceScatterSum + allGather.
//   n = 1663370 (the CNN of McMahan et al. for 28x28 inputs: 1,663,370 parameters) and 11,000,000.
//
// Ratios (bench/ratios.h): rs_step_ag / allreduce_step and rs_ag / allreduce, per n and bucket size
// (the target: the decoupled path costs no more than one all-reduce plus the full step).
//
// How it runs: the command starts two copies of itself (ranks 0 and 1, simulator::spawnLocalRanks)
// and waits for them; each rank runs the same Google Benchmark cases with fixed iteration counts so
// that the ranks' collectives pair up; rank 0 reports (console or --benchmark_format=json,
// --benchmark_out, --ratios_out=FILE), rank 1's output is discarded. Each bucket size is its own
// Gloo group (the bucket size is agreed at rendezvous), on its own port.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bench/ratios.h"
#include "core/error.h"
#include "simulator/collectives.h"
#include "simulator/launch.h"

namespace {

namespace sim = starling::simulator;

constexpr size_t kSizes[] = {1663370, 11000000};
constexpr size_t kBucketsMiB[] = {1, 4, 16};

struct Adam {
  explicit Adam(size_t n) : m(n, 0.0f), v(n, 0.0f), x(n, 0.01f) {}
  // g <- new model; FedAdam's elementwise update (Reddi et al., 2021) with fixed hyperparameters.
  void step(std::span<float> g) {
    float *pm = m.data(), *pv = v.data(), *px = x.data(), *pg = g.data();
    for (size_t i = 0, n = g.size(); i < n; ++i) {
      pm[i] = 0.9f * pm[i] + 0.1f * pg[i];
      pv[i] = 0.99f * pv[i] + 0.01f * pg[i] * pg[i];
      px[i] -= 0.01f * pm[i] / (std::sqrt(pv[i]) + 1e-3f);
      pg[i] = px[i];
    }
  }
  std::vector<float> m, v, x;
};

std::string name(const char* kind, size_t n, size_t mib) {
  return std::string(kind) + "/" + std::to_string(n) + "/" + std::to_string(mib) + "MiB";
}

void registerAll(std::vector<std::unique_ptr<sim::Collectives>>& groups) {
  for (size_t gi = 0; gi < std::size(kBucketsMiB); ++gi) {
    sim::Collectives* c = groups[gi].get();
    const size_t mib = kBucketsMiB[gi];
    for (size_t n : kSizes) {
      const int iters = n > 5000000 ? 20 : 100;
      auto run = [c, n](benchmark::State& st, bool decoupled, bool with_step) {
        std::vector<float> buf(n, 0.001f);
        const auto [lo, hi] = c->shard(n);
        Adam full(with_step && !decoupled ? n : 0), shard(with_step && decoupled ? hi - lo : 0);
        c->barrier();
        for (auto _ : st) {
          if (decoupled) {
            c->reduceScatterSum(buf);
            if (with_step) shard.step(std::span<float>(buf).subspan(lo, hi - lo));
            c->allGather(buf);
          } else {
            c->allReduceSum(buf);
            if (with_step) full.step(buf);
          }
          benchmark::DoNotOptimize(buf.data());
        }
        st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * n * sizeof(float)));
      };
      benchmark::RegisterBenchmark(name("allreduce_step", n, mib).c_str(),
                                   [run](benchmark::State& st) { run(st, false, true); })
          ->Iterations(iters)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(name("rs_step_ag", n, mib).c_str(),
                                   [run](benchmark::State& st) { run(st, true, true); })
          ->Iterations(iters)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(name("allreduce", n, mib).c_str(),
                                   [run](benchmark::State& st) { run(st, false, false); })
          ->Iterations(iters)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(name("rs_ag", n, mib).c_str(),
                                   [run](benchmark::State& st) { run(st, true, false); })
          ->Iterations(iters)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
}

int runRank(std::vector<char*> args, const std::vector<int>& ports) {
  const sim::LaunchInfo info = sim::launchInfoFromEnvironment();
  bool json = false;
  std::string ratios_out;
  std::vector<char*> kept;
  for (char* a : args) {
    const std::string s = a;
    if (s == "--benchmark_format=json") json = true;
    if (s.rfind("--ratios_out=", 0) == 0) {
      ratios_out = s.substr(13);
      continue;
    }
    // Only rank 0 reports.
    if (info.rank != 0 && s.rfind("--benchmark_out", 0) == 0) continue;
    kept.push_back(a);
  }
  if (info.rank != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;
  std::vector<std::unique_ptr<sim::Collectives>> groups;
  for (size_t gi = 0; gi < std::size(kBucketsMiB); ++gi) {
    sim::LaunchInfo g = info;
    g.master_port = ports[gi];
    sim::CollectiveOptions o;
    o.bucket_bytes = kBucketsMiB[gi] << 20;
    o.timeout = std::chrono::minutes(2);
    groups.push_back(sim::makeGloo(g, o));
  }
  int n = static_cast<int>(kept.size());
  benchmark::Initialize(&n, kept.data());
  if (benchmark::ReportUnrecognizedArguments(n, kept.data())) return 1;
  registerAll(groups);
  std::unique_ptr<benchmark::BenchmarkReporter> display;
  if (json)
    display = std::make_unique<benchmark::JSONReporter>();
  else
    display = std::make_unique<benchmark::ConsoleReporter>();
  starling::bench::Recorder rec(std::move(display));
  benchmark::RunSpecifiedBenchmarks(&rec);
  for (auto& g : groups) g->barrier();  // neither rank tears its group down under the other
  if (info.rank != 0) return 0;
  std::vector<starling::bench::Ratio> ratios;
  for (size_t mib : kBucketsMiB) {
    for (size_t sz : kSizes) {
      ratios.push_back({name("decoupled_over_allreduce_with_step", sz, mib),
                        name("rs_step_ag", sz, mib), name("allreduce_step", sz, mib),
                        "<= 1.0 (costs no more)"});
      ratios.push_back({name("rs_ag_over_allreduce", sz, mib), name("rs_ag", sz, mib),
                        name("allreduce", sz, mib),
                        "no target: same bytes on the wire, Gloo ring all-reduce vs c10d send/recv "
                        "to every peer"});
    }
  }
  if (!starling::bench::reportRatios(rec, ratios, ratios_out)) return 1;
  benchmark::Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    // A rank: starling-collectives-bench --collectives-rank=P0,P1,P2 [benchmark flags]
    if (argc > 1 && std::string(argv[1]).rfind("--collectives-rank=", 0) == 0) {
      std::vector<int> ports;
      std::string list = std::string(argv[1]).substr(19);
      for (size_t p = 0; p <= list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        ports.push_back(std::stoi(list.substr(p, q - p)));
        p = q + 1;
      }
      if (ports.size() != std::size(kBucketsMiB)) return 2;
      std::vector<char*> args{argv[0]};
      for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
      return runRank(args, ports);
    }
    // The launcher: two ranks of this program.
    std::string ports;
    int first_port = 0;
    for (size_t i = 0; i < std::size(kBucketsMiB); ++i) {
      const int p = sim::freeLoopbackPort();
      if (i == 0) first_port = p;
      if (i) ports += ',';
      ports += std::to_string(p);
    }
    std::vector<std::string> args{"--collectives-rank=" + ports};
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::vector<int> pids = sim::spawnLocalRanks(self, args, 2, first_port);
    const std::vector<int> st = sim::waitRanks(pids, std::chrono::minutes(30));
    if (st[0] != 0 || st[1] != 0) {
      std::cerr << "starling-collectives-bench: ranks exited with " << st[0] << " and " << st[1]
                << "\n";
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "starling-collectives-bench: " << e.what() << "\n";
    return 1;
  }
}
