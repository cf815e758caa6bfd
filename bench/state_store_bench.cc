// starling-state-store-bench: the simulator's client-state store at scale. Each
// iteration is one client's visit in a round: load its state, change it, store it back, over a
// seeded shuffle of all clients (every client once per pass, as sampling without replacement
// would). The state is a small model's error-feedback residual (10,000 floats, ~40 KB serialized).
//
// References measured in the same run: `ref_unordered_map` keeps every serialized state in an
// std::unordered_map (no bound: what not spilling costs in memory), `ref_memcpy` copies the same
// bytes a visit moves (one blob in, one blob out) through a 256 MB ring, out of cache.
//
// Memory: before each benchmark the peak RSS is reset (/proc/self/clear_refs); counters report
// the peak (VmHWM) and its growth over the RSS at the start, populating the clients included.
// Ratios (time of a visit / time of the reference) go to stderr and to --ratios_out=FILE.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <unordered_map>

#include "bench/ratios.h"
#include "compression/compressor.h"
#include "core/client_state.h"
#include "simulator/state_store.h"

namespace {

using starling::ClientState;
using starling::compression::ResidualState;
using starling::simulator::ClientStateStore;
using starling::simulator::StateStoreOptions;

constexpr uint64_t kFp = 0xbe7c4;
constexpr size_t kFloats = 10000;
constexpr uint64_t kBound = 64ull << 20;

uint64_t procStatus(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string k;
  while (f >> k) {
    if (k == key) {
      uint64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
    std::getline(f, k);
  }
  return 0;
}

// Resets VmHWM to the current RSS and returns that RSS.
uint64_t resetPeak() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
  return procStatus("VmRSS:");
}

void memoryCounters(benchmark::State& st, uint64_t rss0) {
  const uint64_t peak = procStatus("VmHWM:");
  st.counters["peak_rss_mb"] = static_cast<double>(peak) / (1 << 20);
  st.counters["rss_growth_mb"] = static_cast<double>(peak - std::min(peak, rss0)) / (1 << 20);
  // At the end: anonymous (heap) and file-backed (LMDB's map, the binary) resident memory.
  st.counters["end_rss_anon_mb"] = static_cast<double>(procStatus("RssAnon:")) / (1 << 20);
  st.counters["end_rss_file_mb"] = static_cast<double>(procStatus("RssFile:")) / (1 << 20);
}

ClientState makeState() {
  ClientState s(kFp);
  auto& r = s.get<ResidualState>(starling::compression::kResidualComponent);
  r.values.resize(kFloats);
  std::mt19937 g(7);
  std::normal_distribution<float> n;
  for (float& x : r.values) x = n(g);
  return s;
}

std::vector<uint64_t> visitOrder(uint64_t clients) {
  std::vector<uint64_t> order(clients);
  std::iota(order.begin(), order.end(), uint64_t{0});
  std::shuffle(order.begin(), order.end(), std::mt19937_64(20261122));
  return order;
}

size_t blobBytes(const ClientState& s) {
  std::vector<uint8_t> b;
  s.saveTo(b);
  return b.size();
}

// `resumable`: a kept spill_dir (the store keeps undo records for resume), flushed before the pass.
void BM_StoreVisit(benchmark::State& st, uint64_t clients, bool resumable) {
  const uint64_t rss0 = resetPeak();
  std::string dir;
  if (resumable) {
    dir = (std::filesystem::temp_directory_path() /
           ("starling-bench-store-" + std::to_string(::getpid())))
              .string();
    std::filesystem::remove_all(dir);
  }
  {
    StateStoreOptions o;
    o.memory_bytes = kBound;
    o.spill_dir = dir;
    ClientStateStore store(o, kFp);
    ClientState s = makeState();
    auto& v = s.get<ResidualState>(starling::compression::kResidualComponent).values;
    for (uint64_t c = 0; c < clients; ++c) {  // populate (not timed)
      v[0] = static_cast<float>(c);
      store.store(c, s);
    }
    // A resumable store after a checkpoint: each client's first change copies its checkpoint
    // version into the undo table (the worst case: every visit in the pass is a first change).
    if (resumable) store.flush();
    const auto order = visitOrder(clients);
    ClientState work;
    size_t i = 0;
    for (auto _ : st) {
      const uint64_t c = order[i++ % order.size()];
      store.load(c, work);
      work.get<ResidualState>(starling::compression::kResidualComponent).values[1] += 1.0f;
      store.store(c, work);
    }
    const auto stats = store.stats();
    const double blob = static_cast<double>(blobBytes(s));
    st.SetItemsProcessed(st.iterations());
    st.SetBytesProcessed(static_cast<int64_t>(2 * blob * static_cast<double>(st.iterations())));
    st.counters["memory_mb"] = static_cast<double>(stats.memory_bytes) / (1 << 20);
    st.counters["spilled_mb"] = static_cast<double>(stats.spilled_bytes) / (1 << 20);
    st.counters["disk_loads"] = static_cast<double>(stats.loads_from_disk);
    st.counters["hits"] = static_cast<double>(stats.hits);
    memoryCounters(st, rss0);
  }
  if (resumable) std::filesystem::remove_all(dir);
}

void BM_RefUnorderedMap(benchmark::State& st, uint64_t clients) {
  const uint64_t rss0 = resetPeak();
  {
    std::unordered_map<uint64_t, std::vector<uint8_t>> map;
    ClientState s = makeState();
    auto& v = s.get<ResidualState>(starling::compression::kResidualComponent).values;
    for (uint64_t c = 0; c < clients; ++c) {
      v[0] = static_cast<float>(c);
      s.saveTo(map[c]);
    }
    const auto order = visitOrder(clients);
    ClientState work;
    size_t i = 0;
    for (auto _ : st) {
      const uint64_t c = order[i++ % order.size()];
      work.loadFrom(map.at(c));
      work.get<ResidualState>(starling::compression::kResidualComponent).values[1] += 1.0f;
      work.saveTo(map[c]);
    }
    const double blob = static_cast<double>(blobBytes(s));
    st.SetItemsProcessed(st.iterations());
    st.SetBytesProcessed(static_cast<int64_t>(2 * blob * static_cast<double>(st.iterations())));
    memoryCounters(st, rss0);
  }
}

void BM_RefMemcpy(benchmark::State& st) {
  const size_t blob = blobBytes(makeState());
  const size_t slots = (256u << 20) / blob;
  std::vector<uint8_t> ring(slots * blob, 1), one(blob, 2);
  size_t i = 0;
  for (auto _ : st) {
    uint8_t* slot = ring.data() + (i++ % slots) * blob;
    std::memcpy(one.data(), slot, blob);  // the load
    one[0] ^= 1;
    std::memcpy(slot, one.data(), blob);  // the store
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations());
  st.SetBytesProcessed(static_cast<int64_t>(2 * blob * st.iterations()));
}

}  // namespace

