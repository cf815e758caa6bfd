#pragma once
// Differential privacy accounting for client-level DP-FedAvg: the Rényi DP (RDP) of the
// Poisson-subsampled Gaussian mechanism (Mironov, Talwar, Zhang 2019: each round samples every
// client independently with probability q, clips each update to C and adds Gaussian noise of
// standard deviation sigma C to the sum), composed over rounds, and converted to (epsilon, delta)
// with the improved conversion of Canonne, Kamath and Steinke 2020 (Proposition 12) / Asoodeh et
// al. 2020. The discrete Gaussian's RDP (rho-zCDP, rho = sensitivity^2 / (2 sigma^2)) is here too,
// for noise added in the ring (distributed DP under secure aggregation).
//
// Google's dp-accounting (PyPI) is the oracle: tests/privacy compares epsilon within 1% over a
// grid of rates, noise multipliers, rounds and deltas (tools/dp_oracle.py writes its figures).
// The orders are dp-accounting's defaults, so both search the same set.
//
// The guarantee holds only for the sampling it assumes: a run accounted this way must sample
// clients by Poisson sampling with rate q (sampling.poisson). Fixed-size sampling without
// replacement is another mechanism (Wang, Balle, Kasiviswanathan 2019), not accounted here.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace starling::privacy {

// log(erfc(x)), accurate where erfc underflows (the asymptotic series beyond x = 20).
double logErfc(double x);

// dp-accounting's default RDP orders: 1.1, 1.2, ..., 10.9, 11, 12, ..., 63, 128, 256, 512, 1024.
const std::vector<double>& defaultOrders();

// log A_alpha of the Poisson-subsampled Gaussian (sampling rate q in (0, 1), noise multiplier
// sigma > 0) at order alpha > 1; the RDP at alpha is log A_alpha / (alpha - 1).
double logA(double q, double sigma, double alpha);
// RDP at each order of one round (q = 0: 0; q = 1: the Gaussian's alpha / (2 sigma^2); sigma = 0:
// infinite).
std::vector<double> rdpSubsampledGaussian(double q, double sigma, std::span<const double> orders);
// The smallest epsilon over the orders for `rdp` (already composed) and delta in (0, 1).
double epsilonFromRdp(std::span<const double> orders, std::span<const double> rdp, double delta);

// The accountant of one run: q, sigma, delta fixed; epsilon after any number of rounds.
class RdpAccountant {
 public:
  // InvalidArgument for q outside [0, 1], sigma < 0 or not finite, delta outside (0, 1).
  RdpAccountant(double q, double sigma, double delta);
  // Epsilon after `rounds` rounds (composition multiplies the RDP by the rounds).
  double epsilon(uint64_t rounds) const;
  // The most rounds whose epsilon is at most `budget` (0 when even one exceeds it).
  uint64_t roundsWithin(double budget, uint64_t max_rounds) const;
  double q() const { return q_; }
  double sigma() const { return sigma_; }
  double delta() const { return delta_; }

 private:
  double q_, sigma_, delta_;
  std::vector<double> rdp_;  // one round, at defaultOrders()
};

// The largest T in [0, max_rounds] with epsilon(T) <= budget, for an epsilon that grows with the
// rounds (bisection; either accountant's roundsWithin).
uint64_t lastRoundWithin(const std::function<double(uint64_t)>& epsilon, double budget,
                         uint64_t max_rounds);

// The smallest noise multiplier (within rel_tol) whose epsilon after `rounds` rounds is at most
// `target_epsilon`; ConfigError when none up to 1e4 is (a target too small for these rounds).
double noiseForEpsilon(double target_epsilon, double q, uint64_t rounds, double delta,
                       double rel_tol = 1e-4);

