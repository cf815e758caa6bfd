#include "compression/registry.h"

#include <catch2/catch.hpp>

#include "compression/lowrank.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

TEST_CASE("every registered compressor builds by name and compresses", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const auto update = testing::randomVector(layout.numel(), 1);
  REQUIRE(compressors().entries().size() == 11);
  CHECK(compressors().names() ==
        "none, fp16, bf16, topk, stc, randk, randblock, sign, qsgd, powersgd, acpsgd");
  for (const auto& e : compressors().entries()) {
    INFO(e.name);
    CHECK_FALSE(e.summary.empty());
    auto c = makeCompressor(e.name);
    CHECK(c->name() == e.name);
    // The canonical spec parses back to an equivalent compressor.
    CHECK(makeCompressor(c->spec())->spec() == c->spec());
    ClientState st = ClientState(layout.fingerprint());
    // The round's shared factors come from the compressor itself: no compressor names here.
    const SharedFactors shared = c->initialShared(layout, 1);
    REQUIRE(shared.factors.size() == layout.size());
    CHECK(shared.any() == (e.name == "powersgd" || e.name == "acpsgd"));
    auto p = c->compressWithFeedback(layout, update, st, RoundContext{1, 0, 0, 1, &shared});
    REQUIRE(p.size() == layout.size());
    for (size_t t = 0; t < layout.size(); ++t)
      CHECK_NOTHROW(validatePayload(view(p[t]), layout[t], &shared, t));
    // Options that a spec accepts are listed in the entry's options text.
    const auto pos = c->spec().find(':');
    if (pos != std::string::npos) {
      std::string rest = c->spec().substr(pos + 1);
      for (size_t start = 0; start < rest.size();) {
        const size_t comma = rest.find(',', start), eq = rest.find('=', start);
        const std::string key = rest.substr(start, eq - start);
        CHECK(e.options.find(key + "=") != std::string::npos);
        start = comma == std::string::npos ? rest.size() : comma + 1;
      }
    } else {
      CHECK(e.options.empty());
    }
  }
  CHECK(makeCompressor("powersgd")->phases() == 2);
  CHECK(makeCompressor("powersgd:mode=local")->phases() == 1);
}

TEST_CASE("spec options are typed and checked", "[compression]") {
  CHECK(makeCompressor("topk:density=0.001,scope=global,ef=false")->spec() ==
        "topk:density=0.001,scope=global,ef=false");
  CHECK(makeCompressor(" qsgd : levels = 4 ")->spec() == "qsgd:levels=4,ef=false");
  CHECK_THROWS_WITH(makeCompressor("zip"),
                    Catch::Contains("unknown compressor 'zip'") && Catch::Contains("topk"));
  CHECK_THROWS_WITH(makeCompressor("topk:densty=0.1"), Catch::Contains("unknown option 'densty'"));
  CHECK_THROWS_WITH(makeCompressor("topk:density=abc"), Catch::Contains("not a finite number"));
  CHECK_THROWS_WITH(makeCompressor("powersgd:min_rate=inf"),
                    Catch::Contains("not a finite number"));
  CHECK_THROWS_WITH(makeCompressor("topk:density=0"), Catch::Contains("density must be in (0, 1]"));
  CHECK_THROWS_WITH(makeCompressor("topk:density=1.5"),
                    Catch::Contains("density must be in (0, 1]"));
  CHECK_THROWS_WITH(makeCompressor("topk:scope=row"),
                    Catch::Contains("must be one of: global, layer"));
  CHECK_THROWS_WITH(makeCompressor("topk:ef=maybe"), Catch::Contains("not true/false"));
  CHECK_THROWS_WITH(makeCompressor("topk:density"), Catch::Contains("not key=value"));
  CHECK_THROWS_WITH(makeCompressor("topk:density=0.1,density=0.2"), Catch::Contains("given twice"));
  CHECK_THROWS_WITH(makeCompressor("qsgd:levels=0"),
                    Catch::Contains("levels must be in [1, 65535]"));
  CHECK_THROWS_WITH(makeCompressor("qsgd:levels=-3"), Catch::Contains("non-negative integer"));
  CHECK_THROWS_WITH(makeCompressor("powersgd:rank=0"), Catch::Contains("rank must be >= 1"));
  CHECK_THROWS_WITH(makeCompressor("powersgd:min_rate=0.5"), Catch::Contains("min_rate"));
  CHECK_THROWS_WITH(makeCompressor("powersgd:mode=fast"),
                    Catch::Contains("must be one of: local, two_phase"));
  CHECK_THROWS_WITH(makeCompressor("acpsgd:mode=local"), Catch::Contains("unknown option 'mode'"));
  CHECK_THROWS_WITH(makeCompressor("none:x=1"), Catch::Contains("accepted: none"));
  CHECK_THROWS_AS(makeCompressor(""), ConfigError);
}

TEST_CASE("without error feedback a compressor never writes the caller's update", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  for (const char* spec :
       {"none", "fp16", "bf16", "topk:ef=false", "topk:ef=false,scope=global", "randk:ef=false",
        "randblock:ef=false", "sign:ef=false", "qsgd", "powersgd:ef=false",
        "powersgd:ef=false,mode=local", "acpsgd:ef=false"}) {
    auto c = makeCompressor(spec);
    REQUIRE_FALSE(c->usesErrorFeedback());
    std::vector<float> update = testing::randomVector(layout.numel(), 3);
    const std::vector<float> copy = update;
    ClientState st = ClientState(layout.fingerprint());
    const SharedFactors round_shared = c->initialShared(layout, 1);
    c->compressWithFeedback(layout, update, st, RoundContext{1, 0, 0, 1, &round_shared});
    INFO(spec);
    CHECK(update == copy);
  }
}

TEST_CASE("a canonical spec keeps every digit of density and min_rate", "[compression]") {
  // The spec is what a deployed client is told; 0.0123456789 written with a stream's 6 digits
  // would reach it as 0.0123457, and over 10^8 coordinates k would be 1,234,570, not 1,234,568.
  REQUIRE(countForDensity(0.0123456789, 100'000'000) != countForDensity(0.0123457, 100'000'000));
  for (const char* spec :
       {"topk:density=0.0123456789", "stc:density=0.0123456789", "randk:density=0.0123456789",
        "randblock:density=0.0123456789", "powersgd:rank=2,min_rate=2.123456789",
        "acpsgd:rank=2,min_rate=2.123456789"}) {
    INFO(spec);
    const std::string canonical = makeCompressor(spec)->spec();
    const std::string value = std::string(spec).substr(std::string(spec).rfind('=') + 1);
    CHECK(canonical.find("=" + value + ",") != std::string::npos);
    CHECK(makeCompressor(canonical)->spec() == canonical);
  }
}
