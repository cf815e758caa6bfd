// Central DP's mechanism (privacy/dp.h): the Gaussian draws against the normal distribution, the
// noise's scale and its keys (seeded: reproducible; random: not), the fixed denominator, sigma
// from a target, and the refusals (no noise, a budget the rounds exceed, bad weights).
#include "privacy/dp.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
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

DpConfig config(double clip, double sigma, double target = 0.0) {
  DpConfig c;
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
  const ClientDp dp(config(clip, sigma), 0.5, 10, 3);
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
  const auto draw = [](const ClientDp& dp, uint64_t round) {
    std::vector<float> v(64, 0.0f);
    dp.privatize(v, 0.0, 1.0, round);
    return v;
  };
  const ClientDp a(config(1, 1), 0.1, 10, 5), b(config(1, 1), 0.1, 10, 5),
      other_seed(config(1, 1), 0.1, 10, 6);
  CHECK(draw(a, 3) == draw(b, 3));
  CHECK(draw(a, 3) != draw(a, 4));
  CHECK(draw(a, 3) != draw(other_seed, 3));
  DpConfig r = config(1, 1);
  r.seeded_noise = false;
  const ClientDp x(r, 0.1, 10, 5), y(r, 0.1, 10, 5);
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
    DpConfig c = config(1.0, 0.0, target);
    c.delta = delta;
    c.accountant = kind;
    const ClientDp dp(c, q, rounds, 1);
    const double sigma = dp.noiseMultiplier();
    CHECK(sigma > 0.3);
    CHECK(dp.epsilon(rounds) <= target * (1 + 1e-9));
    CHECK(ClientDp::resolveSigma(c, q, rounds) == sigma);
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
    DpConfig half = c;
    half.noise_multiplier = less;
    CHECK_THROWS_MATCHING(ClientDp(half, q, rounds, 1), ConfigError,
                          Contains(std::to_string(fit) + " rounds fit that budget"));
    // Those rounds are accepted, one more is not.
    CHECK(ClientDp::resolveSigma(half, q, fit) == less);
    CHECK_THROWS_MATCHING(ClientDp::resolveSigma(half, q, fit + 1), ConfigError,
                          Contains(std::to_string(fit) + " rounds fit that budget"));
    // A noise multiplier with no target: any number of rounds, epsilon reported.
    DpConfig open = config(1.0, 0.5);
    open.accountant = kind;
    const uint64_t many = testing::kReduced ? 2000 : 100000;
    const ClientDp unbounded(open, q, many, 1);
    CHECK(std::isfinite(unbounded.epsilon(many)));
    CHECK(unbounded.epsilon(many) > unbounded.epsilon(many / 100));
  }
  // PLD is the tight one: less noise for the same budget.
  if (!testing::kReduced) {
    DpConfig c = config(1.0, 0.0, target);
    DpConfig r = c;
    r.accountant = DpAccountant::kRdp;
    CHECK(ClientDp::resolveSigma(c, q, rounds) < 0.95 * ClientDp::resolveSigma(r, q, rounds));
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
    DpConfig c = config(1.0, 1.0);
    c.delta = d;
    CHECK_THROWS_MATCHING(c.validate(), ConfigError, Contains("privacy.delta"));
  }
  CHECK_THROWS_MATCHING(ClientDp(config(1.0, 1.0), 0.0, 10, 1), ConfigError,
                        Contains("sampling rate"));
  CHECK_THROWS_MATCHING(ClientDp(config(1.0, 1.0), 1.5, 10, 1), ConfigError,
                        Contains("sampling rate"));
  // No population, or one whose sampled part is under one client a round.
  DpConfig nobody = config(1.0, 1.0);
  nobody.population = 0;
  CHECK_THROWS_MATCHING(nobody.validate(), ConfigError, Contains("population"));
  nobody.population = 50;
  CHECK_THROWS_MATCHING(ClientDp(nobody, 0.01, 10, 1), ConfigError, Contains("fewer than one"));
  CHECK(ClientDp(nobody, 0.02, 10, 1).expectedWeight() == 0.02 * 50);
  // A target no noise up to 1e4 keeps.
  CHECK_THROWS_AS(ClientDp(config(1.0, 0.0, 1e-6), 1.0, 10, 1), ConfigError);
  // Bad weights are refused, the vector unchanged.
  const ClientDp dp(config(1.0, 1.0), 0.5, 10, 1);
  std::vector<float> v(4, 1.0f);
  for (auto [w, e] :
       {std::pair{1.0, 0.0}, {1.0, -1.0}, {double(NAN), 1.0}, {-1.0, 1.0}, {1.0, double(INFINITY)}})
    CHECK_THROWS_AS(dp.privatize(v, w, e, 1), InvalidArgument);
  CHECK(v == std::vector<float>(4, 1.0f));
}

