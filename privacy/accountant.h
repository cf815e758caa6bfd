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

// The discrete Gaussian mechanism's RDP at each order: rho alpha, rho = sensitivity^2 /
// (2 sigma^2) (Canonne, Kamath, Steinke 2020, Proposition 5).
std::vector<double> rdpDiscreteGaussian(double sigma, double sensitivity,
                                        std::span<const double> orders);

}  // namespace starling::privacy
