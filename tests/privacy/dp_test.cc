// Central DP's mechanism (privacy/dp.h): the Gaussian draws against the normal distribution, the
// noise's scale and its keys (seeded: reproducible; random: not), the fixed denominator, sigma
// from a target, and the refusals (no noise, a budget the rounds exceed, bad weights).
#include "privacy/dp.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "check_throws.h"
#include "core/error.h"
#include "emulated.h"
#include "test_keys.h"

using namespace starling;
using namespace starling::privacy;
using Catch::Matchers::Contains;

namespace {

CentralDpConfig config(double clip, double sigma, double target = 0.0) {
  CentralDpConfig c;
  c.enabled = true;
  c.clip = clip;
  c.noise_multiplier = sigma;
  c.target_epsilon = target;
  c.seeded_noise = true;
  c.population = 1000;
  return c;
}

// The standard normal's CDF.
double phi(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

}  // namespace

TEST_CASE("dp: the Gaussian draws are standard normal", "[privacy][dp]") {
  KeyStream s(testing::testKey(7), 1, MaskStream::kNoise, 0);
  const size_t n = 400'000;
  std::vector<double> x(n);
  double sum = 0, sq = 0;
  size_t finite = 0;
  for (auto& v : x) {
    v = standardNormal(s);
    finite += std::isfinite(v);
    sum += v;
    sq += v * v;
  }
  REQUIRE(finite == n);
  const double mean = sum / n, var = sq / n - mean * mean;
  // Six standard errors: the mean's is 1/sqrt(n), the variance's sqrt(2/n).
  CHECK(std::fabs(mean) < 6 / std::sqrt(double(n)));
  CHECK(std::fabs(var - 1) < 6 * std::sqrt(2.0 / n));
  // The empirical CDF at several points, tails included, within six binomial standard errors.
  for (double t : {-3.0, -2.0, -1.0, -0.3, 0.0, 0.5, 1.5, 2.5, 3.5}) {
    size_t below = 0;
    for (double v : x) below += v <= t;
    const double p = phi(t), se = std::sqrt(p * (1 - p) / n);
    INFO("t " << t);
    CHECK(std::fabs(double(below) / n - p) < 6 * se + 1e-6);
  }
}

TEST_CASE("dp: the noise has standard deviation sigma x clip over the expected weight",
          "[privacy][dp]") {
  const double clip = 0.5, sigma = 2.0, expected = 4.0;
  const CentralDp dp(config(clip, sigma), 0.5, 10, 3);
  CHECK(dp.noiseMultiplier() == sigma);
  // A sum of zero: what comes out is the noise alone, over the expected weight.
  std::vector<float> zero(100'000, 0.0f);
  dp.privatize(zero, 0.0, expected, 1);
  double sum = 0, sq = 0;
  for (float v : zero) {
    sum += v;
    sq += double(v) * v;
  }
  const double n = double(zero.size()), sd_want = sigma * clip / expected;
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  CHECK(std::fabs(mean) < 6 * sd_want / std::sqrt(n));
  CHECK(std::fabs(sd / sd_want - 1) < 6 * std::sqrt(0.5 / n));

  // The mean's sum is kept and divided by the expected weight, not the actual one: the noise is
  // the difference, and it has the same scale.
  std::vector<float> mean_in(50'000);
  for (size_t i = 0; i < mean_in.size(); ++i) mean_in[i] = float(i % 7) * 0.1f - 0.3f;
  std::vector<float> out = mean_in;
  dp.privatize(out, 3.0, expected, 2);
  double dsum = 0, dsq = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double d = double(out[i]) - double(mean_in[i]) * 3.0 / expected;
    dsum += d;
    dsq += d * d;
  }
  const double m2 = double(out.size());
  CHECK(std::fabs(dsum / m2) < 6 * sd_want / std::sqrt(m2));
  CHECK(std::fabs(std::sqrt(dsq / m2) / sd_want - 1) < 0.02);
}

TEST_CASE("dp: seeded noise is the run seed's and the round's, random noise is neither",
          "[privacy][dp]") {
  const auto draw = [](const CentralDp& dp, uint64_t round) {
    std::vector<float> v(64, 0.0f);
    dp.privatize(v, 0.0, 1.0, round);
    return v;
  };
  const CentralDp a(config(1, 1), 0.1, 10, 5), b(config(1, 1), 0.1, 10, 5),
      other_seed(config(1, 1), 0.1, 10, 6);
  CHECK(draw(a, 3) == draw(b, 3));
  CHECK(draw(a, 3) != draw(a, 4));
  CHECK(draw(a, 3) != draw(other_seed, 3));
  CentralDpConfig r = config(1, 1);
  r.seeded_noise = false;
  const CentralDp x(r, 0.1, 10, 5), y(r, 0.1, 10, 5);
  CHECK(draw(x, 3) != draw(y, 3));
  CHECK(draw(x, 3) != draw(a, 3));
  // The sampling key is the noise's: seeded ones agree, random ones do not.
  CHECK(a.samplingKey() == b.samplingKey());
  CHECK(a.samplingKey() != other_seed.samplingKey());
  CHECK(x.samplingKey() != y.samplingKey());
}

TEST_CASE("dp: sigma from a target keeps the budget, and a budget the rounds exceed is refused",
          "[privacy][dp]") {
  const double q = 0.01, delta = 1e-5, target = 2.0;
  // (Fewer under an emulator or a sanitizer: the PLD searches compose every candidate.)
  const uint64_t rounds = testing::kReduced ? 60 : 200;
  // Under the emulator or a sanitizer RDP only: PLD's searches compose every candidate by FFT,
  // minutes there (tests/privacy/pld_test.cc checks its searches, reduced).
  const std::vector<DpAccountant> kinds =
      testing::kReduced ? std::vector<DpAccountant>{DpAccountant::kRdp}
                        : std::vector<DpAccountant>{DpAccountant::kPld, DpAccountant::kRdp};
  for (const DpAccountant kind : kinds) {
    const bool pld = kind == DpAccountant::kPld;
    INFO((pld ? "PLD" : "RDP"));
    // The accountant the run uses, as a function of sigma and rounds.
    const auto spent = [&](double sigma, uint64_t t) {
      return pld ? PldAccountant(q, sigma, delta, kRunPldGrid).epsilon(t)
                 : RdpAccountant(q, sigma, delta).epsilon(t);
    };
    CentralDpConfig c = config(1.0, 0.0, target);
    c.delta = delta;
    c.accountant = kind;
    const CentralDp dp(c, q, rounds, 1);
    const double sigma = dp.noiseMultiplier();
    CHECK(sigma > 0.3);
    CHECK(dp.epsilon(rounds) <= target * (1 + 1e-9));
    CHECK(CentralDp::resolveSigma(c, q, rounds) == sigma);
    // The smallest such sigma (within the calibration's tolerance): 1% less spends too much.
    CHECK(spent(sigma * 0.99, rounds) > target);
    // Epsilon is the accountant's, round by round.
    for (uint64_t t : {uint64_t{1}, uint64_t{10}, rounds - 1})
      CHECK(dp.epsilon(t) == spent(sigma, t));

    // The same budget with less noise (the first of 98%, 96%, ... of it whose budget some rounds
    // fit, but not all): refused, with how many rounds would fit.
    const auto fitting = [&](double s) {
      return pld ? PldAccountant(q, s, delta, kRunPldGrid).roundsWithin(target, rounds)
                 : RdpAccountant(q, s, delta).roundsWithin(target, rounds);
    };
    double less = sigma;
    uint64_t fit = 0;
    for (double f = 0.98; f > 0.1 && (fit == 0 || fit >= rounds); f -= 0.02) {
      less = sigma * f;
      fit = fitting(less);
    }
    REQUIRE(fit > 0);
    REQUIRE(fit < rounds);
    CentralDpConfig half = c;
    half.noise_multiplier = less;
    CHECK_THROWS_MATCHING(CentralDp(half, q, rounds, 1), ConfigError,
                          Contains(std::to_string(fit) + " rounds fit that budget"));
    // Those rounds are accepted, one more is not.
    CHECK(CentralDp::resolveSigma(half, q, fit) == less);
    CHECK_THROWS_MATCHING(CentralDp::resolveSigma(half, q, fit + 1), ConfigError,
                          Contains(std::to_string(fit) + " rounds fit that budget"));
    // A noise multiplier with no target: any number of rounds, epsilon reported.
    CentralDpConfig open = config(1.0, 0.5);
    open.accountant = kind;
    const uint64_t many = testing::kReduced ? 2000 : 100000;
    const CentralDp unbounded(open, q, many, 1);
    CHECK(std::isfinite(unbounded.epsilon(many)));
    CHECK(unbounded.epsilon(many) > unbounded.epsilon(many / 100));
  }
  // PLD is the tight one: less noise for the same budget.
  if (!testing::kReduced) {
    CentralDpConfig c = config(1.0, 0.0, target);
    CentralDpConfig r = c;
    r.accountant = DpAccountant::kRdp;
    CHECK(CentralDp::resolveSigma(c, q, rounds) < 0.95 * CentralDp::resolveSigma(r, q, rounds));
  }
}

TEST_CASE("dp: configurations without a finite epsilon are refused", "[privacy][dp]") {
  CHECK_THROWS_MATCHING(config(1.0, 0.0).validate(), ConfigError,
                        Contains("epsilon would be infinite"));
  CHECK_THROWS_MATCHING(config(0.0, 1.0).validate(), ConfigError, Contains("privacy.clip"));
  CHECK_THROWS_MATCHING(config(-1.0, 1.0).validate(), ConfigError, Contains("privacy.clip"));
  CHECK_THROWS_MATCHING(config(INFINITY, 1.0).validate(), ConfigError, Contains("privacy.clip"));
  CHECK_THROWS_MATCHING(config(1.0, -1.0).validate(), ConfigError,
                        Contains("privacy.noise_multiplier"));
  CHECK_THROWS_MATCHING(config(1.0, NAN).validate(), ConfigError,
                        Contains("privacy.noise_multiplier"));
  CHECK_THROWS_MATCHING(config(1.0, 0.0, -2.0).validate(), ConfigError,
                        Contains("privacy.target_epsilon"));
  for (double d : {0.0, 1.0, -1e-5, double(NAN)}) {
    CentralDpConfig c = config(1.0, 1.0);
    c.delta = d;
    CHECK_THROWS_MATCHING(c.validate(), ConfigError, Contains("privacy.delta"));
  }
  CHECK_THROWS_MATCHING(CentralDp(config(1.0, 1.0), 0.0, 10, 1), ConfigError,
                        Contains("sampling rate"));
  CHECK_THROWS_MATCHING(CentralDp(config(1.0, 1.0), 1.5, 10, 1), ConfigError,
                        Contains("sampling rate"));
  // No population, or one whose sampled part is under one client a round.
  CentralDpConfig nobody = config(1.0, 1.0);
  nobody.population = 0;
  CHECK_THROWS_MATCHING(nobody.validate(), ConfigError, Contains("population"));
  nobody.population = 50;
  CHECK_THROWS_MATCHING(CentralDp(nobody, 0.01, 10, 1), ConfigError, Contains("fewer than one"));
  CHECK(CentralDp(nobody, 0.02, 10, 1).expectedWeight() == 0.02 * 50);
  // A target no noise up to 1e4 keeps.
  CHECK_THROWS_AS(CentralDp(config(1.0, 0.0, 1e-6), 1.0, 10, 1), ConfigError);
  // Bad weights are refused, the vector unchanged.
  const CentralDp dp(config(1.0, 1.0), 0.5, 10, 1);
  std::vector<float> v(4, 1.0f);
  for (auto [w, e] :
       {std::pair{1.0, 0.0}, {1.0, -1.0}, {double(NAN), 1.0}, {-1.0, 1.0}, {1.0, double(INFINITY)}})
    CHECK_THROWS_AS(dp.privatize(v, w, e, 1), InvalidArgument);
  CHECK(v == std::vector<float>(4, 1.0f));
}
