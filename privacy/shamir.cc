#include "privacy/shamir.h"

#include <sodium.h>

#include <set>

#include "core/error.h"

namespace starling::privacy {
namespace detail {

uint64_t fieldAdd(uint64_t a, uint64_t b) {
  uint64_t s = a + b;  // both < 2^61: no overflow
  return s >= kShamirPrime ? s - kShamirPrime : s;
}
uint64_t fieldSub(uint64_t a, uint64_t b) { return a >= b ? a - b : a + kShamirPrime - b; }
uint64_t fieldMul(uint64_t a, uint64_t b) {
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  // p < 2^122; p = hi 2^61 + lo, and 2^61 = 1 mod p.
  const uint64_t lo = static_cast<uint64_t>(p) & kShamirPrime;
  const uint64_t hi = static_cast<uint64_t>(p >> 61);
  return fieldAdd(lo, hi >= kShamirPrime ? hi - kShamirPrime : hi);
}
uint64_t fieldInverse(uint64_t a) {
  STARLING_CHECK_ARG(a % kShamirPrime != 0, "the inverse of 0");
  // a^(p-2) by square and multiply.
  uint64_t result = 1, base = a % kShamirPrime, e = kShamirPrime - 2;
  while (e) {
    if (e & 1) result = fieldMul(result, base);
    base = fieldMul(base, base);
    e >>= 1;
  }
  return result;
}
uint64_t evaluate(std::span<const uint64_t> coeffs, uint64_t x) {
  uint64_t acc = 0;
  for (size_t k = coeffs.size(); k-- > 0;) acc = fieldAdd(fieldMul(acc, x), coeffs[k]);
  return acc;
}
uint64_t interpolate(std::span<const uint64_t> xs, std::span<const uint64_t> ys, uint64_t at) {
  STARLING_CHECK_ARG(xs.size() == ys.size() && !xs.empty(), "interpolate: ", xs.size(),
                     " points and ", ys.size(), " values");
  uint64_t acc = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    uint64_t num = 1, den = 1;
    for (size_t j = 0; j < xs.size(); ++j) {
      if (j == i) continue;
      num = fieldMul(num, fieldSub(at, xs[j]));
      den = fieldMul(den, fieldSub(xs[i], xs[j]));
    }
    acc = fieldAdd(acc, fieldMul(ys[i], fieldMul(num, fieldInverse(den))));
  }
  return acc;
}

}  // namespace detail

namespace {
// A uniform field element from the OS's cryptographic source (61 random bits, rejecting p itself
// and above: 2^61 - 1 values are accepted out of 2^61).
uint64_t randomElement() {
  for (;;) {
    uint64_t v = 0;
    randombytes_buf(&v, sizeof v);
    v &= (uint64_t{1} << 61) - 1;
    if (v < kShamirPrime) return v;
  }
}
}  // namespace

std::array<uint8_t, Share::kBytes> Share::bytes() const {
  std::array<uint8_t, kBytes> out{};
  const auto put = [&](size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) out[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  put(0, x);
  for (size_t k = 0; k < 8; ++k) put(8 + 8 * k, y[k]);
  return out;
}

Share Share::fromBytes(std::span<const uint8_t> b) {
  STARLING_CHECK_ARG(b.size() == kBytes, "a share is ", kBytes, " bytes, not ", b.size());
  const auto get = [&](size_t at) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[at + i]) << (8 * i);
    return v;
  };
  Share s;
  s.x = get(0);
  STARLING_CHECK_ARG(s.x != 0 && s.x < kShamirPrime, "a share's point ", s.x,
                     " is not in 1 .. 2^61 - 2");
  for (size_t k = 0; k < 8; ++k) {
    s.y[k] = get(8 + 8 * k);
    STARLING_CHECK_ARG(s.y[k] < kShamirPrime, "a share's value ", s.y[k],
                       " is not in GF(2^61 - 1)");
  }
  return s;
}

std::vector<Share> shamirSplit(const Key32& secret, uint32_t threshold,
                               std::span<const uint64_t> xs) {
  ensureSodium();
  STARLING_CHECK_ARG(threshold >= 1 && threshold <= xs.size(), "shamir: threshold ", threshold,
                     " of ", xs.size(), " shares");
  std::set<uint64_t> seen;
  for (uint64_t x : xs)
    STARLING_CHECK_ARG(x != 0 && x < kShamirPrime && seen.insert(x).second,
                       "shamir: the points must be distinct and in 1 .. 2^61 - 2 (", x, ")");
  std::vector<Share> out(xs.size());
  for (size_t j = 0; j < xs.size(); ++j) out[j].x = xs[j];
  std::vector<uint64_t> coeffs(threshold);
  for (size_t k = 0; k < 8; ++k) {
    uint32_t limb = 0;
    for (int b = 0; b < 4; ++b) limb |= static_cast<uint32_t>(secret[4 * k + b]) << (8 * b);
    coeffs[0] = limb;
    for (size_t c = 1; c < threshold; ++c) coeffs[c] = randomElement();
    for (size_t j = 0; j < xs.size(); ++j) out[j].y[k] = detail::evaluate(coeffs, xs[j]);
  }
  sodium_memzero(coeffs.data(), coeffs.size() * sizeof(uint64_t));
  return out;
}

Key32 shamirCombine(std::span<const Share> shares, uint32_t threshold) {
  STARLING_CHECK_ARG(threshold >= 1, "shamir: threshold 0");
  if (shares.size() < threshold)
    STARLING_THROW(InvalidArgument, "shamir: ", shares.size(), " shares, ", threshold, " needed");
  std::set<uint64_t> seen;
  for (const Share& s : shares) {
    STARLING_CHECK_ARG(s.x != 0 && s.x < kShamirPrime && seen.insert(s.x).second,
                       "shamir: the shares' points must be distinct and in 1 .. 2^61 - 2 (", s.x,
                       ")");
    for (uint64_t v : s.y) STARLING_CHECK_ARG(v < kShamirPrime, "shamir: a value beyond the field");
  }
  std::vector<uint64_t> xs(threshold), ys(threshold);
  for (size_t i = 0; i < threshold; ++i) xs[i] = shares[i].x;
  Key32 out{};
  for (size_t k = 0; k < 8; ++k) {
    for (size_t i = 0; i < threshold; ++i) ys[i] = shares[i].y[k];
    const uint64_t limb = detail::interpolate(xs, ys, 0);
    // Every further share must lie on the same polynomial.
    for (size_t i = threshold; i < shares.size(); ++i)
      if (detail::interpolate(xs, ys, shares[i].x) != shares[i].y[k])
        STARLING_THROW(InvalidArgument, "shamir: inconsistent shares (the share at ", shares[i].x,
                       " is not on the polynomial of the first ", threshold, ")");
    if (limb >> 32)
      STARLING_THROW(InvalidArgument, "shamir: inconsistent shares (a limb of ", limb,
                     " is not 32 bits)");
    for (int b = 0; b < 4; ++b) out[4 * k + b] = static_cast<uint8_t>(limb >> (8 * b));
  }
  return out;
}

}  // namespace starling::privacy
