#include "privacy/dp.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace starling::privacy {
namespace {

// Distributed DP's tau and dimension for a run of `c`: tau at the floor on each client's noise over
// the whole population, and the model's size (or the largest one, before it is known).
double runTau(const DpConfig& c) { return ddgTau(kMinClientNoise, c.population); }
uint64_t runDim(const DpConfig& c) { return c.dim != 0 ? c.dim : kMaxDdgDim; }

}  // namespace

void DpConfig::validate() const {
  if (!enabled) return;
  if (!(std::isfinite(clip) && clip > 0))
    STARLING_THROW(ConfigError, "privacy.clip must be a finite L2 norm > 0, got ", clip);
  if (!(max_clip >= clip))
    STARLING_THROW(ConfigError, "privacy.clip (", clip, ") is above the largest clip allowed (",
                   max_clip, ": bounds.max_norm and bounds.max_abs under secure aggregation)");
  if (!(std::isfinite(noise_multiplier) && noise_multiplier >= 0))
    STARLING_THROW(ConfigError, "privacy.noise_multiplier must be finite and >= 0, got ",
                   noise_multiplier);
  if (!(std::isfinite(target_epsilon) && target_epsilon >= 0))
    STARLING_THROW(ConfigError, "privacy.target_epsilon must be finite and >= 0, got ",
                   target_epsilon);
  if (noise_multiplier == 0 && target_epsilon == 0)
    STARLING_THROW(ConfigError,
                   "differential privacy without noise: epsilon would be infinite; set "
                   "privacy.noise_multiplier, or privacy.target_epsilon to derive it");
  if (!(delta > 0 && delta < 1))
    STARLING_THROW(ConfigError, "privacy.delta must be in (0, 1), got ", delta);
  if (population == 0)
    STARLING_THROW(ConfigError,
                   "differential privacy needs the population (data.num_clients): the public "
                   "number of clients whose sampled part the sum is divided by");
  if (mechanism == DpMechanism::kDistributed && accountant == DpAccountant::kPld)
    STARLING_THROW(ConfigError,
                   "privacy.dp = distributed is accounted by its own RDP bound (the sum of "
                   "clients' discrete Gaussians, subsampled): privacy.accountant = pld is not "
                   "built for it; leave privacy.accountant out or set it to rdp");
  if (adaptive_clip) {
    if (mechanism == DpMechanism::kDistributed)
      STARLING_THROW(ConfigError,
                     "privacy.adaptive_clip needs privacy.dp = central: the root counts the "
                     "updates within the clip, which under distributed DP it cannot see");
    if (!(target_quantile > 0 && target_quantile < 1))
      STARLING_THROW(ConfigError, "privacy.target_quantile must be in (0, 1), got ",
                     target_quantile);
    if (!(std::isfinite(clip_lr) && clip_lr > 0))
      STARLING_THROW(ConfigError, "privacy.clip_lr must be finite and > 0, got ", clip_lr);
    if (!(std::isfinite(count_noise) && count_noise >= 0))
      STARLING_THROW(ConfigError, "privacy.clip_count_noise must be finite and >= 0, got ",
                     count_noise);
  }
  if (mechanism == DpMechanism::kCentral && min_clients != 0)
    STARLING_THROW(ConfigError,
                   "privacy.min_clients is set but privacy.dp is central: it is the fewest "
                   "clients whose noise a sum holds under privacy.dp = distributed");
}

int64_t discreteGaussian(KeyStream& s, double sigma) {
  STARLING_CHECK_ARG(sigma > 0 && sigma <= kMaxClientNoise, "discreteGaussian: sigma ", sigma);
  const double t = std::floor(sigma) + 1;
  const double s2 = sigma * sigma;
  for (;;) {
    // Two floored exponentials of mean t: geometric with P(g) = (1 - e^(-1/t)) e^(-g/t); their
    // difference is the discrete Laplace, P(y) proportional to e^(-|y|/t). 1 - u is in (0, 1].
    const double g1 = std::floor(-t * std::log(1.0 - s.uniform()));
    const double g2 = std::floor(-t * std::log(1.0 - s.uniform()));
    const double y = g1 - g2;
    const double excess = std::abs(y) - s2 / t;
    if (s.uniform() < std::exp(-excess * excess / (2 * s2))) return static_cast<int64_t>(y);
  }
}

