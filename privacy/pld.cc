#include "privacy/pld.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <unsupported/Eigen/FFT>
#include <vector>

#include "core/error.h"
#include "privacy/accountant.h"

namespace starling::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kTail = 9.5;                   // standard deviations kept: tails of 1e-21
constexpr size_t kMaxPoints = size_t{1} << 20;  // the composition's window, at most

double logAdd(double a, double b) {
  const double hi = std::max(a, b), lo = std::min(a, b);
  return hi + std::log1p(std::exp(lo - hi));
}
// log P(Z > z) and log P(Z <= z), Z standard normal, finite far into the tails.
double logUpper(double z) { return std::log(0.5) + logErfc(z / std::sqrt(2.0)); }
double logLower(double z) { return logUpper(-z); }

// One neighbouring relation's privacy loss as an increasing function g of y:
//   remove: y ~ (1 - q) N(0, s^2) + q N(1, s^2), g(y) = l(y);
//   add:    y ~ N(0, s^2),                       g(y) = -l(-y);
// with l(x) = log(1 - q + q e^((2x - 1) / (2 s^2))), the loss of x drawn from the mixture
// against N(0, s^2).
struct Relation {
  double q, s;
  bool remove;

  double l(double x) const {
    const double a = (2 * x - 1) / (2 * s * s);
    return q == 1 ? a : logAdd(std::log1p(-q), std::log(q) + a);
  }
  // The x with l(x) = v, when there is one (v > log(1 - q)).
  std::optional<double> lInv(double v) const {
    if (q == 1) return s * s * v + 0.5;
    const double floor = std::log1p(-q);
    if (!(v > floor)) return std::nullopt;
    // log(e^v - (1 - q)) without cancellation.
    const double w = v + std::log1p(-std::exp(floor - v));
    return s * s * (w - std::log(q)) + 0.5;
  }
  double g(double y) const { return remove ? l(y) : -l(-y); }
};

// Losses k h for k in [lo, lo + p.size()), and an infinite loss of mass `inf`.
struct Pmf {
  int64_t lo = 0;
  std::vector<double> p;
  double inf = 0;
};

// One round's exact delta(eps) = P(L > eps) - e^eps Q(L > eps) for the relation's pair, its
// large terms in log space (e^eps alone overflows past eps = 709).
double exactDelta(const Relation& r, double eps) {
  const double s = r.s;
  if (r.remove) {
    // L = l(y) > eps <=> y > x = l^-1(eps), y from the mixture against N(0, s^2): delta =
    // q P(N(1) > x) - (e^eps - (1 - q)) P(N(0) > x); all of it when eps is below l's floor.
    const std::optional<double> x = r.lInv(eps);
    if (!x) return -std::expm1(eps);
    const double w = r.q == 1 ? eps : eps + std::log1p(-(1 - r.q) * std::exp(-eps));
    return r.q * std::exp(logUpper((*x - 1) / s)) - std::exp(w + logUpper(*x / s));
  }
  // L = -l(x), x ~ N(0, s^2) against the mixture: L > eps <=> x < l^-1(-eps): delta =
  // P(N(0) < x) - e^eps ((1 - q) P(N(0) < x) + q P(N(1) < x)); nothing when no x has such a loss.
  const std::optional<double> x = r.lInv(-eps);
  if (!x) return 0.0;
  const double lo0 = logLower(*x / s), lo1 = logLower((*x - 1) / s);
  return std::exp(lo0) - std::exp(eps + logAdd(std::log1p(-r.q) + lo0, std::log(r.q) + lo1));
}