namespace {

// P(y) of N_Z(0, sigma^2), normalised over |y| <= 40 sigma + 40 (the rest is below 1e-300).
std::map<int64_t, double> discreteGaussianPmf(double sigma) {
  std::map<int64_t, double> p;
  const auto r = static_cast<int64_t>(40 * sigma + 40);
  double total = 0;
  for (int64_t y = -r; y <= r; ++y) {
    const double dy = static_cast<double>(y);
    total += p[y] = std::exp(-dy * dy / (2 * sigma * sigma));
  }
  for (auto& [y, v] : p) v /= total;
  return p;
}

}  // namespace

TEST_CASE("dp: the discrete Gaussian draws follow its distribution", "[privacy][dp][ddg]") {
  // Small sigmas against the exact probabilities by a chi-square test (cells of expected count
  // at least 20, the tails pooled); at 10^-4 the statistic of a right sampler passes this bound
  // (the Wilson-Hilferty quantile) but one time in 10^4, and a sampler off by 2% in one cell's
  // probability does not.
  for (double sigma : {0.5, 1.5, 4.0}) {
    CAPTURE(sigma);
    KeyStream s(testing::testKey(11), 3, MaskStream::kNoise, 0);
    const size_t n = 400'000;
    std::map<int64_t, size_t> seen;
    for (size_t i = 0; i < n; ++i) ++seen[discreteGaussian(s, sigma)];
    const auto pmf = discreteGaussianPmf(sigma);
    double chi2 = 0, pooled_p = 0, pooled_seen = 0;
    size_t cells = 0;
    for (const auto& [y, p] : pmf) {
      const double expected = p * n, got = seen.count(y) ? double(seen[y]) : 0.0;
      if (expected >= 20) {
        chi2 += (got - expected) * (got - expected) / expected;
        ++cells;
      } else {
        pooled_p += p;
        pooled_seen += got;
      }
    }
    if (pooled_p * n >= 20) {
      chi2 += (pooled_seen - pooled_p * n) * (pooled_seen - pooled_p * n) / (pooled_p * n);
      ++cells;
    }
    REQUIRE(cells >= 3);
    const double df = double(cells - 1), z = 3.719;  // the normal's 1 - 1e-4 quantile
    const double bound = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
    INFO("chi2 " << chi2 << " over " << df << " degrees of freedom, bound " << bound);
    CHECK(chi2 < bound);
  }
  // Large sigmas (the ring's): mean 0 and the distribution's own variance (just under sigma^2),
  // within six standard errors.
  for (double sigma : {37.5, 1e4, 3e8}) {
    CAPTURE(sigma);
    KeyStream s(testing::testKey(12), 4, MaskStream::kNoise, 0);
    const size_t n = 200'000;
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; ++i) {
      const double y = static_cast<double>(discreteGaussian(s, sigma));
      sum += y;
      sq += y * y;
    }
    const double mean = sum / n, var = sq / n - mean * mean;
    CHECK(std::fabs(mean) < 6 * sigma / std::sqrt(double(n)));
    CHECK(std::fabs(var / (sigma * sigma) - 1) < 6 * std::sqrt(2.0 / n));
  }
  KeyStream s(testing::testKey(1), 1, MaskStream::kNoise, 0);
  CHECK_THROWS_AS(discreteGaussian(s, 0.0), InvalidArgument);
  CHECK_THROWS_AS(discreteGaussian(s, double(NAN)), InvalidArgument);
  CHECK_THROWS_AS(discreteGaussian(s, 2 * kMaxClientNoise), InvalidArgument);
}

