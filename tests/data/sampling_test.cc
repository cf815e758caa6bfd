#include "data/sampling.h"

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <numeric>

using namespace starling;
using namespace starling::data;

TEST_CASE("shuffleInPlace draws every permutation equally often", "[data]") {
  RngStream r(StreamKey{1, 0, 0, StreamPurpose::kTest, 0});
  std::map<std::array<int, 3>, int> count;
  const int draws = 60000;
  for (int i = 0; i < draws; ++i) {
    std::array<int, 3> v{0, 1, 2};
    shuffleInPlace(std::span<int>(v), r);
    ++count[v];
  }
  REQUIRE(count.size() == 6);
  double chi2 = 0;
  for (const auto& [perm, c] : count) chi2 += (c - draws / 6.0) * (c - draws / 6.0) / (draws / 6.0);
  CHECK(chi2 < 20.5);  // chi-square, 5 degrees of freedom, p = 0.001
}

TEST_CASE("sampleLogGamma has the gamma distribution's mean and variance", "[data]") {
  for (double shape : {0.05, 0.5, 1.0, 3.0, 50.0}) {
    INFO("shape " << shape);
    RngStream r(StreamKey{2, 0, 0, StreamPurpose::kTest, 0});
    const int n = 40000;
    double s = 0, s2 = 0;
    for (int i = 0; i < n; ++i) {
      const double g = std::exp(sampleLogGamma(r, shape));
      s += g;
      s2 += g * g;
    }
    const double mean = s / n, var = s2 / n - mean * mean;
    // Gamma(k, 1): mean k, variance k. 6 standard errors of the mean; variance within 15%.
    CHECK(std::fabs(mean - shape) < 6 * std::sqrt(shape / n));
    CHECK(std::fabs(var / shape - 1) < 0.15);
  }
}

TEST_CASE("sampleDirichlet draws points of the simplex with the right moments", "[data]") {
  RngStream r(StreamKey{3, 0, 0, StreamPurpose::kTest, 0});
  const size_t k = 4;
  const double alpha = 0.5;
  const int n = 40000;
  std::vector<double> p(k), sum(k), sum2(k);
  for (int i = 0; i < n; ++i) {
    sampleDirichlet(r, alpha, std::span<double>(p));
    REQUIRE(std::fabs(std::accumulate(p.begin(), p.end(), 0.0) - 1) < 1e-12);
    for (size_t j = 0; j < k; ++j) {
      REQUIRE(p[j] >= 0);
      sum[j] += p[j];
      sum2[j] += p[j] * p[j];
    }
  }
  // Symmetric Dirichlet: mean 1/k, variance (1/k)(1 - 1/k) / (k alpha + 1).
  const double mean = 1.0 / k, var = mean * (1 - mean) / (k * alpha + 1);
  for (size_t j = 0; j < k; ++j) {
    const double m = sum[j] / n, v = sum2[j] / n - m * m;
    CHECK(std::fabs(m - mean) < 6 * std::sqrt(var / n));
    CHECK(std::fabs(v / var - 1) < 0.1);
  }
}
