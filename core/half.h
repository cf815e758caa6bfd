#pragma once
// IEEE binary16 and bfloat16 conversions with round-to-nearest-even. Portable bit manipulation;
// values out of binary16 range become +-inf (callers that must stay finite clamp first).
#include <cstdint>
#include <cstring>

namespace starling {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t floatToBf16(float f) {
  uint32_t u = floatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16ToFloat(uint16_t h) { return bitsFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t floatToHalf(float f) {
  const uint32_t u = floatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absu < 0x38800000u) {  // subnormal or zero in half
    if (absu < 0x33000000u)
      return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t exp = absu >> 23;
    const uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24 -> mantissa shift into the 10-bit subnormal field
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((absu - 0x38000000u) >> 13);
  const uint32_t rem = absu & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bitsFloat(sign);
    // subnormal: value = mant * 2^-24
    const float v = static_cast<float>(mant) * 0x1.0p-24f;
    return sign ? -v : v;
  }
  if (exp == 31) return bitsFloat(sign | 0x7f800000u | (mant << 13));
  return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline constexpr float kHalfMax = 65504.0f;

}  // namespace starling
