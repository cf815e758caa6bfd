// The arm64 client (build-arm64/bin/starling-client, cross-built by `make test`) under
// qemu-aarch64 -L / against the native root server on 127.0.0.1, CURVE on, for two rounds beside a
// native client. This binary has its own main: when the arm64 client or qemu-aarch64 is missing
// (STARLING_SKIP_ARM64=1, no cross packages), it exits 77 and ctest reports "Skipped".
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>

#include "../catch_session.h"
#include "integration/federation.h"

using namespace starling::testing;
using std::chrono::seconds;

namespace {
const std::string kArm64Client = STARLING_ARM64_CLIENT;
const std::string kQemu = STARLING_QEMU_AARCH64;

// Client 1 of `f`: the arm64 client, run by the emulator with the multiarch libc, with the same
// command line as a native client's (and `extra`).
void startArm64Client(Federation& f, int port, const std::vector<std::string>& extra) {
  std::vector<std::string> cmd{kQemu,
                               "-L",
                               "/",
                               kArm64Client,
                               "--client.server",
                               Federation::endpoint(port),
                               "--client.id",
                               "1",
                               "--security.key",
                               f.keys() + "/client-1.key_secret",
                               "--security.server_key",
                               f.keys() + "/server.key",
                               "--data.num_clients",
                               "2",
                               "--model.spec",
                               "softmax",
                               "--data.partition",
                               "iid"};
  cmd.insert(cmd.end(), extra.begin(), extra.end());
  f.start("client-1", cmd);
}

// The root of `f` for `rounds` rounds of both clients (and `extra`), then the native client 0
// (the data split in two, as the arm64 client's).
void startRootAndNativeClient(Federation& f, int port, int rounds,
                              const std::vector<std::string>& extra) {
  std::vector<std::string> args{"--train.rounds",           std::to_string(rounds),
                                "--sampling.min_available", "2",
                                "--sampling.min_clients",   "2",
                                "--round.deadline_ms",      "120000",
                                "--net.silence_ms",         "20000",
                                "--state.metrics",          f.path("metrics.jsonl")};
  args.insert(args.end(), extra.begin(), extra.end());
  f.root("root", port, f.allowList("allow", {"client-0", "client-1"}), args);
  f.client(0, port, "server", 2);
}
}  // namespace

TEST_CASE("the arm64 client under qemu-user takes part in rounds of the native server",
          "[integration][arm64]") {
  Federation f("arm64");
  f.clientKeys(0, 2);
  const int port = freePort();
  startRootAndNativeClient(f, port, 2, {"--compression.compressor", "topk:density=0.05"});
  startArm64Client(f, port, {"--state.file", f.path("client-1.state")});
  const int rc = f.proc("root").wait(seconds(300));
  INFO(f.allLogs());
  REQUIRE(rc == 0);
  const auto lines = readLines(f.path("metrics.jsonl"));
  REQUIRE(lines.size() == 2);
  for (const auto& l : lines) {
    CHECK(field(l, "applied") == "true");
    CHECK(field(l, "clients_completed") == "2");  // the native and the arm64 client
  }
  CHECK(f.proc("client-1").wait(seconds(30)) == 0);
  CHECK(countOf(f.log("client-1"), "phase 0: training") == 2);
  CHECK(std::filesystem::exists(f.path("client-1.state")));
}

TEST_CASE(
    "the arm64 client decodes the block-scaled downlink: the whole model in 2 bits a value, then "
    "the refresh, beside a native client",
    "[integration][arm64]") {
  Federation f("arm64q2");
  f.clientKeys(0, 2);
  const int port = freePort();
  startRootAndNativeClient(f, port, 3, {"--downlink.mode", "q2"});
  startArm64Client(f, port, {});
  const int rc = f.proc("root").wait(seconds(300));
  INFO(f.allLogs());
  REQUIRE(rc == 0);
  const auto lines = readLines(f.path("metrics.jsonl"));
  REQUIRE(lines.size() == 3);
  const uint64_t dense = 4 * (28 * 28 * 10 + 10);  // the deployed softmax in f32, a client
  for (const auto& l : lines) {
    CHECK(field(l, "applied") == "true");
    CHECK(field(l, "clients_completed") == "2");
    // Two tasks of 2.125 bits a value and their framing: under a seventh of two dense ones.
    CHECK(std::stoull(field(l, "downlink_bytes")) < 2 * dense / 7);
  }
  // Neither client refused a task (it would have registered again).
  CHECK(countOf(f.log("root"), "again") == 0);
  CHECK(f.proc("client-1").wait(seconds(30)) == 0);
  CHECK(countOf(f.log("client-1"), "phase 0: training") == 3);
}

int main(int argc, char** argv) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  starling::testing::failEmptyTests(session);
  const Catch::ConfigData& c = session.configData();
  const bool listing =
      c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters || c.showHelp;
  if (!listing && (kQemu.empty() || !std::filesystem::exists(kQemu) ||
                   !std::filesystem::exists(kArm64Client))) {
    std::printf("no arm64 client (%s) or no qemu-aarch64 (%s): skipped\n", kArm64Client.c_str(),
                kQemu.c_str());
    return 77;
  }
  return session.run();
}
