#include "privacy/accountant.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace starling::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log(exp(a) + exp(b)).
double logAdd(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  const double hi = std::max(a, b), lo = std::min(a, b);
  return hi + std::log1p(std::exp(lo - hi));
}

double logComb(double n, double k) {
  return std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1);
}

// Integer alpha: A_alpha = sum_i C(alpha, i) q^i (1-q)^(alpha-i) exp((i^2 - i) / (2 sigma^2)).
double logAInt(double q, double sigma, uint64_t alpha) {
  double acc = -kInf;
  const double lq = std::log(q), l1mq = std::log1p(-q);
  for (uint64_t i = 0; i <= alpha; ++i) {
    const double di = static_cast<double>(i);
    const double t = logComb(static_cast<double>(alpha), di) + di * lq +
                     (static_cast<double>(alpha) - di) * l1mq +
                     (di * di - di) / (2 * sigma * sigma);
    acc = logAdd(acc, t);
  }
  return acc;
}

// Fractional alpha (Mironov, Talwar, Zhang 2019, Section 3.3): A_alpha split at
// z0 = sigma^2 log(1/q - 1) + 1/2 into two series with erfc terms, summed until both terms
// decrease and are 30 nats below the total.
double logAFrac(double q, double sigma, double alpha) {
  double a0 = -kInf, a1 = -kInf, last0 = -kInf, last1 = -kInf;
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  const double lq = std::log(q), l1mq = std::log1p(-q);
  for (int i = 0; i < 1000; ++i) {
    const double di = i, j = alpha - di;
    const double coef = logComb(alpha, di);
    const double t0 = coef + di * lq + j * l1mq, t1 = coef + j * lq + di * l1mq;
    const double e0 = std::log(0.5) + logErfc((di - z0) / (std::sqrt(2.0) * sigma));
    const double e1 = std::log(0.5) + logErfc((z0 - j) / (std::sqrt(2.0) * sigma));
    const double s0 = t0 + (di * di - di) / (2 * sigma * sigma) + e0;
    const double s1 = t1 + (j * j - j) / (2 * sigma * sigma) + e1;
    a0 = logAdd(a0, s0);
    a1 = logAdd(a1, s1);
    const double total = logAdd(a0, a1);
    if (s0 < last0 && s1 < last1 && std::max(s0, s1) < total - 30) return total;
    last0 = s0;
    last1 = s1;
  }
  return kInf;  // did not converge: the order is left out (infinite RDP)
}

// Epsilon at delta after `times` compositions of one step's RDP `rdp` at `orders` (0 times: 0).
double composedEpsilon(std::span<const double> orders, std::span<const double> rdp, uint64_t times,
                       double delta) {
  if (times == 0) return 0;
  std::vector<double> composed(rdp.size());
  for (size_t i = 0; i < rdp.size(); ++i) composed[i] = rdp[i] * static_cast<double>(times);
  return epsilonFromRdp(orders, composed, delta);
}

// The smallest noise multiplier (within rel_tol) whose `eps` is at most the target, an epsilon
// that shrinks as the noise grows: doubling from 1, then bisection. ConfigError naming `what`
// when none up to 1e4 is.
double smallestNoise(const std::function<double(double)>& eps, double target_epsilon, double q,
                     uint64_t rounds, double delta, double rel_tol, const char* what) {
  if (!(target_epsilon > 0 && std::isfinite(target_epsilon)))
    STARLING_THROW(ConfigError, "privacy.target_epsilon must be finite and > 0, got ",
                   target_epsilon);
  double hi = 1.0;
  while (eps(hi) > target_epsilon) {
    hi *= 2;
    if (hi > 1e4)
      STARLING_THROW(ConfigError, "no noise multiplier up to 1e4 gives ", what,
                     " <= ", target_epsilon, " after ", rounds, " rounds at sampling rate ", q,
                     " and delta ", delta, ": raise privacy.target_epsilon or lower the rounds");
  }
  double lo = 0;
  while (hi - lo > rel_tol * hi) {
    const double mid = 0.5 * (lo + hi);
    (eps(mid) > target_epsilon ? lo : hi) = mid;
  }
  return hi;
}

}  // namespace

// log(erfc(x)), accurate where erfc underflows: for large x, erfc(x) = exp(-x^2) / (x sqrt(pi))
// (1 - 1/(2x^2) + 3/(4x^4) - 15/(8x^6) + ...).
double logErfc(double x) {
  if (x < 20) return std::log(std::erfc(x));
  const double inv2 = 1.0 / (x * x);
  const double series = 1 - 0.5 * inv2 + 0.75 * inv2 * inv2 - 1.875 * inv2 * inv2 * inv2;
  return -x * x - std::log(x) - 0.5 * std::log(M_PI) + std::log(series);
}

