#include <Eigen/Core>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "bench/bench_common.h"
#include "compression/lowrank.h"
#include "compression/registry.h"
#include "compression/topk_select.h"
#include "core/rng.h"

namespace starling::bench {
namespace cz = starling::compression;

const std::vector<float>& input(size_t n) {
  static std::map<size_t, std::vector<float>> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  std::vector<float> v(n);
  RngStream r(StreamKey{2026, 0, 0, StreamPurpose::kTest, n});
  for (float& x : v) x = static_cast<float>(r.normal());
  return cache.emplace(n, std::move(v)).first->second;
}

std::string sizeName(size_t n) {
  if (n % 1000000 == 0) return std::to_string(n / 1000000) + "M";
  return std::to_string(n);
}

void registerMemcpy(size_t n) {
  benchmark::RegisterBenchmark(("memcpy/" + sizeName(n)).c_str(), [n](benchmark::State& st) {
    const auto& src = input(n);
    std::vector<float> dst(n);
    for (auto _ : st) {
      std::memcpy(dst.data(), src.data(), n * sizeof(float));
      benchmark::DoNotOptimize(dst.data());
      benchmark::ClobberMemory();
    }
    st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) *
                         static_cast<int64_t>(n * sizeof(float)));
  });
}

namespace {

// A square-ish matrix layout of n floats, so that low-rank compressors have a matrix to work on.
ParamLayout matrixLayout(size_t n) {
  ParamLayout l;
  const int64_t side = n == 1000000 ? 1000 : 5000;
  l.add("w", {side, static_cast<int64_t>(n) / side});
  return l;
}

// Compression through the client's entry point (in place, error feedback, a reused workspace).
void registerCompress(const std::string& name, const std::string& spec, const ParamLayout& layout) {
  benchmark::RegisterBenchmark(name.c_str(), [spec, layout](benchmark::State& st) {
    auto c = cz::makeCompressor(spec);
    const auto& x = input(layout.numel());
    ClientState state(layout.fingerprint());
    cz::Workspace ws;
    const cz::SharedFactors shared = c->initialShared(layout, 1);
    uint64_t round = 0;
    size_t bytes = 0;
    for (auto _ : st) {
      auto p = c->compressWithFeedback(
          layout, x, state, cz::RoundContext{1, round++, 0, 1, shared.any() ? &shared : nullptr},
          &ws);
      bytes = 0;
      for (const auto& q : p) bytes += cz::payloadDataBytes(q);
      benchmark::DoNotOptimize(p.data());
    }
    st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) *
                         static_cast<int64_t>(layout.numel() * sizeof(float)));
    st.counters["payload_bytes"] = static_cast<double>(bytes);
    st.counters["compression_ratio"] =
        static_cast<double>(layout.numel() * sizeof(float)) / static_cast<double>(bytes);
  });
}

}  // namespace

void registerCompressionBenchmarks() {
  for (size_t n : {size_t{1000000}, size_t{25000000}}) {
    registerMemcpy(n);
    const ParamLayout layout = matrixLayout(n);
    for (const char* d : {"0.001", "0.01"}) {
      const std::string suffix = sizeName(n) + "/density:" + d;
      const double density = std::stod(d);
      benchmark::RegisterBenchmark(("topk_select/" + suffix).c_str(),
                                   [n, density](benchmark::State& st) {
                                     const auto& x = input(n);
                                     std::vector<uint32_t> idx;
                                     const size_t k = cz::countForDensity(density, n);
                                     for (auto _ : st) {
                                       cz::selectTopK(x, k, idx, 1);
                                       benchmark::DoNotOptimize(idx.data());
                                     }
                                     st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) *
                                                          static_cast<int64_t>(n * sizeof(float)));
                                   });
      for (const char* c : {"topk", "stc", "randk", "randblock"})
        registerCompress(std::string("compress/") + c + "/" + suffix,
                         std::string(c) + ":density=" + d, layout);
      registerCompress("randblock_select/" + suffix, std::string("randblock:ef=false,density=") + d,
                       layout);
      registerCompress("compress/topk_global/" + suffix,
                       std::string("topk:scope=global,density=") + d, layout);
    }
    for (const char* c : {"none", "fp16", "bf16", "sign", "qsgd", "acpsgd"})
      registerCompress(std::string("compress/") + c + "/" + sizeName(n), c, layout);
    // PowerSGD's client-local form: both factors from one client (the two-phase form splits the
    // same two products over the round's two phases).
    registerCompress("compress/powersgd/" + sizeName(n), "powersgd:mode=local", layout);
  }

  // PowerSGD rank 4 on 4096 x 6144 against its two matrix products (Eigen, same shapes).
  ParamLayout big;
  big.add("w", {4096, 6144});
  registerCompress("compress/powersgd/4096x6144/rank:4", "powersgd:rank=4,mode=local", big);
  benchmark::RegisterBenchmark("two_matmuls/4096x6144/rank:4", [](benchmark::State& st) {
    using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const auto& x = input(size_t{4096} * 6144);
    Eigen::Map<const RowMatrix> m(x.data(), 4096, 6144);
    RowMatrix q = RowMatrix::Random(6144, 4), p(4096, 4);
    for (auto _ : st) {
      p.noalias() = m * q;
      q.noalias() = m.transpose() * p;
      benchmark::DoNotOptimize(q.data());
    }
  });
}

}  // namespace starling::bench
