#include "aggregation/robust.h"

#include <catch2/catch.hpp>

#include "core/error.h"

using namespace starling;
using namespace starling::aggregation;

TEST_CASE("coordinate-wise median and odd and even", "[aggregation]") {
  CHECK(coordinateMedian({{1, 9}, {3, 7}, {2, 8}}) == std::vector<float>{2, 8});
  CHECK(coordinateMedian({{1, 0}, {4, 0}, {2, 5}, {3, 5}}) == std::vector<float>{2.5f, 2.5f});
  CHECK(coordinateMedian({{5, -1}}) == std::vector<float>{5, -1});
  CHECK(coordinateMedian({{1}, {1}, {1}, {100}}) == std::vector<float>{1});  // ties
  CHECK_THROWS_WITH(coordinateMedian({}), Catch::Contains("no updates"));
  CHECK_THROWS_WITH(coordinateMedian({{1, 2}, {1}}), Catch::Contains("update 1 has 1 values"));
}

TEST_CASE("trimmed mean cuts int(beta * n) at each end", "[aggregation]") {
  // n = 5, beta = 0.2: cut 1 each side -> mean of the middle 3
  CHECK(trimmedMean({{1}, {2}, {3}, {4}, {100}}, 0.2) == std::vector<float>{3});
  // n = 4, beta = 0.2: int(0.8) = 0, plain mean
  CHECK(trimmedMean({{1}, {2}, {3}, {10}}, 0.2) == std::vector<float>{4});
  // n = 10, beta = 0.25: cut 2 each side
  CHECK(trimmedMean({{-50}, {-40}, {1}, {2}, {3}, {4}, {5}, {6}, {70}, {80}}, 0.25) ==
        std::vector<float>{3.5f});
  CHECK_THROWS_WITH(trimmedMean({{1}}, 0.5), Catch::Contains("beta must be in [0, 0.5)"));
}

TEST_CASE("krum picks the update closest to its neighbours", "[aggregation]") {
  // n = 5, f = 1: each score sums the n - f - 2 = 2 smallest squared distances.
  const DenseUpdates u = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {10, 10}};
  // scores: (0,0): 1+1=2, (1,0): 1+1=2, (0,1): 1+1=2, (1,1): 1+1=2, (10,10): 162+181=343
  const auto s = krumScores(u, 1);
  CHECK(s == std::vector<double>{2, 2, 2, 2, 343});
  CHECK(krum(u, 1) == std::vector<float>{0, 0});  // tie: lowest index
  CHECK(krumSelect(u, 1, 3) == std::vector<size_t>{0, 1, 2});
  CHECK_THROWS_WITH(krum(u, 2),
                    Catch::Contains("needs at least 2f+3 = 7 updates, the round has 5"));
}

TEST_CASE("multi-krum averages the kept updates by weight", "[aggregation]") {
  const DenseUpdates u = {{0, 0}, {2, 0}, {0, 2}, {2, 2}, {40, 40}};
  // scores: corners 4+4=8 each, the outlier far larger; m = n - f = 4 keeps the corners.
  const auto m = multiKrum(u, {1, 1, 1, 5, 100}, 1, 0);
  CHECK(m[0] == Approx((0 + 2 + 0 + 2 * 5) / 8.0));
  CHECK(m[1] == Approx((0 + 0 + 2 + 2 * 5) / 8.0));
  CHECK_THROWS_WITH(multiKrum(u, {1, 1}, 1, 0), Catch::Contains("2 weights for 5 updates"));
  CHECK_THROWS_WITH(multiKrum(u, {1, 1, 1, 1, 1}, 1, 9), Catch::Contains("m=9"));
}

TEST_CASE("bulyan requires n >= 4f + 3 and resists an outlier", "[aggregation]") {
  // n = 7, f = 1: theta = 5 selected by repeated Krum, beta = 3 closest to the median averaged.
  const DenseUpdates u = {{1}, {2}, {3}, {4}, {5}, {6}, {1000}};
  // Repeated Krum (k = max(1, n - f - 2) neighbours) selects 3, 4, 2 (tie with 5: lower index),
  // 5, then 1 (tie with 6); the 3 values closest to the median 3 of {1..5} are {2, 3, 4}.
  CHECK(bulyan(u, 1) == std::vector<float>{3});
  CHECK_THROWS_WITH(bulyan({{1}, {2}, {3}, {4}, {5}, {6}}, 1),
                    Catch::Contains("needs at least 4f+3 = 7 updates"));
  CHECK(bulyan({{1}, {2}, {3}}, 0) ==
        std::vector<float>{2});  // f = 0: theta = beta = 3, plain mean
}

TEST_CASE("clipping scales an update to the norm bound", "[aggregation]") {
  std::vector<float> u = {3, 4};
  CHECK(clipUpdate(u, 10.0) == 1.0);
  CHECK(u == std::vector<float>{3, 4});
  CHECK(clipUpdate(u, 1.0) == Approx(0.2));
  CHECK(u[0] == Approx(0.6f));
  CHECK(u[1] == Approx(0.8f));
  CHECK_THROWS_AS(clipUpdate(u, 0.0), InvalidArgument);
}
