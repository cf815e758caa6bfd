#pragma once
// Rice coding of strictly increasing positions, for the sparse ternary encoding (STC's positions,
// Sattler et al. 2019, which Golomb-code them; Rice is Golomb with a power-of-two divisor).
//
// Position j travels as its gap g_j = idx_j - idx_{j-1} - 1 (g_0 = idx_0): the quotient g >> r as
// that many 1 bits and a 0, then the r low bits of g, LSB-first, one stream for all positions. At
// density d the gaps are about geometric with mean 1/d - 1 and a well-chosen r costs about
// log2(1/d) + 1.5 bits per position, against 32 for a u32 index.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "compression/bitpack.h"

namespace starling::compression {

inline constexpr uint32_t kMaxRiceParameter = 31;

// Bits of the stream for these positions with parameter r.
inline size_t riceBits(std::span<const uint32_t> idx, uint32_t r) {
  size_t bits = idx.size() * (size_t{1} + r);
  uint32_t prev = 0;
  for (size_t j = 0; j < idx.size(); ++j) {
    const uint32_t gap = idx[j] - prev;  // prev is idx[j-1] + 1, or 0
    bits += gap >> r;
    prev = idx[j] + 1;
  }
  return bits;
}

// The parameter that makes the stream shortest (the smallest such r).
inline uint32_t bestRiceParameter(std::span<const uint32_t> idx) {
  // sum_j (g_j >> r) for every r, from each gap's bits; then the total per r.
  size_t quotient[kMaxRiceParameter + 1] = {};
  uint32_t prev = 0;
  for (uint32_t i : idx) {
    uint32_t g = i - prev;
    for (uint32_t r = 0; r <= kMaxRiceParameter && g != 0; ++r, g >>= 1) quotient[r] += g;
    prev = i + 1;
  }
  uint32_t best = 0;
  size_t best_bits = SIZE_MAX;
  for (uint32_t r = 0; r <= kMaxRiceParameter; ++r) {
    const size_t bits = quotient[r] + idx.size() * (size_t{1} + r);
    if (bits < best_bits) best_bits = bits, best = r;
  }
  return best;
}

// The stream for strictly increasing positions, ceil(bits/8) bytes, padding bits zero.
inline std::vector<uint8_t> riceEncode(std::span<const uint32_t> idx, uint32_t r) {
  std::vector<uint8_t> out;
  BitWriter w(out, riceBits(idx, r), 1);
  uint32_t prev = 0;
  for (uint32_t i : idx) {
    const uint32_t gap = i - prev;
    for (uint32_t q = gap >> r; q > 0;) {
      const uint32_t run = std::min<uint32_t>(q, 24);
      w.put((1u << run) - 1, run);
      q -= run;
    }
    w.put(0, 1);
    if (r > 0) w.put(gap & ((1u << r) - 1u), r);
    prev = i + 1;
  }
  w.flush();
  return out;
}

// Reads a stream back, trusting nothing: each position must fit below n and the stream must hold
// exactly `count` positions with zero padding. Calls on(position) for each in order; returns false
// (and stops) at the first violation, with `why` saying which.
struct RiceCheck {
  enum class Problem { kNone, kParameter, kShort, kBeyond, kTrailing, kPadding };
  Problem problem = Problem::kNone;
  const char* why = nullptr;
  size_t at = 0;  // the position's ordinal where it failed
};
template <class F>
bool riceDecode(std::span<const uint8_t> s, size_t count, uint32_t r, size_t n, F&& on, RiceCheck* check = nullptr) {
  using P = RiceCheck::Problem;
  auto failed = [&](P problem, const char* why, size_t at) {
    if (check) *check = RiceCheck{problem, why, at};
    return false;
  };
  if (r > kMaxRiceParameter) return failed(P::kParameter, "Rice parameter above 31", 0);
  const size_t total = s.size() * 8;
  size_t bit = 0;
  auto get = [&](size_t b) { return (s[b >> 3] >> (b & 7)) & 1u; };
  uint64_t next = 0;  // the smallest position the next one may take
  for (size_t j = 0; j < count; ++j) {
    uint64_t q = 0;
    for (;;) {
      if (bit >= total) return failed(P::kShort, "the position stream ends early", j);
      if (!get(bit++)) break;
      // Every quotient unit moves the position by 2^r: past n it cannot be valid.
      if ((++q << r) + next >= n) return failed(P::kBeyond, "a position beyond the tensor", j);
    }
    if (bit + r > total) return failed(P::kShort, "the position stream ends early", j);
    uint64_t low = 0;
    for (uint32_t b = 0; b < r; ++b) low |= static_cast<uint64_t>(get(bit++)) << b;
    const uint64_t pos = next + (q << r) + low;
    if (pos >= n) return failed(P::kBeyond, "a position beyond the tensor", j);
    on(static_cast<uint32_t>(pos));
    next = pos + 1;
  }
  if ((bit + 7) / 8 != s.size()) return failed(P::kTrailing, "bytes after the last position", count);
  for (; bit < total; ++bit)
    if (get(bit)) return failed(P::kPadding, "non-zero padding bits after the last position", count);
  return true;
}

}  // namespace starling::compression
