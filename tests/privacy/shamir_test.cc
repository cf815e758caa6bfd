// Shamir sharing over GF(2^61 - 1) (privacy/shamir.h): the field against hand-worked values, any t
// shares give the secret back, fewer are refused, an altered share is caught.
#include "privacy/shamir.h"

#include <catch2/catch.hpp>
#include <vector>

#include "core/error.h"

using namespace starling;
using namespace starling::privacy;
using namespace starling::privacy::detail;

namespace {
constexpr uint64_t p = kShamirPrime;
}

TEST_CASE("shamir: field arithmetic against hand-worked values", "[privacy][shamir]") {
  CHECK(fieldAdd(p - 1, 1) == 0);
  CHECK(fieldAdd(p - 1, 5) == 4);
  CHECK(fieldSub(3, 5) == p - 2);
  CHECK(fieldMul(p - 1, p - 1) == 1);          // (-1)(-1)
  CHECK(fieldMul(uint64_t{1} << 60, 2) == 1);  // 2^61 = 1 mod p
  CHECK(fieldMul(uint64_t{1} << 60, 4) == 2);
  CHECK(fieldMul(fieldInverse(3), 3) == 1);
  CHECK(fieldInverse(2) == (p + 1) / 2);
  CHECK_THROWS_AS(fieldInverse(0), InvalidArgument);
  // f(x) = 5 + 3x + 2x^2: f(1) = 10, f(2) = 19, f(3) = 32.
  const std::vector<uint64_t> f{5, 3, 2};
  CHECK(evaluate(f, 1) == 10);
  CHECK(evaluate(f, 2) == 19);
  CHECK(evaluate(f, 3) == 32);
  const std::vector<uint64_t> xs{1, 2, 3}, ys{10, 19, 32};
  CHECK(interpolate(xs, ys, 0) == 5);
  CHECK(interpolate(xs, ys, 4) == 49);  // 5 + 12 + 32
  // Wrapping: g(x) = 7 + (p - 1) x = 7 - x: g(1) = 6, g(2) = 5; from them g(0) = 2 g(1) - g(2) = 7.
  const std::vector<uint64_t> g{7, p - 1};
  CHECK(evaluate(g, 1) == 6);
  CHECK(evaluate(g, 2) == 5);
  CHECK(evaluate(g, 10) == p - 3);
  const std::vector<uint64_t> gx{1, 2}, gy{6, 5};
  CHECK(interpolate(gx, gy, 0) == 7);
}

TEST_CASE("shamir: any t of n shares give the secret, in any order", "[privacy][shamir]") {
  const Key32 secret = randomKey();
  const std::vector<uint64_t> xs{1, 2, 3, 4, 5, 6, 7};
  for (uint32_t t : {1u, 2u, 4u, 7u}) {
    INFO("threshold " << t);
    const std::vector<Share> shares = shamirSplit(secret, t, xs);
    REQUIRE(shares.size() == xs.size());
    // Every window of t consecutive shares (cyclically), and them reversed.
    for (size_t start = 0; start < xs.size(); ++start) {
      std::vector<Share> pick;
      for (size_t i = 0; i < t; ++i) pick.push_back(shares[(start + i) % xs.size()]);
      CHECK(shamirCombine(pick, t) == secret);
      std::reverse(pick.begin(), pick.end());
      CHECK(shamirCombine(pick, t) == secret);
    }
    CHECK(shamirCombine(shares, t) == secret);  // all of them, consistent
    if (t > 1) {
      const std::vector<Share> few(shares.begin(), shares.begin() + (t - 1));
      CHECK_THROWS_AS(shamirCombine(few, t), InvalidArgument);
      // t - 1 shares of a degree t - 1 polynomial, interpolated as if they were all: a random field
      // element per limb, which fails the 32-bit check (all 8 limbs pass with chance 2^-232).
      CHECK_THROWS_AS(shamirCombine(few, t - 1), InvalidArgument);
    }
  }
}

TEST_CASE("shamir: an altered, repeated or foreign share is refused", "[privacy][shamir]") {
  const Key32 secret = randomKey(), other = randomKey();
  const std::vector<uint64_t> xs{11, 22, 33, 44, 55};
  std::vector<Share> shares = shamirSplit(secret, 3, xs);
  // An altered value: caught when a fourth share checks the first three.
  std::vector<Share> bad = shares;
  bad[3].y[5] = fieldAdd(bad[3].y[5], 1);
  CHECK_THROWS_AS(shamirCombine(bad, 3), InvalidArgument);
  bad = shares;
  bad[0].y[0] = fieldAdd(bad[0].y[0], 1);
  CHECK_THROWS_AS(shamirCombine(bad, 3), InvalidArgument);
  // A share of another secret at a fresh point.
  std::vector<Share> mixed(shares.begin(), shares.begin() + 3);
  mixed.push_back(shamirSplit(other, 3, std::vector<uint64_t>{66, 77, 88})[0]);
  CHECK_THROWS_AS(shamirCombine(mixed, 3), InvalidArgument);
  // The same point twice, a zero point, a value beyond the field.
  std::vector<Share> twice{shares[0], shares[0], shares[1]};
  CHECK_THROWS_AS(shamirCombine(twice, 3), InvalidArgument);
  Share zero = shares[0];
  zero.x = 0;
  CHECK_THROWS_AS(shamirCombine(std::vector<Share>{zero, shares[1], shares[2]}, 3),
                  InvalidArgument);
  Share big = shares[0];
  big.y[2] = p;
  CHECK_THROWS_AS(shamirCombine(std::vector<Share>{big, shares[1], shares[2]}, 3), InvalidArgument);
  // Splitting: distinct points in the field, a threshold in 1..n.
  CHECK_THROWS_AS(shamirSplit(secret, 0, xs), InvalidArgument);
  CHECK_THROWS_AS(shamirSplit(secret, 6, xs), InvalidArgument);
  CHECK_THROWS_AS(shamirSplit(secret, 2, std::vector<uint64_t>{1, 1}), InvalidArgument);
  CHECK_THROWS_AS(shamirSplit(secret, 1, std::vector<uint64_t>{0}), InvalidArgument);
}