// The connect-the-dots PMF (Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022): losses on the
// grid whose delta(eps) equals the exact one at every grid point and, between them, lies on the
// chord in e^eps above the exact curve (which is convex in e^eps): a pessimistic PMF, tighter than
// rounding each loss up. On [eps_i, eps_i+1] delta = A_i - B_i e^eps, with A_i the mass above
// eps_i and B_i its sum of e^-eps_j; the mass at eps_i is e^eps_i (B_i-1 - B_i). Below the grid's
// first point everything is moved up to it; above its last, delta there is the infinite loss's.
// Nothing when the grid would have more than kMaxPoints points (the caller coarsens it).
std::optional<Pmf> discretize(const Relation& r, double h) {
  const double y_lo = -kTail * r.s, y_hi = (r.remove ? 1.0 : 0.0) + kTail * r.s;
  if ((r.g(y_hi) - r.g(y_lo)) / h + 3 > static_cast<double>(kMaxPoints)) return std::nullopt;
  const auto kmin = static_cast<int64_t>(std::floor(r.g(y_lo) / h));
  const auto kmax = static_cast<int64_t>(std::ceil(r.g(y_hi) / h)) + 1;
  const auto n = static_cast<size_t>(kmax - kmin + 1);
  std::vector<double> d(n);
  for (size_t i = 0; i < n; ++i)
    d[i] = std::max(0.0, exactDelta(r, static_cast<double>(kmin + static_cast<int64_t>(i)) * h));
  Pmf pmf;
  pmf.lo = kmin;
  pmf.p.assign(n, 0.0);
  pmf.inf = d[n - 1];
  // With D_i = d_i - d_i+1 (and D = 0 above the last point), the mass at point i + 1 is
  // (e^h D_i - D_i+1) / (e^h - 1): e^eps_i B's change, written without e^eps itself.
  const double eh = std::exp(h), em1 = std::expm1(h);
  double mass = 0.0;
  for (size_t i = 0; i + 1 < n; ++i) {
    const double gap = d[i] - d[i + 1], next = i + 2 < n ? d[i + 1] - d[i + 2] : 0.0;
    const double p = std::max(0.0, (eh * gap - next) / em1);
    pmf.p[i + 1] = p;
    mass += p;
  }
  pmf.p[0] = std::max(0.0, 1.0 - mass - pmf.inf);
  return pmf;
}

// The composed PMF of `rounds` rounds: losses (base + i) h, i < size, and the infinite loss.
struct Composed {
  int64_t base = 0;
  std::vector<double> p;
  double inf = 0;
};

std::optional<Composed> compose(const Pmf& one, uint64_t rounds, double h) {
  const double t = static_cast<double>(rounds);
  const auto value = [&](size_t i) {
    return static_cast<double>(one.lo + static_cast<int64_t>(i)) * h;
  };
  // log E[e^(lambda L)] over the finite losses.
  const auto logMgf = [&](double lambda) {
    double hi = -kInf;
    for (size_t i = 0; i < one.p.size(); ++i)
      if (one.p[i] > 0) hi = std::max(hi, lambda * value(i));
    double sum = 0;
    for (size_t i = 0; i < one.p.size(); ++i)
      if (one.p[i] > 0) sum += one.p[i] * std::exp(lambda * value(i) - hi);
    return hi + std::log(sum);
  };
  // The window: where Chernoff's bound leaves less than e^-40 (4e-18) of the composed mass outside
  // each side (it aliases into the window), within the composed support [T lo, T hi].
  double top = t * value(one.p.size() - 1), bottom = t * value(0);
  for (double lambda : {1.0 / 64, 1.0 / 16, 0.25, 1.0, 4.0, 16.0, 64.0}) {
    top = std::min(top, (t * logMgf(lambda) + 40) / lambda);
    bottom = std::max(bottom, -(t * logMgf(-lambda) + 40) / lambda);
  }
  const double width = std::max(top - bottom, 0.0) + 4 * h;
  size_t n = 1;
  while (static_cast<double>(n) * h < width) {
    n *= 2;
    if (n > kMaxPoints) return std::nullopt;
  }
  Composed c;
  c.base = static_cast<int64_t>(std::floor(bottom / h)) - 1;
  const auto N = static_cast<int64_t>(n);
  const auto at = [&](int64_t k) { return static_cast<size_t>(((k % N) + N) % N); };
  std::vector<std::complex<double>> x(n), f;
  for (size_t i = 0; i < one.p.size(); ++i) x[at(one.lo + static_cast<int64_t>(i))] += one.p[i];
  Eigen::FFT<double> fft;
  fft.fwd(f, x);
  for (auto& z : f) z = std::abs(z) == 0 ? z : std::pow(z, t);
  fft.inv(x, f);
  c.p.resize(n);
  // Composed index K sits at K mod n: position i holds the K of [base, base + n) congruent to it.
  for (size_t i = 0; i < n; ++i)
    c.p[i] = std::max(0.0, x[at(c.base + static_cast<int64_t>(i))].real());
  // The mass Chernoff's bound leaves outside the window (at most e^-40 each side) aliased into it:
  // counted as infinite loss, so that it can only raise epsilon.
  c.inf = std::min(1.0, -std::expm1(t * std::log1p(-std::min(one.inf, 1.0))) + 2 * std::exp(-40.0));
  return c;
}

