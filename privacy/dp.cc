#include "privacy/dp.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace starling::privacy {
void CentralDpConfig::validate() const {
  if (!enabled) return;
  if (!(std::isfinite(clip) && clip > 0))
    STARLING_THROW(ConfigError, "privacy.clip must be a finite L2 norm > 0, got ", clip);
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
}

double standardNormal(KeyStream& s) {
  // 1 - u is in (0, 1]: the logarithm stays finite.
  const double u1 = 1.0 - s.uniform(), u2 = s.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double CentralDp::resolveSigma(const CentralDpConfig& c, double q, uint64_t rounds) {
  c.validate();
  if (!(q > 0 && q <= 1))
    STARLING_THROW(ConfigError,
                   "differential privacy needs a Poisson sampling rate in (0, 1], got ", q);
  if (q * static_cast<double>(c.population) < 1)
    STARLING_THROW(ConfigError, "sampling.poisson_rate ", q, " of a population of ", c.population,
                   " expects ", q * static_cast<double>(c.population),
                   " clients a round, fewer than one: the mean would be one update magnified");
  const bool pld = c.accountant == DpAccountant::kPld;
  const auto derive = [&] {
    return pld ? pldNoiseForEpsilon(c.target_epsilon, q, rounds, c.delta, 1e-4, kRunPldGrid)
               : noiseForEpsilon(c.target_epsilon, q, rounds, c.delta);
  };
  const double sigma = c.noise_multiplier > 0 ? c.noise_multiplier : derive();
  const double spent = accountantEpsilon(c, q, sigma, rounds);
  // The accountant's epsilon carries its own rounding: a sigma derived for exactly this budget
  // may land a hair above it.
  if (c.target_epsilon > 0 && spent > c.target_epsilon * (1 + 1e-9)) {
    const uint64_t fit =
        pld ? PldAccountant(q, sigma, c.delta, kRunPldGrid).roundsWithin(c.target_epsilon, rounds)
            : RdpAccountant(q, sigma, c.delta).roundsWithin(c.target_epsilon, rounds);
    std::string derived = "none does";
    try {
      derived = std::to_string(derive());
    } catch (const ConfigError&) {
    }
    STARLING_THROW(ConfigError, rounds, " rounds at noise multiplier ", sigma,
                   " and sampling rate ", q, " spend epsilon ", spent, " (delta ", c.delta, ", ",
                   pld ? "PLD" : "RDP", " accountant), more than privacy.target_epsilon ",
                   c.target_epsilon, ": ", fit, " rounds fit that budget; for ", rounds,
                   " rounds leave privacy.noise_multiplier out to derive one (", derived, ")");
  }
  return sigma;
}

double CentralDp::accountantEpsilon(const CentralDpConfig& c, double q, double sigma,
                                    uint64_t rounds) {
  return c.accountant == DpAccountant::kPld
             ? PldAccountant(q, sigma, c.delta, kRunPldGrid).epsilon(rounds)
             : RdpAccountant(q, sigma, c.delta).epsilon(rounds);
}

CentralDp::CentralDp(const CentralDpConfig& config, double q, uint64_t rounds, uint64_t run_seed)
    : config_(config), q_(q), sigma_(resolveSigma(config, q, rounds)) {
  if (config_.accountant == DpAccountant::kPld)
    pld_.emplace(q_, sigma_, config_.delta, kRunPldGrid);
  else
    rdp_.emplace(q_, sigma_, config_.delta);
  key_ = config_.seeded_noise ? publicKey("starling central dp noise", run_seed, 0) : randomKey();
}

double CentralDp::epsilon(uint64_t rounds) const {
  return pld_ ? pld_->epsilon(rounds) : rdp_->epsilon(rounds);
}

double CentralDp::expectedWeight() const { return q_ * static_cast<double>(config_.population); }

void CentralDp::privatize(std::span<float> mean, double total_weight, double expected_weight,
                          uint64_t round) const {
  if (!(std::isfinite(expected_weight) && expected_weight > 0 && std::isfinite(total_weight) &&
        total_weight >= 0))
    STARLING_THROW(InvalidArgument, "differential privacy: an expected weight of ", expected_weight,
                   " and a total weight of ", total_weight, " cannot be privatised");
  KeyStream s(key_, round, MaskStream::kNoise, 0);
  const double sd = sigma_ * config_.clip;
  for (float& x : mean)
    x = static_cast<float>((static_cast<double>(x) * total_weight + sd * standardNormal(s)) /
                           expected_weight);
}

}  // namespace starling::privacy
