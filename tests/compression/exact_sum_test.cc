// compression/exact_sum.h: the sum of |v| correctly rounded to double, whatever the order.
#include "compression/exact_sum.h"

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"

using namespace starling;
using compression::exactAbsSum;
using compression::exactSquareSum;

namespace {

bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// An independent reference for floats whose exponents lie in [lo, lo + window]: each |v| (or v^2)
// as an exact 128-bit multiple of 2^(lo - 150) (or its square), summed exactly, then one
// correctly rounded conversion. The window keeps the sum within 128 bits: 50 for |v|, 25 for v^2.
double referenceSum(const std::vector<float>& v, int lo, int window, bool squares) {
  unsigned __int128 sum = 0;
  bool in_window = true;
  const int unit = std::max(lo, 1);
  for (float x : v) {
    const uint32_t bits = std::bit_cast<uint32_t>(x) & 0x7fffffffu;
    const int e = static_cast<int>(bits >> 23);
    in_window = in_window && e >= lo && e <= lo + window;
    const unsigned __int128 m = (bits & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
    const int shift = std::max(e, 1) - unit;
    sum += squares ? (m * m) << (2 * shift) : m << shift;
  }
  REQUIRE(in_window);
  return std::ldexp(static_cast<double>(sum), (squares ? 2 : 1) * (unit - 150));
}

std::vector<float> randomFloats(size_t n, int lo, int window, uint64_t seed) {
  RngStream r(StreamKey{seed, 0, 0, StreamPurpose::kTest, static_cast<uint64_t>(lo)});
  std::vector<float> v(n);
  for (float& x : v) {
    // Random significands over a window of exponents, both signs, some exact repeats.
    const uint32_t e = static_cast<uint32_t>(lo) + static_cast<uint32_t>(r.below(window + 1));
    const uint32_t m = r.below(4) == 0 ? 0x400000u : static_cast<uint32_t>(r.below(0x800000));
    x = std::bit_cast<float>((static_cast<uint32_t>(r.below(2)) << 31) | (e << 23) | m);
  }
  return v;
}

}  // namespace

TEST_CASE("exactAbsSum rounds once, to nearest with ties to even", "[compression][exact_sum]") {
  const float big = 0x1p53f;  // a double's ulp there is 2
  CHECK(exactAbsSum({}) == 0.0);
  CHECK(sameBits(exactAbsSum(std::vector<float>{0.0f, -0.0f}), 0.0));
  // Left to right in double both 1s are lost; the exact sum keeps them.
  CHECK(exactAbsSum(std::vector<float>{big, 1.0f, 1.0f}) == 0x1p53 + 2.0);
  // Ties: 2^53 + 1 to the even 2^53, 2^53 + 3 to the even 2^53 + 4; just past a tie, up.
  CHECK(exactAbsSum(std::vector<float>{big, 1.0f}) == 0x1p53);
  CHECK(exactAbsSum(std::vector<float>{big, -3.0f}) == 0x1p53 + 4.0);
  CHECK(exactAbsSum(std::vector<float>{big, 1.0f, 0x1p-20f}) == 0x1p53 + 2.0);
  CHECK(exactAbsSum(std::vector<float>{0x1p-20f, 1.0f, big}) == 0x1p53 + 2.0);
  // Denormals are exact multiples of 2^-149; the largest finite floats do not overflow.
  CHECK(exactAbsSum(std::vector<float>{0x1p-149f, -0x1p-149f, 0x1p-149f}) == std::ldexp(3.0, -149));
  CHECK(exactAbsSum(std::vector<float>{0x1p-126f, 0x1p-149f}) == 0x1p-126 + 0x1p-149);
  const float fmax = std::numeric_limits<float>::max();
  CHECK(exactAbsSum(std::vector<float>(1000, fmax)) == 1000.0 * static_cast<double>(fmax));
}

TEST_CASE("exactAbsSum is the exact sum rounded, in any order", "[compression][exact_sum]") {
  for (const int lo : {0, 60, 100}) {  // 0: denormals among them
    INFO("exponents from " << lo);
    RngStream r(StreamKey{6, 0, 0, StreamPurpose::kTest, 0});
    const std::vector<float> v = randomFloats(100000, lo, 50, 5);
    const double want = referenceSum(v, lo, 50, false);
    const double got = exactAbsSum(v);
    CHECK(sameBits(got, want));
    std::vector<float> shuffled = v;
    std::shuffle(shuffled.begin(), shuffled.end(), r);
    CHECK(sameBits(exactAbsSum(shuffled), got));
    std::sort(shuffled.begin(), shuffled.end());
    CHECK(sameBits(exactAbsSum(shuffled), got));
    // Buckets filled in parts add up to the same sum.
    compression::ExponentBuckets b{};
    compression::addAbsSignificands(std::span(v).first(33333), b);
    compression::addAbsSignificands(std::span(v).subspan(33333), b);
    CHECK(sameBits(compression::roundBuckets(b), got));
  }
}

TEST_CASE("exactSquareSum is the exact sum of squares rounded, in any order",
          "[compression][exact_sum]") {
  CHECK(exactSquareSum({}) == 0.0);
  CHECK(exactSquareSum(std::vector<float>{3.0f, -4.0f}) == 25.0);
  // 2^-149 squared is 2^-298, far below a float and exact in a double.
  CHECK(exactSquareSum(std::vector<float>{0x1p-149f, 0x1p-149f}) == std::ldexp(1.0, -297));
  // Left to right in double each 1 is lost after 2^54 (its ulp is 4); exactly, 2^54 + 5 is nearest
  // 2^54 + 4, and 2^54 + 6, a tie, goes to the even 2^54 + 8.
  CHECK(exactSquareSum(std::vector<float>{0x1p27f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}) == 0x1p54 + 4.0);
  CHECK(exactSquareSum(std::vector<float>{0x1p27f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, -1.0f}) ==
        0x1p54 + 8.0);
  const float fmax = std::numeric_limits<float>::max();
  CHECK(exactSquareSum(std::vector<float>(4, fmax)) ==
        4.0 * static_cast<double>(fmax) * static_cast<double>(fmax));
  for (const int lo : {0, 90, 200}) {
    INFO("exponents from " << lo);
    const std::vector<float> v = randomFloats(100000, lo, 25, 9);
    const double got = exactSquareSum(v);
    CHECK(sameBits(got, referenceSum(v, lo, 25, true)));
    std::vector<float> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sameBits(exactSquareSum(sorted), got));
  }
}

