// The PLD accountant (privacy/pld.h) against Google's dp-accounting's PLDAccountant
// (tests/privacy/dp_accounting_pld_oracle.tsv, tools/dp_oracle.py --pld), against the RDP
// accountant it tightens, and against the Gaussian mechanism's closed form.
#include "privacy/pld.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "emulated.h"
#include "privacy/accountant.h"

using namespace starling;
using namespace starling::privacy;

namespace {

// The Gaussian mechanism's exact delta(epsilon) (Balle and Wang 2018), sensitivity 1.
// e^eps's term in log space: eps reaches the thousands in the tiny-noise test.
double gaussianDelta(double sigma, double eps) {
  const auto logPhi = [](double z) { return std::log(0.5) + logErfc(-z / std::sqrt(2.0)); };
  return std::exp(logPhi(0.5 / sigma - eps * sigma)) -
         std::exp(eps + logPhi(-0.5 / sigma - eps * sigma));
}

}  // namespace

TEST_CASE("pld: epsilon within 1% of dp-accounting's PLD accountant over a grid",
          "[privacy][pld]") {
  const char* fresh = std::getenv("STARLING_DP_PLD_ORACLE");  // tests/tools/dp_oracle_test.sh
  std::ifstream in(fresh ? std::string(fresh)
                         : std::string(STARLING_SOURCE_DIR) +
                               "/tests/privacy/dp_accounting_pld_oracle.tsv");
  REQUIRE(in.good());
  size_t rows = 0;
  double worst = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    double q = 0, sigma = 0, delta = 0, eps = 0;
    uint64_t rounds = 0;
    REQUIRE(ss >> q >> sigma >> rounds >> delta >> eps);
    INFO("q " << q << ", sigma " << sigma << ", rounds " << rounds << ", delta " << delta
              << ": dp-accounting " << eps);
    ++rows;
    // Under an emulator or a sanitizer, the small compositions only (the same code paths).
    if (testing::kReduced && (rounds > 1 || q == 1.0)) continue;
    const double mine = PldAccountant(q, sigma, delta).epsilon(rounds);
    CHECK(mine == Approx(eps).epsilon(0.01));
    worst = std::max(worst, std::fabs(mine - eps) / eps);
  }
  CHECK(rows == 96);
  WARN("largest relative difference from dp-accounting's PLD: " << worst);
}

TEST_CASE("pld: tighter than RDP, the Gaussian's exact epsilon when everyone is sampled",
          "[privacy][pld]") {
  // The subsampled Gaussian: PLD at most RDP (both are upper bounds; PLD the tight one).
  const std::vector<uint64_t> rounds =
      testing::kReduced ? std::vector<uint64_t>{20} : std::vector<uint64_t>{1, 50, 500};
  const std::vector<double> sigmas =
      testing::kReduced ? std::vector<double>{1.0} : std::vector<double>{0.7, 1.0, 3.0};
  for (double q : {0.001, 0.01, 0.1})
    for (double sigma : sigmas)
      for (uint64_t t : rounds) {
        INFO("q " << q << ", sigma " << sigma << ", rounds " << t);
        CHECK(PldAccountant(q, sigma, 1e-5).epsilon(t) <=
              RdpAccountant(q, sigma, 1e-5).epsilon(t) * (1 + 1e-6));
      }
  // q = 1: T rounds of the Gaussian mechanism are one of sigma / sqrt(T), whose delta(epsilon) is
  // known exactly; the PLD's epsilon at that delta is the exact one, rounded up by the grid only.
  for (double sigma : {0.8, 2.0, 5.0})
    for (uint64_t t :
         testing::kReduced ? std::vector<uint64_t>{4} : std::vector<uint64_t>{1, 16, 400}) {
      const double s = sigma / std::sqrt(double(t));
      const double eps = PldAccountant(1.0, sigma, 1e-5).epsilon(t);
      INFO("sigma " << sigma << ", rounds " << t << ": epsilon " << eps);
      CHECK(gaussianDelta(s, eps) <= 1e-5 * (1 + 1e-6));  // an upper bound
      CHECK(gaussianDelta(s, eps * 0.99 - 1e-3) > 1e-5);  // and a tight one
    }
}

TEST_CASE("pld: a tiny noise is not under-reported (losses past e^709)", "[privacy][pld]") {
  // q = 1: the Gaussian mechanism of sigma 0.02, whose epsilon at delta 1e-5 is about 1,462; a
  // round's losses reach thousands, where e^eps overflows a double.
  const double eps = PldAccountant(1.0, 0.02, 1e-5).epsilon(1);
  CHECK(eps > 1000);
  CHECK(gaussianDelta(0.02, eps) <= 1e-5 * (1 + 1e-6));
  // Subsampled at 1/2: one client's presence still shows (epsilon about log(1/2) below it).
  const double half = PldAccountant(0.5, 0.02, 1e-5).epsilon(1);
  CHECK(half > 1000);
  CHECK(half <= eps);
}

TEST_CASE("pld: monotone, rounds within a budget, noise for a target", "[privacy][pld]") {
  // (A coarser grid under an emulator or a sanitizer: every search discretises each candidate.)
  const double h = testing::kReduced ? 1e-3 : 1e-4;
  const PldAccountant a(0.01, 1.0, 1e-5, h);
  double last = 0;
  for (uint64_t t : {1, 2, 10, 100, 1000}) {
    const double e = a.epsilon(t);
    CHECK(e > last);
    last = e;
  }
  CHECK(a.epsilon(0) == 0);
  // (Smaller under an emulator or a sanitizer: the same searches over fewer rounds.)
  const double budget = testing::kReduced ? 0.5 : 1.0;
  const uint64_t most = testing::kReduced ? 40 : 2000, run = testing::kReduced ? 10 : 300;
  const uint64_t fit = a.roundsWithin(budget, most);
  REQUIRE(fit > 1);
  REQUIRE(fit < most);
  CHECK(a.epsilon(fit) <= budget);
  CHECK(a.epsilon(fit + 1) > budget);
  const double sigma = pldNoiseForEpsilon(2.0, 0.01, run, 1e-5, 1e-4, h);
  CHECK(PldAccountant(0.01, sigma, 1e-5, h).epsilon(run) <= 2.0);
  CHECK(PldAccountant(0.01, sigma * 0.99, 1e-5, h).epsilon(run) > 2.0);
  CHECK(sigma < noiseForEpsilon(2.0, 0.01, run, 1e-5));  // less noise than RDP asks
  CHECK_THROWS_AS(PldAccountant(0.0, 1.0, 1e-5), InvalidArgument);
  CHECK_THROWS_AS(PldAccountant(0.1, 0.0, 1e-5), InvalidArgument);
  CHECK_THROWS_AS(PldAccountant(0.1, 1.0, 1.0), InvalidArgument);
  CHECK_THROWS_AS(pldNoiseForEpsilon(1e-7, 1.0, 10, 1e-5), ConfigError);
}
