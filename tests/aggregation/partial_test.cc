#include "aggregation/partial.h"

#include <catch2/catch.hpp>
#include <numeric>

#include "compression/lowrank.h"
#include "compression/registry.h"
#include "protocol/codec.h"
#include "test_util.h"

using namespace starling;
using namespace starling::aggregation;
using namespace starling::compression;

namespace {

std::shared_ptr<const AggregateLayout> aggLayout(const ParamLayout& layout,
                                                 const SharedFactors* shared = nullptr,
                                                 std::vector<std::string> metrics = {"loss"},
                                                 uint64_t round = 2, uint32_t phase = 0) {
  return std::make_shared<const AggregateLayout>(
      std::make_shared<const ParamLayout>(layout), round, phase,
      shared ? std::make_shared<const SharedFactors>(*shared) : nullptr, std::move(metrics));
}

struct Updates {
  std::vector<Update> updates;
  std::vector<double> weights;
  std::vector<double> dense_mean;  // reference: decoded updates summed in double
};

Updates makeUpdates(const ParamLayout& layout, const std::string& spec, size_t clients,
                    const SharedFactors* shared) {
  auto c = makeCompressor(spec);
  Updates r;
  r.dense_mean.assign(layout.numel(), 0.0);
  double total = 0;
  for (size_t i = 0; i < clients; ++i) {
    ClientState st(layout.fingerprint());
    Update u;
    u.header.layout_fingerprint = layout.fingerprint();
    u.header.client_id = i;
    u.header.num_examples = 10 + i * 7;
    u.tensors = c->compressWithFeedback(layout, testing::randomVector(layout.numel(), 1000 + i), st,
                                        RoundContext{5, 2, 0, i, shared});
    u.metrics = {{"loss", 1.0 + static_cast<double>(i)}, {"undeclared", 5.0}};
    const double w = static_cast<double>(u.header.num_examples);
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
// Inner nodes merge their children in process, or through the wire (exportDense -> encodePartial
// -> Decoder::decodePartial -> mergeValidated), as an edge aggregator's partial reaches the root.
PartialAggregate randomTree(const std::shared_ptr<const AggregateLayout>& L, const Updates& r,
                            size_t lo, size_t hi, RngStream& rng, bool via_wire) {
  PartialAggregate agg(L);
  if (hi - lo <= 2 || rng.below(4) == 0) {
    for (size_t i = lo; i < hi; ++i) agg.addValidated(view(r.updates[i]), r.weights[i]);
    return agg;
  }
  const size_t mid = lo + 1 + rng.below(hi - lo - 1);
  auto left = randomTree(L, r, lo, mid, rng, via_wire);
  auto right = randomTree(L, r, mid, hi, rng, via_wire);
  if (via_wire) {
    protocol::Decoder dec(L->model());
    for (auto* child : {&left, &right}) {
      const auto bytes = protocol::encodePartial(child->exportDense());
      agg.mergeValidated(dec.decodePartial(bytes));
    }
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
  for (const Kind& k :
       {Kind{"none", nullptr}, Kind{"topk:density=0.05", nullptr},
        Kind{"randblock:density=0.1", nullptr}, Kind{"qsgd:levels=8", nullptr},
        Kind{"sign", nullptr}, Kind{"fp16", nullptr}, Kind{"powersgd:rank=2,mode=local", nullptr},
        Kind{"acpsgd:rank=2", &shared}}) {
    INFO(k.spec);
    const Updates r = makeUpdates(layout, k.spec, 13, k.shared);
    const auto L = aggLayout(layout, k.shared);
    PartialAggregate flat(L);
    for (size_t i = 0; i < r.updates.size(); ++i)
      flat.addValidated(view(r.updates[i]), r.weights[i]);
    CHECK(maxDiff(flat.mean(), r.dense_mean) < 1e-5);
    for (uint64_t seed = 0; seed < 4; ++seed) {
      RngStream rng(StreamKey{seed, 0, 0, StreamPurpose::kTest, 0});
      auto tree = randomTree(L, r, 0, r.updates.size(), rng, seed % 2 == 1);
      CHECK(tree.count() == flat.count());
      CHECK(tree.totalWeight() == flat.totalWeight());
      CHECK(testing::maxAbsDiff(tree.mean(), flat.mean()) < 1e-5);
      CHECK(tree.metricMeans().at("loss") == Approx(flat.metricMeans().at("loss")));
    }
  }
}

TEST_CASE("the partial aggregate is one buffer: adding buffers is merging", "[aggregation]") {
  // What an all-reduce does: elementwise sums of the workers' buffers.
  const ParamLayout layout = testing::smallCnnLayout();
  LowRankOptions lo;
  lo.rank = 2;
  const SharedFactors shared = initialSharedFactors(layout, lo, 5);
  const Updates r = makeUpdates(layout, "acpsgd:rank=2", 6, &shared);
  const auto L = aggLayout(layout, &shared, {"loss", "acc"});
  std::vector<PartialAggregate> workers(3, PartialAggregate(L));
  PartialAggregate flat(L);
  for (size_t i = 0; i < r.updates.size(); ++i) {
    workers[i % 3].addValidated(view(r.updates[i]), r.weights[i]);
    flat.addValidated(view(r.updates[i]), r.weights[i]);
  }
  std::vector<float> reduced(L->size(), 0.0f);
  for (const auto& w : workers) {
    REQUIRE(w.buffer().size() == L->size());
    for (size_t j = 0; j < reduced.size(); ++j) reduced[j] += w.buffer()[j];
  }
  PartialAggregate all(L);
  std::copy(reduced.begin(), reduced.end(), all.buffer().begin());
  CHECK(all.count() == 6);
  CHECK(all.totalWeight() == flat.totalWeight());
  CHECK(testing::maxAbsDiff(all.mean(), flat.mean()) < 1e-5);
  CHECK(all.metricMeans() == flat.metricMeans());
  // The buffer holds exactly: dense sum, factor sums, 2 floats per metric, weight and count.
  size_t factors = 0;
  for (size_t t = 0; t < layout.size(); ++t) factors += L->factorSize(t);
  CHECK(L->size() == layout.numel() + factors + 2 * 2 + 2);
  CHECK(factors > 0);
}

TEST_CASE("sparse and random-block accumulation equal their densified sums", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  for (const char* spec :
       {"topk:density=0.02", "randk:density=0.02", "randblock:density=0.3", "sign"}) {
    const Updates r = makeUpdates(layout, spec, 9, nullptr);
    PartialAggregate agg(aggLayout(layout));
    for (size_t i = 0; i < r.updates.size(); ++i)
      agg.addValidated(view(r.updates[i]), r.weights[i]);
    INFO(spec);
    CHECK(maxDiff(agg.mean(), r.dense_mean) < 1e-6);
  }
  // A block that wraps past the end lands on both ends.
  ParamLayout l;
  l.add("v", {10});
  Update u;
  u.header.layout_fingerprint = l.fingerprint();
  u.tensors = {RandBlock{8, {1, 2, 3, 4}}};
  PartialAggregate agg(aggLayout(l));
  agg.addValidated(view(u), 2.0);
  CHECK(agg.mean() == std::vector<float>{3, 4, 0, 0, 0, 0, 0, 0, 1, 2});
}

TEST_CASE("declared metrics are averaged over the updates that report them", "[aggregation]") {
  ParamLayout l;
  l.add("v", {2});
  PartialAggregate agg(aggLayout(l, nullptr, {"loss", "acc"}));
  Update u;
  u.header.layout_fingerprint = l.fingerprint();
  u.tensors = {DenseF32{{1, 1}}};
  u.metrics = {{"loss", 2.0}, {"acc", 0.5}, {"other", 99.0}};
  agg.addValidated(view(u), 1.0);
  u.metrics = {{"loss", 5.0}};  // no acc this time
  agg.addValidated(view(u), 3.0);
  const auto m = agg.metricMeans();
  CHECK(m.at("loss") == Approx((2.0 + 15.0) / 4.0));
  CHECK(m.at("acc") == Approx(0.5));  // weighted over the one update that reported it
  CHECK(m.count("other") == 0);
}

TEST_CASE("exportSparse keeps the top entries and banks the rest", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const Updates r = makeUpdates(layout, "none", 5, nullptr);
  const auto L = aggLayout(layout);
  PartialAggregate agg(L);
  for (size_t i = 0; i < r.updates.size(); ++i) agg.addValidated(view(r.updates[i]), r.weights[i]);
  std::vector<float> residual;
  for (int round = 0; round < 3; ++round) {
    std::vector<float> expect(agg.denseSum().begin(), agg.denseSum().end());
    if (!residual.empty())
      for (size_t i = 0; i < expect.size(); ++i) expect[i] += residual[i];
    const PartialMessage s = agg.exportSparse(0.1, residual);
    auto exported = testing::densify(layout, s.tensors);
    size_t nnz = 0;
    for (const auto& p : s.tensors) nnz += std::get<Sparse>(p).indices.size();
    CHECK(nnz <= layout.numel() / 10 + layout.size());
    for (size_t i = 0; i < exported.size(); ++i) exported[i] += residual[i];
    CHECK(testing::maxAbsDiff(exported, expect) < 1e-5);
    CHECK(s.header.total_weight == agg.totalWeight());
    CHECK(s.header.count == agg.count());
    // The root merges it like any partial.
    PartialAggregate root(L);
    root.mergeValidated(view(s));
    CHECK(root.count() == agg.count());
  }
}

TEST_CASE("bad input to a partial aggregate is refused and changes nothing", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const Updates r = makeUpdates(layout, "topk:density=0.05", 2, nullptr);
  PartialAggregate agg(aggLayout(layout));
  agg.addValidated(view(r.updates[0]), 1.0);
  const std::vector<float> before(agg.buffer().begin(), agg.buffer().end());
  for (double w : {0.0, -1.0, std::nan(""), static_cast<double>(INFINITY)})
    CHECK_THROWS_WITH(agg.addValidated(view(r.updates[1]), w),
                      Catch::Contains("weight must be finite and > 0"));
  CHECK_THROWS_WITH(agg.addValidated(view(r.updates[1]), 1.0, 1.5),
                    Catch::Contains("scale must be in (0, 1]"));
  Update shortu = r.updates[1];
  shortu.tensors.pop_back();
  CHECK_THROWS_WITH(agg.addValidated(view(shortu), 1.0), Catch::Contains("carries 5 tensors"));
  CHECK(std::vector<float>(agg.buffer().begin(), agg.buffer().end()) == before);
  PartialAggregate empty(aggLayout(layout));
  CHECK_THROWS_WITH(empty.mean(), Catch::Contains("no updates"));
}

TEST_CASE("partials of another round, phase, shared factors or metric set do not merge",
          "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  LowRankOptions lo;
  const SharedFactors a = initialSharedFactors(layout, lo, 1),
                      b = initialSharedFactors(layout, lo, 2);
  PartialAggregate pa(aggLayout(layout, &a));
  CHECK_THROWS_WITH(pa.merge(PartialAggregate(aggLayout(layout, &b))),
                    Catch::Contains("cannot merge"));
  CHECK_THROWS_WITH(pa.merge(PartialAggregate(aggLayout(layout, &a, {"loss"}, 3))),
                    Catch::Contains("cannot merge"));
  CHECK_THROWS_WITH(pa.merge(PartialAggregate(aggLayout(layout, &a, {"loss"}, 2, 1))),
                    Catch::Contains("cannot merge"));
  CHECK_THROWS_WITH(pa.merge(PartialAggregate(aggLayout(layout, &a, {"acc"}))),
                    Catch::Contains("cannot merge"));
  CHECK_NOTHROW(
      pa.merge(PartialAggregate(aggLayout(layout, &a))));  // an equal layout built elsewhere
  // A dense payload for a tensor that is factored this phase is refused.
  Update u;
  u.header.layout_fingerprint = layout.fingerprint();
  for (size_t t = 0; t < layout.size(); ++t)
    u.tensors.push_back(DenseF32{std::vector<float>(layout[t].numel, 1.0f)});
  CHECK_THROWS_WITH(pa.addValidated(view(u), 1.0), Catch::Contains("must be one low-rank factor"));
  // A one-factor payload is refused where the phase has no shared factor.
  PartialAggregate plain(aggLayout(layout));
  const size_t fc1 = *layout.find("fc1.weight");
  u.tensors[fc1] = LowRank{64, 256, 4, std::vector<float>(64 * 4, 1.0f), {}};
  CHECK_THROWS_WITH(plain.addValidated(view(u), 1.0), Catch::Contains("no shared factor for it"));
  CHECK(plain.count() == 0);
  // The wrong side (Q where the shared side is Q) is refused too.
  Update q = u;
  for (size_t t = 0; t < layout.size(); ++t)
    if (!a.factors[t].empty())
      q.tensors[t] = LowRank{static_cast<uint32_t>(layout[t].rows()),
                             static_cast<uint32_t>(layout[t].cols()),
                             4,
                             {},
                             std::vector<float>(layout[t].cols() * 4, 1.0f)};
  CHECK_THROWS_WITH(pa.addValidated(view(q), 1.0), Catch::Contains("must be one low-rank factor"));
}

TEST_CASE("streaming FedAvg memory does not grow with the number of clients", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const Updates r = makeUpdates(layout, "topk:density=0.05", 4, nullptr);
  PartialAggregate agg(aggLayout(layout));
  const size_t bytes = agg.bufferBytes();
  CHECK(bytes == agg.layout().size() * sizeof(float));
  for (int rep = 0; rep < 250; ++rep)
    for (size_t i = 0; i < r.updates.size(); ++i)
      agg.addValidated(view(r.updates[i]), r.weights[i]);
  CHECK(agg.count() == 1000);
  CHECK(agg.bufferBytes() == bytes);
}