TEST_CASE("roundBuckets carries across words and rounds ties at a word's edge",
          "[compression][exact_sum]") {
  // Bucket e holds significands in units of 2^(max(e, 1) - 150): bucket 1 at bit 0 of the wide
  // sum, bucket 65 at bit 64, bucket 117 at bit 116 (all times 2^-149).
  const auto sum = [](std::initializer_list<std::pair<size_t, uint64_t>> terms) {
    compression::ExponentBuckets b{};
    for (const auto& [e, v] : terms) b[e] = v;
    return compression::roundBuckets(b);
  };
  constexpr uint64_t kAll = ~uint64_t{0};
  // (2^64 - 1) + 2 + (2^64 - 1) 2^64 = 2^128 + 1: a carry through a full word; to 53 bits, 2^128.
  CHECK(sum({{1, kAll}, {2, 1}, {65, kAll}}) == std::ldexp(1.0, 128 - 149));
  // 3 (2^64 - 1): a carry into the next word, rounded to 3 x 2^64.
  CHECK(sum({{1, kAll}, {2, kAll}}) == std::ldexp(3.0, 64 - 149));
  // 2^116 + 2^63: the half bit is a word's top bit, nothing under it, the kept bits even: down.
  CHECK(sum({{117, 1}, {64, 1}}) == std::ldexp(1.0, 116 - 149));
  // 2^116 + 2^64 + 2^63: the same tie with the kept bits odd: up, to 2^116 + 2^65.
  CHECK(sum({{117, 1}, {65, 1}, {64, 1}}) ==
        std::ldexp(1.0, 116 - 149) + std::ldexp(1.0, 65 - 149));
  // 2^116 + 2^63 + 1: past the tie by a bit in the lowest word: up.
  CHECK(sum({{117, 1}, {64, 1}, {1, 1}}) == std::ldexp(1.0, 116 - 149) + std::ldexp(1.0, 64 - 149));
}
