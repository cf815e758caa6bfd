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

namespace {
// A solution of the linear system a z = b over GF(p) (a: rows x cols, row-major, b: rows), free
// unknowns 0, or nullopt when it has none. Gaussian elimination with the first non-zero pivot.
std::optional<std::vector<uint64_t>> solve(std::vector<uint64_t> a, std::vector<uint64_t> b,
                                           size_t rows, size_t cols) {
  std::vector<size_t> pivot_col;
  size_t r = 0;
  for (size_t c = 0; c < cols && r < rows; ++c) {
    size_t found = rows;
    for (size_t i = r; i < rows; ++i)
      if (a[i * cols + c] != 0) {
        found = i;
        break;
      }
    if (found == rows) continue;
    if (found != r) {
      for (size_t j = 0; j < cols; ++j) std::swap(a[r * cols + j], a[found * cols + j]);
      std::swap(b[r], b[found]);
    }
    const uint64_t inv = fieldInverse(a[r * cols + c]);
    for (size_t j = c; j < cols; ++j) a[r * cols + j] = fieldMul(a[r * cols + j], inv);
    b[r] = fieldMul(b[r], inv);
    for (size_t i = 0; i < rows; ++i) {
      if (i == r || a[i * cols + c] == 0) continue;
      const uint64_t f = a[i * cols + c];
      for (size_t j = c; j < cols; ++j)
        a[i * cols + j] = fieldSub(a[i * cols + j], fieldMul(f, a[r * cols + j]));
      b[i] = fieldSub(b[i], fieldMul(f, b[r]));
    }
    pivot_col.push_back(c);
    ++r;
  }
  for (size_t i = r; i < rows; ++i)
    if (b[i] != 0) return std::nullopt;  // 0 = b[i]: inconsistent
  std::vector<uint64_t> z(cols, 0);
  for (size_t i = 0; i < r; ++i) z[pivot_col[i]] = b[i];
  return z;
}
}  // namespace

