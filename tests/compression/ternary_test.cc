// The sparse ternary encoding (STC) and its Rice-coded positions: round trips, the shortest
// parameter, the size it reaches, and every way a hostile stream can lie.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "compression/registry.h"
#include "compression/rice.h"
#include "compression/sparsify.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

namespace {

std::vector<uint32_t> randomPositions(size_t n, double density, uint32_t seed) {
  std::mt19937 g(seed);
  std::bernoulli_distribution keep(density);
  std::vector<uint32_t> idx;
  for (size_t i = 0; i < n; ++i)
    if (keep(g)) idx.push_back(static_cast<uint32_t>(i));
  return idx;
}

std::vector<uint32_t> decodeAll(std::span<const uint8_t> s, size_t count, uint32_t r, size_t n,
                                RiceCheck* check) {
  std::vector<uint32_t> out;
  if (!riceDecode(
          s, count, r, n, [&](uint32_t i) { out.push_back(i); }, check))
    out.clear();
  return out;
}

}  // namespace

TEST_CASE("Rice-coded positions decode to what was encoded, with any parameter", "[compression]") {
  const size_t n = 100000;
  for (double density : {0.0005, 0.01, 0.05, 0.3, 1.0}) {
    const auto idx = randomPositions(n, density, 11);
    for (uint32_t r : {0u, 1u, 3u, 7u, 16u, 31u}) {
      if (r == 0 && density < 0.01) continue;  // unary gaps of ~2,000 bits each: valid but slow
      INFO("density " << density << " r " << r);
      const auto s = riceEncode(idx, r);
      CHECK(s.size() == (riceBits(idx, r) + 7) / 8);
      RiceCheck check;
      CHECK(decodeAll(s, idx.size(), r, n, &check) == idx);
      CHECK(check.why == nullptr);
    }
  }
  // The extremes: nothing, the first and the last position alone, every position.
  for (const std::vector<uint32_t>& idx :
       {std::vector<uint32_t>{}, std::vector<uint32_t>{0}, std::vector<uint32_t>{99999},
        std::vector<uint32_t>{0, 99999}}) {
    const uint32_t r = bestRiceParameter(idx);
    CHECK(decodeAll(riceEncode(idx, r), idx.size(), r, n, nullptr) == idx);
  }
}

TEST_CASE(
    "the chosen Rice parameter gives the shortest stream, about log2(1/density) + 2 bits a "
    "position",
    "[compression]") {
  const size_t n = 1 << 20;
  for (double density : {0.001, 0.01, 0.05, 0.1, 0.5}) {
    const auto idx = randomPositions(n, density, 5);
    const uint32_t best = bestRiceParameter(idx);
    for (uint32_t r = 0; r <= kMaxRiceParameter; ++r)
      CHECK(riceBits(idx, best) <= riceBits(idx, r));
    const double per_position =
        static_cast<double>(riceBits(idx, best)) / static_cast<double>(idx.size());
    INFO("density " << density << ": " << per_position << " bits per position");
    // Golomb's bound for geometric gaps is about log2(1/density) + 1.5; a u32 index costs 32.
    CHECK(per_position <= std::log2(1.0 / density) + 2.0);
  }
}

TEST_CASE("the encoder refuses positions out of order and a parameter above 31", "[compression]") {
  const std::vector<uint32_t> repeated{3, 7, 7, 9}, backwards{3, 9, 7}, fine{3, 7, 9};
  CHECK_THROWS_AS(riceEncode(repeated, 1), std::invalid_argument);
  CHECK_THROWS_AS(riceEncode(backwards, 1), std::invalid_argument);
  CHECK_THROWS_AS(riceEncode(fine, 32), std::invalid_argument);
  CHECK(decodeAll(riceEncode(fine, 1), 3, 1, 10, nullptr) == fine);
}

