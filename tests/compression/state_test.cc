#include <catch2/catch.hpp>

#include "compression/registry.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

TEST_CASE("client state serializes losslessly and resumes identically", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  for (const char* spec : {"topk:density=0.05", "powersgd:rank=2"}) {
    auto c = makeCompressor(spec);
    ClientState a = c->initialState(layout);
    c->compress(layout, testing::randomVector(layout.numel(), 1), a, RoundContext{1, 0, 1});
    ClientState b = ClientState::deserialize(a.serialize());
    CHECK(b.residual == a.residual);
    CHECK(b.factors == a.factors);
    CHECK(b.layout_fingerprint == a.layout_fingerprint);
    // The restored state continues exactly like the original.
    const auto u = testing::randomVector(layout.numel(), 2);
    auto pa = testing::densify(layout, c->compress(layout, u, a, RoundContext{1, 1, 1}));
    auto pb = testing::densify(layout, c->compress(layout, u, b, RoundContext{1, 1, 1}));
    CHECK(pa == pb);
  }
}

TEST_CASE("corrupt client state blobs are rejected", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  auto c = makeCompressor("topk");
  auto blob = c->initialState(layout).serialize();
  CHECK_THROWS_WITH(ClientState::deserialize(std::span(blob).first(blob.size() - 1)), Catch::Contains("truncated"));
  auto bad = blob;
  bad[0] ^= 0xff;
  CHECK_THROWS_WITH(ClientState::deserialize(bad), Catch::Contains("bad magic"));
  bad = blob;
  bad[4] = 9;
  CHECK_THROWS_WITH(ClientState::deserialize(bad), Catch::Contains("version 9"));
  bad = blob;
  bad[17] = 0xff;  // residual count: high byte of the u64 after magic, version, fingerprint, phase
  bad[24] = 0x7f;
  CHECK_THROWS_AS(ClientState::deserialize(bad), IoError);
  bad = blob;
  bad.push_back(0);
  CHECK_THROWS_WITH(ClientState::deserialize(bad), Catch::Contains("trailing"));
}
