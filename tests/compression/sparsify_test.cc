#include "compression/sparsify.h"

#include <catch2/catch.hpp>
#include <set>

#include "compression/dense.h"
#include "compression/quantize.h"
#include "compression/registry.h"
#include "compression/topk_select.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

namespace {

// Error-feedback invariant: decoded(sent) + new residual == update + old residual, up to float
// rounding relative to the largest magnitude (rel_tol = 0: exactly).
void checkErrorFeedback(const std::string& spec, double rel_tol) {
  auto c = makeCompressor(spec);
  const ParamLayout layout = testing::smallCnnLayout();
  ClientState st = ClientState(layout.fingerprint());
  REQUIRE(c->usesErrorFeedback());
  const SharedFactors* shared = nullptr;
  for (uint64_t round = 0; round < 4; ++round) {
    const auto update = testing::randomVector(layout.numel(), 100 + round);
    const auto old = testing::residualOf(st, layout.numel());
    std::vector<float> expect(layout.numel());
    for (size_t i = 0; i < expect.size(); ++i) expect[i] = update[i] + old[i];
    auto payloads =
        c->compressWithFeedback(layout, update, st, RoundContext{1, round, 0, 5, shared});
    REQUIRE(payloads.size() == layout.size());
    for (size_t t = 0; t < layout.size(); ++t)
      validatePayload(view(payloads[t]), layout[t], shared, t);
    auto sent = testing::densify(layout, payloads, shared);
    const auto res = testing::residualOf(st, layout.numel());
    for (size_t i = 0; i < sent.size(); ++i) sent[i] += res[i];
    double scale = 0;
    for (float x : expect) scale = std::max(scale, std::fabs(static_cast<double>(x)));
    INFO(spec << " round " << round);
    CHECK(testing::maxAbsDiff(sent, expect) <= rel_tol * scale);
  }
}

}  // namespace

TEST_CASE("error-feedback invariant holds for every sparsifier and quantizer", "[compression]") {
  // Sparsifiers send values exactly, so the invariant is exact.
  checkErrorFeedback("topk:density=0.05", 0.0);
  checkErrorFeedback("topk:density=0.01,scope=global", 0.0);
  checkErrorFeedback("randk:density=0.05", 0.0);
  checkErrorFeedback("randblock:density=0.05", 0.0);
  checkErrorFeedback("sign", 1e-6);
  checkErrorFeedback("stc:density=0.05", 1e-6);
  checkErrorFeedback("qsgd:levels=4,ef=true", 1e-6);
}

TEST_CASE("topk sends the k largest per tensor or globally", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const auto update = testing::randomVector(layout.numel(), 7);
  SECTION("layer scope") {
    auto c = makeCompressor("topk:density=0.1,ef=false");
    auto p = c->compress(layout, update, {});
    for (size_t t = 0; t < layout.size(); ++t) {
      const auto& s = std::get<Sparse>(p[t]);
      const auto v = layout.slice(std::span<const float>(update), t);
      CHECK(s.indices == selectTopKBySort(v, countForDensity(0.1, v.size())));
    }
  }
  SECTION("global scope") {
    auto c = makeCompressor("topk:density=0.02,scope=global,ef=false");
    auto p = c->compress(layout, update, {});
    std::set<size_t> got;
    for (size_t t = 0; t < layout.size(); ++t)
      for (uint32_t i : std::get<Sparse>(p[t]).indices) got.insert(layout[t].offset + i);
    const auto ref = selectTopKBySort(update, countForDensity(0.02, update.size()));
    CHECK(got == std::set<size_t>(ref.begin(), ref.end()));
  }
}

TEST_CASE("randblock picks the same block for every client of a round", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  auto c = makeCompressor("randblock:density=0.1");
  std::vector<std::vector<uint32_t>> offsets;
  for (uint64_t client : {1, 2, 99}) {
    ClientState st = ClientState(layout.fingerprint());
    auto p = c->compressWithFeedback(layout, testing::randomVector(layout.numel(), client), st,
                                     RoundContext{42, 3, 0, client});
    std::vector<uint32_t> o;
    for (auto& x : p) o.push_back(std::get<RandBlock>(x).offset);
    offsets.push_back(o);
  }
  CHECK(offsets[0] == offsets[1]);
  CHECK(offsets[0] == offsets[2]);
  // Another round moves the blocks.
  ClientState st = ClientState(layout.fingerprint());
  auto p = c->compressWithFeedback(layout, testing::randomVector(layout.numel(), 1), st,
                                   RoundContext{42, 4, 0, 1});
  std::vector<uint32_t> o;
  for (auto& x : p) o.push_back(std::get<RandBlock>(x).offset);
  CHECK(o != offsets[0]);
}

