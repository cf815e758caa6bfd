#pragma once
// Client-level differential privacy, central (a trusted server adds the noise) or distributed (each
// client adds its share in secure aggregation's ring; DpMechanism below). Central (DP-FedAvg,
// McMahan, Ramage, Talwar, Zhang 2018): each round samples every available client independently
// with probability q (Poisson sampling), clips each update to L2 norm C, weighs every update alike,
// and releases
//
//   delta_t = (sum of the clipped updates + N(0, (sigma C)^2 I)) / (q N)
//
// where N is the run's population, a public number fixed for the run (the simulation's
// data.num_clients, the root's data.num_clients), so q N is the expected number of updates: a
// fixed denominator, which reveals nothing (with the count itself, or with the clients online, the
// release's scale would depend on who took part). One client's presence or absence moves the sum
// by at most C, so each round is the subsampled Gaussian mechanism the RDP accountant
// (privacy/accountant.h) composes.
//
// What is protected is what the models reveal: the root, which is trusted, also keeps the round's
// records (counts, bytes, the clients' mean train_loss), which are exact and not covered.
//
// What this does not cover, and the engine refuses (docs/privacy.md): a rule that is not the
// clipped uniform mean (a robust rule's sensitivity is not the sum's), a compressor whose update
// is formed over several phases or shares factors across rounds (a phase's clip is not the
// update's), SCAFFOLD (the control variates are a second release), sampling that is not Poisson,
// and buffered asynchronous steps (they mix model versions and do not sample by Poisson).
//
// The noise comes from libsodium's ChaCha20 (KeyStream, MaskStream::kNoise), keyed by
// randombytes, or, with seeded_noise, by a key derived from the run seed: reproducible, which
// the simulator needs (every worker steps alike) and tests use, but then anyone who knows the
// seed can subtract the noise: a deployment keeps the default. Standard normals by Box-Muller on
// 53-bit uniforms, in double; like every floating-point Gaussian sampler it is not exactly the
// ideal mechanism: its tails end at |z| = 8.57, and its values are doubles rounded to float
// (docs/privacy.md says what that means).
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "privacy/accountant.h"
#include "privacy/crypto.h"
#include "privacy/pld.h"

