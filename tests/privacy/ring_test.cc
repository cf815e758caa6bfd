// Fixed-point arithmetic in Z_{2^b} (privacy/ring.h): the scale that keeps a sum from wrapping,
// unbiased stochastic rounding, exact sums of masked values, and the refusals.
#include "privacy/ring.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "privacy/crypto.h"
#include "privacy/dp.h"
#include "test_keys.h"

using namespace starling;
using namespace starling::privacy;

using starling::testing::testKey;

TEST_CASE("ring: the chosen scale keeps the worst-case sum inside the signed range",
          "[privacy][ring]") {
  for (uint32_t bits : {32u, 40u, 48u, 64u})
    for (uint64_t n : {uint64_t{1}, uint64_t{10}, uint64_t{1000}}) {
      INFO(bits << " bits, " << n << " clients");
      const RingSpec r = RingSpec::fit(bits, 2.5, n, 1000);
      // n clients at +clip, each rounded up: n (s C + 1) must not exceed 2^(b-1) - 1.
      const long double worst = static_cast<long double>(n) * (r.scale * 2.5L + 1);
      CHECK(worst <= static_cast<long double>(r.maxMagnitude()));
      // ... and the scale is the largest that does: 0.1% more would not.
      const long double bigger = static_cast<long double>(n) * (r.scale * 1.001L * 2.5L + 1);
      CHECK(bigger > static_cast<long double>(r.maxMagnitude()));
    }
}

TEST_CASE("ring: the sum of n clients at the clip, rounded up, decodes without wrapping",
          "[privacy][ring]") {
  // The adversarial case of the bound: every client sends +clip (or -clip) everywhere.
  const uint64_t n = 37;
  const RingSpec r = RingSpec::fit(24, 1.0, n, 1);
  for (float sign : {1.0f, -1.0f}) {
    std::vector<uint64_t> acc(3, 0), enc(3);
    for (uint64_t c = 0; c < n; ++c) {
      const std::vector<float> x(3, sign * 1.0f);
      encode(r, x, testKey(c), 1, enc);
      add(r, acc, enc);
    }
    std::vector<float> out(3);
    decode(r, acc, out);
    for (float v : out) CHECK(v == Approx(sign * static_cast<double>(n)).epsilon(1e-3));
  }
}

TEST_CASE("ring: stochastic rounding is unbiased", "[privacy][ring]") {
  // A scale of 4 makes 0.3 land on 1.2: rounded to 1 with probability 0.8, to 2 with 0.2. Over
  // 200,000 draws the mean is 1.2 within 6 standard errors (sqrt(0.16 / 2e5) = 0.0009).
  RingSpec r;
  r.bits = 32;
  r.scale = 4;
  r.clip = 1;
  r.max_clients = 1;
  const size_t n = 200'000;
  std::vector<float> x(n, 0.3f);
  std::vector<uint64_t> enc(n);
  encode(r, x, testKey(7), 1, enc);
  double sum = 0;
  size_t ones = 0, twos = 0;
  for (uint64_t w : enc) {
    sum += static_cast<double>(w);
    ones += w == 1;
    twos += w == 2;
  }
  CHECK(ones + twos == n);  // nothing else
  CHECK(std::abs(sum / n - 4 * 0.3f) < 6 * std::sqrt(0.16 / n));
  // Negative values round the same way, mirrored.
  std::vector<float> neg(n, -0.3f);
  encode(r, neg, testKey(8), 1, enc);
  std::vector<float> dec(n);
  decode(r, enc, dec);
  double s2 = 0;
  for (float v : dec) s2 += v;
  CHECK(std::abs(s2 / n + 0.3) < 6 * std::sqrt(0.16 / n) / 4);
}

TEST_CASE("ring: masks that cancel leave the exact sum, in every width", "[privacy][ring]") {
  // Values and masks as the privacy code draws them: ChaCha20 words (privacy/crypto.h).
  KeyStream rng(testKey(3), 1, MaskStream::kPairwiseMask, 0);
  for (uint32_t bits : {8u, 17u, 32u, 63u, 64u}) {
    INFO(bits << " bits");
    RingSpec r;
    r.bits = bits;
    const uint64_t m = r.mask();
    std::vector<uint64_t> a(100), b(100), mask(100), sum(100, 0);
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = rng.next() & m;
      b[i] = rng.next() & m;
      mask[i] = rng.next() & m;
    }
    std::vector<uint64_t> ma = a, mb = b;
    add(r, ma, mask);  // client a adds the pair's mask
    sub(r, mb, mask);  // client b subtracts it
    add(r, sum, ma);
    add(r, sum, mb);
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(sum[i] == ((a[i] + b[i]) & m));
      CHECK(sum[i] <= m);
    }
  }
}

