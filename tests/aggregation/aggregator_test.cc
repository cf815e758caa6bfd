#include <catch2/catch.hpp>

#include "aggregation/aggregator.h"
#include "aggregation/robust.h"
#include "compression/registry.h"
#include "test_util.h"

using namespace starling;
using namespace starling::aggregation;
using namespace starling::compression;

namespace {
Update denseUpdate(const ParamLayout& layout, std::vector<float> v, uint64_t examples, uint64_t client = 0) {
  Update u;
  u.layout_fingerprint = layout.fingerprint();
  u.client_id = client;
  u.num_examples = examples;
  u.tensors = {DenseF32{std::move(v)}};
  u.metrics = {{"acc", static_cast<double>(client)}};
  return u;
}
ParamLayout vec(int64_t n) {
  ParamLayout l;
  l.add("v", {n});
  return l;
}
}  // namespace

TEST_CASE("fedavg weights by examples or uniformly", "[aggregation]") {
  const ParamLayout l = vec(2);
  auto a = makeAggregator("fedavg", l);
  a->add(denseUpdate(l, {1, 0}, 1, 0));
  a->add(denseUpdate(l, {4, 3}, 2, 1));
  auto r = a->finish();
  CHECK(r.delta == std::vector<float>{3, 2});
  CHECK(r.total_weight == 3.0);
  CHECK(r.metrics.at("acc") == Approx(2.0 / 3.0));
  auto u = makeAggregator("fedavg:weight=uniform", l);
  u->add(denseUpdate(l, {1, 0}, 1));
  u->add(denseUpdate(l, {4, 3}, 2));
  CHECK(u->finish().delta == std::vector<float>{2.5f, 1.5f});
}

TEST_CASE("streaming clipping equals clipping each dense update", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  auto c = makeCompressor("topk:density=0.1");
  auto agg = makeAggregator("fedavg:clip=2.5", layout);
  std::vector<double> ref(layout.numel(), 0.0);
  double total = 0;
  for (uint64_t i = 0; i < 5; ++i) {
    ClientState st = c->initialState(layout);
    Update u;
    u.layout_fingerprint = layout.fingerprint();
    u.num_examples = i + 1;
    u.tensors = c->compress(layout, testing::randomVector(layout.numel(), i, 0.5 + i), st, RoundContext{1, 0, i});
    auto dense = testing::densify(layout, u.tensors);
    clipUpdate(dense, 2.5);
    for (size_t j = 0; j < dense.size(); ++j) ref[j] += (i + 1.0) * dense[j];
    total += i + 1.0;
    agg->add(u);
  }
  const auto got = agg->finish().delta;
  for (size_t j = 0; j < got.size(); ++j) REQUIRE(got[j] == Approx(ref[j] / total).margin(1e-6));
}

TEST_CASE("robust rules run through the same interface on compressed updates", "[aggregation]") {
  const ParamLayout l = vec(3);
  const std::vector<std::vector<float>> honest = {{1, 1, 1}, {1.1f, 0.9f, 1}, {0.9f, 1.1f, 1}, {1, 1, 1.1f}, {1, 1, 0.9f}};
  for (const char* spec : {"median", "trimmed_mean:beta=0.2", "krum:f=1", "multikrum:f=1", "bulyan:f=1"}) {
    auto a = makeAggregator(spec, l);
    for (size_t i = 0; i < honest.size(); ++i) a->add(denseUpdate(l, honest[i], 1 + i));
    a->add(denseUpdate(l, {-500, 500, 1e4f}, 1000));  // a poisoned update with a huge weight
    if (std::string(spec) == "bulyan:f=1") a->add(denseUpdate(l, {1, 1, 1}, 1));  // n = 7 = 4f + 3
    INFO(spec);
    const auto r = a->finish();
    for (float x : r.delta) CHECK((x > 0.85f && x < 1.15f));
  }
  // FedAvg by contrast is dragged away.
  auto f = makeAggregator("fedavg", l);
  for (const auto& h : honest) f->add(denseUpdate(l, h, 1));
  f->add(denseUpdate(l, {-500, 500, 1e4f}, 1000));
  CHECK(f->finish().delta[2] > 1000);
}

