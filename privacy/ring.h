#pragma once
// Fixed-point arithmetic in the ring Z_{2^b}, the arithmetic of secure aggregation:
// each client's clipped update is scaled, rounded stochastically to integers (unbiased: E[round(v)]
// = v), and reduced mod 2^b; masks and sums are added mod 2^b; the unmasked sum is read back as a
// signed b-bit integer and unscaled.
//
// The sum must not wrap: n clients each sending values of magnitude at most clip (an L2 clip bounds
// every coordinate) scale to at most scale * clip + 1 after rounding, so the sum of n lies in
// [-n (scale clip + 1), n (scale clip + 1)], which b bits hold as a signed integer when
// n (scale clip + 1) <= 2^(b-1) - 1. RingSpec::fit chooses the largest scale that keeps it so, and
// refuses a configuration where none does, or where rounding would cost more than 2^-10 of an
// update's norm (the rounding error of d coordinates is about sqrt(d) / scale in norm, against a
// norm up to clip: scale clip >= 2^10 sqrt(d)), with the numbers and the bits it would take,
// before round 1.
//
// Elements are uint64 holding a value below 2^b (b in 8..64). The rounding draws from libsodium's
// ChaCha20 stream of a key the caller holds (a client's fresh randomKey() each round;
// privacy/crypto.h), never from core/rng's statistical streams: under distributed DP the rounding
// is part of the mechanism, and its randomness must be as unpredictable as the noise's.
#include <cstdint>
#include <span>

#include "privacy/crypto.h"

namespace starling::privacy {

// Distributed DP's noise in the ring (privacy/dp.h): each client adds discrete Gaussian noise of
// standard deviation multiplier (scale clip + sqrt(dim)) / sqrt(min_clients) ring units.
struct RingNoise {
  double multiplier = 0;     // z: the sum's noise over one client's L2 sensitivity
  uint64_t min_clients = 1;  // m: the fewest clients whose noise a sum holds
};

struct RingSpec {
  uint32_t bits = 32;  // the ring is Z_{2^bits}
  double scale = 1.0;  // a value v is encoded as round(v * scale)
  double clip = 1.0;   // |v| <= clip for every encoded value (the L2 clip bounds each coordinate)
  uint64_t max_clients = 1;  // the most values one sum adds
  uint64_t dim = 1;          // values per update (the model's size)
  // Distributed DP: the standard deviation of the discrete Gaussian each client adds to every
  // value after rounding, in ring units (0: none).
  double noise = 0;

  static constexpr uint32_t kMinBits = 8, kMaxBits = 64;
  // Rounding may cost at most 2^-kPrecisionBits of an update's norm (see the top of the file).
  static constexpr uint32_t kPrecisionBits = 10;
  // The ring holds the noise of a sum out to this many of its standard deviations: the sum of
  // discrete Gaussians is sub-Gaussian (Canonne, Kamath, Steinke 2020), so a value passes it with
  // probability below 2 exp(-72), about 10^-31.
  static constexpr double kNoiseTails = 12;
  // sensitivity()'s margin over scale clip (a clip computed in float may leave a norm 2^-24 over).
  static constexpr double kClipMargin = 0x1p-20;

  // The largest scale that keeps a sum of `max_clients` values (and, with `noise`, their noise
  // out to kNoiseTails standard deviations) within `bits`; ConfigError naming bits, clip,
  // max_clients and dim (and the bits it would take) when rounding would then cost more than
  // 2^-kPrecisionBits of an update's norm. With `noise`, the spec's noise is its client noise at
  // that scale.
  static RingSpec fit(uint32_t bits, double clip, uint64_t max_clients, uint64_t dim,
                      const RingNoise* noise = nullptr);
  // The fewest bits fit() accepts for these (the clip cancels out: only the ratio matters);
  // kMaxBits + 1 when even 64 bits do not.
  static uint32_t bitsNeeded(uint64_t max_clients, uint64_t dim, const RingNoise* noise = nullptr);
  // ConfigError unless the sum of max_clients values of magnitude clip, and their noise out to
  // kNoiseTails standard deviations, cannot wrap; or the noise is negative or not finite.
  void validate() const;
  // One client's L2 sensitivity in ring units: scale clip (1 + 2^-20) + sqrt(dim) (rounding moves
  // each value by less than 1; the margin covers a clip computed in float).
  double sensitivity() const;

  uint64_t mask() const { return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1; }
  // The largest |sum| the ring holds as a signed integer: 2^(b-1) - 1.
  uint64_t maxMagnitude() const { return (uint64_t{1} << (bits - 1)) - 1; }
};

// out[i] = round_stochastic(x[i] * scale) mod 2^b, value i rounded up with the probability of its
// fraction by word i of the ChaCha20 stream of (rounding_key, round, MaskStream::kRounding).
// InvalidArgument when a value is not finite or above clip in magnitude (the caller clips first),
// or the sizes differ.
void encode(const RingSpec& r, std::span<const float> x, const Key32& rounding_key, uint64_t round,
            std::span<uint64_t> out);
// words[i] += a discrete Gaussian of standard deviation r.noise (privacy/dp.h discreteGaussian),
// mod 2^b, drawn from the ChaCha20 stream of (noise_key, round, MaskStream::kNoise); nothing when
// r.noise is 0.
void addNoise(const RingSpec& r, std::span<uint64_t> words, const Key32& noise_key, uint64_t round);
// out[i] = signed(sum[i]) / scale: the sum of encoded values read back (InvalidArgument for a
// word at or above 2^b, which no sum of ring elements holds).
void decode(const RingSpec& r, std::span<const uint64_t> sum, std::span<float> out);
// acc[i] = acc[i] + x[i] mod 2^b (sub: - x[i]).
void add(const RingSpec& r, std::span<uint64_t> acc, std::span<const uint64_t> x);
void sub(const RingSpec& r, std::span<uint64_t> acc, std::span<const uint64_t> x);

}  // namespace starling::privacy
