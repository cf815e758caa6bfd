// The GPU paths (cuda/device.h) against their CPU twins, on random data.
//
// This binary has its own main: without a usable GPU every test case exits with 77, which ctest
// reports as "Skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt), so a machine without a GPU never
// counts these as passed. Catch2 2.x has no SKIP macro, hence the exit code.
#define CATCH_CONFIG_RUNNER
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "../catch_session.h"
#include "core/error.h"
#include "core/finite.h"
#include "cuda/device.h"

namespace gpu = starling::cuda;

namespace {

std::vector<float> normals(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// k distinct indices below n in increasing order, like a received Sparse payload.
std::vector<uint32_t> distinctIndices(size_t k, uint32_t n, uint32_t seed) {
  std::vector<uint32_t> all(n);
  std::iota(all.begin(), all.end(), 0u);
  std::vector<uint32_t> picked;
  picked.reserve(k);
  std::mt19937 g(seed);
  std::sample(all.begin(), all.end(), std::back_inserter(picked), k, g);  // keeps the input order
  return picked;
}

// The CPU reference: a scatter-add with one fused multiply-add per entry, the rounding that
// cuda/device.h promises (std::fma is never re-rounded by the compiler, unlike acc += w * v).
void scatterAdd(std::vector<float>& acc, const std::vector<uint32_t>& idx,
                const std::vector<float>& val, float w) {
  for (size_t i = 0; i < idx.size(); ++i) acc[idx[i]] = std::fma(w, val[i], acc[idx[i]]);
}

std::vector<float> download(const gpu::DeviceBuffer& b) {
  std::vector<float> v(b.size());
  b.download(v);
  return v;
}

}  // namespace

TEST_CASE("a device buffer starts zeroed and returns what was uploaded", "[cuda]") {
  const size_t n = (1u << 20) + 13;
  gpu::DeviceBuffer b(n);
  REQUIRE(b.size() == n);
  CHECK(download(b) == std::vector<float>(n, 0.0f));
  const std::vector<float> v = normals(n, 1);
  b.upload(v);
  CHECK(download(b) == v);
}

TEST_CASE("a moved-from device buffer is empty and the moved-to one owns the data", "[cuda]") {
  const std::vector<float> v = normals(1000, 2);
  gpu::DeviceBuffer a(v.size());
  a.upload(v);
  gpu::DeviceBuffer b(std::move(a));
  CHECK(a.size() == 0);
  CHECK(download(b) == v);
  gpu::DeviceBuffer c(10);
  c = std::move(b);
  CHECK(b.size() == 0);
  CHECK(download(c) == v);
}

TEST_CASE("sparse scatter-add on the device equals the CPU scatter-add bit for bit", "[cuda]") {
  const uint32_t n = 1u << 20;
  const size_t nnz = 10000;
  std::vector<float> acc = normals(n, 3);  // a non-zero accumulator, so the add itself is checked
  gpu::DeviceBuffer d(n);
  d.upload(acc);
  // Three updates with different index sets and weights, as a round adds them; the third in
  // shuffled order (the kernel must not depend on sorted indices).
  for (uint32_t round = 0; round < 3; ++round) {
    std::vector<uint32_t> idx = distinctIndices(nnz, n, 10 + round);
    if (round == 2) std::shuffle(idx.begin(), idx.end(), std::mt19937(99));
    const std::vector<float> val = normals(nnz, 20 + round);
    const float w = 0.25f + 0.7f * static_cast<float>(round);
    scatterAdd(acc, idx, val, w);
    gpu::accumulateSparse(d, idx, val, w);
  }
  const std::vector<float> got = download(d);
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += got[i] != acc[i];
  CHECK(differ == 0);
}

TEST_CASE("device allFinite agrees with the CPU allFinite", "[cuda]") {
  const size_t n = (1u << 20) + 13;  // not a multiple of the block size
  std::vector<float> v = normals(n, 4);
  // The largest finite magnitudes and a subnormal sit right below / far below the NaN-inf bound.
  v[7] = std::numeric_limits<float>::max();
  v[8] = -std::numeric_limits<float>::max();
  v[9] = std::numeric_limits<float>::denorm_min();
  gpu::DeviceBuffer d(n);
  d.upload(v);
  REQUIRE(starling::allFinite(v));
  CHECK(gpu::allFinite(d));

  const float bad[] = {
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (float x : bad) {
    for (size_t pos : {size_t{0}, n / 2 + 5, n - 1}) {
      std::vector<float> w = v;
      w[pos] = x;
      d.upload(w);
      INFO("value " << x << " at " << pos);
      CHECK_FALSE(starling::allFinite(w));
      CHECK_FALSE(gpu::allFinite(d));
    }
  }
  CHECK(gpu::allFinite(gpu::DeviceBuffer(0)));
}

TEST_CASE("bad arguments are InvalidArgument and leave the buffer untouched", "[cuda]") {
  gpu::DeviceBuffer d(100);
  CHECK_THROWS_AS(d.upload(std::vector<float>(99)), starling::InvalidArgument);
  std::vector<float> small(99);
  CHECK_THROWS_AS(d.download(small), starling::InvalidArgument);
  const std::vector<uint32_t> out_of_range{3, 100};
  const std::vector<uint32_t> two{3, 4};
  const std::vector<float> one{1.0f};
  const std::vector<float> twoValues{1.0f, 2.0f};
  CHECK_THROWS_AS(gpu::accumulateSparse(d, out_of_range, twoValues, 1.0f),
                  starling::InvalidArgument);
  CHECK_THROWS_AS(gpu::accumulateSparse(d, two, one, 1.0f), starling::InvalidArgument);
  CHECK(download(d) == std::vector<float>(100, 0.0f));
}

int main(int argc, char** argv) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  starling::testing::failEmptyTests(session);
  const Catch::ConfigData& c = session.configData();
  // Listing (catch_discover_tests runs --list-test-names-only at build time) needs no GPU.
  const bool listing =
      c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters || c.showHelp;
  if (!listing && gpu::deviceCount() == 0) {
    // Even without a GPU, check the error contract: a CUDA failure surfaces as IoError with CUDA's
    // message, never as a crash or another exception. (A GPU this build has no code for can still
    // allocate, so success is accepted too.)
    try {
      gpu::DeviceBuffer probe(1);
      std::printf("no CUDA device that can run this build's kernels: skipped\n");
    } catch (const starling::IoError& e) {
      std::printf("no usable CUDA device (%s): skipped\n", e.what());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "without a device, DeviceBuffer threw a non-IoError: %s\n", e.what());
      return 1;
    }
    return 77;
  }
  return session.run();
}