TEST_CASE("bad updates are rejected and counted while the round goes on", "[aggregation]") {
  const ParamLayout l = vec(2);
  for (const char* spec : {"fedavg", "median", "krum:f=0"}) {
    auto a = makeAggregator(spec, l);
    a->add(denseUpdate(l, {1, 1}, 1));
    CHECK_THROWS_WITH(a->add(denseUpdate(l, {1, 1}, 0)), Catch::Contains("reports 0 examples"));
    CHECK_THROWS_WITH(a->add(denseUpdate(l, {1, std::nanf("")}, 1)), Catch::Contains("not finite"));
    Update other = denseUpdate(l, {1, 1}, 1);
    other.layout_fingerprint = 42;
    CHECK_THROWS_WITH(a->add(other), Catch::Contains("another model"));
    CHECK_THROWS_AS(a->add(denseUpdate(l, {1, 1, 1}, 1)), InvalidArgument);
    INFO(spec);
    CHECK(a->rejected() == 4);
    CHECK(a->count() == 1);
    a->add(denseUpdate(l, {3, 3}, 1));
    a->add(denseUpdate(l, {2, 2}, 1));
    // Krum: every update has one neighbour at squared distance 2, a tie won by the lowest index.
    const std::vector<float> want = std::string(spec) == "krum:f=0" ? std::vector<float>{1, 1} : std::vector<float>{2, 2};
    CHECK(a->finish().delta == want);
    a->reset();
    CHECK(a->count() == 0);
    CHECK_THROWS_WITH(a->finish(), Catch::Contains("no updates"));
  }
}

TEST_CASE("robust preconditions fail clearly at finish", "[aggregation]") {
  const ParamLayout l = vec(1);
  auto k = makeAggregator("krum:f=2", l);
  for (int i = 0; i < 6; ++i) k->add(denseUpdate(l, {1}, 1));
  CHECK_THROWS_WITH(k->finish(), Catch::Contains("needs at least 2f+3 = 7"));
  auto b = makeAggregator("bulyan:f=2", l);
  for (int i = 0; i < 10; ++i) b->add(denseUpdate(l, {1}, 1));
  CHECK_THROWS_WITH(b->finish(), Catch::Contains("needs at least 4f+3 = 11"));
}

TEST_CASE("aggregator specs are checked", "[aggregation]") {
  const ParamLayout l = vec(1);
  CHECK_THROWS_WITH(makeAggregator("mean", l), Catch::Contains("unknown aggregation rule 'mean'"));
  CHECK_THROWS_WITH(makeAggregator("median:f=1", l), Catch::Contains("unknown option 'f'"));
  CHECK_THROWS_WITH(makeAggregator("trimmed_mean:beta=0.5", l), Catch::Contains("beta must be in [0, 0.5)"));
  CHECK_THROWS_WITH(makeAggregator("fedavg:clip=-1", l), Catch::Contains("clip must be finite"));
  CHECK_THROWS_WITH(makeAggregator("fedavg:weight=loss", l), Catch::Contains("must be one of: examples, uniform"));
  CHECK(AggregatorOptions::parse("multikrum:f=2,m=3,clip=1").m == 3);
}

TEST_CASE("completion policy decides whether a round counts", "[aggregation]") {
  CompletionPolicy p;
  p.min_results = 3;
  p.min_completion_rate = 0.6;
  CHECK(decideRound(p, 3, 2).apply);  // 3/5 = 0.6
  auto d = decideRound(p, 3, 3);      // 0.5
  CHECK_FALSE(d.apply);
  CHECK_THAT(d.reason, Catch::Contains("completion rate 0.5"));
  d = decideRound(p, 2, 0);
  CHECK_FALSE(d.apply);
  CHECK_THAT(d.reason, Catch::Contains("2 results, at least 3 required"));
  CHECK_FALSE(decideRound(CompletionPolicy{}, 0, 0).apply);  // empty round
  p.min_completion_rate = 1.5;
  CHECK_THROWS_AS(decideRound(p, 3, 0), ConfigError);
  p = CompletionPolicy{};
  p.min_results = 0;
  CHECK_THROWS_AS(decideRound(p, 3, 0), ConfigError);
}
