#include <catch2/catch.hpp>

#include <numeric>

#include "aggregation/partial.h"
#include "compression/lowrank.h"
#include "compression/registry.h"
#include "test_util.h"

using namespace starling;
using namespace starling::aggregation;
using namespace starling::compression;

namespace {

struct Round {
  std::vector<Update> updates;
  std::vector<double> weights;
  std::vector<double> dense_mean;  // reference: decoded updates summed in double
};

Round makeRound(const ParamLayout& layout, const std::string& spec, size_t clients, const SharedFactors* shared) {
  auto c = makeCompressor(spec);
  Round r;
  r.dense_mean.assign(layout.numel(), 0.0);
  double total = 0;
  for (size_t i = 0; i < clients; ++i) {
    ClientState st = c->initialState(layout);
    Update u;
    u.layout_fingerprint = layout.fingerprint();
    u.client_id = i;
    u.num_examples = 10 + i * 7;
    u.tensors = c->compress(layout, testing::randomVector(layout.numel(), 1000 + i), st, RoundContext{5, 2, i, shared});
    u.metrics = {{"loss", 1.0 + static_cast<double>(i)}};
    const double w = static_cast<double>(u.num_examples);
    const auto dense = testing::densify(layout, u.tensors, shared);
    for (size_t j = 0; j < dense.size(); ++j) r.dense_mean[j] += w * dense[j];
    total += w;
    r.updates.push_back(std::move(u));
    r.weights.push_back(w);
  }
  for (double& x : r.dense_mean) x /= total;
  return r;
}

double maxDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Aggregates updates [lo, hi) as a random binary tree of partials; leaves add updates directly.
PartialAggregate randomTree(const ParamLayout& layout, const SharedFactors* shared, const Round& r, size_t lo,
                            size_t hi, RngStream& rng, bool via_summary) {
  PartialAggregate agg(layout, shared);
  if (hi - lo <= 2 || rng.below(4) == 0) {
    for (size_t i = lo; i < hi; ++i) agg.add(r.updates[i], r.weights[i]);
    return agg;
  }
  const size_t mid = lo + 1 + rng.below(hi - lo - 1);
  auto left = randomTree(layout, shared, r, lo, mid, rng, via_summary);
  auto right = randomTree(layout, shared, r, mid, hi, rng, via_summary);
  if (via_summary) {
    agg.merge(left.exportDense());
    agg.merge(right.exportDense());
  } else {
    agg.merge(right);
    agg.merge(left);
  }
  return agg;
}

}  // namespace

TEST_CASE("a random tree of partial aggregates equals the flat aggregate", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  LowRankOptions lo;
  lo.rank = 2;
  const SharedFactors shared = initialSharedFactors(layout, lo, 5);
  struct Kind {
    std::string spec;
    const SharedFactors* shared;
  };
  for (const Kind& k : {Kind{"none", nullptr}, Kind{"topk:density=0.05", nullptr}, Kind{"randblock:density=0.1", nullptr},
                        Kind{"qsgd:levels=8", nullptr}, Kind{"powersgd:rank=2", nullptr},
                        Kind{"acpsgd:rank=2", &shared}}) {
    INFO(k.spec);
    const Round r = makeRound(layout, k.spec, 13, k.shared);
    PartialAggregate flat(layout, k.shared);
    for (size_t i = 0; i < r.updates.size(); ++i) flat.add(r.updates[i], r.weights[i]);
    CHECK(maxDiff(flat.mean(), r.dense_mean) < 1e-5);
    for (uint64_t seed = 0; seed < 4; ++seed) {
      RngStream rng(StreamKey{seed, 0, 0, StreamPurpose::kTest, 0});
      auto tree = randomTree(layout, k.shared, r, 0, r.updates.size(), rng, seed % 2 == 1);
      CHECK(tree.count() == flat.count());
      CHECK(tree.totalWeight() == flat.totalWeight());
      CHECK(testing::maxAbsDiff(tree.mean(), flat.mean()) < 1e-5);
      CHECK(tree.metricMeans().at("loss") == Approx(flat.metricMeans().at("loss")));
    }
  }
}

TEST_CASE("sparse and random-block accumulation equal their densified sums", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  for (const char* spec : {"topk:density=0.02", "randk:density=0.02", "randblock:density=0.3", "sign"}) {
    const Round r = makeRound(layout, spec, 9, nullptr);
    PartialAggregate agg(layout);
    for (size_t i = 0; i < r.updates.size(); ++i) agg.add(r.updates[i], r.weights[i]);
    INFO(spec);
    CHECK(maxDiff(agg.mean(), r.dense_mean) < 1e-6);
  }
  // A block that wraps past the end lands on both ends.
  ParamLayout l;
  l.add("v", {10});
  Update u;
  u.layout_fingerprint = l.fingerprint();
  u.tensors = {RandBlock{8, {1, 2, 3, 4}}};
  PartialAggregate agg(l);
  agg.add(u, 2.0);
  CHECK(agg.mean() == std::vector<float>{3, 4, 0, 0, 0, 0, 0, 0, 1, 2});
}

