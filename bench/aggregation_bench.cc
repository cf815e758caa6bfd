#include <cstring>

#include "aggregation/partial.h"
#include "bench/bench_common.h"
#include "compression/bitpack.h"
#include "compression/rice.h"
#include "compression/topk_select.h"
#include "protocol/codec.h"

namespace starling::bench {
namespace cz = starling::compression;
namespace ag = starling::aggregation;

namespace {

constexpr size_t kClients = 1000;
constexpr size_t kDistinct =
    16;  // distinct updates cycled through (64 MB of dense data: past the caches)

ParamLayout flat(size_t n) {
  ParamLayout l;
  l.add("w", {static_cast<int64_t>(n)});
  return l;
}

std::shared_ptr<const ag::AggregateLayout> aggLayout(const ParamLayout& l) {
  return std::make_shared<const ag::AggregateLayout>(std::make_shared<const ParamLayout>(l), 1, 0,
                                                     nullptr, std::vector<std::string>{});
}

cz::Update header(const ParamLayout& l, size_t i) {
  cz::Update u;
  u.header = {l.fingerprint(), 1, 0, i, 1};
  return u;
}

std::vector<cz::Update> denseUpdates(const ParamLayout& l) {
  std::vector<cz::Update> out;
  const auto& x = input(l.numel() * kDistinct);
  for (size_t i = 0; i < kDistinct; ++i) {
    cz::Update u = header(l, i);
    u.tensors = {cz::DenseF32{
        std::vector<float>(x.begin() + i * l.numel(), x.begin() + (i + 1) * l.numel())}};
    out.push_back(std::move(u));
  }
  return out;
}

// Sparse updates with `nnz` entries each (the top-k of a seeded vector), for a model of n floats.
std::vector<cz::Update> sparseUpdates(const ParamLayout& l, size_t nnz) {
  std::vector<cz::Update> out;
  const auto& x = input(l.numel());
  for (size_t i = 0; i < kDistinct; ++i) {
    cz::Sparse s;
    cz::selectTopK(std::span<const float>(x).subspan(0, l.numel()), nnz, s.indices, i);
    // Spread each update's support differently: rotate indices (kept sorted).
    for (auto& idx : s.indices) idx = static_cast<uint32_t>((idx + i * 7919) % l.numel());
    std::sort(s.indices.begin(), s.indices.end());
    s.values.assign(s.indices.size(), 0.5f);
    cz::Update u = header(l, i);
    u.tensors = {std::move(s)};
    out.push_back(std::move(u));
  }
  return out;
}

std::vector<cz::Update> topk1pct(const ParamLayout& l) { return sparseUpdates(l, l.numel() / 100); }

// The same supports as sparseUpdates, as STC sends them: Rice-coded positions, a sign bit each.
std::vector<cz::Update> ternaryUpdates(const ParamLayout& l, size_t nnz) {
  std::vector<cz::Update> out = sparseUpdates(l, nnz);
  for (auto& u : out) {
    const auto& s = std::get<cz::Sparse>(u.tensors[0]);
    cz::Ternary x;
    x.count = static_cast<uint32_t>(s.indices.size());
    x.mu = 0.5f;
    x.rice = static_cast<uint8_t>(cz::bestRiceParameter(s.indices));
    x.positions = cz::riceEncode(s.indices, x.rice);
    x.signs.assign(cz::packedBytes(x.count, 1), 0x5a);
    if (x.count % 8) x.signs.back() &= static_cast<uint8_t>((1u << (x.count % 8)) - 1);
    u.tensors = {std::move(x)};
  }
  return out;
}
std::vector<cz::Update> stc1pct(const ParamLayout& l) { return ternaryUpdates(l, l.numel() / 100); }

// Accumulation alone: views of owned updates, already validated.
void registerAccumulate(const std::string& name, ParamLayout layout,
                        std::vector<cz::Update> (*make)(const ParamLayout&), bool validate) {
  benchmark::RegisterBenchmark(name.c_str(), [layout, make, validate](benchmark::State& st) {
    const auto updates = make(layout);
    std::vector<cz::UpdateView> views;
    for (const auto& u : updates) views.push_back(cz::view(u));
    ag::PartialAggregate agg(aggLayout(layout));
    size_t payload = 0;
    for (const auto& u : updates) payload += cz::payloadDataBytes(u.tensors[0]);
    for (auto _ : st) {
      st.PauseTiming();  // zeroing the accumulator is per round, not per update
      agg.reset();
      st.ResumeTiming();
      for (size_t c = 0; c < kClients; ++c) {
        const auto& v = views[c % kDistinct];
        if (validate) cz::validateUpdate(layout, v);
        agg.addValidated(v, 1.0);
      }
      benchmark::DoNotOptimize(agg.buffer().data());
    }
    st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) *
                         static_cast<int64_t>(kClients * payload / kDistinct));
  });
}

