#include "compression/exact_sum.h"

#include <bit>
#include <cmath>

namespace starling::compression {
namespace {

// A non-negative integer of 640 bits: the exact sum of 64-bit terms shifted left by up to 576.
class WideSum {
 public:
  void add(uint64_t term, size_t shift) {
    if (term == 0) return;
    const size_t word = shift / 64, bit = shift % 64;
    const uint64_t parts[2] = {term << bit, bit == 0 ? 0 : term >> (64 - bit)};
    uint64_t carry = 0;
    for (size_t j = word; j < kWords; ++j) {
      const uint64_t add = j - word < 2 ? parts[j - word] : 0;
      const uint64_t s = w_[j] + add;
      const uint64_t c1 = s < add ? 1 : 0;
      w_[j] = s + carry;
      carry = c1 + (w_[j] < carry ? 1 : 0);  // at most 1: s + carry overflows only when s did not
      if (j > word && carry == 0) break;
    }
  }

  // The integer times 2^unit_exp, correctly rounded to double (to nearest, ties to even).
  double toDouble(int unit_exp) const {
    size_t top = kWords;
    while (top > 0 && w_[top - 1] == 0) --top;
    if (top == 0) return 0.0;
    const size_t p = (top - 1) * 64 + 63 - static_cast<size_t>(std::countl_zero(w_[top - 1]));
    if (p < 53) return std::ldexp(static_cast<double>(w_[0]), unit_exp);  // exact
    const size_t low = p - 52;  // the 53 kept bits are [low, p]
    uint64_t mant = bitsFrom(low) & ((uint64_t{1} << 53) - 1);
    const bool half = (bitsFrom(low - 1) & 1) != 0;
    const size_t below = low - 1;  // sticky: any bit under the half bit
    bool sticky = false;
    for (size_t j = 0; j < below / 64 && !sticky; ++j) sticky = w_[j] != 0;
    if (!sticky && below % 64 != 0)
      sticky = (w_[below / 64] & ((uint64_t{1} << (below % 64)) - 1)) != 0;
    if (half && (sticky || (mant & 1) != 0)) ++mant;  // 2^53 after the carry is exact too
    return std::ldexp(static_cast<double>(mant), static_cast<int>(low) + unit_exp);
  }

 private:
  static constexpr size_t kWords = 10;
  // The largest shift (a square's hi half: 2 x 253 + 24) plus a 64-bit term plus the carries of
  // 2^40 terms stays inside the words.
  static_assert(2 * 253 + 24 + 64 + 40 < kWords * 64, "WideSum too narrow");
  uint64_t bitsFrom(size_t from) const {  // the 64 bits from bit `from` up
    const size_t word = from / 64, bit = from % 64;
    uint64_t x = w_[word] >> bit;
    if (bit != 0 && word + 1 < kWords) x |= w_[word + 1] << (64 - bit);
    return x;
  }
  uint64_t w_[kWords] = {};
};

// The shift of exponent e's unit 2^(max(e, 1) - 150) over 2^-149.
size_t unitShift(size_t e) { return (e == 0 ? 1 : e) - 1; }

// |x|'s exponent and significand (the implicit bit set for normal numbers).
struct Parts {
  uint32_t e, m;
};
Parts parts(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x) & 0x7fffffffu;
  const uint32_t e = bits >> 23;
  return {e, (bits & 0x7fffffu) | (e != 0 ? 0x800000u : 0u)};
}

}  // namespace

void addAbsSignificands(std::span<const float> v, ExponentBuckets& b) {
  // Four bucket sets: consecutive values of one exponent then add to different words, not one
  // chain of dependent read-modify-writes.
  std::array<ExponentBuckets, 4> part{};
  const size_t n = v.size();
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (size_t j = 0; j < 4; ++j) {
      const Parts p = parts(v[i + j]);
      part[j][p.e] += p.m;
    }
  for (; i < n; ++i) {
    const Parts p = parts(v[i]);
    part[0][p.e] += p.m;
  }
  for (const ExponentBuckets& p : part)
    for (size_t e = 0; e < b.size(); ++e) b[e] += p[e];
}

double roundBuckets(const ExponentBuckets& b) {
  WideSum s;
  for (size_t e = 0; e < b.size(); ++e) s.add(b[e], unitShift(e));
  return s.toDouble(-149);
}

double exactAbsSum(std::span<const float> v) {
  ExponentBuckets b{};
  addAbsSignificands(v, b);
  return roundBuckets(b);
}

void addSquaredSignificands(std::span<const float> v, SquareBuckets& b) {
  for (float x : v) {
    const Parts p = parts(x);
    const uint64_t sq = static_cast<uint64_t>(p.m) * p.m;
    b.hi[p.e] += sq >> 24;
    b.lo[p.e] += sq & 0xffffffu;
  }
}

double roundSquareBuckets(const SquareBuckets& b) {
  // x^2 = m^2 * 2^(2 unitShift(e)) * 2^-298.
  WideSum s;
  for (size_t e = 0; e < b.hi.size(); ++e) {
    s.add(b.lo[e], 2 * unitShift(e));
    s.add(b.hi[e], 2 * unitShift(e) + 24);
  }
  return s.toDouble(-298);
}

double exactSquareSum(std::span<const float> v) {
  SquareBuckets b;
  addSquaredSignificands(v, b);
  return roundSquareBuckets(b);
}

}  // namespace starling::compression
