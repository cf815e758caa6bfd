#include <catch2/catch.hpp>

#include <cmath>
#include <set>
#include <vector>

#include "core/rng.h"

using namespace starling;

TEST_CASE("a stream is a pure function of its key", "[core]") {
  StreamKey k{7, 3, 11, StreamPurpose::kQsgd, 2};
  RngStream a(k), b(k);
  for (int i = 0; i < 1000; ++i) REQUIRE(a.next() == b.next());
}

TEST_CASE("every key field separates streams", "[core]") {
  const StreamKey base{7, 3, 11, StreamPurpose::kQsgd, 2};
  std::vector<StreamKey> keys = {base};
  auto k = base; k.run_seed = 8; keys.push_back(k);
  k = base; k.round = 4; keys.push_back(k);
  k = base; k.client_id = 12; keys.push_back(k);
  k = base; k.purpose = StreamPurpose::kRandK; keys.push_back(k);
  k = base; k.sub = 3; keys.push_back(k);
  std::set<uint64_t> firsts;
  for (const auto& key : keys) {
    RngStream r(key);
    firsts.insert(r.next());
  }
  CHECK(firsts.size() == keys.size());
}

TEST_CASE("below() is uniform and in range", "[core]") {
  RngStream r(StreamKey{1, 0, 0, StreamPurpose::kTest, 0});
  const int bins = 10, draws = 100000;
  std::vector<int> count(bins);
  for (int i = 0; i < draws; ++i) {
    auto v = r.below(bins);
    REQUIRE(v < static_cast<uint64_t>(bins));
    ++count[v];
  }
  double chi2 = 0;
  const double e = static_cast<double>(draws) / bins;
  for (int c : count) chi2 += (c - e) * (c - e) / e;
  CHECK(chi2 < 27.9);  // chi-square, 9 degrees of freedom, p = 0.001
  CHECK(r.below(1) == 0u);
}

TEST_CASE("normal() has mean 0 and variance 1", "[core]") {
  RngStream r(StreamKey{2, 0, 0, StreamPurpose::kTest, 0});
  const int n = 200000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    const double x = r.normal();
    s += x;
    s2 += x * x;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  CHECK(std::fabs(mean) < 5.0 / std::sqrt(n));
  CHECK(std::fabs(var - 1.0) < 0.02);
}

TEST_CASE("uniform() stays in the half-open unit interval", "[core]") {
  RngStream r(StreamKey{3, 0, 0, StreamPurpose::kTest, 0});
  double lo = 1, hi = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = r.uniform();
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    const float f = r.uniformFloat();
    REQUIRE(f >= 0.0f);
    REQUIRE(f < 1.0f);
  }
  CHECK(lo >= 0.0);
  CHECK(hi < 1.0);
  CHECK(lo < 1e-3);
  CHECK(hi > 1 - 1e-3);
}