TEST_CASE(
    "dp: distributed DP adds no noise at the root, derives min_clients, and refuses what it "
    "cannot account",
    "[privacy][dp][ddg]") {
  DpConfig c = config(1.0, 1.0);
  c.mechanism = DpMechanism::kDistributed;
  c.accountant = DpAccountant::kRdp;
  const ClientDp dp(c, 0.1, 50, 1);  // 100 clients expected a round
  REQUIRE(dp.distributed());
  CHECK(dp.minClients() == 50);  // half of q N
  // The noise is in the ring sum already: the root only divides by q N.
  std::vector<float> v{1.0f, -2.0f, 0.5f};
  dp.privatize(v, 40.0, dp.expectedWeight(), 1);
  CHECK(v[0] == Approx(40.0 / 100));
  CHECK(v[1] == Approx(-80.0 / 100));
  // Its epsilon is the distributed accountant's, with tau at the floor over the population and
  // the largest model (the model's size is not known here).
  CHECK(
      dp.epsilon(50) ==
      Approx(DdgAccountant(0.1, 1.0, ddgTau(kMinClientNoise, 1000), kMaxDdgDim, 1e-5).epsilon(50)));
  // From a target: reached, and 1% less noise would pass it.
  DpConfig t = c;
  t.noise_multiplier = 0;
  t.target_epsilon = 3.0;
  const ClientDp from_target(t, 0.1, 50, 1);
  CHECK(from_target.epsilon(50) <= 3.0);
  CHECK(ClientDp::accountantEpsilon(t, 0.1, 0.99 * from_target.noiseMultiplier(), 50) > 3.0);
  // Small populations: at least 3 clients' noise.
  DpConfig few = c;
  few.population = 20;
  CHECK(ClientDp(few, 0.2, 5, 1).minClients() == 3);
  // Refused: the PLD accountant, min_clients under central DP or above the expected count.
  DpConfig pld = c;
  pld.accountant = DpAccountant::kPld;
  CHECK_THROWS_MATCHING(pld.validate(), ConfigError, Contains("privacy.accountant"));
  DpConfig central = config(1.0, 1.0);
  central.min_clients = 10;
  CHECK_THROWS_MATCHING(central.validate(), ConfigError, Contains("privacy.min_clients"));
  DpConfig many = c;
  many.min_clients = 101;
  CHECK_THROWS_MATCHING(ClientDp(many, 0.1, 50, 1), ConfigError, Contains("privacy.min_clients"));
}

