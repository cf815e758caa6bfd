// The NCCL twin of the Gloo collectives (simulator/nccl_collectives.h) against the exact sums the
// Gloo test checks (tests/simulator/collectives_test.cc).
//
// Its own main: without a usable GPU every run exits with 77, which ctest reports as "Skipped"
// (SKIP_RETURN_CODE, tests/simulator/CMakeLists.txt), so a machine without a GPU never counts
// these as passed. With one GPU the group is a world of one (NCCL allows one rank per device per
// communicator), which still runs the staging copies, the bucket packing and NCCL's in-place
// collectives. A multi-rank NCCL test needs two GPUs and is not written yet.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

#include "../catch_session.h"
#include "core/error.h"
#include "simulator/nccl_collectives.h"

namespace sim = starling::simulator;

namespace {

float valueAt(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13) % 17) - 8);
}

}  // namespace

TEST_CASE("NCCL, world of one: all-reduce, reduce-scatter and all-gather keep the buffer",
          "[simulator][nccl]") {
  const size_t bucket = GENERATE(size_t{4} << 20, size_t{40});
  sim::CollectiveOptions o;
  o.bucket_bytes = bucket;
  o.timeout = std::chrono::seconds(60);
  auto c = sim::makeNccl(sim::LaunchInfo{}, o);
  REQUIRE(c->backend() == "nccl");
  REQUIRE(c->size() == 1);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{12345}, size_t{3000001}}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = valueAt(0, i);
    std::vector<float> a = x;
    c->allReduceSum(a);
    CHECK(a == x);
    std::vector<float> b = x;
    c->reduceScatterSum(b);
    c->allGather(b);
    CHECK(b == x);
  }
  c->barrier();
}

int main(int argc, char** argv) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  starling::testing::failEmptyTests(session);
  const Catch::ConfigData& c = session.configData();
  // Listing (catch_discover_tests runs --list-test-names-only at build time) needs no GPU.
  const bool listing =
      c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters || c.showHelp;
  if (!listing && sim::ncclDeviceCount() == 0) {
    // Without a device, the error contract still holds: makeNccl is an IoError, never a crash.
    try {
      sim::makeNccl(sim::LaunchInfo{});
      std::fprintf(stderr, "makeNccl succeeded without a CUDA device\n");
      return 1;
    } catch (const starling::IoError& e) {
      std::printf("no usable CUDA device (%s): skipped\n", e.what());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "without a device, makeNccl threw a non-IoError: %s\n", e.what());
      return 1;
    }
    return 77;
  }
  return session.run();
}
