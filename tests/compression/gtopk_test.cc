#include "compression/gtopk.h"

#include <catch2/catch.hpp>
#include <map>

#include "compression/topk_select.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

namespace {

Sparse randomSparse(size_t n, size_t k, uint64_t seed) {
  auto dense = testing::randomVector(n, seed);
  Sparse s;
  s.indices = selectTopKBySort(dense, k);
  for (uint32_t i : s.indices) s.values.push_back(dense[i]);
  return s;
}

std::vector<float> toDense(const Sparse& s, size_t n) {
  std::vector<float> d(n, 0.0f);
  for (size_t i = 0; i < s.indices.size(); ++i) d[s.indices[i]] += s.values[i];
  return d;
}

// Sort-based reference of one tree node: densify the sum, keep the top-k of it by full sort.
Sparse referenceMerge(const Sparse& a, const Sparse& b, size_t k, size_t n,
                      std::vector<float>& dropped) {
  auto sum = toDense(a, n);
  auto bd = toDense(b, n);
  std::vector<bool> present(n, false);
  for (uint32_t i : a.indices) present[i] = true;
  for (uint32_t i : b.indices) present[i] = true;
  for (size_t i = 0; i < n; ++i) sum[i] += bd[i];
  // Only positions present in either input compete (a present zero sum still counts).
  std::vector<std::pair<uint32_t, float>> cand;
  for (size_t i = 0; i < n; ++i)
    if (present[i]) cand.push_back({static_cast<uint32_t>(i), sum[i]});
  std::sort(cand.begin(), cand.end(), [](auto& x, auto& y) {
    return std::fabs(x.second) > std::fabs(y.second) ||
           (std::fabs(x.second) == std::fabs(y.second) && x.first < y.first);
  });
  std::map<uint32_t, float> kept;
  for (size_t i = 0; i < cand.size(); ++i) {
    if (i < k)
      kept[cand[i].first] = cand[i].second;
    else
      dropped[cand[i].first] += cand[i].second;
  }
  Sparse out;
  for (auto& [i, v] : kept) {
    out.indices.push_back(i);
    out.values.push_back(v);
  }
  return out;
}

}  // namespace

TEST_CASE("a gTop-k merge tree over 8 updates matches the sort-based reference", "[compression]") {
  const size_t n = 5000, k = 100;
  std::vector<Sparse> level, ref_level;
  std::vector<float> inputs_sum(n, 0.0f);
  for (uint64_t w = 0; w < 8; ++w) {
    auto s = randomSparse(n, k, 40 + w);
    // make supports overlap heavily so that merging really adds values
    for (auto& i : s.indices) i = i % 1500;
    std::sort(s.indices.begin(), s.indices.end());
    s.indices.erase(std::unique(s.indices.begin(), s.indices.end()), s.indices.end());
    s.values.resize(s.indices.size());
    for (size_t j = 0; j < s.values.size(); ++j)
      s.values[j] = static_cast<float>(std::sin(w * 7.0 + s.indices[j]));
    auto d = toDense(s, n);
    for (size_t i = 0; i < n; ++i) inputs_sum[i] += d[i];
    level.push_back(s);
    ref_level.push_back(s);
  }
  std::vector<float> dropped(n, 0.0f), ref_dropped(n, 0.0f);
  while (level.size() > 1) {  // log2(8) = 3 rounds of pairwise merges
    std::vector<Sparse> next, ref_next;
    for (size_t i = 0; i < level.size(); i += 2) {
      auto m = gtopkMerge(level[i], level[i + 1], k);
      CHECK(m.kept.indices.size() == k);
      auto dd = toDense(m.dropped, n);
      for (size_t j = 0; j < n; ++j) dropped[j] += dd[j];
      next.push_back(m.kept);
      ref_next.push_back(referenceMerge(ref_level[i], ref_level[i + 1], k, n, ref_dropped));
      REQUIRE(next.back().indices == ref_next.back().indices);
      REQUIRE(testing::maxAbsDiff(next.back().values, ref_next.back().values) < 1e-5);
    }
    level = next;
    ref_level = ref_next;
  }
  CHECK(testing::maxAbsDiff(dropped, ref_dropped) < 1e-5);
  // Nothing is lost: the final top-k plus all dropped mass is the sum of the inputs.
  auto total = toDense(level[0], n);
  for (size_t i = 0; i < n; ++i) total[i] += dropped[i];
  CHECK(testing::maxAbsDiff(total, inputs_sum) < 1e-4);
}

TEST_CASE("gTop-k merge keeps everything when the union fits", "[compression]") {
  Sparse a{{1, 5}, {1.0f, 2.0f}}, b{{5, 9}, {3.0f, -1.0f}};
  auto m = gtopkMerge(a, b, 3);
  CHECK(m.kept.indices == std::vector<uint32_t>{1, 5, 9});
  CHECK(m.kept.values == std::vector<float>{1.0f, 5.0f, -1.0f});
  CHECK(m.dropped.indices.empty());
  auto m2 = gtopkMerge(a, b, 1);
  CHECK(m2.kept.indices == std::vector<uint32_t>{5});
  CHECK(m2.dropped.indices == std::vector<uint32_t>{1, 9});
  Sparse bad{{3, 2}, {1.0f, 1.0f}};
  CHECK_THROWS_AS(gtopkMerge(bad, a, 2), InvalidArgument);
}