TEST_CASE(
    "dp: adaptive clipping splits the noise between the sum and the count, and moves the clip "
    "toward the quantile",
    "[privacy][dp][adaptive]") {
  DpConfig c = config(1.0, 1.0);
  c.population = 100'000;
  c.adaptive_clip = true;
  c.target_quantile = 0.5;
  c.clip_lr = 0.2;
  ClientDp dp(c, 0.1, 50, 1);  // q N = 10,000: the count's default noise is 500
  CHECK(dp.countNoise() == Approx(500));
  // Andrew et al.: z^-2 = z_sum^-2 + (2 sigma_b)^-2.
  const double zs = dp.sumNoiseMultiplier();
  CHECK(1 / (zs * zs) + 1 / (4 * 500.0 * 500.0) == Approx(1.0));
  CHECK(zs > 1.0);
  CHECK(dp.clip() == 1.0);
  // Every update within the clip (b about 1): the clip shrinks by about exp(-0.2 x 0.5); none
  // (b about 0): it grows by about exp(0.1). The count's noise over q N is 0.05 here: within 6 of
  // those on b.
  const double all = dp.adaptClip(10'000, 10'000, 1);
  CHECK(all < 1.0);
  CHECK(std::fabs(std::log(all) / -0.2 - 0.5) < 6 * 0.05);
  ClientDp fresh(c, 0.1, 50, 1);
  const double none = fresh.adaptClip(0, 10'000, 1);
  CHECK(none > 1.0);
  CHECK(std::fabs(std::log(none) / -0.2 + 0.5) < 6 * 0.05);
  // The count is noised: the same count in two rounds moves the clip by different steps.
  ClientDp a(c, 0.1, 50, 1);
  const double r1 = a.adaptClip(5'000, 10'000, 1), r2 = a.adaptClip(5'000, 10'000, 2) / r1;
  CHECK(r1 != r2);
  // The noise on the sum is the sum's multiplier times the current clip.
  ClientDp n(c, 0.1, 50, 1);
  n.setClip(0.25);
  std::vector<float> v(200'000, 0.0f);
  n.privatize(v, 10'000, n.expectedWeight(), 3);
  double sq = 0;
  for (float x : v) sq += double(x) * x;
  const double sd = std::sqrt(sq / v.size()), want = zs * 0.25 / n.expectedWeight();
  CHECK(std::fabs(sd / want - 1) < 6 / std::sqrt(2.0 * v.size()));
  // Refused: a count too quiet to leave the sum any budget, a bad quantile or step, under
  // distributed DP, and a clip that is not a number.
  DpConfig quiet = c;
  quiet.count_noise = 0.4;  // 2 x 0.4 < z = 1
  CHECK_THROWS_MATCHING(ClientDp(quiet, 0.1, 50, 1), ConfigError, Contains("clip_count_noise"));
  for (double qt : {0.0, 1.0, -0.1}) {
    DpConfig b = c;
    b.target_quantile = qt;
    CHECK_THROWS_MATCHING(b.validate(), ConfigError, Contains("privacy.target_quantile"));
  }
  DpConfig lr = c;
  lr.clip_lr = 0;
  CHECK_THROWS_MATCHING(lr.validate(), ConfigError, Contains("privacy.clip_lr"));
  DpConfig ddg = c;
  ddg.mechanism = DpMechanism::kDistributed;
  ddg.accountant = DpAccountant::kRdp;
  CHECK_THROWS_MATCHING(ddg.validate(), ConfigError, Contains("privacy.adaptive_clip"));
  CHECK_THROWS_AS(dp.setClip(double(NAN)), InvalidArgument);
  CHECK_THROWS_AS(ClientDp(config(1.0, 1.0), 0.5, 10, 1).adaptClip(1, 2, 1), InvalidArgument);
}

TEST_CASE("dp: the floor a root logs for its clients never exceeds the noise it asks for",
          "[privacy][dp][ddg]") {
  // secagg.min_noise = minNoiseText(dp): at most z / sqrt(m), so a client configured with it
  // takes the root's rounds, and within 2e-5 of it, so the floor holds the root to its noise.
  size_t cases = 0;
  for (double z = 0.3; z < 20; z *= 1.37)
    for (uint64_t m : {3u, 7u, 20u, 50u, 101u, 999u, 12345u}) {
      DpConfig c = config(1.0, z);
      c.mechanism = DpMechanism::kDistributed;
      c.accountant = DpAccountant::kRdp;
      c.population = 1'000'000;
      c.min_clients = m;
      const ClientDp dp(c, 0.1, 1, 1);
      const double asked = z / std::sqrt(double(m));
      const double logged = std::stod(minNoiseText(dp));
      CAPTURE(z, m, minNoiseText(dp));
      CHECK(logged <= asked);
      CHECK(logged >= asked * (1 - 2e-5));
      ++cases;
    }
  CHECK(cases > 50);
  CHECK(minNoiseText(ClientDp(config(1.0, 1.0), 0.5, 10, 1)) == "0");
}