namespace starling::privacy {

// Where the noise is added. Central: by the root, to the sum it decodes (it sees the sum without
// noise). Distributed (Kairouz, Liu, Steinke 2021, under secure aggregation only): each client adds
// discrete Gaussian noise to its encoded update in the ring before masking (privacy/ring.h
// addNoise), so that no party ever sees a sum without noise. Every round's sum then holds the
// noise of at least min_clients clients (a round with fewer survivors is not applied), each of
// standard deviation z Delta / sqrt(min_clients) ring units: the sum's is at least z Delta, Delta
// = scale C + sqrt(d) the L2 sensitivity of one client's encoded update (its stochastic rounding
// moves each of d values by less than 1). Accounted by DdgAccountant (accountant.h), under
// zero-out adjacency (a client's data replaced by a client that sends a zero update and its
// noise; Kairouz et al. 2021 and Google's deployments use it): the sampled clients, and so the
// noise shares, are the same on both sides, so whether a round is applied reveals nothing.
enum class DpMechanism { kCentral, kDistributed };

// Each client's noise under distributed DP is at least this many ring units (a round that would
// draw less is not applied): tau (accountant.h) is then below 10 N exp(-pi^2 16) = N 10^-67 for a
// population of N, and the run's accountant takes tau at this floor over the whole population.
inline constexpr double kMinClientNoise = 4.0;
// ... and at most this many: discreteGaussian's draws come from 53-bit uniforms, which leave its
// probabilities a relative error near 2^-20 here (more above; the ring lowers its scale instead).
inline constexpr double kMaxClientNoise = 0x1p30;
// The largest model the distributed accountant is checked for before the model is known (its
// bound grows with the size; once known, the model's own).
inline constexpr uint64_t kMaxDdgDim = uint64_t{1} << 40;

// Which accountant says what a run spends: the PLD one (privacy/pld.h, tight: less noise for a
// budget) or the RDP one (privacy/accountant.h, an upper bound, Opacus' and TF Privacy's).
enum class DpAccountant { kPld, kRdp };
// The PLD accountant's grid step for a run: it reports every round, and 2e-4 is 2.5 times faster
// than dp-accounting's 1e-4; its epsilon is never below the 1e-4 grid's, within 0.2% of it from
// epsilon 0.1 up, and up to 3% above it at epsilons of a few thousandths (docs/privacy.md).
inline constexpr double kRunPldGrid = 2e-4;

struct DpConfig {
  bool enabled = false;
  DpAccountant accountant = DpAccountant::kPld;
  double clip = 0.0;              // C: each update's L2 norm is clipped to it
  double noise_multiplier = 0.0;  // sigma; 0: the smallest that keeps target_epsilon
  double target_epsilon = 0.0;    // the run's budget; 0: none (epsilon is still reported)
  double delta = 1e-5;
  bool seeded_noise = false;
  uint64_t population = 0;  // N: the sum is divided by q N
  DpMechanism mechanism = DpMechanism::kCentral;
  // Distributed: the fewest clients whose noise an applied round's sum holds (0: half the
  // expected q N, rounded up, and at least 3).
  uint64_t min_clients = 0;
  // Distributed: the values of each noised sum (the model's size); 0 until known (kMaxDdgDim then
  // bounds it).
  uint64_t dim = 0;
  // Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021), central only: the clip
  // starts at `clip` and follows the target_quantile of the update norms. Each round the root
  // counts the updates within the round's clip C_t (b_i = 1) and releases
  //   b = (sum (b_i - 1/2) + N(0, count_noise^2)) / (q N) + 1/2,
  // then C_{t+1} = C_t exp(-clip_lr (b - target_quantile)). The count's sensitivity is 1/2, so
  // the round is a Gaussian mechanism of noise multiplier z for (sum, count) together when the
  // sum's noise multiplier is (z^-2 - (2 count_noise)^-2)^(-1/2): the accountant's z is the
  // configured (or derived) one, and the sum takes a little more noise.
  bool adaptive_clip = false;
  double target_quantile = 0.5;  // gamma in (0, 1)
  double clip_lr = 0.2;          // eta_C > 0 (geometric steps)
  double count_noise = 0;        // sigma_b; 0: q N / 20, the paper's choice
  // The largest clip adaptive clipping moves to (besides 1e30): the round engine's, under secure
  // aggregation, where the clients clip and the unmasked sum of n updates must pass n times the
  // round's bounds (bounds.max_norm, bounds.max_abs).
  double max_clip = 1e30;
  // ConfigError naming the privacy.* key: C not positive, a negative or non-finite sigma or
  // target, no noise at all (epsilon would be infinite), delta outside (0, 1), no population;
  // distributed DP with the PLD accountant (its accountant is its own RDP bound); adaptive
  // clipping under distributed DP, or with a quantile outside (0, 1), a clip_lr not positive, a
  // count_noise negative.
  void validate() const;
};

// One draw of the discrete Gaussian N_Z(0, sigma^2) (P(y) proportional to exp(-y^2 / (2 sigma^2))
// over the integers; Canonne, Kamath, Steinke 2020, Algorithm 3: a discrete Laplace of scale
// floor(sigma) + 1 as the difference of two floored exponentials, accepted with probability
// exp(-(|y| - sigma^2 / t)^2 / (2 sigma^2))). The probabilities are computed in double from
// `s`'s 53-bit uniforms (not the exact rational arithmetic of the paper): docs/privacy.md says
// what that means. sigma in (0, kMaxClientNoise].
int64_t discreteGaussian(KeyStream& s, double sigma);

// One standard normal draw from `s` (Box-Muller, two uniforms per draw).
double standardNormal(KeyStream& s);

class ClientDp;
// The client floor (client::SecAggTrust::min_noise, secagg.min_noise) matching a distributed
// run: z / sqrt(m), made 1e-6 smaller and written rounded down to 6 significant digits, so that a
// client configured with the text accepts the root's rounds. "0" under central DP.
std::string minNoiseText(const ClientDp& dp);

class ClientDp {
 public:
  // The noise multiplier a run of `rounds` rounds at sampling rate `q` takes: the configured one,
  // or the smallest that keeps the target. ConfigError (with the numbers and what would fit) for a
  // bad configuration, a rate outside (0, 1], q N below 1, or rounds that would exceed the target.
  static double resolveSigma(const DpConfig& config, double q, uint64_t rounds);
  // `q`: the Poisson sampling rate in (0, 1]; `rounds`: the run's rounds; `run_seed`: for
  // seeded_noise. Sigma is resolveSigma()'s (its refusals too). A run never spends past its
  // target: one whose rounds would is refused here, before round 1.
  ClientDp(const DpConfig& config, double q, uint64_t rounds, uint64_t run_seed);