int main(int argc, char** argv) {
  starling::bench::CommandLine cl;
  if (!starling::bench::initBenchmarks(argc, argv, cl)) return 1;
  // Named in full (the ratios find benchmarks by name); a fixed iteration count: one pass over the
  // 100,000 clients' shuffle.
  benchmark::RegisterBenchmark("store_visit/clients:1000", BM_StoreVisit, 1000, false)
      ->Iterations(20000)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("store_visit/clients:100000", BM_StoreVisit, 100000, false)
      ->Iterations(100000)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("store_visit/clients:100000/resumable", BM_StoreVisit, 100000, true)
      ->Iterations(100000)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("ref_unordered_map/clients:100000", BM_RefUnorderedMap, 100000)
      ->Iterations(100000)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("ref_memcpy", BM_RefMemcpy)
      ->Iterations(100000)
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  const auto rec = starling::bench::runBenchmarks(cl.json);
  const std::string ref_map = "ref_unordered_map/clients:100000";
  const std::string ref_cpy = "ref_memcpy";
  const std::vector<starling::bench::Ratio> ratios = {
      {"store_1k_clients_vs_unordered_map", "store_visit/clients:1000", ref_map, "report"},
      {"store_100k_clients_vs_unordered_map", "store_visit/clients:100000", ref_map, "report"},
      {"store_100k_resumable_vs_unordered_map", "store_visit/clients:100000/resumable", ref_map,
       "report"},
      {"store_100k_clients_vs_memcpy", "store_visit/clients:100000", ref_cpy, "report"},
      {"unordered_map_vs_memcpy", ref_map, ref_cpy, "report"},
  };
  benchmark::Shutdown();
  return starling::bench::reportRatios(*rec, ratios, cl.ratios_out) ? 0 : 1;
}
