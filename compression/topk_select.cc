#include "compression/topk_select.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace starling::compression {
namespace {

constexpr size_t kBlock = 32;

// A candidate: its magnitude and index. Candidates are collected in index order.
struct Cand {
  float a;
  uint32_t i;
};

// The total order: larger magnitude first, then lower index.
inline bool before(const Cand& x, const Cand& y) { return x.a > y.a || (x.a == y.a && x.i < y.i); }

// Collects (|x|, index) for |x| >= thr into `out` (room for cap + kBlock); returns cap + 1 as
// soon as more than cap were found. A block is skipped unless the integer max of its magnitude
// bits reaches thr's bits (for non-negative floats the integer order is the float order, and the
// integer max vectorises); inside a block that may hold a candidate the float test decides
// (NaN never passes it) and writes are branch-free. A block starts with c <= cap, so its writes
// stay below cap + kBlock.
size_t collect(std::span<const float> x, float thr, Cand* out, size_t cap) {
  const size_t n = x.size();
  const float* p = x.data();
  uint32_t thr_bits;
  std::memcpy(&thr_bits, &thr, 4);
  size_t c = 0;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    uint32_t m = 0;
    for (size_t j = 0; j < kBlock; ++j) {
      uint32_t u;
      std::memcpy(&u, p + i + j, 4);
      u &= 0x7fffffffu;
      m = u > m ? u : m;
    }
    if (m < thr_bits) continue;
    for (size_t j = 0; j < kBlock; ++j) {
      const float a = std::fabs(p[i + j]);
      out[c] = Cand{a, static_cast<uint32_t>(i + j)};
      c += a >= thr;
    }
    if (c > cap) return cap + 1;
  }
  for (; i < n; ++i) {
    const float a = std::fabs(p[i]);
    if (a >= thr) {
      if (c >= cap) return cap + 1;
      out[c++] = Cand{a, static_cast<uint32_t>(i)};
    }
  }
  return c;
}

// Keeps the first k of `cand` (index-ordered, c >= k) under the total order, as ascending
// indices: find the k-th candidate on a copy, then filter in index order. No sort of the result.
void finish(const Cand* cand, size_t c, size_t k, std::vector<uint32_t>& out) {
  out.resize(k);
  if (c == k) {
    for (size_t j = 0; j < k; ++j) out[j] = cand[j].i;
    return;
  }
  std::vector<Cand> work(cand, cand + c);
  std::nth_element(work.begin(), work.begin() + static_cast<ptrdiff_t>(k - 1), work.end(), before);
  const Cand kth = work[k - 1];
  size_t o = 0;
  for (size_t j = 0; j < c; ++j)
    if (!before(kth, cand[j])) out[o++] = cand[j].i;  // cand[j] is kth or comes before it
}

}  // namespace

std::vector<uint32_t> selectTopKBySort(std::span<const float> x, size_t k) {
  std::vector<uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) {
    return before(Cand{std::fabs(x[a]), a}, Cand{std::fabs(x[b]), b});
  });
  idx.resize(std::min(k, idx.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

void selectTopK(std::span<const float> x, size_t k, std::vector<uint32_t>& out, uint64_t seed,
                TopKSelectStats* stats) {
  const size_t n = x.size();
  STARLING_CHECK_ARG(n < (size_t{1} << 32), "selectTopK: ", n,
                     " elements exceed the u32 index range");
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
  auto everything = [&] {
    std::vector<Cand> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = Cand{std::fabs(x[i]), static_cast<uint32_t>(i)};
    ++st.passes;
    st.candidates = n;
    st.fallback = true;
    finish(all.data(), n, k, out);
  };
  // Small or dense selections: the sampling machinery does not pay off.
  if (n <= 4096 || k > n / 8) return everything();

  // A strided sample of at most n/128 values, aiming at 32 sampled values above the true k-th
  // magnitude (fewer when n/128 is the limit; the count error is then larger but still bounded
  // by the rank margin below).
  const double q = static_cast<double>(k) / static_cast<double>(n);
  const size_t s = std::min(std::max<size_t>(1024, n / 128),
                            std::max<size_t>(1024, static_cast<size_t>(std::ceil(32.0 / q))));
  const size_t stride = n / s;
  RngStream rng(StreamKey{seed, 0, kAnyClient, StreamPurpose::kTopkSample, n});
  const size_t start = static_cast<size_t>(rng.below(stride));
  std::vector<float> sample(s);
  for (size_t i = 0; i < s; ++i) sample[i] = std::fabs(x[start + i * stride]);

  // Aim at ~1.25k candidates plus four standard deviations of the sample's count error.
  const double expected = q * static_cast<double>(s);
  double rank = expected * 1.25 + 4.0 * std::sqrt(expected) + 1.0;
  const size_t cap = 3 * k + 4096;
  // Uninitialised on purpose: collect() writes before it reads.
  std::unique_ptr<Cand[]> cand(new Cand[cap + kBlock]);
  for (int attempt = 0; attempt < 6; ++attempt) {
    const size_t r = std::min(s, static_cast<size_t>(rank));
    std::nth_element(sample.begin(), sample.begin() + static_cast<ptrdiff_t>(r - 1), sample.end(),
                     std::greater<float>());
    const float thr = sample[r - 1];
    const size_t c = collect(x, thr, cand.get(), cap);
    ++st.passes;
    if (c >= k && c <= cap) {
      st.candidates = c;
      finish(cand.get(), c, k, out);
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
  everything();
}

}  // namespace starling::compression