TEST_CASE("exportSparse keeps the top entries and banks the rest", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const Round r = makeRound(layout, "none", 5, nullptr);
  PartialAggregate agg(layout);
  for (size_t i = 0; i < r.updates.size(); ++i) agg.add(r.updates[i], r.weights[i]);
  std::vector<float> residual;
  for (int round = 0; round < 3; ++round) {
    std::vector<float> expect(agg.denseSum().begin(), agg.denseSum().end());
    if (!residual.empty())
      for (size_t i = 0; i < expect.size(); ++i) expect[i] += residual[i];
    const AggregateSummary s = agg.exportSparse(0.1, residual);
    auto exported = testing::densify(layout, s.sum);
    size_t nnz = 0;
    for (const auto& p : s.sum) nnz += std::get<Sparse>(p).indices.size();
    CHECK(nnz <= layout.numel() / 10 + layout.size());
    for (size_t i = 0; i < exported.size(); ++i) exported[i] += residual[i];
    CHECK(testing::maxAbsDiff(exported, expect) < 1e-5);
    CHECK(s.total_weight == agg.totalWeight());
    // The root merges it like any partial.
    PartialAggregate root(layout);
    root.merge(s);
    CHECK(root.count() == agg.count());
  }
}

TEST_CASE("bad input to a partial aggregate is refused and changes nothing", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const Round r = makeRound(layout, "topk:density=0.05", 2, nullptr);
  PartialAggregate agg(layout);
  agg.add(r.updates[0], 1.0);
  const auto before = agg.mean();
  for (double w : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)})
    CHECK_THROWS_WITH(agg.add(r.updates[1], w), Catch::Contains("weight must be finite and > 0"));
  Update other = r.updates[1];
  other.layout_fingerprint ^= 1;
  CHECK_THROWS_WITH(agg.add(other, 1.0), Catch::Contains("another model"));
  Update bad = r.updates[1];
  std::get<Sparse>(bad.tensors[2]).indices.back() = 1 << 20;
  CHECK_THROWS_WITH(agg.add(bad, 1.0), Catch::Contains(">= numel"));
  Update nan = r.updates[1];
  std::get<Sparse>(nan.tensors[2]).values[0] = std::nanf("");
  CHECK_THROWS_WITH(agg.add(nan, 1.0), Catch::Contains("not finite"));
  Update shortu = r.updates[1];
  shortu.tensors.pop_back();
  CHECK_THROWS_WITH(agg.add(shortu, 1.0), Catch::Contains("carries 5 tensors"));
  CHECK(agg.count() == 1);
  CHECK(agg.mean() == before);
  PartialAggregate empty(layout);
  CHECK_THROWS_WITH(empty.mean(), Catch::Contains("no updates"));
  ParamLayout l2;
  l2.add("x", {3});
  PartialAggregate wrong(l2);
  CHECK_THROWS_WITH(agg.merge(wrong), Catch::Contains("different models"));
}

TEST_CASE("partials of different rounds' shared factors do not merge", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  LowRankOptions lo;
  const SharedFactors a = initialSharedFactors(layout, lo, 1), b = initialSharedFactors(layout, lo, 2);
  PartialAggregate pa(layout, &a), pb(layout, &b);
  CHECK_THROWS_WITH(pa.merge(pb), Catch::Contains("different shared factors"));
  // A dense payload for a tensor that is factored this round is refused.
  Update u;
  u.layout_fingerprint = layout.fingerprint();
  for (size_t t = 0; t < layout.size(); ++t) u.tensors.push_back(DenseF32{std::vector<float>(layout[t].numel, 1.0f)});
  CHECK_THROWS_WITH(pa.add(u, 1.0), Catch::Contains("must be one low-rank factor"));
  // And a one-factor payload is refused where the round has no shared factor, even by the
  // unvalidated path.
  PartialAggregate plain(layout);
  const size_t fc1 = *layout.find("fc1.weight");
  u.tensors[fc1] = LowRank{64, 256, 4, std::vector<float>(64 * 4, 1.0f), {}};
  CHECK_THROWS_WITH(plain.addValidated(u, 1.0), Catch::Contains("no shared factor for it"));
  CHECK(plain.count() == 0);
}

TEST_CASE("streaming FedAvg holds a constant number of buffers", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const Round r = makeRound(layout, "topk:density=0.05", 4, nullptr);
  PartialAggregate agg(layout);
  const size_t buffers = agg.bufferCount(), bytes = agg.bufferBytes();
  CHECK(bytes == layout.numel() * sizeof(float));
  for (int rep = 0; rep < 250; ++rep)
    for (size_t i = 0; i < r.updates.size(); ++i) agg.add(r.updates[i], r.weights[i]);
  CHECK(agg.count() == 1000);
  CHECK(agg.bufferCount() == buffers);
  CHECK(agg.bufferBytes() == bytes);
}
