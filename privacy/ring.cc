#include "privacy/ring.h"

#include <cmath>

#include "core/error.h"

namespace starling::privacy {
namespace {

// The smallest scale * clip that keeps rounding within 2^-kPrecisionBits of an update's norm.
double minScaledClip(uint64_t dim) {
  return std::ldexp(std::sqrt(static_cast<double>(dim)), RingSpec::kPrecisionBits);
}

// The largest scale * clip a sum of n values may have in b bits: n (s C + 1) <= 2^(b-1) - 1, in
// long double (2^63 - 1 is exact there, not in double), then rounded down to a double.
double maxScaledClip(uint32_t bits, uint64_t n) {
  const long double room = std::ldexp(1.0L, static_cast<int>(bits) - 1) - 1.0L;
  const long double v = room / static_cast<long double>(n) - 1.0L;
  double d = static_cast<double>(v);
  if (static_cast<long double>(d) > v) d = std::nextafter(d, 0.0);
  return d;
}

}  // namespace

uint32_t RingSpec::bitsNeeded(uint64_t max_clients, uint64_t dim) {
  for (uint32_t b = kMinBits; b <= kMaxBits; ++b)
    if (maxScaledClip(b, max_clients) >= minScaledClip(dim)) return b;
  return kMaxBits + 1;
}

RingSpec RingSpec::fit(uint32_t bits, double clip, uint64_t max_clients, uint64_t dim) {
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
  const double scaled = maxScaledClip(bits, max_clients);
  if (!(scaled >= minScaledClip(dim))) {
    const uint32_t need = bitsNeeded(max_clients, dim);
    STARLING_THROW(ConfigError, "secagg.bits = ", bits, " cannot hold the sum of ", max_clients,
                   " clipped updates of ", dim, " values: scaled to keep that sum below 2^",
                   bits - 1, ", each update's rounding would cost ",
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
  r.validate();
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
  // The bound in long double: n (s C + 1) against 2^(b-1) - 1, each exactly representable up to
  // 2^64.
  const long double worst =
      static_cast<long double>(max_clients) * (static_cast<long double>(scale) * clip + 1.0L);
  if (worst > static_cast<long double>(maxMagnitude()))
    STARLING_THROW(ConfigError, "ring: ", max_clients, " values of up to ", scale * clip + 1,
                   " (scale ", scale, " x clip ", clip, ", + 1 for rounding) can sum to ",
                   static_cast<double>(worst), ", beyond the ", bits, "-bit ring's signed range (",
                   maxMagnitude(), "): the sum would wrap");
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
