#include "compression/topk_select.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace starling::compression {
namespace {

constexpr size_t kBlock = 16;

// Collects indices with |x| >= thr into cand (sized cap + kBlock); returns cap + 1 as soon as
// more than cap were found. Writes are branch-free inside a block that holds a candidate; a block
// starts with c <= cap, so its writes stay below cap + kBlock.
size_t collect(std::span<const float> x, float thr, std::vector<uint32_t>& cand, size_t cap) {
  const size_t n = x.size();
  const float* p = x.data();
  uint32_t* out = cand.data();
  size_t c = 0;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    int any = 0;
    for (size_t j = 0; j < kBlock; ++j) any |= std::fabs(p[i + j]) >= thr;
    if (!any) continue;
    for (size_t j = 0; j < kBlock; ++j) {
      out[c] = static_cast<uint32_t>(i + j);
      c += std::fabs(p[i + j]) >= thr;
    }
    if (c > cap) return cap + 1;
  }
  for (; i < n; ++i) {
    if (std::fabs(p[i]) >= thr) {
      if (c >= cap) return cap + 1;
      out[c++] = static_cast<uint32_t>(i);
    }
  }
  return c;
}

struct ByMagnitude {
  const float* x;
  bool operator()(uint32_t a, uint32_t b) const {
    const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
    return fa > fb || (fa == fb && a < b);
  }
};

void finish(std::span<const float> x, std::vector<uint32_t>& cand, size_t k, std::vector<uint32_t>& out) {
  ByMagnitude cmp{x.data()};
  if (cand.size() > k) std::nth_element(cand.begin(), cand.begin() + static_cast<ptrdiff_t>(k), cand.end(), cmp);
  out.assign(cand.begin(), cand.begin() + static_cast<ptrdiff_t>(k));
  std::sort(out.begin(), out.end());
}

}  // namespace

std::vector<uint32_t> selectTopKBySort(std::span<const float> x, size_t k) {
  std::vector<uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::sort(idx.begin(), idx.end(), ByMagnitude{x.data()});
  idx.resize(std::min(k, idx.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

void selectTopK(std::span<const float> x, size_t k, std::vector<uint32_t>& out, uint64_t seed,
                TopKSelectStats* stats) {
  const size_t n = x.size();
  STARLING_CHECK_ARG(n < (size_t{1} << 32), "selectTopK: ", n, " elements exceed the u32 index range");
  TopKSelectStats local;
  TopKSelectStats& st = stats ? *stats : local;
  st = {};
  k = std::min(k, n);
  if (k == n) {
    out.resize(n);
    std::iota(out.begin(), out.end(), 0u);
    return;
  }
  if (k == 0) {
    out.clear();
    return;
  }
  std::vector<uint32_t> cand;
  // Small or dense selections: the sampling machinery does not pay off.
  if (n <= 4096 || k > n / 8) {
    cand.resize(n);
    std::iota(cand.begin(), cand.end(), 0u);
    st.passes = 1;
    st.candidates = n;
    st.fallback = true;
    finish(x, cand, k, out);
    return;
  }

  // Sample so that about 64 sampled values lie above the true k-th magnitude.
  const double q = static_cast<double>(k) / static_cast<double>(n);
  const size_t s = std::min(n, std::max<size_t>(2048, static_cast<size_t>(std::ceil(64.0 / q))));
  const size_t stride = n / s;
  RngStream rng(StreamKey{seed, 0, kAnyClient, StreamPurpose::kTopkSample, n});
  const size_t start = static_cast<size_t>(rng.below(stride));
  std::vector<float> sample(s);
  for (size_t i = 0; i < s; ++i) sample[i] = std::fabs(x[start + i * stride]);

  // Aim at ~1.25k candidates plus three standard deviations of the sample's count error.
  const double expected = q * static_cast<double>(s);
  double rank = expected * 1.25 + 3.0 * std::sqrt(expected) + 1.0;
  const size_t cap = 3 * k + 4096;
  cand.resize(cap + kBlock);
  for (int attempt = 0; attempt < 6; ++attempt) {
    const size_t r = std::min(s, static_cast<size_t>(rank));
    std::nth_element(sample.begin(), sample.begin() + static_cast<ptrdiff_t>(r - 1), sample.end(), std::greater<float>());
    const float thr = sample[r - 1];
    const size_t c = collect(x, thr, cand, cap);
    ++st.passes;
    if (c >= k && c <= cap) {
      cand.resize(c);
      st.candidates = c;
      finish(x, cand, k, out);
      return;
    }
    if (c < k) {
      if (r == s) break;  // even the smallest sampled value leaves too few: fall back
      rank *= 2.0;
    } else {
      if (rank <= expected + 1.0) break;  // the threshold cannot rise further without missing k
      rank = std::max(expected + 1.0, rank * 0.6);
    }
  }
  cand.resize(n);
  std::iota(cand.begin(), cand.end(), 0u);
  ++st.passes;
  st.candidates = n;
  st.fallback = true;
  finish(x, cand, k, out);
}

}  // namespace starling::compression
