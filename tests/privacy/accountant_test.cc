// The RDP accountant (privacy/accountant.h) against Google's dp-accounting (its figures in
// tests/privacy/dp_accounting_oracle.tsv, written by tools/dp_oracle.py; STARLING_DP_ORACLE names
// a fresh file instead), and against what follows from the definitions: the unsampled Gaussian's
// closed form, monotonicity, the fractional orders joining the integer ones, noise calibration.
#include "privacy/accountant.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"

using namespace starling;
using namespace starling::privacy;

namespace {
std::string oraclePath() {
  if (const char* p = std::getenv("STARLING_DP_ORACLE")) return p;
  return std::string(STARLING_SOURCE_DIR) + "/tests/privacy/dp_accounting_oracle.tsv";
}
}  // namespace

TEST_CASE("accountant: epsilon within 1% of dp-accounting over a grid", "[privacy][accountant]") {
  std::ifstream in(oraclePath());
  REQUIRE(in.good());
  std::string line;
  size_t rows = 0;
  double worst = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    double q = 0, sigma = 0, delta = 0, eps = 0;
    uint64_t rounds = 0;
    REQUIRE(ss >> q >> sigma >> rounds >> delta >> eps);
    INFO("q " << q << ", sigma " << sigma << ", rounds " << rounds << ", delta " << delta
              << ": dp-accounting " << eps);
    const double mine = RdpAccountant(q, sigma, delta).epsilon(rounds);
    INFO("starling " << mine);
    if (std::isinf(eps)) {
      CHECK(std::isinf(mine));
    } else {
      CHECK(std::abs(mine - eps) <= 0.01 * eps + 1e-12);
      worst = std::max(worst, std::abs(mine - eps) / std::max(eps, 1e-300));
    }
    ++rows;
  }
  CHECK(rows >= 100);
  INFO("largest relative difference " << worst);
  CHECK(worst < 0.01);
}

TEST_CASE("accountant: with every client sampled it is the Gaussian mechanism's closed form",
          "[privacy][accountant]") {
  // q = 1: RDP alpha / (2 sigma^2) per round; epsilon = min over the orders of
  // T alpha / (2 sigma^2) + log(1 - 1/alpha) - log(delta alpha) / (alpha - 1).
  const double sigma = 2.0, delta = 1e-5;
  const uint64_t rounds = 50;
  double best = INFINITY;
  for (double a : defaultOrders()) {
    if (a <= 1.01) continue;
    best = std::min(best, rounds * a / (2 * sigma * sigma) + std::log1p(-1 / a) -
                              std::log(delta * a) / (a - 1));
  }
  CHECK(RdpAccountant(1.0, sigma, delta).epsilon(rounds) == Approx(best).epsilon(1e-12));
}

TEST_CASE("accountant: epsilon grows with rounds and sampling, shrinks with noise",
          "[privacy][accountant]") {
  const RdpAccountant a(0.01, 1.0, 1e-5);
  double last = 0;
  for (uint64_t t : {1, 10, 100, 1000, 10000}) {
    const double e = a.epsilon(t);
    CHECK(e > last);
    last = e;
  }
  CHECK(a.epsilon(0) == 0);
  CHECK(RdpAccountant(0.02, 1.0, 1e-5).epsilon(100) > a.epsilon(100));
  CHECK(RdpAccountant(0.01, 2.0, 1e-5).epsilon(100) < a.epsilon(100));
  CHECK(RdpAccountant(0.01, 1.0, 1e-6).epsilon(100) > a.epsilon(100));
  CHECK(RdpAccountant(0.0, 1.0, 1e-5).epsilon(100) == 0);
  CHECK(std::isinf(RdpAccountant(0.01, 0.0, 1e-5).epsilon(1)));
  // roundsWithin is the inverse.
  const uint64_t t = a.roundsWithin(2.0, 1'000'000);
  CHECK(a.epsilon(t) <= 2.0);
  CHECK(a.epsilon(t + 1) > 2.0);
  CHECK(a.roundsWithin(1e-9, 100) == 0);
}

TEST_CASE("accountant: fractional orders join the integer ones", "[privacy][accountant]") {
  // log A_alpha is continuous in alpha: the series of the fractional case, just beside an
  // integer, is within a hair of the binomial sum at it.
  for (double q : {0.001, 0.01, 0.1})
    for (double sigma : {0.7, 1.0, 4.0})
      for (double a : {2.0, 5.0, 20.0}) {
        INFO("q " << q << ", sigma " << sigma << ", alpha " << a);
        const double at = logA(q, sigma, a), beside = logA(q, sigma, a + 1e-7);
        CHECK(std::abs(at - beside) <= 1e-5 * std::max(1.0, std::abs(at)));
      }
}

TEST_CASE("accountant: the noise for a target epsilon reaches it and no less noise does",
          "[privacy][accountant]") {
  for (double target : {1.0, 4.0, 8.0}) {
    const double sigma = noiseForEpsilon(target, 0.01, 2000, 1e-5);
    INFO("target " << target << ": sigma " << sigma);
    CHECK(RdpAccountant(0.01, sigma, 1e-5).epsilon(2000) <= target);
    CHECK(RdpAccountant(0.01, sigma * 0.99, 1e-5).epsilon(2000) > target);
  }
  CHECK_THROWS_AS(noiseForEpsilon(0.0, 0.01, 100, 1e-5), ConfigError);
  CHECK_THROWS_AS(noiseForEpsilon(-1.0, 0.01, 100, 1e-5), ConfigError);
  CHECK_THROWS_AS(noiseForEpsilon(INFINITY, 0.01, 100, 1e-5), ConfigError);
  CHECK_THROWS_AS(noiseForEpsilon(1e-6, 1.0, 1'000'000, 1e-9), ConfigError);
  CHECK_THROWS_AS(RdpAccountant(1.5, 1.0, 1e-5), InvalidArgument);
  CHECK_THROWS_AS(RdpAccountant(0.1, -1.0, 1e-5), InvalidArgument);
  CHECK_THROWS_AS(RdpAccountant(0.1, 1.0, 0.0), InvalidArgument);
  CHECK_THROWS_AS(RdpAccountant(0.1, 1.0, 1.0), InvalidArgument);
}

TEST_CASE("accountant: the discrete Gaussian is rho-zCDP", "[privacy][accountant]") {
  const std::vector<double> orders{2, 10, 100};
  const auto r = rdpDiscreteGaussian(4.0, 2.0, orders);
  for (size_t i = 0; i < orders.size(); ++i) CHECK(r[i] == Approx(orders[i] * 4.0 / 32.0));
}