TEST_CASE("shamir: a share's bytes round-trip and are checked", "[privacy][shamir]") {
  const std::vector<Share> shares = shamirSplit(randomKey(), 2, std::vector<uint64_t>{3, 9});
  for (const Share& s : shares) {
    const auto b = s.bytes();
    const Share back = Share::fromBytes(b);
    CHECK(back.x == s.x);
    CHECK(back.y == s.y);
  }
  auto b = shares[0].bytes();
  CHECK_THROWS_AS(Share::fromBytes(std::span<const uint8_t>(b).first(b.size() - 1)),
                  InvalidArgument);
  b[0] = b[1] = b[2] = b[3] = b[4] = b[5] = b[6] = b[7] = 0;  // point 0
  CHECK_THROWS_AS(Share::fromBytes(b), InvalidArgument);
  b = shares[0].bytes();
  for (int i = 8; i < 16; ++i) b[i] = 0xff;  // a value of 2^64 - 1
  CHECK_THROWS_AS(Share::fromBytes(b), InvalidArgument);
}

TEST_CASE("shamir: up to (m - t) / 2 wrong shares are decoded around and named, more refused",
          "[privacy][shamir]") {
  // m = 9 shares, t = 4: up to 2 wrong shares are corrected, whichever limbs they alter.
  const Key32 secret = randomKey();
  std::vector<uint64_t> xs;
  for (uint64_t x = 1; x <= 9; ++x) xs.push_back(x * 7919);
  const std::vector<Share> shares = shamirSplit(secret, 4, xs);
  // Honest shares: nothing named.
  Recovered r = shamirRecover(shares, 4);
  CHECK(r.secret == secret);
  CHECK(r.wrong.empty());
  for (size_t a = 0; a < shares.size(); ++a)
    for (size_t b = a; b < shares.size(); ++b) {
      INFO("wrong shares at " << a << " and " << b);
      std::vector<Share> bad = shares;
      bad[a].y[a % 8] = fieldAdd(bad[a].y[a % 8], 12345);   // one limb
      for (uint64_t& y : bad[b].y) y = fieldAdd(y, b + 1);  // every limb
      r = shamirRecover(bad, 4);
      CHECK(r.secret == secret);
      std::vector<uint64_t> want{xs[a]};
      if (b != a) want.push_back(xs[b]);
      CHECK(r.wrong == want);
      // shamirCombine refuses what shamirRecover decodes around.
      CHECK_THROWS_AS(shamirCombine(bad, 4), InvalidArgument);
    }
  // Three wrong shares are more than 9 shares of degree < 4 can correct: refused, never a wrong
  // secret passed off as right.
  for (size_t a = 0; a + 2 < shares.size(); ++a) {
    std::vector<Share> bad = shares;
    for (size_t i = a; i < a + 3; ++i)
      for (uint64_t& y : bad[i].y) y = fieldAdd(y, 1000 + i);
    CHECK_THROWS_WITH(shamirRecover(bad, 4), Catch::Matchers::Contains("too many inconsistent"));
  }
  // Wrong in different limbs, two shares each alone correctable, three together are not.
  std::vector<Share> spread = shares;
  spread[0].y[0] = fieldAdd(spread[0].y[0], 1);
  spread[1].y[1] = fieldAdd(spread[1].y[1], 1);
  spread[2].y[2] = fieldAdd(spread[2].y[2], 1);
  CHECK_THROWS_WITH(shamirRecover(spread, 4), Catch::Matchers::Contains("too many"));
  // The checks on points and values stay.
  std::vector<Share> twice = shares;
  twice[1].x = twice[0].x;
  CHECK_THROWS_AS(shamirRecover(twice, 4), InvalidArgument);
}

TEST_CASE("shamir: Berlekamp-Welch finds the polynomial of random codes with errors",
          "[privacy][shamir]") {
  // Polynomials of degree < k at n points, e = (n - k) / 2 values replaced: decoded exactly; the
  // same without errors; for several (n, k).
  uint64_t seed = 1;
  const auto next = [&] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (seed >> 3) % p;
  };
  for (const auto& [n, k] : {std::pair<size_t, size_t>{5, 1}, {7, 3}, {12, 5}, {30, 16}, {3, 3}}) {
    std::vector<uint64_t> coeffs(k), xs(n), ys(n);
    for (auto& c : coeffs) c = next();
    for (size_t i = 0; i < n; ++i) {
      xs[i] = i + 1;
      ys[i] = evaluate(coeffs, xs[i]);
    }
    auto clean = decodeReedSolomon(xs, ys, k);
    REQUIRE(clean);
    CHECK(*clean == coeffs);
    const size_t e = (n - k) / 2;
    for (size_t i = 0; i < e; ++i) ys[(3 * i + 1) % n] = fieldAdd(ys[(3 * i + 1) % n], next() | 1);
    auto decoded = decodeReedSolomon(xs, ys, k);
    REQUIRE(decoded);
    CHECK(*decoded == coeffs);
  }
}
