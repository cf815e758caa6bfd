#include "privacy/ring.h"

#include <cmath>

#include "core/error.h"
#include "privacy/dp.h"

namespace starling::privacy {
namespace {

// The smallest scale * clip that keeps rounding within 2^-kPrecisionBits of an update's norm.
double minScaledClip(uint64_t dim) {
  return std::ldexp(std::sqrt(static_cast<double>(dim)), RingSpec::kPrecisionBits);
}

// a: the noise's share of the bound, kNoiseTails sqrt(n) times each client's noise over
// (s C + sqrt(d)): kNoiseTails z sqrt(n / m).
long double noiseFactor(uint64_t n, const RingNoise* noise) {
  if (!noise) return 0;
  return static_cast<long double>(RingSpec::kNoiseTails) * noise->multiplier *
         std::sqrt(static_cast<long double>(n) / static_cast<long double>(noise->min_clients));
}

// The largest scale * clip a sum of n values may have in b bits: n (s C + 1) <= 2^(b-1) - 1, and
// with noise n (s C + 1) + a (s C (1 + kClipMargin) + sqrt(d)) <= 2^(b-1) - 1, in long double
// (2^63 - 1 is exact
// there, not in double), then rounded down to a double (negative: none fits).
double maxScaledClip(uint32_t bits, uint64_t n, uint64_t dim, const RingNoise* noise) {
  const long double room = std::ldexp(1.0L, static_cast<int>(bits) - 1) - 1.0L;
  const long double a = noiseFactor(n, noise);
  const long double nn = static_cast<long double>(n);
  const long double v = (room - nn - a * std::sqrt(static_cast<long double>(dim))) /
                        (nn + a * (1.0L + RingSpec::kClipMargin));
  double d = static_cast<double>(v);
  if (static_cast<long double>(d) > v) d = std::nextafter(d, -1.0);
  return d;
}

void checkNoise(const RingNoise* noise) {
  if (noise &&
      !(std::isfinite(noise->multiplier) && noise->multiplier > 0 && noise->min_clients > 0))
    STARLING_THROW(ConfigError, "ring noise: a multiplier of ", noise->multiplier, " over ",
                   noise->min_clients, " clients (both must be > 0)");
}

}  // namespace

uint32_t RingSpec::bitsNeeded(uint64_t max_clients, uint64_t dim, const RingNoise* noise) {
  checkNoise(noise);
  for (uint32_t b = kMinBits; b <= kMaxBits; ++b)
    if (maxScaledClip(b, max_clients, dim, noise) >= minScaledClip(dim)) return b;
  return kMaxBits + 1;
}

double RingSpec::sensitivity() const {
  // The clip in float may leave a norm 2^-24 over it (clipForRing): 2^-20 covers it.
  return scale * clip * (1 + kClipMargin) + std::sqrt(static_cast<double>(dim));
}

RingSpec RingSpec::fit(uint32_t bits, double clip, uint64_t max_clients, uint64_t dim,
                       const RingNoise* noise) {
  checkNoise(noise);
  if (bits < kMinBits || bits > kMaxBits)
    STARLING_THROW(ConfigError, "secagg.bits = ", bits, " must be in [", kMinBits, ", ", kMaxBits,
                   "]");
  if (!(std::isfinite(clip) && clip > 0))
    STARLING_THROW(ConfigError,
                   "the clipping bound must be finite and > 0 under secure "
                   "aggregation (privacy.clip), got ",
                   clip);
  if (max_clients == 0) STARLING_THROW(ConfigError, "secure aggregation of 0 clients");
  if (dim == 0) STARLING_THROW(ConfigError, "secure aggregation of a model of 0 values");
  double scaled = maxScaledClip(bits, max_clients, dim, noise);
  // discreteGaussian draws up to kMaxClientNoise: the scale is lowered to keep each client's noise
  // there.
  if (noise)
    scaled = std::min(
        scaled,
        (kMaxClientNoise * std::sqrt(static_cast<double>(noise->min_clients)) / noise->multiplier -
         std::sqrt(static_cast<double>(dim))) /
            (1 + kClipMargin) * (1 - 1e-12));
  if (!(scaled >= minScaledClip(dim))) {
    const uint32_t need = bitsNeeded(max_clients, dim, noise);
    STARLING_THROW(ConfigError, "secagg.bits = ", bits, " cannot hold the sum of ", max_clients,
                   " clipped updates of ", dim, " values",
                   noise ? " and their noise (privacy.dp = distributed)" : "",
                   ": scaled to keep that sum below 2^", bits - 1,
                   ", each update's rounding would cost ",
                   std::sqrt(static_cast<double>(dim)) / std::max(scaled, 1e-300),
                   " of its norm (at most 2^-", kPrecisionBits, " allowed); ",
                   need <= kMaxBits ? "it takes secagg.bits = " + std::to_string(need)
                                    : std::string("no ring of at most 64 bits does: fewer clients "
                                                  "per sum"));
  }
  RingSpec r;
  r.bits = bits;
  r.clip = clip;
  r.max_clients = max_clients;
  r.dim = dim;
  r.scale = scaled / clip;
  // scale * clip may round up past `scaled`: step down until the bound holds exactly.
  while (static_cast<long double>(r.scale) * clip > static_cast<long double>(scaled))
    r.scale = std::nextafter(r.scale, 0.0);
  if (noise) {
    const auto noiseAt = [&] {
      return noise->multiplier * r.sensitivity() /
             std::sqrt(static_cast<double>(noise->min_clients));
    };
    r.noise = noiseAt();
    // The noise's own rounding may put the bound a hair past the ring: step the scale down.
    const auto wraps = [&] {
      const long double n = static_cast<long double>(max_clients);
      return n * (static_cast<long double>(r.scale) * clip + 1.0L) +
                 static_cast<long double>(kNoiseTails) * std::sqrt(n) *
                     static_cast<long double>(r.noise) >
             static_cast<long double>(r.maxMagnitude());
    };
    for (int i = 0; i < 64 && wraps(); ++i) {
      r.scale *= 1 - 1e-12;
      r.noise = noiseAt();
    }
  }
  r.validate();  // a noise below kMinClientNoise is refused here, with the reason
  return r;
}

void RingSpec::validate() const {
  if (bits < kMinBits || bits > kMaxBits)
    STARLING_THROW(ConfigError, "ring: bits = ", bits, " must be in [", kMinBits, ", ", kMaxBits,
                   "]");
  if (!(std::isfinite(scale) && scale > 0) || !(std::isfinite(clip) && clip > 0) ||
      max_clients == 0)
    STARLING_THROW(ConfigError, "ring: scale ", scale, ", clip ", clip, " and max_clients ",
                   max_clients, " must be > 0 and finite");
  if (!(std::isfinite(noise) && noise >= 0 && noise <= kMaxClientNoise))
    STARLING_THROW(ConfigError, "ring: a noise of ", noise, " (must be finite, >= 0 and <= 2^30)");
  if (noise > 0 && noise < kMinClientNoise)
    STARLING_THROW(ConfigError, "ring: each client's noise would be ", noise,
                   " ring units, below the ", kMinClientNoise,
                   " the distributed accountant assumes (privacy/dp.h): a larger "
                   "privacy.noise_multiplier, fewer privacy.min_clients, or more secagg.bits");
  // The bound in long double: n (s C + 1) + kNoiseTails sqrt(n) noise against 2^(b-1) - 1, each
  // exactly representable up to 2^64.
  const long double worst =
      static_cast<long double>(max_clients) * (static_cast<long double>(scale) * clip + 1.0L) +
      static_cast<long double>(kNoiseTails) * std::sqrt(static_cast<long double>(max_clients)) *
          static_cast<long double>(noise);
  if (worst > static_cast<long double>(maxMagnitude()))
    STARLING_THROW(ConfigError, "ring: ", max_clients, " values of up to ", scale * clip + 1,
                   " (scale ", scale, " x clip ", clip, ", + 1 for rounding)",
                   noise > 0 ? " and their noise out to 12 standard deviations" : "",
                   " can sum to ", static_cast<double>(worst), ", beyond the ", bits,
                   "-bit ring's signed range (", maxMagnitude(), "): the sum would wrap");
}

void addNoise(const RingSpec& r, std::span<uint64_t> words, const Key32& noise_key,
              uint64_t round) {
  if (r.noise == 0) return;
  STARLING_CHECK_ARG(std::isfinite(r.noise) && r.noise > 0, "addNoise: a noise of ", r.noise);
  const uint64_t m = r.mask();
  KeyStream s(noise_key, round, MaskStream::kNoise, 0);
  for (uint64_t& w : words) w = (w + static_cast<uint64_t>(discreteGaussian(s, r.noise))) & m;
}

void encode(const RingSpec& r, std::span<const float> x, const Key32& rounding_key, uint64_t round,
            std::span<uint64_t> out) {
  STARLING_CHECK_ARG(x.size() == out.size(), "encode: ", x.size(), " values into ", out.size());
  const uint64_t m = r.mask();
  KeyStream rounding(rounding_key, round, MaskStream::kRounding, 0);
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    if (!std::isfinite(v) || std::abs(v) > r.clip)
      STARLING_THROW(InvalidArgument, "encode: value ", i, " is ", v, ", beyond the clip ", r.clip,
                     " (clip the update before encoding it)");
    const double scaled = v * r.scale;
    const double lo = std::floor(scaled);
    // Up with probability scaled - lo: E[result] = scaled.
    const auto k = static_cast<int64_t>(lo) + (rounding.uniform() < scaled - lo ? 1 : 0);
    out[i] = static_cast<uint64_t>(k) & m;
  }
}