std::optional<std::vector<uint64_t>> decodeReedSolomon(std::span<const uint64_t> xs,
                                                       std::span<const uint64_t> ys, size_t k) {
  const size_t n = xs.size();
  STARLING_CHECK_ARG(ys.size() == n && k >= 1 && k <= n, "decodeReedSolomon: ", n, " points, ",
                     ys.size(), " values, degree < ", k);
  const size_t e = (n - k) / 2;
  // Q(x_i) = y_i E(x_i) with E monic of degree e and Q of degree < k + e: unknowns Q_0 ..
  // Q_{k+e-1}, E_0 .. E_{e-1}; each point gives sum_j Q_j x^j - y sum_j E_j x^j = y x^e.
  const size_t cols = k + 2 * e;
  std::vector<uint64_t> a(n * cols), b(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t pw = 1;
    for (size_t j = 0; j < k + e; ++j) {  // j reaches e: k >= 1
      a[i * cols + j] = pw;
      if (j < e) a[i * cols + k + e + j] = fieldSub(0, fieldMul(ys[i], pw));
      if (j == e) b[i] = fieldMul(ys[i], pw);
      pw = fieldMul(pw, xs[i]);
    }
  }
  const auto z = solve(std::move(a), std::move(b), n, cols);
  if (!z) return std::nullopt;
  // P = Q / E, which must divide exactly.
  std::vector<uint64_t> rem(z->begin(), z->begin() + static_cast<std::ptrdiff_t>(k + e));
  std::vector<uint64_t> den(z->begin() + static_cast<std::ptrdiff_t>(k + e), z->end());
  den.push_back(1);  // monic
  std::vector<uint64_t> quot(k, 0);
  for (size_t d = k; d-- > 0;) {
    const uint64_t c = rem[d + e];  // the leading coefficient left (E is monic)
    quot[d] = c;
    if (c == 0) continue;
    for (size_t j = 0; j <= e; ++j) rem[d + j] = fieldSub(rem[d + j], fieldMul(c, den[j]));
  }
  for (size_t j = 0; j < e; ++j)
    if (rem[j] != 0) return std::nullopt;
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += evaluate(quot, xs[i]) != ys[i];
  if (wrong > e) return std::nullopt;
  return quot;
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

namespace {
// What combining needs of the shares: at least `threshold`, distinct points in the field, values
// in it (InvalidArgument otherwise).
void checkShares(std::span<const Share> shares, uint32_t threshold) {
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
}
}  // namespace

namespace {
// The first share off the polynomials the first `threshold` define (the points checked), if any.
std::optional<size_t> firstOff(std::span<const Share> shares, uint32_t threshold) {
  std::vector<uint64_t> xs(threshold), ys(threshold);
  for (size_t i = 0; i < threshold; ++i) xs[i] = shares[i].x;
  for (size_t k = 0; k < 8; ++k) {
    for (size_t i = 0; i < threshold; ++i) ys[i] = shares[i].y[k];
    for (size_t i = threshold; i < shares.size(); ++i)
      if (detail::interpolate(xs, ys, shares[i].x) != shares[i].y[k]) return i;
  }
  return std::nullopt;
}

// The secret of the limbs' constant terms `limbs` (InvalidArgument for one past 32 bits).
Key32 secretOf(const std::array<uint64_t, 8>& limbs) {
  Key32 out{};
  for (size_t k = 0; k < 8; ++k) {
    if (limbs[k] >> 32)
      STARLING_THROW(InvalidArgument, "shamir: inconsistent shares (a limb of ", limbs[k],
                     " is not 32 bits)");
    for (int b = 0; b < 4; ++b) out[4 * k + b] = static_cast<uint8_t>(limbs[k] >> (8 * b));
  }
  return out;
}

// The secret the first `threshold` shares give.
Key32 secretOfFirst(std::span<const Share> shares, uint32_t threshold) {
  std::vector<uint64_t> xs(threshold), ys(threshold);
  for (size_t i = 0; i < threshold; ++i) xs[i] = shares[i].x;
  std::array<uint64_t, 8> limbs{};
  for (size_t k = 0; k < 8; ++k) {
    for (size_t i = 0; i < threshold; ++i) ys[i] = shares[i].y[k];
    limbs[k] = detail::interpolate(xs, ys, 0);
  }
  return secretOf(limbs);
}
}  // namespace

Key32 shamirCombine(std::span<const Share> shares, uint32_t threshold) {
  checkShares(shares, threshold);
  if (const auto off = firstOff(shares, threshold))
    STARLING_THROW(InvalidArgument, "shamir: inconsistent shares (the share at ", shares[*off].x,
                   " is not on the polynomial of the first ", threshold, ")");
  return secretOfFirst(shares, threshold);
}

Recovered shamirRecover(std::span<const Share> shares, uint32_t threshold) {
  // The checks of points and values, and the common case: every share on one polynomial.
  checkShares(shares, threshold);
  if (!firstOff(shares, threshold)) return Recovered{secretOfFirst(shares, threshold), {}};
  const size_t n = shares.size();
  std::vector<uint64_t> xs(n), ys(n);
  for (size_t i = 0; i < n; ++i) xs[i] = shares[i].x;
  Recovered out;
  std::array<uint64_t, 8> limbs{};
  std::set<uint64_t> wrong;
  for (size_t k = 0; k < 8; ++k) {
    for (size_t i = 0; i < n; ++i) ys[i] = shares[i].y[k];
    const auto poly = detail::decodeReedSolomon(xs, ys, threshold);
    if (!poly)
      STARLING_THROW(InvalidArgument, "shamir: too many inconsistent shares (more than ",
                     (n - threshold) / 2, " of ", n, " are off the polynomial of degree < ",
                     threshold, ")");
    for (size_t i = 0; i < n; ++i)
      if (detail::evaluate(*poly, xs[i]) != ys[i]) wrong.insert(xs[i]);
    limbs[k] = (*poly)[0];
  }
  // Wrong in different limbs, they may together be more than one decoding corrects. (A limb
  // decoded to a wrong polynomial, when more than e of its shares are wrong, may name honest
  // points: the caller's commitment check then fails the secret.)
  if (wrong.size() > (n - threshold) / 2)
    STARLING_THROW(InvalidArgument, "shamir: too many inconsistent shares (", wrong.size(), " of ",
                   n, " are wrong, at most ", (n - threshold) / 2, " can be corrected)");
  out.secret = secretOf(limbs);
  out.wrong.assign(wrong.begin(), wrong.end());
  return out;
}

}  // namespace starling::privacy