TEST_CASE("randk draws distinct sorted indices and per client", "[compression]") {
  for (size_t k : {size_t{10}, size_t{400}}) {  // Floyd and selection sampling paths
    auto a = sampleIndices(1000, k, 1, 2, 3, 0);
    auto b = sampleIndices(1000, k, 1, 2, 4, 0);
    REQUIRE(a.size() == k);
    CHECK(std::is_sorted(a.begin(), a.end()));
    CHECK(std::adjacent_find(a.begin(), a.end()) == a.end());
    CHECK(a.back() < 1000u);
    CHECK(a != b);
    CHECK(a == sampleIndices(1000, k, 1, 2, 3, 0));
  }
  // Every position is reachable and roughly uniform.
  std::vector<int> hits(100);
  for (uint64_t r = 0; r < 2000; ++r)
    for (uint32_t i : sampleIndices(100, 5, 9, r, 1, 0)) ++hits[i];
  for (int h : hits) CHECK((h > 50 && h < 170));  // expectation 100
}

TEST_CASE("compressors reject bad input and leave the state untouched", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  auto c = makeCompressor("topk:density=0.1");
  ClientState st = ClientState(layout.fingerprint());
  auto update = testing::randomVector(layout.numel(), 1);
  c->compressWithFeedback(layout, update, st, {});
  const auto before = testing::stateBytes(st);
  update[77] = std::nanf("");
  CHECK_THROWS_WITH(c->compressWithFeedback(layout, update, st, {}),
                    Catch::Contains("value 77 (nan) is not finite"));
  CHECK(testing::stateBytes(st) == before);
  std::vector<float> short_update(10);
  CHECK_THROWS_AS(c->compressWithFeedback(layout, short_update, st, {}), InvalidArgument);
  ParamLayout other;
  other.add("x", {static_cast<int64_t>(layout.numel())});
  CHECK_THROWS_WITH(c->compressWithFeedback(other, testing::randomVector(other.numel(), 1), st, {}),
                    Catch::Contains("another model"));
  CHECK(testing::stateBytes(st) == before);
}

TEST_CASE("dense codecs round-trip within their precision", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  auto update = testing::randomVector(layout.numel(), 2);
  update[3] = 1e6f;  // beyond fp16 range: clamped, never inf
  for (auto [spec, rel] : {std::pair{"none", 0.0}, {"fp16", 1.0 / 1024}, {"bf16", 1.0 / 128}}) {
    auto c = makeCompressor(spec);
    auto p = c->compress(layout, update, {});
    for (size_t t = 0; t < layout.size(); ++t)
      REQUIRE_NOTHROW(validatePayload(view(p[t]), layout[t]));
    auto back = testing::densify(layout, p);
    for (size_t i = 0; i < back.size(); ++i) {
      if (i == 3) continue;
      REQUIRE(std::fabs(back[i] - update[i]) <= std::fabs(update[i]) * rel + 1e-7);
    }
    if (std::string(spec) == "fp16") CHECK(back[3] == 65504.0f);
  }
}

TEST_CASE("error feedback is exact on a model larger than the caches (streaming-store path)",
          "[compression]") {
  // compressWithFeedback forms residual + update with non-temporal stores above 16 MB.
  ParamLayout layout;
  layout.add("w", {int64_t{5'000'003}});  // 20 MB, odd length: head and tail loops run too
  auto c = makeCompressor("randblock:density=0.01");
  ClientState st(layout.fingerprint());
  Workspace ws;
  std::vector<float> old_residual(layout.numel(), 0.0f);
  for (uint64_t round = 0; round < 2; ++round) {
    const auto u = testing::randomVector(layout.numel(), 40 + round);
    const auto sent = testing::densify(
        layout, c->compressWithFeedback(layout, u, st, RoundContext{1, round, 0, 1}, &ws));
    const auto& r = st.find<ResidualState>(kResidualComponent)->values;
    size_t mismatches = 0;
    for (size_t i = 0; i < u.size(); ++i)
      mismatches += (sent[i] + r[i]) != (u[i] + old_residual[i]);
    CHECK(mismatches == 0);  // exact: a sparsifier moves values, it does not round them
    old_residual = r;
  }
}