void decode(const RingSpec& r, std::span<const uint64_t> sum, std::span<float> out) {
  STARLING_CHECK_ARG(sum.size() == out.size(), "decode: ", sum.size(), " values into ", out.size());
  const uint64_t m = r.mask();
  const uint64_t sign = uint64_t{1} << (r.bits - 1);
  for (size_t i = 0; i < sum.size(); ++i) {
    const uint64_t w = sum[i];
    if ((w & ~m) != 0)
      STARLING_THROW(InvalidArgument, "decode: word ", i, " is ", w, ", not in Z_2^", r.bits);
    // Two's complement in b bits: a set sign bit extends through the bits above b (C++20 converts
    // unsigned to signed modulo 2^64).
    const auto v = static_cast<int64_t>((w & sign) ? (w | ~m) : w);
    out[i] = static_cast<float>(static_cast<double>(v) / r.scale);
  }
}

void add(const RingSpec& r, std::span<uint64_t> acc, std::span<const uint64_t> x) {
  STARLING_CHECK_ARG(acc.size() == x.size(), "ring add: ", x.size(), " values into ", acc.size());
  const uint64_t m = r.mask();
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = (acc[i] + x[i]) & m;
}

void sub(const RingSpec& r, std::span<uint64_t> acc, std::span<const uint64_t> x) {
  STARLING_CHECK_ARG(acc.size() == x.size(), "ring sub: ", x.size(), " values from ", acc.size());
  const uint64_t m = r.mask();
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = (acc[i] - x[i]) & m;
}

}  // namespace starling::privacy