// The smallest epsilon with delta(epsilon) <= delta: delta at every grid point from suffix sums
// (delta(eps_i) = A_i - e^eps_i B_i over the losses above eps_i), then, in the segment where it
// crosses, the exact solution of A - B e^eps = delta.
double epsilonOf(const Composed& c, double h, double delta) {
  const size_t n = c.p.size();
  const auto loss = [&](size_t i) {
    return static_cast<double>(c.base + static_cast<int64_t>(i)) * h;
  };
  // Walking down from the top: a = the mass above the current point (the infinite loss's
  // included), s = e^v B, its sum of e^(v - v_j) (kept scaled: e^v alone overflows).
  double a = c.inf, s = 0.0;
  const double step = std::exp(-h);
  for (size_t i = n; i-- > 0;) {
    const double v = loss(i);
    if (a - s > delta) {
      // delta crosses between v and the point above: a - s e^(eps - v) = delta.
      return std::max(0.0, s > 0 ? v + std::log((a - delta) / s) : kInf);
    }
    if (v <= 0) return 0.0;  // delta(0) is within: epsilon is 0
    a += c.p[i];
    s = (s + c.p[i]) * step;
  }
  // The window's bottom is above 0 and delta is still within there: below it only the
  // segment's curve, a - s e^(eps - (bottom - h)), remains.
  const double below = loss(0) - h;
  return s > 0 && a > delta ? std::max(0.0, below + std::log((a - delta) / s)) : 0.0;
}

}  // namespace

// Per relation (remove, add) and grid step: the round's PMF. Guarded: an accountant is const and
// may be shared between threads.
struct PldAccountant::Cache {
  std::mutex mutex;
  std::map<std::pair<bool, double>, std::shared_ptr<const Pmf>> pmfs;
};

PldAccountant::PldAccountant(double q, double sigma, double delta, double h)
    : q_(q), sigma_(sigma), delta_(delta), h_(h) {
  STARLING_CHECK_ARG(q > 0 && q <= 1, "PLD accountant: sampling rate ", q, " is not in (0, 1]");
  STARLING_CHECK_ARG(std::isfinite(sigma) && sigma > 0, "PLD accountant: noise multiplier ", sigma,
                     " is not positive");
  STARLING_CHECK_ARG(delta > 0 && delta < 1, "PLD accountant: delta ", delta, " is not in (0, 1)");
  STARLING_CHECK_ARG(std::isfinite(h) && h > 0 && h <= 0.1, "PLD accountant: grid step ", h);
  cache_ = std::make_shared<Cache>();
}

double PldAccountant::epsilon(uint64_t rounds) const {
  if (rounds == 0) return 0.0;
  double eps = 0.0;
  for (const bool remove : {true, false}) {
    const Relation r{q_, sigma_, remove};
    // A window too wide for memory: a coarser grid (still pessimistic, a little less tight); past
    // a grid step of 1 nothing is worth reporting (a loss that wide is no privacy).
    for (double h = h_;; h *= 2) {
      if (h > 1) return kInf;
      std::shared_ptr<const Pmf> one;
      {
        std::lock_guard<std::mutex> lock(cache_->mutex);
        auto& slot = cache_->pmfs[{remove, h}];
        if (!slot) {
          std::optional<Pmf> p = discretize(r, h);
          if (!p) continue;  // a coarser grid
          slot = std::make_shared<const Pmf>(std::move(*p));
        }
        one = slot;
      }
      const std::optional<Composed> c = compose(*one, rounds, h);
      if (c) {
        eps = std::max(eps, epsilonOf(*c, h, delta_));
        break;
      }
    }
  }
  return eps;
}

uint64_t PldAccountant::roundsWithin(double budget, uint64_t max_rounds) const {
  return lastRoundWithin([&](uint64_t t) { return epsilon(t); }, budget, max_rounds);
}

double pldNoiseForEpsilon(double target_epsilon, double q, uint64_t rounds, double delta,
                          double rel_tol, double h) {
  if (!(target_epsilon > 0 && std::isfinite(target_epsilon)))
    STARLING_THROW(ConfigError, "privacy.target_epsilon must be finite and > 0, got ",
                   target_epsilon);
  const auto eps = [&](double sigma) { return PldAccountant(q, sigma, delta, h).epsilon(rounds); };
  double hi = 1.0;
  while (eps(hi) > target_epsilon) {
    hi *= 2;
    if (hi > 1e4)
      STARLING_THROW(ConfigError,
                     "no noise multiplier up to 8192 gives epsilon <= ", target_epsilon, " after ",
                     rounds, " rounds at sampling rate ", q, " and delta ", delta,
                     ": raise privacy.target_epsilon or lower the rounds");
  }
  double lo = hi / 2;
  while (lo > 1e-3 && eps(lo) <= target_epsilon) {
    hi = lo;
    lo /= 2;
  }
  while (hi - lo > rel_tol * hi) {
    const double mid = 0.5 * (lo + hi);
    (eps(mid) <= target_epsilon ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace starling::privacy