const std::vector<double>& defaultOrders() {
  static const std::vector<double> orders = [] {
    std::vector<double> o;
    for (int x = 1; x < 100; ++x) o.push_back(1 + x / 10.0);
    for (int a = 11; a < 64; ++a) o.push_back(a);
    for (double a : {128.0, 256.0, 512.0, 1024.0}) o.push_back(a);
    return o;
  }();
  return orders;
}

double logA(double q, double sigma, double alpha) {
  STARLING_CHECK_ARG(q > 0 && q < 1 && sigma > 0 && alpha > 1, "logA: q ", q, ", sigma ", sigma,
                     ", alpha ", alpha);
  if (alpha == std::floor(alpha)) return logAInt(q, sigma, static_cast<uint64_t>(alpha));
  return logAFrac(q, sigma, alpha);
}

std::vector<double> rdpSubsampledGaussian(double q, double sigma, std::span<const double> orders) {
  STARLING_CHECK_ARG(q >= 0 && q <= 1, "the sampling rate must be in [0, 1], got ", q);
  STARLING_CHECK_ARG(sigma >= 0 && std::isfinite(sigma), "the noise multiplier must be >= 0, got ",
                     sigma);
  std::vector<double> out;
  for (double a : orders) {
    STARLING_CHECK_ARG(a > 1, "an RDP order must be > 1, got ", a);
    if (q == 0)
      out.push_back(0);
    else if (sigma == 0 || std::isinf(a))
      out.push_back(kInf);
    else if (q == 1)
      out.push_back(a / (2 * sigma * sigma));
    else
      out.push_back(logA(q, sigma, a) / (a - 1));
  }
  return out;
}

double epsilonFromRdp(std::span<const double> orders, std::span<const double> rdp, double delta) {
  STARLING_CHECK_ARG(orders.size() == rdp.size(), "epsilonFromRdp: ", orders.size(), " orders, ",
                     rdp.size(), " values");
  STARLING_CHECK_ARG(delta > 0 && delta < 1, "delta must be in (0, 1), got ", delta);
  double best = kInf;
  for (size_t i = 0; i < orders.size(); ++i) {
    const double a = orders[i], r = rdp[i];
    double eps;
    if (r < 0) {
      eps = 0;  // numerically negative: nothing is revealed
    } else if (delta * delta + std::expm1(-r) > 0) {
      eps = 0;  // the KL bound: delta >= sqrt(1 - exp(-r)) already
    } else if (a > 1.01) {
      // Canonne, Kamath, Steinke 2020, Proposition 12.
      eps = r + std::log1p(-1 / a) - std::log(delta * a) / (a - 1);
    } else {
      eps = kInf;
    }
    best = std::min(best, eps);
  }
  return std::max(0.0, best);
}

RdpAccountant::RdpAccountant(double q, double sigma, double delta)
    : q_(q), sigma_(sigma), delta_(delta) {
  STARLING_CHECK_ARG(delta > 0 && delta < 1, "delta must be in (0, 1), got ", delta);
  rdp_ = rdpSubsampledGaussian(q, sigma, defaultOrders());
}

double RdpAccountant::epsilon(uint64_t rounds) const {
  return composedEpsilon(defaultOrders(), rdp_, rounds, delta_);
}

uint64_t lastRoundWithin(const std::function<double(uint64_t)>& epsilon, double budget,
                         uint64_t max_rounds) {
  if (max_rounds == 0 || epsilon(1) > budget) return 0;
  uint64_t lo = 1, hi = max_rounds;
  if (epsilon(hi) <= budget) return hi;
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (epsilon(mid) <= budget ? lo : hi) = mid;
  }
  return lo;
}

uint64_t RdpAccountant::roundsWithin(double budget, uint64_t max_rounds) const {
  return lastRoundWithin([&](uint64_t t) { return epsilon(t); }, budget, max_rounds);
}

double noiseForEpsilon(double target_epsilon, double q, uint64_t rounds, double delta,
                       double rel_tol) {
  return smallestNoise([&](double sigma) { return RdpAccountant(q, sigma, delta).epsilon(rounds); },
                       target_epsilon, q, rounds, delta, rel_tol, "epsilon");
}

double rdpPoissonSubsampled(double q, const std::function<double(uint64_t)>& eps, uint64_t alpha,
                            bool tight) {
  STARLING_CHECK_ARG(q >= 0 && q <= 1 && alpha >= 2, "subsampled RDP: q ", q, ", order ", alpha);
  if (q == 0) return 0;
  const double a = static_cast<double>(alpha);
  const double whole = eps(alpha);
  if (q == 1) return whole;
  const double lq = std::log(q), l1mq = std::log1p(-q);
  // l = 0 and 1 together: (1-q)^(a-1) (a q - q + 1).
  double acc = (a - 1) * l1mq + std::log1p((a - 1) * q);
  for (uint64_t l = 2; l <= alpha; ++l) {
    const double dl = static_cast<double>(l);
    const double e = eps(l);
    if (std::isinf(e)) return tight ? kInf : whole;
    const double coef = tight || l == 2 ? 0.0 : std::log(3.0);
    acc = logAdd(acc, coef + logComb(a, dl) + dl * lq + (a - dl) * l1mq + (dl - 1) * e);
  }
  const double bound = acc / (a - 1);
  return tight ? bound : std::min(bound, whole);
}