TEST_CASE("a hostile position stream is refused, never read past its end", "[compression]") {
  const size_t n = 1000;
  const std::vector<uint32_t> idx = {3, 40, 41, 500, 999};
  const uint32_t r = 4;
  const auto good = riceEncode(idx, r);
  RiceCheck check;
  using P = RiceCheck::Problem;

  SECTION("fewer bytes than the positions need") {
    const std::vector<uint8_t> cut(good.begin(), good.end() - 1);
    CHECK(decodeAll(cut, idx.size(), r, n, &check).empty());
    CHECK(check.problem == P::kShort);
  }
  SECTION("a count larger than the stream holds") {
    CHECK(decodeAll(good, idx.size() + 3, r, n, &check).empty());
    CHECK(check.problem == P::kShort);
  }
  SECTION("a count smaller than the stream holds leaves bytes or set bits behind") {
    CHECK(decodeAll(good, 2, r, n, &check).empty());
    CHECK((check.problem == P::kTrailing || check.problem == P::kPadding));
  }
  SECTION("a trailing byte") {
    auto more = good;
    more.push_back(0);
    CHECK(decodeAll(more, idx.size(), r, n, &check).empty());
    CHECK(check.problem == P::kTrailing);
  }
  SECTION("a set padding bit") {
    const size_t bits = riceBits(idx, r);
    REQUIRE(bits % 8 != 0);
    auto bad = good;
    bad.back() |= static_cast<uint8_t>(0x80);
    CHECK(decodeAll(bad, idx.size(), r, n, &check).empty());
    CHECK(check.problem == P::kPadding);
  }
  SECTION("a position at or beyond the tensor's end") {
    CHECK(decodeAll(good, idx.size(), r, 999, &check).empty());
    CHECK(check.problem == P::kBeyond);
    CHECK(check.at == 4);
  }
  SECTION("a stream of ones (an endless quotient) stops at the tensor's end") {
    const std::vector<uint8_t> ones(1 << 16, 0xff);
    CHECK(decodeAll(ones, 1, 0, n, &check).empty());
    CHECK(check.problem == P::kBeyond);
    CHECK(decodeAll(ones, 1, 0, size_t{1} << 40, &check).empty());
    CHECK(check.problem == P::kShort);
  }
  SECTION("a parameter above 31") {
    CHECK(decodeAll(good, idx.size(), 32, n, &check).empty());
    CHECK(check.problem == P::kParameter);
  }
}

TEST_CASE("stc sends top-k's positions, each as +-mu, with mu the mean kept magnitude",
          "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const auto update = testing::randomVector(layout.numel(), 17);
  const auto stc = makeCompressor("stc:density=0.1,ef=false");
  const auto topk = makeCompressor("topk:density=0.1,ef=false");
  CHECK(stc->name() == "stc");
  CHECK(stc->spec() == "stc:density=0.1,ef=false");
  const RoundContext ctx{1, 2, 0, 3};
  const auto got = stc->compress(layout, update, ctx);
  const auto ref = topk->compress(layout, update, ctx);
  REQUIRE(got.size() == layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    INFO("tensor " << t);
    const auto& x = std::get<Ternary>(got[t]);
    const auto& s = std::get<Sparse>(ref[t]);
    REQUIRE(x.count == s.indices.size());
    const auto stats = validatePayload(view(got[t]), layout[t], nullptr, t);
    stc->checkReceived(layout, t, view(got[t]), ctx);
    double mean = 0.0;
    for (float v : s.values) mean += std::fabs(v);
    mean /= static_cast<double>(s.values.size());
    CHECK(x.mu == Approx(mean).epsilon(1e-6));
    CHECK(stats.max_abs == Approx(x.mu));
    CHECK(stats.sq_norm == Approx(x.count * static_cast<double>(x.mu) * x.mu));
    // Decoded: exactly top-k's positions, with top-k's signs and magnitude mu.
    std::vector<float> dense(layout[t].numel, 0.0f);
    accumulatePayload(view(got[t]), layout[t], dense, 2.0f, nullptr, t);
    size_t nonzero = 0;
    for (float v : dense) nonzero += v != 0.0f;
    CHECK(nonzero == s.indices.size());
    for (size_t j = 0; j < s.indices.size(); ++j)
      CHECK(dense[s.indices[j]] == 2.0f * (s.values[j] < 0 ? -x.mu : x.mu));
    // What travels: count, mu and the parameter (9 bytes), the Rice stream and a bit per position.
    CHECK(payloadDataBytes(got[t]) == 9 + x.positions.size() + (x.count + 7) / 8);
  }
}