double standardNormal(KeyStream& s) {
  // 1 - u is in (0, 1]: the logarithm stays finite.
  const double u1 = 1.0 - s.uniform(), u2 = s.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double ClientDp::resolveSigma(const DpConfig& c, double q, uint64_t rounds) {
  c.validate();
  if (!(q > 0 && q <= 1))
    STARLING_THROW(ConfigError,
                   "differential privacy needs a Poisson sampling rate in (0, 1], got ", q);
  if (q * static_cast<double>(c.population) < 1)
    STARLING_THROW(ConfigError, "sampling.poisson_rate ", q, " of a population of ", c.population,
                   " expects ", q * static_cast<double>(c.population),
                   " clients a round, fewer than one: the mean would be one update magnified");
  const bool pld = c.accountant == DpAccountant::kPld;
  const bool ddg = c.mechanism == DpMechanism::kDistributed;
  if (ddg) {
    const double expected = q * static_cast<double>(c.population);
    if (static_cast<double>(resolveMinClients(c, q)) > expected)
      STARLING_THROW(ConfigError, "privacy.min_clients = ", resolveMinClients(c, q),
                     c.min_clients == 0 ? " (derived: half the expected count, at least 3)" : "",
                     " exceeds the ", expected,
                     " clients a round sampling.poisson_rate expects of the population: most "
                     "rounds would have too few clients' noise to be applied (a larger "
                     "sampling.poisson_rate, or a smaller privacy.min_clients)");
  }
  const auto derive = [&] {
    return ddg   ? ddgNoiseForEpsilon(c.target_epsilon, q, rounds, runTau(c), runDim(c), c.delta)
           : pld ? pldNoiseForEpsilon(c.target_epsilon, q, rounds, c.delta, 1e-4, kRunPldGrid)
                 : noiseForEpsilon(c.target_epsilon, q, rounds, c.delta);
  };
  const double sigma = c.noise_multiplier > 0 ? c.noise_multiplier : derive();
  const double spent = accountantEpsilon(c, q, sigma, rounds);
  // The accountant's epsilon carries its own rounding: a sigma derived for exactly this budget
  // may land a hair above it.
  if (c.target_epsilon > 0 && spent > c.target_epsilon * (1 + 1e-9)) {
    const uint64_t fit = lastRoundWithin(
        [&](uint64_t t) { return accountantEpsilon(c, q, sigma, t); }, c.target_epsilon, rounds);
    std::string derived = "none does";
    try {
      derived = std::to_string(derive());
    } catch (const ConfigError&) {
    }
    STARLING_THROW(ConfigError, rounds, " rounds at noise multiplier ", sigma,
                   " and sampling rate ", q, " spend epsilon ", spent, " (delta ", c.delta, ", ",
                   ddg   ? "distributed discrete Gaussian"
                   : pld ? "PLD"
                         : "RDP",
                   " accountant), more than privacy.target_epsilon ", c.target_epsilon, ": ", fit,
                   " rounds fit that budget; for ", rounds,
                   " rounds leave privacy.noise_multiplier out to derive one (", derived, ")");
  }
  return sigma;
}

double ClientDp::accountantEpsilon(const DpConfig& c, double q, double sigma, uint64_t rounds) {
  if (c.mechanism == DpMechanism::kDistributed)
    return DdgAccountant(q, sigma, runTau(c), runDim(c), c.delta).epsilon(rounds);
  return c.accountant == DpAccountant::kPld
             ? PldAccountant(q, sigma, c.delta, kRunPldGrid).epsilon(rounds)
             : RdpAccountant(q, sigma, c.delta).epsilon(rounds);
}

ClientDp::ClientDp(const DpConfig& config, double q, uint64_t rounds, uint64_t run_seed)
    : config_(config),
      q_(q),
      sigma_(resolveSigma(config, q, rounds)),
      min_clients_(resolveMinClients(config, q)) {
  sigma_sum_ = sigma_;
  clip_ = config_.clip;
  if (config_.adaptive_clip) {
    count_noise_ = config_.count_noise > 0 ? config_.count_noise
                                           : q_ * static_cast<double>(config_.population) / 20;
    const double rest = 1 / (sigma_ * sigma_) - 1 / (4 * count_noise_ * count_noise_);
    if (!(rest > 0))
      STARLING_THROW(ConfigError, "privacy.adaptive_clip: the count's noise ", count_noise_,
                     " must exceed half the noise multiplier ", sigma_,
                     " (2 count_noise > z), or the count would take the whole budget; raise "
                     "privacy.clip_count_noise (default q N / 20 = ",
                     q_ * static_cast<double>(config_.population) / 20, ")");
    sigma_sum_ = 1 / std::sqrt(rest);
  }
  if (distributed())
    ddg_.emplace(q_, sigma_, runTau(config_), runDim(config_), config_.delta);
  else if (config_.accountant == DpAccountant::kPld)
    pld_.emplace(q_, sigma_, config_.delta, kRunPldGrid);
  else
    rdp_.emplace(q_, sigma_, config_.delta);
  key_ = config_.seeded_noise ? publicKey("starling central dp noise", run_seed, 0) : randomKey();
}

double ClientDp::epsilon(uint64_t rounds) const {
  return ddg_ ? ddg_->epsilon(rounds) : pld_ ? pld_->epsilon(rounds) : rdp_->epsilon(rounds);
}

std::string minNoiseText(const ClientDp& dp) {
  if (!dp.distributed()) return "0";
  const double v =
      dp.noiseMultiplier() / std::sqrt(static_cast<double>(dp.minClients())) * (1 - 1e-6);
  // Down to 6 significant digits, then printed with them (the decimal is exact at that length).
  const double p = std::pow(10.0, std::floor(std::log10(v)) - 5);
  const double down = std::floor(v / p) * p;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", down);
  // The printed decimal reads back at most one ulp from `down`, which is 1e-6 below the floor's
  // value: never above what the root asks.
  return buf;
}

double ClientDp::epsilonKnownSample(uint64_t participations) const {
  STARLING_CHECK_ARG(ddg_.has_value(), "epsilonKnownSample: distributed DP only");
  return ddg_->epsilonKnownSample(participations);
}

void ClientDp::setClip(double clip) {
  STARLING_CHECK_ARG(std::isfinite(clip) && clip > 0, "DP: a clip of ", clip);
  clip_ = clip;
}

double ClientDp::adaptClip(double unclipped, double count, uint64_t round) {
  STARLING_CHECK_ARG(config_.adaptive_clip, "adaptClip without privacy.adaptive_clip");
  STARLING_CHECK_ARG(std::isfinite(unclipped) && std::isfinite(count) && unclipped >= 0 &&
                         unclipped <= count + 1e-3,
                     "adaptClip: ", unclipped, " of ", count, " updates within the clip");
  // Index 1 of the round's noise stream: the sum's draws are index 0.
  KeyStream s(key_, round, MaskStream::kNoise, 1);
  const double noised = unclipped - count / 2 + count_noise_ * standardNormal(s);
  const double b = noised / expectedWeight() + 0.5;
  clip_ *= std::exp(-config_.clip_lr * (b - config_.target_quantile));
  // A clip that underflows or overflows would end the run's learning or its privacy: kept within
  // [1e-30, 1e30] (reached only after thousands of rounds at the default step).
  clip_ = std::clamp(clip_, 1e-30, std::min(1e30, config_.max_clip));
  return clip_;
}

uint64_t ClientDp::resolveMinClients(const DpConfig& c, double q) {
  if (c.mechanism != DpMechanism::kDistributed) return 0;
  if (c.min_clients != 0) return c.min_clients;
  const double half = std::ceil(q * static_cast<double>(c.population) / 2);
  return std::max<uint64_t>(3, static_cast<uint64_t>(half));
}

double ClientDp::expectedWeight() const { return q_ * static_cast<double>(config_.population); }

void ClientDp::privatize(std::span<float> mean, double total_weight, double expected_weight,
                         uint64_t round) const {
  if (!(std::isfinite(expected_weight) && expected_weight > 0 && std::isfinite(total_weight) &&
        total_weight >= 0))
    STARLING_THROW(InvalidArgument, "differential privacy: an expected weight of ", expected_weight,
                   " and a total weight of ", total_weight, " cannot be privatised");
  if (distributed()) {
    for (float& x : mean)
      x = static_cast<float>(static_cast<double>(x) * total_weight / expected_weight);
    return;
  }
  KeyStream s(key_, round, MaskStream::kNoise, 0);
  const double sd = sigma_sum_ * clip_;
  for (float& x : mean)
    x = static_cast<float>((static_cast<double>(x) * total_weight + sd * standardNormal(s)) /
                           expected_weight);
}

}  // namespace starling::privacy