double ddgTau(double sigma_c, uint64_t m) {
  STARLING_CHECK_ARG(sigma_c > 0 && std::isfinite(sigma_c), "ddgTau: sigma ", sigma_c);
  constexpr uint64_t kExact = 1'000'000;
  double tau = 0;
  const double c = 2 * M_PI * M_PI * sigma_c * sigma_c;
  const uint64_t last = std::min<uint64_t>(m > 0 ? m - 1 : 0, kExact);
  for (uint64_t k = 1; k <= last; ++k) {
    const double dk = static_cast<double>(k);
    const double term = std::exp(-c * dk / (dk + 1));
    if (term == 0) return 10 * tau;  // the terms shrink with k: every later one is 0 too
    tau += term;
  }
  // Past k = 10^6 each term is below exp(-c K / (K + 1)): the rest bounded by their count times it.
  if (m > kExact + 1) {
    const double dk = static_cast<double>(kExact);
    tau += static_cast<double>(m - 1 - kExact) * std::exp(-c * dk / (dk + 1));
  }
  return 10 * tau;
}

double rdpDistributedDiscreteGaussian(double s, double tau, uint64_t dim, uint64_t alpha) {
  STARLING_CHECK_ARG(s >= 0 && tau >= 0 && dim > 0 && alpha >= 1,
                     "distributed discrete Gaussian: s ", s, ", tau ", tau, ", dim ", dim,
                     ", order ", alpha);
  const double a = static_cast<double>(alpha), d = static_cast<double>(dim);
  const double one = a * s * s / 2 + tau * d;
  const double two = a / 2 * (s + std::sqrt(d) * tau) * (s + std::sqrt(d) * tau);
  return std::min(one, two);
}

const std::vector<double>& ddgOrders() {
  static const std::vector<double> orders = [] {
    std::vector<double> o;
    for (int a = 2; a < 64; ++a) o.push_back(a);
    o.push_back(128);
    o.push_back(256);
    return o;
  }();
  return orders;
}

DdgAccountant::DdgAccountant(double q, double z, double tau, uint64_t dim, double delta)
    : delta_(delta) {
  STARLING_CHECK_ARG(q >= 0 && q <= 1, "the sampling rate must be in [0, 1], got ", q);
  STARLING_CHECK_ARG(z > 0 && std::isfinite(z), "the noise multiplier must be > 0, got ", z);
  STARLING_CHECK_ARG(tau >= 0 && std::isfinite(tau) && dim > 0, "tau ", tau, " and dim ", dim);
  STARLING_CHECK_ARG(delta > 0 && delta < 1, "delta must be in (0, 1), got ", delta);
  const auto eps = [&](uint64_t a) { return rdpDistributedDiscreteGaussian(1 / z, tau, dim, a); };
  for (double a : ddgOrders()) {
    rdp_.push_back(rdpPoissonSubsampled(q, eps, static_cast<uint64_t>(a), false));
    rdp_whole_.push_back(eps(static_cast<uint64_t>(a)));
  }
}

double DdgAccountant::epsilonKnownSample(uint64_t participations) const {
  return composedEpsilon(ddgOrders(), rdp_whole_, participations, delta_);
}

double DdgAccountant::epsilon(uint64_t rounds) const {
  return composedEpsilon(ddgOrders(), rdp_, rounds, delta_);
}

uint64_t DdgAccountant::roundsWithin(double budget, uint64_t max_rounds) const {
  return lastRoundWithin([&](uint64_t t) { return epsilon(t); }, budget, max_rounds);
}

double ddgNoiseForEpsilon(double target_epsilon, double q, uint64_t rounds, double tau,
                          uint64_t dim, double delta, double rel_tol) {
  return smallestNoise(
      [&](double z) { return DdgAccountant(q, z, tau, dim, delta).epsilon(rounds); },
      target_epsilon, q, rounds, delta, rel_tol, "distributed epsilon");
}

std::vector<double> rdpDiscreteGaussian(double sigma, double sensitivity,
                                        std::span<const double> orders) {
  STARLING_CHECK_ARG(sigma > 0 && sensitivity >= 0, "discrete Gaussian: sigma ", sigma,
                     ", sensitivity ", sensitivity);
  const double rho = sensitivity * sensitivity / (2 * sigma * sigma);
  std::vector<double> out;
  for (double a : orders) out.push_back(rho * a);
  return out;
}

}  // namespace starling::privacy
