#include <catch2/catch.hpp>

#include "compression/lowrank.h"
#include "compression/registry.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

TEST_CASE("every catalogued compressor builds by name and compresses", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const auto update = testing::randomVector(layout.numel(), 1);
  REQUIRE(compressorCatalog().size() == 10);
  for (const auto& info : compressorCatalog()) {
    auto c = makeCompressor(info.name);
    CHECK(c->name() == info.name);
    // The canonical spec parses back to an equivalent compressor.
    CHECK(makeCompressor(c->spec())->spec() == c->spec());
    ClientState st = c->initialState(layout);
    SharedFactors shared;
    RoundContext ctx{1, 0, 1};
    if (info.name == "acpsgd") {
      shared = initialSharedFactors(layout, LowRankOptions{}, 1);
      ctx.shared = &shared;
    }
    auto p = c->compress(layout, update, st, ctx);
    REQUIRE(p.size() == layout.size());
    for (size_t t = 0; t < layout.size(); ++t) CHECK_NOTHROW(validatePayload(p[t], layout[t], &shared, t));
  }
}

TEST_CASE("spec options are typed and checked", "[compression]") {
  CHECK(makeCompressor("topk:density=0.001,scope=global,ef=false")->spec() ==
        "topk:density=0.001,scope=global,ef=false");
  CHECK(makeCompressor(" qsgd : levels = 4 ")->spec() == "qsgd:levels=4,ef=false");
  CHECK_THROWS_WITH(makeCompressor("zip"), Catch::Contains("unknown compressor 'zip'") && Catch::Contains("topk"));
  CHECK_THROWS_WITH(makeCompressor("topk:densty=0.1"), Catch::Contains("unknown option 'densty'"));
  CHECK_THROWS_WITH(makeCompressor("topk:density=abc"), Catch::Contains("not a finite number"));
  CHECK_THROWS_WITH(makeCompressor("powersgd:min_rate=inf"), Catch::Contains("not a finite number"));
  CHECK_THROWS_WITH(makeCompressor("topk:density=0"), Catch::Contains("density must be in (0, 1]"));
  CHECK_THROWS_WITH(makeCompressor("topk:density=1.5"), Catch::Contains("density must be in (0, 1]"));
  CHECK_THROWS_WITH(makeCompressor("topk:scope=row"), Catch::Contains("must be one of: global, layer"));
  CHECK_THROWS_WITH(makeCompressor("topk:ef=maybe"), Catch::Contains("not true/false"));
  CHECK_THROWS_WITH(makeCompressor("topk:density"), Catch::Contains("not key=value"));
  CHECK_THROWS_WITH(makeCompressor("topk:density=0.1,density=0.2"), Catch::Contains("given twice"));
  CHECK_THROWS_WITH(makeCompressor("qsgd:levels=0"), Catch::Contains("levels must be in [1, 65535]"));
  CHECK_THROWS_WITH(makeCompressor("qsgd:levels=-3"), Catch::Contains("non-negative integer"));
  CHECK_THROWS_WITH(makeCompressor("powersgd:rank=0"), Catch::Contains("rank must be >= 1"));
  CHECK_THROWS_WITH(makeCompressor("powersgd:min_rate=0.5"), Catch::Contains("min_rate"));
  CHECK_THROWS_WITH(makeCompressor("none:x=1"), Catch::Contains("accepted: none"));
  CHECK_THROWS_AS(makeCompressor(""), ConfigError);
}

TEST_CASE("without error feedback a compressor never writes the caller's update", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const SharedFactors shared = initialSharedFactors(layout, LowRankOptions{}, 1);
  for (const char* spec : {"none", "fp16", "bf16", "topk:ef=false", "topk:ef=false,scope=global", "randk:ef=false",
                           "randblock:ef=false", "sign:ef=false", "qsgd", "powersgd:ef=false", "acpsgd:ef=false"}) {
    auto c = makeCompressor(spec);
    REQUIRE_FALSE(c->usesErrorFeedback());
    std::vector<float> update = testing::randomVector(layout.numel(), 3);
    const std::vector<float> copy = update;
    ClientState st = c->initialState(layout);
    c->compress(layout, update, st, RoundContext{1, 0, 1, &shared});
    INFO(spec);
    CHECK(update == copy);
  }
}
