#include <catch2/catch.hpp>

#include "compression/registry.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

TEST_CASE("sign sends mean magnitude times the signs", "[compression]") {
  ParamLayout layout;
  layout.add("w", {5});
  auto c = makeCompressor("sign");
  ClientState st = ClientState(layout.fingerprint());
  const std::vector<float> u = {1, -2, 3, -4, 0};
  auto p = c->compressWithFeedback(layout, u, st, {});
  const auto& s = std::get<Sign>(p[0]);
  CHECK(s.scale == Approx(2.0));  // (1+2+3+4+0)/5
  auto back = testing::densify(layout, p);
  CHECK(back == std::vector<float>{2, -2, 2, -2, 2});
  CHECK(testing::residualOf(st, 5) == std::vector<float>{-1, 0, 1, -2, -2});
}

TEST_CASE("QSGD is unbiased (fixed seed and many rounds)", "[compression]") {
  ParamLayout layout;
  layout.add("w", {64});
  const auto v = testing::randomVector(64, 11);
  auto c = makeCompressor("qsgd:levels=2");  // no error feedback: the read-only entry
  const int rounds = 20000;
  std::vector<double> mean(64, 0.0);
  double max_dev = 0;
  for (int r = 0; r < rounds; ++r) {
    auto back = testing::densify(
        layout, c->compress(layout, v, RoundContext{3, static_cast<uint64_t>(r), 0, 1}));
    for (size_t i = 0; i < 64; ++i) mean[i] += back[i];
  }
  const double norm = testing::norm2(v);
  for (size_t i = 0; i < 64; ++i) {
    mean[i] /= rounds;
    // Each draw is within one level (norm/s) of v[i]; the mean's std is <= norm/(2 s sqrt(rounds)).
    const double bound = 5.0 * norm / (2.0 * 2.0 * std::sqrt(rounds));
    max_dev = std::max(max_dev, std::fabs(mean[i] - v[i]) / bound);
    REQUIRE(std::fabs(mean[i] - v[i]) <= bound);
  }
  // And it is not trivially exact: a single draw differs from v.
  auto one = testing::densify(layout, c->compress(layout, v, RoundContext{3, 0, 0, 1}));
  CHECK(testing::maxAbsDiff(one, v) > 1e-3);
}

TEST_CASE("QSGD levels fit their bits and the payload size is exact", "[compression]") {
  CHECK(qsgdLevelBits(1) == 1);
  CHECK(qsgdLevelBits(2) == 2);
  CHECK(qsgdLevelBits(3) == 2);
  CHECK(qsgdLevelBits(4) == 3);
  CHECK(qsgdLevelBits(255) == 8);
  CHECK(qsgdLevelBits(256) == 9);
  ParamLayout layout;
  layout.add("w", {1001});
  auto c = makeCompressor("qsgd:levels=15");  // 1 + 4 bits per value
  auto p = c->compress(layout, testing::randomVector(1001, 1), {});
  CHECK(std::get<Qsgd>(p[0]).packed.size() == (1001 * 5 + 7) / 8);
  CHECK(payloadDataBytes(p[0]) == 8 + (1001 * 5 + 7) / 8);
}

TEST_CASE("QSGD of a zero tensor is zero", "[compression]") {
  ParamLayout layout;
  layout.add("w", {10});
  auto c = makeCompressor("qsgd");
  std::vector<float> z(10, 0.0f);
  auto back = testing::densify(layout, c->compress(layout, z, {}));
  CHECK(back == z);
}