  const DpConfig& config() const { return config_; }
  double noiseMultiplier() const { return sigma_; }
  double q() const { return q_; }
  // Epsilon spent after `rounds` rounds (every round counts, applied or not), by the configured
  // accountant: against whoever receives the models (the sample amplifies).
  double epsilon(uint64_t rounds) const;
  // Distributed DP, against the root (which draws the sample and so knows who took part): a
  // client's epsilon after `participations` rounds it took part in, without amplification.
  double epsilonKnownSample(uint64_t participations) const;
  // The configured accountant's epsilon for (q, sigma) after `rounds` rounds.
  static double accountantEpsilon(const DpConfig& config, double q, double sigma, uint64_t rounds);

  // q N, what privatize() divides the sum by.
  double expectedWeight() const;
  bool distributed() const { return config_.mechanism == DpMechanism::kDistributed; }
  // Distributed: the fewest clients whose noise an applied round holds (config's, or resolved).
  uint64_t minClients() const { return min_clients_; }
  // The clip of the next round: config().clip, or adaptive clipping's current one.
  double clip() const { return clip_; }
  void setClip(double clip);  // a resumed run's (checkpoint); InvalidArgument unless > 0, finite
  // The sum's noise multiplier: noiseMultiplier(), or with adaptive clipping the part of it the
  // sum takes, (z^-2 - (2 count_noise)^-2)^(-1/2).
  double sumNoiseMultiplier() const { return sigma_sum_; }
  double countNoise() const { return count_noise_; }
  // Adaptive clipping after an applied round `round` whose sum held `count` updates, `unclipped`
  // of them within its clip: the noised quantile estimate, and the next clip (returned).
  double adaptClip(double unclipped, double count, uint64_t round);
  // The min_clients a configuration resolves to at rate q (distributed; 0 for central).
  static uint64_t resolveMinClients(const DpConfig& config, double q);
  // `mean` (the clipped updates' uniform mean, total weight `total_weight`, i.e. their count)
  // becomes (mean * total_weight + N(0, (sigma C)^2 I)) / expected_weight: round `round`'s noise.
  // Under distributed DP the noise is already in the sum: (mean * total_weight) / expected_weight.
  // InvalidArgument unless expected_weight > 0 and total_weight >= 0, both finite.
  void privatize(std::span<float> mean, double total_weight, double expected_weight,
                 uint64_t round) const;
  // The key Poisson sampling draws under (keyedUniform, MaskStream::kSampling, one draw per client
  // id): the mechanism's, so that the sample is as secret as the noise.
  const Key32& samplingKey() const { return key_; }

 private:
  DpConfig config_;
  double q_ = 0.0, sigma_ = 0.0;
  double sigma_sum_ = 0.0, count_noise_ = 0.0, clip_ = 0.0;
  uint64_t min_clients_ = 0;
  std::optional<PldAccountant> pld_;  // the accountant, one of the three
  std::optional<RdpAccountant> rdp_;
  std::optional<DdgAccountant> ddg_;
  Key32 key_{};
};

}  // namespace starling::privacy
