#include <catch2/catch.hpp>

#include "compression/topk_select.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

TEST_CASE("top-k selects exactly the set a full sort selects", "[compression]") {
  for (size_t n : {size_t{100}, size_t{5000}, size_t{200000}}) {
    for (double density : {0.001, 0.01, 0.1, 0.5}) {
      auto x = testing::randomVector(n, n + static_cast<uint64_t>(density * 1e6));
      const size_t k = std::max<size_t>(1, static_cast<size_t>(density * n));
      std::vector<uint32_t> got;
      selectTopK(x, k, got, 99);
      REQUIRE(got == selectTopKBySort(x, k));
    }
  }
}

TEST_CASE("top-k breaks ties by index and whatever the sampling seed", "[compression]") {
  // Few distinct magnitudes: many ties at the k-th value, and both signs.
  const size_t n = 100000;
  auto x = testing::randomVector(n, 3);
  for (float& v : x) v = std::round(v * 2.0f) / 2.0f;
  for (size_t k : {size_t{10}, size_t{1000}, size_t{12345}}) {
    const auto ref = selectTopKBySort(x, k);
    for (uint64_t seed : {1, 2, 3}) {
      std::vector<uint32_t> got;
      selectTopK(x, k, got, seed);
      REQUIRE(got == ref);
    }
  }
}

TEST_CASE("top-k survives adversarial inputs", "[compression]") {
  std::vector<uint32_t> got;
  SECTION("all equal") {
    std::vector<float> x(50000, 1.5f);
    selectTopK(x, 100, got);
    CHECK(got == selectTopKBySort(x, 100));
  }
  SECTION("all zero but a few") {
    std::vector<float> x(50000, 0.0f);
    x[17] = -3;
    x[40000] = 2;
    selectTopK(x, 10, got);
    CHECK(got == selectTopKBySort(x, 10));
    CHECK(got[0] == 0u);  // zeros fill up by index
  }
  SECTION("a spike the sample misses") {
    std::vector<float> x(1 << 20, 1e-3f);
    x[123457] = 1e9f;
    selectTopK(x, 1, got);
    CHECK(got == std::vector<uint32_t>{123457});
  }
  SECTION("k = n and k = 0") {
    auto x = testing::randomVector(10000, 4);
    selectTopK(x, 10000, got);
    CHECK(got.size() == 10000);
    selectTopK(x, 0, got);
    CHECK(got.empty());
  }
}

TEST_CASE("top-k normally finishes in one candidate pass", "[compression]") {
  auto x = testing::randomVector(1 << 20, 8);
  TopKSelectStats st;
  std::vector<uint32_t> got;
  selectTopK(x, 1000, got, 1, &st);
  CHECK(st.passes == 1);
  CHECK_FALSE(st.fallback);
  CHECK(st.candidates >= 1000);
  CHECK(st.candidates <= 3 * 1000 + 4096);
}