TEST_CASE("ring: decode reads two's complement in b bits", "[privacy][ring]") {
  RingSpec r;
  r.bits = 8;
  r.scale = 1;
  std::vector<uint64_t> w{0, 1, 127, 128, 129, 255};
  std::vector<float> out(w.size());
  decode(r, w, out);
  CHECK(out == std::vector<float>{0, 1, 127, -128, -127, -1});
  r.bits = 64;
  std::vector<uint64_t> w64{uint64_t{1} << 63, ~uint64_t{0}};
  std::vector<float> out64(2);
  decode(r, w64, out64);
  CHECK(out64[0] == static_cast<float>(-9.223372036854775808e18));
  CHECK(out64[1] == -1.0f);
  // A word beyond the ring is no sum of its elements.
  r.bits = 8;
  std::vector<uint64_t> bad{256};
  std::vector<float> one(1);
  CHECK_THROWS_AS(decode(r, bad, one), InvalidArgument);
}

TEST_CASE(
    "ring: a configuration whose sum could wrap, or that rounds away the update, is refused "
    "with the numbers",
    "[privacy][ring]") {
  // 10,000 clients of the CNN's 1,663,370 values in 32 bits: scaled to fit, one update's rounding
  // would cost 2^-7 of its norm (sqrt(d) / (2^31 / 10^4) = 1290 / 214,747), more than 2^-10. It
  // takes 35 bits: 2^34 / 10^4 >= 2^10 sqrt(d) = 1.32e6. The message says so.
  try {
    RingSpec::fit(32, 1.0, 10'000, 1'663'370);
    FAIL("accepted");
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    CHECK(m.find("secagg.bits = 32") != std::string::npos);
    CHECK(m.find("10000 clipped updates") != std::string::npos);
    CHECK(m.find("it takes secagg.bits = 35") != std::string::npos);
  }
  CHECK(RingSpec::bitsNeeded(10'000, 1'663'370) == 35);
  CHECK(RingSpec::bitsNeeded(1000, 1'663'370) == 32);  // 2^31 / 1000 = 2.1e6 >= 1.32e6
  CHECK_NOTHROW(RingSpec::fit(35, 1.0, 10'000, 1'663'370));
  CHECK_THROWS_AS(RingSpec::fit(34, 1.0, 10'000, 1'663'370), ConfigError);
  CHECK(RingSpec::bitsNeeded(uint64_t{1} << 62, 1 << 20) == RingSpec::kMaxBits + 1);
  CHECK_THROWS_AS(RingSpec::fit(7, 1.0, 10, 10), ConfigError);
  CHECK_THROWS_AS(RingSpec::fit(65, 1.0, 10, 10), ConfigError);
  CHECK_THROWS_AS(RingSpec::fit(32, 0.0, 10, 10), ConfigError);
  CHECK_THROWS_AS(RingSpec::fit(32, std::nan(""), 10, 10), ConfigError);
  CHECK_THROWS_AS(RingSpec::fit(32, 1.0, 0, 10), ConfigError);
  // A hand-set spec whose sum could wrap.
  RingSpec r;
  r.bits = 16;
  r.clip = 1;
  r.scale = 1000;
  r.max_clients = 33;  // 33 x 1001 = 33,033 > 32,767
  CHECK_THROWS_AS(r.validate(), ConfigError);
  r.max_clients = 32;  // 32,032 fits
  CHECK_NOTHROW(r.validate());
}

TEST_CASE("ring: a value beyond the clip, or not finite, is not encoded", "[privacy][ring]") {
  const RingSpec r = RingSpec::fit(32, 1.0, 4, 4);
  std::vector<uint64_t> out(1);
  for (float bad : {1.0001f, -1.5f, std::nanf(""), INFINITY}) {
    const std::vector<float> x{bad};
    CHECK_THROWS_AS(encode(r, x, testKey(1), 1, out), InvalidArgument);
  }
}

TEST_CASE("ring: the rounding is the key's stream: the same key and round, the same words",
          "[privacy][ring]") {
  // libsodium's ChaCha20 (privacy/crypto.h), never a statistical stream: a client's fresh key
  // makes its rounding unpredictable; a fixed key reproduces it.
  RingSpec r;
  r.bits = 32;
  r.scale = 4;
  r.clip = 1;
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.37f * std::sin(static_cast<float>(i));
  const auto enc = [&](const Key32& k, uint64_t round) {
    std::vector<uint64_t> out(x.size());
    encode(r, x, k, round, out);
    return out;
  };
  CHECK(enc(testKey(3), 5) == enc(testKey(3), 5));
  CHECK(enc(testKey(3), 5) != enc(testKey(4), 5));
  CHECK(enc(testKey(3), 5) != enc(testKey(3), 6));
  // Up with the fraction's probability, as the stream's word i says.
  KeyStream words(testKey(3), 5, MaskStream::kRounding, 0);
  const auto got = enc(testKey(3), 5);
  for (size_t i = 0; i < x.size(); ++i) {
    const double scaled = static_cast<double>(x[i]) * r.scale;
    const auto lo = static_cast<int64_t>(std::floor(scaled));
    const int64_t want = lo + (words.uniform() < scaled - static_cast<double>(lo) ? 1 : 0);
    CHECK(got[i] == (static_cast<uint64_t>(want) & r.mask()));
  }
}

TEST_CASE("ring: with distributed DP's noise the sum and its noise out to 12 deviations fit",
          "[privacy][ring][ddg]") {
  for (uint32_t bits : {32u, 48u, 64u})
    for (uint64_t n : {uint64_t{3}, uint64_t{100}, uint64_t{1000}})
      for (double z : {0.5, 1.0, 4.0}) {
        CAPTURE(bits, n, z);
        const RingNoise noise{z, std::max<uint64_t>(3, n / 2)};
        const RingSpec plain = RingSpec::fit(bits, 2.5, n, 1000);
        const RingSpec r = RingSpec::fit(bits, 2.5, n, 1000, &noise);
        // Each client's noise: z (scale clip + sqrt(d)) / sqrt(m).
        CHECK(r.noise == Approx(z * (r.scale * 2.5 * (1 + 0x1p-20) + std::sqrt(1000.0)) /
                                std::sqrt(double(noise.min_clients))));
        CHECK(r.noise >= kMinClientNoise);
        CHECK(r.scale < plain.scale);  // room was made for the noise
        // The bound: n clients at the clip, rounded up, and the sum's noise at 12 deviations.
        const long double worst = static_cast<long double>(n) * (r.scale * 2.5L + 1) +
                                  12.0L * std::sqrt(static_cast<long double>(n)) * r.noise;
        CHECK(worst <= static_cast<long double>(r.maxMagnitude()));
        // ... and the scale is close to the largest that keeps it (0.1% more wraps), unless the
        // cap on each client's noise bound it first (wide rings).
        if (r.noise < kMaxClientNoise / 1.01) {
          const long double n1 = static_cast<long double>(n);
          const long double over =
              n1 * (r.scale * 1.001L * 2.5L + 1) + 12.0L * std::sqrt(n1) * r.noise * 1.001L;
          CHECK(over > static_cast<long double>(r.maxMagnitude()));
        } else {
          CHECK(r.noise <= kMaxClientNoise);
        }
      }
  // A noise under the floor the accountant assumes, or not finite, is refused; so is a ring too
  // small for the noise.
  RingSpec low = RingSpec::fit(32, 1.0, 10, 100);
  low.noise = 1.0;
  CHECK_THROWS_AS(low.validate(), ConfigError);
  low.noise = std::nan("");
  CHECK_THROWS_AS(low.validate(), ConfigError);
  const RingNoise loud{1e6, 3};
  CHECK_THROWS_AS(RingSpec::fit(24, 1.0, 100, 1000, &loud), ConfigError);
  CHECK(RingSpec::bitsNeeded(100, 1000, &loud) > RingSpec::bitsNeeded(100, 1000));
}

TEST_CASE("ring: the clients' noise in the ring sum has the variance the spec states",
          "[privacy][ring][ddg]") {
  // n clients encode zeros and add their noise: the decoded sum is the noise alone, each value's
  // variance n noise^2 / scale^2 (the discrete Gaussian's variance is within 1e-6 of sigma^2 at
  // these sigmas).
  const uint64_t n = 20;
  const size_t d = 20'000;
  const RingNoise noise{1.0, 10};
  const RingSpec r = RingSpec::fit(32, 1.0, n, d, &noise);
  std::vector<uint64_t> acc(d, 0), words(d);
  const std::vector<float> zeros(d, 0.0f);
  for (uint64_t c = 0; c < n; ++c) {
    encode(r, zeros, testKey(100 + c), 1, words);
    addNoise(r, words, testKey(100 + c), 1);
    add(r, acc, words);
  }
  std::vector<float> sum(d);
  decode(r, acc, sum);
  double sq = 0, mean = 0;
  for (float v : sum) {
    mean += v;
    sq += double(v) * v;
  }
  mean /= d;
  const double var = sq / d - mean * mean;
  const double want = double(n) * r.noise * r.noise / (r.scale * r.scale);
  CHECK(std::fabs(var / want - 1) < 6 * std::sqrt(2.0 / d));
  CHECK(std::fabs(mean) < 6 * std::sqrt(want / d));
  // Without noise the zeros sum to zero exactly.
  RingSpec quiet = r;
  quiet.noise = 0;
  std::fill(acc.begin(), acc.end(), 0);
  for (uint64_t c = 0; c < n; ++c) {
    encode(quiet, zeros, testKey(100 + c), 1, words);
    addNoise(quiet, words, testKey(100 + c), 1);
    add(quiet, acc, words);
  }
  CHECK(std::all_of(acc.begin(), acc.end(), [](uint64_t w) { return w == 0; }));
}
