#include "privacy/dp.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace starling::privacy {
namespace {

double resolveSigma(const CentralDpConfig& c, double q, uint64_t rounds) {
  c.validate();
  if (!(q > 0 && q <= 1))
    STARLING_THROW(ConfigError,
                   "differential privacy needs a Poisson sampling rate in (0, 1], got ", q);
  if (c.noise_multiplier > 0) return c.noise_multiplier;
  return noiseForEpsilon(c.target_epsilon, q, rounds, c.delta);
}

}  // namespace

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
}

double standardNormal(KeyStream& s) {
  // 1 - u is in (0, 1]: the logarithm stays finite.
  const double u1 = 1.0 - s.uniform(), u2 = s.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

CentralDp::CentralDp(const CentralDpConfig& config, double q, uint64_t rounds, uint64_t run_seed)
    : config_(config),
      sigma_(resolveSigma(config, q, rounds)),
      accountant_(q, sigma_, config.delta) {
  if (config_.target_epsilon > 0 && !withinBudget(rounds)) {
    const uint64_t fit = accountant_.roundsWithin(config_.target_epsilon, rounds);
    std::string derived = "none up to 1e4 does";
    try {
      derived = std::to_string(noiseForEpsilon(config_.target_epsilon, q, rounds, config_.delta));
    } catch (const ConfigError&) {
    }
    STARLING_THROW(ConfigError, rounds, " rounds at noise multiplier ", sigma_,
                   " and sampling rate ", q, " spend epsilon ", epsilon(rounds), " (delta ",
                   config_.delta, "), more than privacy.target_epsilon ", config_.target_epsilon,
                   ": ", fit, " rounds fit that budget; for ", rounds,
                   " rounds leave privacy.noise_multiplier out to derive one (", derived, ")");
  }
  key_ = config_.seeded_noise ? publicKey("starling central dp noise", run_seed, 0) : randomKey();
}

bool CentralDp::withinBudget(uint64_t rounds) const {
  if (config_.target_epsilon <= 0 || rounds == 0) return true;
  // The accountant's epsilon carries its own rounding: a sigma derived for exactly this budget
  // may land a hair above it.
  return epsilon(rounds) <= config_.target_epsilon * (1 + 1e-9);
}

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
