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
#include "privacy/dp.h"

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

TEST_CASE(
    "accountant: the tight Poisson-subsampled sum at the Gaussian's RDP is Mironov's exact "
    "A_alpha, and the general bound lies between it and no subsampling",
    "[privacy][accountant][ddg]") {
  for (double q : {0.001, 0.01, 0.1, 0.5})
    for (double sigma : {0.7, 1.0, 2.0, 5.0})
      for (uint64_t a : {2u, 3u, 5u, 10u, 32u, 64u}) {
        CAPTURE(q, sigma, a);
        const auto gauss = [&](uint64_t l) { return static_cast<double>(l) / (2 * sigma * sigma); };
        // logA is checked against dp-accounting above: the generic sum must agree with it.
        const double exact = logA(q, sigma, static_cast<double>(a)) / static_cast<double>(a - 1);
        const double tight = rdpPoissonSubsampled(q, gauss, a, true);
        CHECK(tight == Approx(exact).epsilon(1e-9).margin(1e-15));
        const double general = rdpPoissonSubsampled(q, gauss, a, false);
        CHECK(general >= exact * (1 - 1e-12));
        CHECK(general <= gauss(a) * (1 + 1e-12));
      }
  // At rate 1 it is the mechanism itself; at rate 0, nothing.
  const auto e = [](uint64_t l) { return 0.3 * static_cast<double>(l); };
  CHECK(rdpPoissonSubsampled(1.0, e, 7, false) == Approx(2.1));
  CHECK(rdpPoissonSubsampled(0.0, e, 7, false) == 0.0);
}

TEST_CASE("accountant: tau of a sum of discrete Gaussians, and the distributed accountant",
          "[privacy][accountant][ddg]") {
  // tau = 10 sum_{k=1}^{m-1} exp(-2 pi^2 sigma^2 k / (k + 1)), summed here in long double.
  for (double sigma : {0.3, 0.5, 1.0})
    for (uint64_t m : {2u, 3u, 10u, 1000u}) {
      long double want = 0;
      for (uint64_t k = 1; k < m; ++k)
        want += std::exp(-2.0L * M_PI * M_PI * sigma * sigma * k / (k + 1.0L));
      CHECK(ddgTau(sigma, m) == Approx(static_cast<double>(10 * want)).epsilon(1e-12));
    }
  CHECK(ddgTau(1.0, 1) == 0.0);  // one client's noise is a discrete Gaussian: no price
  // Past 10^6 clients the rest is bounded above: never below the exact part, never above the
  // bound 10 (m - 1) exp(-pi^2 sigma^2) (k / (k + 1) >= 1/2).
  const uint64_t big = 3'000'000;
  CHECK(ddgTau(0.3, big) >= ddgTau(0.3, 1'000'001));
  CHECK(ddgTau(0.3, big) <= 10.0 * (big - 1) * std::exp(-M_PI * M_PI * 0.09));
  // The floor the run assumes (privacy/dp.h): tau over a billion clients is below 1e-57, so tau d
  // is nothing for any model.
  CHECK(ddgTau(kMinClientNoise, 1'000'000'000) < 1e-57);

  // With tau 0 and every client sampled it is the Gaussian mechanism's RDP on integer orders:
  // never below the Gaussian accountant's (which also searches fractional orders), and close
  // where epsilon is of a size a run would use (at epsilon in the hundreds the best order is
  // below 2, which the integer orders miss).
  for (double z : {2.0, 4.0, 8.0})
    for (uint64_t t : {1u, 10u, 100u}) {
      CAPTURE(z, t);
      const double ddg = DdgAccountant(1.0, z, 0.0, 1000, 1e-5).epsilon(t);
      const double gauss = RdpAccountant(1.0, z, 1e-5).epsilon(t);
      CHECK(ddg >= gauss * (1 - 1e-12));
      CHECK(ddg <= gauss * 1.05);
    }
  // Subsampled, the general bound costs something over the Gaussian's exact accountant, never
  // less, and tau enters: a larger tau never gives a smaller epsilon.
  for (double q : {0.01, 0.1}) {
    CAPTURE(q);
    const double ddg = DdgAccountant(q, 1.0, 0.0, 1000, 1e-5).epsilon(100);
    const double gauss = RdpAccountant(q, 1.0, 1e-5).epsilon(100);
    CHECK(ddg >= gauss);
    CHECK(ddg <= 2 * gauss);
    CHECK(DdgAccountant(q, 1.0, 1e-4, 1000, 1e-5).epsilon(100) > ddg);
  }
  CHECK(DdgAccountant(0.1, 1.0, 0.0, 10, 1e-5).epsilon(0) == 0.0);
  // Epsilon grows with the rounds and shrinks with the noise.
  const DdgAccountant a(0.05, 1.2, 0.0, 100, 1e-5);
  CHECK(a.epsilon(10) < a.epsilon(100));
  CHECK(DdgAccountant(0.05, 1.5, 0.0, 100, 1e-5).epsilon(100) < a.epsilon(100));
  CHECK(a.roundsWithin(a.epsilon(50), 1000) == 50);
}

TEST_CASE("accountant: the distributed noise for a target reaches it and 1% less does not",
          "[privacy][accountant][ddg]") {
  for (double target : {1.0, 4.0}) {
    CAPTURE(target);
    const double z = ddgNoiseForEpsilon(target, 0.01, 500, 0.0, 1000, 1e-5);
    CHECK(DdgAccountant(0.01, z, 0.0, 1000, 1e-5).epsilon(500) <= target);
    CHECK(DdgAccountant(0.01, 0.99 * z, 0.0, 1000, 1e-5).epsilon(500) > target);
  }
  CHECK_THROWS_AS(ddgNoiseForEpsilon(1e-9, 0.5, 100000, 0.0, 1000, 1e-5), ConfigError);
}
