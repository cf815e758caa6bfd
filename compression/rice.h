#pragma once
// Rice coding of strictly increasing positions, for the sparse ternary encoding (STC's positions,
// Sattler et al. 2019, which Golomb-code them; Rice is Golomb with a power-of-two divisor).
//
// Position j travels as its gap g_j = idx_j - idx_{j-1} - 1 (g_0 = idx_0): the quotient g >> r as
// that many 1 bits and a 0, then the r low bits of g, LSB-first, one stream for all positions. At
// density d the gaps are about geometric with mean 1/d - 1 and a well-chosen r costs about
// log2(1/d) + 1.5 bits per position, against 32 for a u32 index.
#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include "compression/bitpack.h"

namespace starling::compression {

inline constexpr uint32_t kMaxRiceParameter = 31;
static_assert(std::endian::native == std::endian::little,
              "riceDecode loads 8 stream bytes as one little-endian word");

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

// The stream for strictly increasing positions, ceil(bits/8) bytes, padding bits zero. Positions
// out of order would wrap a gap into a stream that decodes to other positions: refused.
inline std::vector<uint8_t> riceEncode(std::span<const uint32_t> idx, uint32_t r) {
  if (r > kMaxRiceParameter) throw std::invalid_argument("riceEncode: parameter above 31");
  for (size_t j = 1; j < idx.size(); ++j)
    if (idx[j] <= idx[j - 1])
      throw std::invalid_argument("riceEncode: positions not strictly increasing");
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
bool riceDecode(std::span<const uint8_t> s, size_t count, uint32_t r, size_t n, F&& on,
                RiceCheck* check = nullptr) {
  using P = RiceCheck::Problem;
  auto failed = [&](P problem, const char* why, size_t at) {
    if (check) *check = RiceCheck{problem, why, at};
    return false;
  };
  if (r > kMaxRiceParameter) return failed(P::kParameter, "Rice parameter above 31", 0);
  // A 64-bit window over the stream: `buf` holds `have` unread bits, LSB first; `pos` is the next
  // byte to load. The quotient's run of ones is counted a window at a time.
  const uint8_t* d = s.data();
  const size_t size = s.size();
  size_t pos = 0;
  uint64_t buf = 0;
  uint32_t have = 0;
  auto refill = [&] {
    if (size - pos >= 8) {
      uint64_t w;
      std::memcpy(&w, d + pos, 8);  // little-endian hosts (x86-64, arm64)
      buf |= w << have;             // have <= 56 here: only whole bytes that fit are counted
      const uint32_t take = (63 - have) >> 3;
      pos += take;
      have += take * 8;
    } else {
      while (have <= 56 && pos < size) {
        buf |= static_cast<uint64_t>(d[pos++]) << have;
        have += 8;
      }
    }
  };
  auto consume = [&](uint32_t bits) {  // bits <= have
    buf = bits >= 64 ? 0 : buf >> bits;
    have -= bits;
  };
  const uint64_t low_mask = (uint64_t{1} << r) - 1;
  uint64_t next = 0;  // the smallest position the next one may take
  for (size_t j = 0; j < count; ++j) {
    // The largest quotient that keeps the position below n: more is refused at once, so a
    // stream of ones costs at most a window per 64 units of it. (With next = n no position fits;
    // a whole code is still read, so that a stream that ends first is reported as short.)
    const uint64_t max_q = next < n ? (n - 1 - next) >> r : 0;
    uint64_t q = 0;
    for (;;) {
      if (have <= 56) refill();
      if (have == 0) return failed(P::kShort, "the position stream ends early", j);
      const auto ones = static_cast<uint32_t>(std::countr_one(buf));
      if (ones < have) {
        q += ones;
        consume(ones + 1);
        break;
      }
      q += have;  // every unread bit is a one: the run goes on in the next bytes
      consume(have);
      if (q > max_q) return failed(P::kBeyond, "a position beyond the tensor", j);
    }
    if (q > max_q) return failed(P::kBeyond, "a position beyond the tensor", j);
    if (have < r) refill();
    if (have < r) return failed(P::kShort, "the position stream ends early", j);
    const uint64_t p = next + (q << r) + (buf & low_mask);
    consume(r);
    if (p >= n) return failed(P::kBeyond, "a position beyond the tensor", j);
    on(static_cast<uint32_t>(p));
    next = p + 1;
  }
  const size_t used = pos * 8 - have;  // bits read
  if ((used + 7) / 8 != size) return failed(P::kTrailing, "bytes after the last position", count);
  if (used % 8 != 0 && (d[size - 1] >> (used % 8)) != 0)
    return failed(P::kPadding, "non-zero padding bits after the last position", count);
  return true;
}

}  // namespace starling::compression