// What a server does with 1,000 received messages, from bytes to the aggregate:
//   copy:      decode into owned vectors (a copy of every payload), validate, accumulate
//   zerocopy:  decode into views over the bytes, validate (one read), accumulate (one read)
//   memcpy:    the reference, a memcpy of the same bytes
enum class Path { kCopy, kZeroCopy, kMemcpy };

void registerIngest(const std::string& name, ParamLayout layout,
                    std::vector<cz::Update> (*make)(const ParamLayout&), Path path) {
  benchmark::RegisterBenchmark(name.c_str(), [layout, make, path](benchmark::State& st) {
    std::vector<std::vector<uint8_t>> wire;
    for (const auto& u : make(layout)) wire.push_back(protocol::encodeUpdate(u));
    size_t bytes = 0;
    for (const auto& w : wire) bytes = std::max(bytes, w.size());
    std::vector<uint8_t> dst(bytes);
    protocol::Decoder dec(layout);
    ag::PartialAggregate agg(aggLayout(layout));
    for (auto _ : st) {
      st.PauseTiming();
      agg.reset();
      st.ResumeTiming();
      for (size_t c = 0; c < kClients; ++c) {
        const auto& w = wire[c % kDistinct];
        switch (path) {
          case Path::kCopy: {
            const cz::Update u = protocol::decodeUpdate(w, layout);
            agg.addValidated(cz::view(u), 1.0);
            break;
          }
          case Path::kZeroCopy: {
            const cz::UpdateView& v = dec.decodeUpdate(w);
            cz::validateUpdate(layout, v);
            agg.addValidated(v, 1.0);
            break;
          }
          case Path::kMemcpy:
            std::memcpy(dst.data(), w.data(), w.size());
            benchmark::ClobberMemory();
            break;
        }
      }
      benchmark::DoNotOptimize(agg.buffer().data());
      benchmark::DoNotOptimize(dst.data());
    }
    size_t total = 0;
    for (size_t c = 0; c < kClients; ++c) total += wire[c % kDistinct].size();
    st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(total));
  });
}

}  // namespace

void registerAggregationBenchmarks() {
  const ParamLayout m1 = flat(1000000);
  registerAccumulate("accumulate/dense/1000x1M", m1, denseUpdates, false);
  registerAccumulate("accumulate/dense_validated/1000x1M", m1, denseUpdates, true);
  benchmark::RegisterBenchmark("memcpy_ref/1000x1M", [](benchmark::State& st) {
    const auto& x = input(1000000 * kDistinct);
    std::vector<float> dst(1000000);
    for (auto _ : st) {
      for (size_t c = 0; c < kClients; ++c) {
        std::memcpy(dst.data(), x.data() + (c % kDistinct) * 1000000, 1000000 * sizeof(float));
        benchmark::ClobberMemory();
      }
      benchmark::DoNotOptimize(dst.data());
    }
    st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) *
                         static_cast<int64_t>(kClients * 4000000));
  });
  // Sparse updates: 10,000 non-zeros (top-k 1% of a 1M model) into a 1M model, and 10,000 vs
  // 100,000 non-zeros into a 25M model: the cost follows the non-zeros, not the model size.
  auto sparse10k = [](const ParamLayout& l) { return sparseUpdates(l, 10000); };
  auto sparse100k = [](const ParamLayout& l) { return sparseUpdates(l, 100000); };
  registerAccumulate("accumulate/sparse_nnz10000/1000x1M", m1, +sparse10k, false);
  registerAccumulate("accumulate/sparse_nnz10000/1000x25M", flat(25000000), +sparse10k, false);
  registerAccumulate("accumulate/sparse_nnz100000/1000x25M", flat(25000000), +sparse100k, false);
  // STC's ternary updates on the same supports: the positions are Rice-decoded a window at a time.
  auto ternary10k = [](const ParamLayout& l) { return ternaryUpdates(l, 10000); };
  registerAccumulate("accumulate/ternary_nnz10000/1000x1M", m1, +ternary10k, false);
  registerAccumulate("accumulate/ternary_validated_nnz10000/1000x1M", m1, +ternary10k, true);

  for (auto [kind, make] : {std::pair{"dense", &denseUpdates}, std::pair{"topk1pct", &topk1pct},
                            std::pair{"stc1pct", &stc1pct}}) {
    const std::string suffix = std::string(kind) + "/1000x1M";
    registerIngest("ingest/copy/" + suffix, m1, make, Path::kCopy);
    registerIngest("ingest/zerocopy/" + suffix, m1, make, Path::kZeroCopy);
    registerIngest("ingest/memcpy/" + suffix, m1, make, Path::kMemcpy);
  }
}

}  // namespace starling::bench