// Secure aggregation sums masked vectors coordinate by coordinate, so it takes only a support the
// round fixes for every client (SharedSupport): each client's phase-0 payloads lie on it, in its
// order, whoever the client; other rounds draw other supports.
TEST_CASE("a shared support holds every client's payload, in the payload's order",
          "[compression][secagg]") {
  const ParamLayout layout = testing::smallCnnLayout();
  for (const char* spec : {"randblock:density=0.1", "randk:density=0.1,positions=shared", "none"}) {
    INFO(spec);
    const auto c = makeCompressor(spec);
    REQUIRE(c->supportIsShared());
    const SharedSupport s = c->sharedSupport(layout, RoundContext{7, 3, 0, 1, nullptr});
    CHECK(s.all == (std::string(spec) == "none"));
    for (uint64_t client : {1, 2, 90}) {
      // The support ignores the client; the client's payloads lie on it.
      const SharedSupport mine = c->sharedSupport(layout, RoundContext{7, 3, 0, client, nullptr});
      CHECK(mine.positions == s.positions);
      const auto update = testing::randomVector(layout.numel(), 40 + client);
      const auto payloads = c->compress(layout, update, RoundContext{7, 3, 0, client, nullptr});
      const auto dense = testing::densify(layout, payloads, nullptr);
      std::vector<float> on(s.size(layout.numel()));
      s.gather(dense, on);
      // What the payloads carry, tensor by tensor, in their order.
      std::vector<float> carried;
      for (const auto& p : payloads) {
        if (const auto* b = std::get_if<RandBlock>(&p))
          carried.insert(carried.end(), b->values.begin(), b->values.end());
        else if (const auto* sp = std::get_if<Sparse>(&p))
          carried.insert(carried.end(), sp->values.begin(), sp->values.end());
        else
          carried.insert(carried.end(), std::get<DenseF32>(p).values.begin(),
                         std::get<DenseF32>(p).values.end());
      }
      CHECK(on == carried);
      // Nothing outside the support: scattering back gives the densified update.
      std::vector<float> back(layout.numel(), 5.0f);
      s.scatter(on, back);
      CHECK(back == dense);
    }
    if (!s.all) {
      std::set<uint32_t> distinct(s.positions.begin(), s.positions.end());
      CHECK(distinct.size() == s.positions.size());
      CHECK(s.positions.size() < layout.numel() / 5);
      CHECK(c->sharedSupport(layout, RoundContext{7, 4, 0, 1, nullptr}).positions != s.positions);
      CHECK(c->sharedSupport(layout, RoundContext{8, 3, 0, 1, nullptr}).positions != s.positions);
    }
  }
  // rand-k's own draw differs per client; the shared one does not.
  const auto own = makeCompressor("randk:density=0.1");
  const auto shared = makeCompressor("randk:density=0.1,positions=shared");
  CHECK(own->spec().find("positions=client") != std::string::npos);
  CHECK(makeCompressor(shared->spec())->spec() == shared->spec());
  CHECK(std::get<Sparse>(own->compress(layout, testing::randomVector(layout.numel(), 1),
                                       RoundContext{7, 3, 0, 1, nullptr})[0])
            .indices !=
        std::get<Sparse>(own->compress(layout, testing::randomVector(layout.numel(), 1),
                                       RoundContext{7, 3, 0, 2, nullptr})[0])
            .indices);
  CHECK(std::get<Sparse>(shared->compress(layout, testing::randomVector(layout.numel(), 1),
                                          RoundContext{7, 3, 0, 1, nullptr})[0])
            .indices ==
        std::get<Sparse>(shared->compress(layout, testing::randomVector(layout.numel(), 2),
                                          RoundContext{7, 3, 0, 2, nullptr})[0])
            .indices);
  // Those whose support or scale is each client's own share none.
  for (const char* spec : {"topk:density=0.1", "stc:density=0.1", "sign", "qsgd", "randk",
                           "randblock:offset=client", "powersgd:rank=2", "acpsgd:rank=2"}) {
    INFO(spec);
    const auto c = makeCompressor(spec);
    CHECK_FALSE(c->supportIsShared());
    CHECK_THROWS_AS(c->sharedSupport(layout, RoundContext{7, 3, 0, 1, nullptr}), InvalidArgument);
  }
  // Sizes are checked.
  const SharedSupport s = makeCompressor("randblock:density=0.1")->sharedSupport(layout, {});
  std::vector<float> dense(layout.numel()), few(3);
  CHECK_THROWS_AS(s.gather(dense, few), InvalidArgument);
  CHECK_THROWS_AS(s.scatter(few, dense), InvalidArgument);
  std::vector<float> short_model(10), out(s.positions.size());
  CHECK_THROWS_AS(s.gather(short_model, out), InvalidArgument);
  // A position outside the model: refused before anything is written.
  std::vector<float> small(s.positions.size() + 1, 3.0f);
  SharedSupport outside = s;
  outside.positions.back() = static_cast<uint32_t>(small.size());
  CHECK_THROWS_AS(outside.scatter(std::vector<float>(outside.positions.size(), 1.0f), small),
                  InvalidArgument);
  CHECK(std::all_of(small.begin(), small.end(), [](float v) { return v == 3.0f; }));
}