// ---- Distributed DP: the sum of clients' discrete Gaussians (privacy/dp.h, privacy.dp =
// distributed)
//
// RDP of a mechanism under Poisson subsampling at rate q, from the mechanism's RDP `eps` at
// integer orders (Zhu and Wang, ICML 2019, "Poisson subsampled Rényi differential privacy"), at an
// integer order alpha >= 2:
//   general (Theorem 6, any mechanism): log((1-q)^(a-1) (a q - q + 1)
//       + C(a,2) q^2 (1-q)^(a-2) e^eps(2) + 3 sum_{l=3..a} C(a,l) q^l (1-q)^(a-l) e^((l-1) eps(l)))
//       / (a - 1), and never above eps(alpha) itself;
//   tight (the same sum with every coefficient 1, the l = 2 term included): exact for mechanisms
//       such as the Gaussian, whose subsampled RDP it equals (Mironov, Talwar, Zhang's A_alpha;
//       tested against logA), and not a bound for others.
double rdpPoissonSubsampled(double q, const std::function<double(uint64_t)>& eps, uint64_t alpha,
                            bool tight);

// The sum of m clients' discrete Gaussian noise, each of standard deviation sigma_c, released
// with a signal of L2 sensitivity Delta (Kairouz, Liu, Steinke, ICML 2021, Proposition 14 /
// their code's Eq. 17): at order alpha the RDP is at most
//   min(alpha s^2 / 2 + tau d, alpha / 2 (s + sqrt(d) tau)^2),
// s = Delta / (sqrt(m) sigma_c) (one over the sum's noise multiplier), d values, and
//   tau = 10 sum_{k=1..m-1} exp(-2 pi^2 sigma_c^2 k / (k + 1)),
// the price of a sum of discrete Gaussians not being one. ddgTau computes tau (exactly up to
// m = 10^6 + 1; beyond, the terms past k = 10^6 are each bounded by their largest: an upper bound).
double ddgTau(double sigma_c, uint64_t m);
double rdpDistributedDiscreteGaussian(double s, double tau, uint64_t dim, uint64_t alpha);
// The integer orders the distributed accountant searches: 2 .. 63, 128, 256.
const std::vector<double>& ddgOrders();

// The accountant of a run under distributed DP: every round samples by Poisson at rate q, and its
// sum carries the discrete Gaussian noise of at least m clients at noise multiplier z (the sum's
// noise standard deviation over its sensitivity, both in ring units); `tau` (ddgTau) is an upper
// bound for every round of the run, over `dim` values (privacy/dp.h says how the run bounds it).
// Each round's RDP is rdpDistributedDiscreteGaussian's at s = 1 / z, subsampled by the general
// bound above; composed over rounds and converted as RdpAccountant does.
class DdgAccountant {
 public:
  // InvalidArgument for q outside [0, 1], z not positive and finite, tau negative or not finite,
  // dim 0, delta outside (0, 1).
  DdgAccountant(double q, double z, double tau, uint64_t dim, double delta);
  // Against whoever receives the models: the sample is secret, and amplifies.
  double epsilon(uint64_t rounds) const;
  uint64_t roundsWithin(double budget, uint64_t max_rounds) const;
  // Against a party that knows the sample (the root draws it and sends each round's clients the
  // roster): a client's epsilon after it took part in `participations` rounds, no amplification.
  double epsilonKnownSample(uint64_t participations) const;

 private:
  double delta_;
  std::vector<double> rdp_;        // one round, at ddgOrders()
  std::vector<double> rdp_whole_;  // one participation, not subsampled
};

// The smallest z (within rel_tol) whose distributed epsilon after `rounds` rounds is at most
// `target_epsilon`; ConfigError when none up to 1e4 is.
double ddgNoiseForEpsilon(double target_epsilon, double q, uint64_t rounds, double tau,
                          uint64_t dim, double delta, double rel_tol = 1e-4);

// The discrete Gaussian mechanism's RDP at each order: rho alpha, rho = sensitivity^2 /
// (2 sigma^2) (Canonne, Kamath, Steinke 2020, Proposition 5).
std::vector<double> rdpDiscreteGaussian(double sigma, double sensitivity,
                                        std::span<const double> orders);

}  // namespace starling::privacy
