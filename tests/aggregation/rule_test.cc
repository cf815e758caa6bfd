#include "aggregation/rule.h"

#include <catch2/catch.hpp>

#include "core/error.h"

using namespace starling;
using namespace starling::aggregation;

TEST_CASE("aggregation rules build by spec with typed, checked options", "[aggregation]") {
  CHECK(makeRule("fedavg")->spec() == "fedavg:weight=examples,clip=0");
  CHECK(makeRule("fedavg:weight=uniform,clip=2.5")->spec() == "fedavg:weight=uniform,clip=2.5");
  CHECK(makeRule("trimmed_mean:beta=0.1")->spec() == "trimmed_mean:beta=0.1,clip=0");
  CHECK(makeRule("multikrum:f=2,m=3")->spec() == "multikrum:f=2,m=3,weight=examples,clip=0");
  for (const auto& e : aggregationRules().entries()) {
    auto r = makeRule(e.name);
    INFO(e.name);
    CHECK(r->name() == e.name);
    CHECK(makeRule(r->spec())->spec() == r->spec());  // the canonical spec parses back
    CHECK(r->streaming() == (e.name == "fedavg"));
  }
  CHECK_THROWS_WITH(makeRule("mean"), Catch::Contains("unknown aggregation rule 'mean'") &&
                                          Catch::Contains("bulyan"));
  CHECK_THROWS_WITH(makeRule("median:f=1"), Catch::Contains("unknown option 'f'"));
  CHECK_THROWS_WITH(makeRule("median:weight=uniform"), Catch::Contains("unknown option 'weight'"));
  CHECK_THROWS_WITH(makeRule("trimmed_mean:beta=0.5"), Catch::Contains("beta must be in [0, 0.5)"));
  CHECK_THROWS_WITH(makeRule("krum:f=-1"), Catch::Contains("non-negative integer"));
  CHECK_THROWS_AS(makeRule("fedavg:clip=nan"), ConfigError);
}

TEST_CASE("which rules weight by examples", "[aggregation]") {
  CHECK(makeRule("fedavg")->weightsByExamples());
  CHECK_FALSE(makeRule("fedavg:weight=uniform")->weightsByExamples());
  CHECK(makeRule("multikrum")->weightsByExamples());
  for (const char* r : {"median", "trimmed_mean", "krum", "bulyan"})
    CHECK_FALSE(makeRule(r)->weightsByExamples());
}

TEST_CASE("robust combine checks its input and its output", "[aggregation]") {
  const DenseUpdates u = {{1, 2}, {3, 4}, {5, 6}};
  const std::vector<double> w = {1, 1, 1};
  CHECK(makeRule("median")->combine(u, w) == std::vector<float>{3, 4});
  CHECK_THROWS_WITH(makeRule("median")->combine({{1, NAN}, {1, 2}}, {1, 1}),
                    Catch::Contains("non-finite"));
  CHECK_THROWS_WITH(makeRule("krum:f=1")->combine(u, w), Catch::Contains("2f+3"));
  CHECK_THROWS_AS(makeRule("fedavg")->combine(u, w), InternalError);
}