TEST_CASE(
    "stc does not send an exact zero as +-mu: a tensor with fewer than k non-zeros sends fewer",
    "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  auto update = testing::randomVector(layout.numel(), 31);
  // conv1.bias (16 values, k = 2 at 10%) keeps one non-zero; fc2.bias (10 values, k = 1) none.
  auto bias1 = layout.slice(std::span<float>(update), 1);
  std::fill(bias1.begin(), bias1.end(), 0.0f);
  bias1[5] = -0.25f;
  auto bias2 = layout.slice(std::span<float>(update), 5);
  std::fill(bias2.begin(), bias2.end(), 0.0f);
  const auto stc = makeCompressor("stc:density=0.1");
  ClientState st(layout.fingerprint());
  const RoundContext ctx{1, 0, 0, 3};
  const auto got = stc->compressWithFeedback(layout, update, st, ctx);
  const auto& one = std::get<Ternary>(got[1]);
  CHECK(one.count == 1);
  CHECK(one.mu == 0.25f);
  CHECK(std::get<Ternary>(got[5]).count == 0);
  for (size_t t = 0; t < layout.size(); ++t) {
    validatePayload(view(got[t]), layout[t], nullptr, t);
    stc->checkReceived(layout, t, view(got[t]), ctx);  // fewer than k is accepted
  }
  const auto sent = testing::densify(layout, got, nullptr);
  const auto res = testing::residualOf(st, layout.numel());
  for (size_t t : {size_t{1}, size_t{5}})
    for (size_t i = layout[t].offset; i < layout[t].offset + layout[t].numel; ++i) {
      INFO("tensor " << t << " position " << i - layout[t].offset);
      CHECK(sent[i] == update[i]);  // -0.25 exactly, and zeros stay zeros
      CHECK(res[i] == 0.0f);
    }
  // More than k is still a lie.
  Ternary more = std::get<Ternary>(got[0]);
  const size_t k = countForDensity(0.1, layout[0].numel);
  REQUIRE(more.count == k);
  std::vector<uint32_t> idx(k + 1);
  for (size_t j = 0; j <= k; ++j) idx[j] = static_cast<uint32_t>(j);
  more.count = static_cast<uint32_t>(k + 1);
  more.rice = 0;
  more.positions = riceEncode(idx, 0);
  more.signs.assign((k + 1 + 7) / 8, 0);
  validatePayload(view(Payload{more}), layout[0], nullptr, 0);  // well-formed on its own
  CHECK_THROWS_AS(stc->checkReceived(layout, 0, view(Payload{more}), ctx), InputError);
}

// At 5% a top-k position costs 8 bytes (u32 index and f32 value); an STC position at most log2(20)
// + 2 bits of Rice code (the bound tested above) and one sign bit, 7.33 bits, so 8.7x less, and
// dense's 4 bytes per coordinate are 87x an STC update's 0.05 x 7.33 bits. Per-tensor headers (9
// bytes, and k rounded up on the small biases) take some of that: 8x and 80x are what must hold.
TEST_CASE(
    "stc's update is at least 8x smaller than top-k's at the same density, 80x smaller than dense "
    "at 5%",
    "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const auto update = testing::randomVector(layout.numel(), 23);
  const RoundContext ctx{1, 0, 0, 3};
  auto bytes = [&](const char* spec) {
    size_t b = 0;
    for (const auto& p : makeCompressor(spec)->compress(layout, update, ctx))
      b += payloadDataBytes(p);
    return b;
  };
  const double dense = static_cast<double>(layout.numel()) * 4;
  INFO("stc " << bytes("stc:density=0.05") << " topk " << bytes("topk:density=0.05") << " dense "
              << dense);
  CHECK(bytes("topk:density=0.05") >= 8 * static_cast<double>(bytes("stc:density=0.05")));
  CHECK(dense >= 80 * static_cast<double>(bytes("stc:density=0.05")));
}

TEST_CASE("a ternary payload that lies is refused with its reason", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  const auto update = testing::randomVector(layout.numel(), 29);
  const auto stc = makeCompressor("stc:density=0.1,ef=false");
  const RoundContext ctx{1, 0, 0, 3};
  const auto good = std::get<Ternary>(stc->compress(layout, update, ctx)[0]);
  const TensorSpec& t = layout[0];
  auto refused = [&](const Ternary& x, Errc code) {
    try {
      validatePayload(view(Payload{x}), t, nullptr, 0);
    } catch (const InputError& e) {
      return e.code() == code;
    }
    return false;
  };
  Ternary x = good;
  x.mu = std::nanf("");
  CHECK(refused(x, Errc::kNonFinite));
  x = good;
  x.mu = -1.0f;
  CHECK(refused(x, Errc::kNonFinite));
  x = good;
  x.count = static_cast<uint32_t>(t.numel + 1);
  CHECK(refused(x, Errc::kSizeMismatch));
  x = good;
  x.signs.push_back(0);
  CHECK(refused(x, Errc::kSizeMismatch));
  x = good;
  if (x.count % 8 != 0) {
    x.signs.back() |= 0x80;
    CHECK(refused(x, Errc::kBadPadding));
  }
  x = good;
  x.rice = 40;
  CHECK(refused(x, Errc::kLevelOutOfRange));
  x = good;
  x.positions.pop_back();
  CHECK(refused(x, Errc::kSizeMismatch));
  x = good;
  x.positions.assign(x.positions.size(), 0xff);
  CHECK(refused(x, Errc::kIndexOutOfRange));
  // A server expecting stc refuses more than k entries or another encoding.
  x = good;
  x.count += 1;
  CHECK_THROWS_AS(stc->checkReceived(layout, 0, view(Payload{x}), ctx), InputError);
  CHECK_THROWS_AS(
      stc->checkReceived(layout, 0,
                         view(makeCompressor("topk:density=0.1")->compress(layout, update, ctx)[0]),
                         ctx),
      InputError);
}
