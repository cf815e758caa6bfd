#include "core/half.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "core/rng.h"

using namespace starling;

TEST_CASE("every finite half survives float and back", "[core]") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00u) == 0x7c00u) continue;  // inf / NaN
    const float f = halfToFloat(static_cast<uint16_t>(h));
    REQUIRE(floatToHalf(f) == h);
  }
}

TEST_CASE("floatToHalf picks the nearest half and ties to even", "[core]") {
  RngStream r(StreamKey{5, 0, 0, StreamPurpose::kTest, 0});
  for (int i = 0; i < 200000; ++i) {
    // magnitudes from subnormal to near the top of the range
    const float x =
        static_cast<float>(r.normal() * std::ldexp(1.0, static_cast<int>(r.below(40)) - 24));
    if (std::fabs(x) >= 65504.0f) continue;
    const uint16_t h = floatToHalf(x);
    const double got = std::fabs(halfToFloat(h) - static_cast<double>(x));
    for (int d : {-1, 1}) {
      const uint16_t n = static_cast<uint16_t>(h + d);
      if ((n & 0x7c00u) == 0x7c00u || ((n ^ h) & 0x8000u))
        continue;  // left the finite range or sign
      REQUIRE(got <= std::fabs(halfToFloat(n) - static_cast<double>(x)));
    }
  }
  CHECK(floatToHalf(1.0f + 0x1.0p-11f) == floatToHalf(1.0f));  // tie, even mantissa stays
  CHECK(floatToHalf(1.0f + 3 * 0x1.0p-11f) ==
        floatToHalf(1.0f) + 2);             // tie, odd mantissa rounds up
  CHECK(floatToHalf(70000.0f) == 0x7c00u);  // overflow is inf
  CHECK(floatToHalf(65504.0f) == 0x7bffu);
}

TEST_CASE("bf16 rounds to nearest even and keeps NaN", "[core]") {
  CHECK(bf16ToFloat(floatToBf16(1.0f)) == 1.0f);
  CHECK(floatToBf16(1.0f + 0x1.0p-8f) == floatToBf16(1.0f));  // tie to even
  CHECK(floatToBf16(1.0f + 3 * 0x1.0p-8f) == floatToBf16(1.0f) + 2);
  CHECK(std::isnan(bf16ToFloat(floatToBf16(std::nanf("")))));
  RngStream r(StreamKey{6, 0, 0, StreamPurpose::kTest, 0});
  for (int i = 0; i < 10000; ++i) {
    const float x = static_cast<float>(r.normal() * 1000);
    REQUIRE(std::fabs(bf16ToFloat(floatToBf16(x)) - x) <= std::fabs(x) * 0x1.0p-8f);
  }
}
