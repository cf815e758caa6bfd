// The run recorder through which both round engines close a round or a step: the order of its
// steps, who writes (the lead only), when an evaluation is due, and what a failure leaves.
#include "server/run_recorder.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "temp_dir.h"

using namespace starling;
using server::RecorderConfig;
using server::RoundRecord;
using server::RunRecorder;

namespace {

std::vector<std::string> linesOf(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

RoundRecord recordOf(uint64_t round, bool applied = true) {
  RoundRecord r;
  r.round = round;
  r.applied = applied;
  r.model_version = round + 1;
  return r;
}

}  // namespace

TEST_CASE("the run recorder closes a round: durable, its line, the engine's last step, progress",
          "[server]") {
  testing::TempDir dir("recorder");
  const auto file = dir.path / "m.jsonl";
  RunRecorder rec(RecorderConfig{file.string(), true, 0, false});
  std::vector<std::string> seen;
  {
    const RunRecorder::Reporting reporting = rec.reportTo([&](const RoundRecord& r) {
      seen.push_back("progress " + std::to_string(r.round) + " lines " +
                     std::to_string(linesOf(file).size()));
    });
    RoundRecord r = recordOf(1);
    rec.close(
        r, [&] { seen.push_back("durable lines " + std::to_string(linesOf(file).size())); },
        [&] { seen.push_back("then lines " + std::to_string(linesOf(file).size())); });
    CHECK(r.wall_seconds >= 0.0);
  }
  // The line after the state is durable, before the engine's last step; progress last.
  CHECK(seen == std::vector<std::string>{"durable lines 0", "then lines 1", "progress 1 lines 1"});
  const auto lines = linesOf(file);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("\"round\":1,\"applied\":true") == 1);
  CHECK(lines[0].find("\"model_version\":2") != std::string::npos);
  // The guard is gone: the callback (whose captures may be gone too) is not called again.
  RoundRecord r2 = recordOf(2);
  rec.close(r2);
  CHECK(seen.size() == 3);
  CHECK(linesOf(file).size() == 2);
}

TEST_CASE("a worker that is not the lead writes no line and reports nothing, but is durable",
          "[server]") {
  testing::TempDir dir("recorder-follower");
  const auto file = dir.path / "m.jsonl";
  RunRecorder rec(RecorderConfig{file.string(), false, 0, false});
  int durable = 0, then = 0, progress = 0;
  const RunRecorder::Reporting reporting = rec.reportTo([&](const RoundRecord&) { ++progress; });
  RoundRecord r = recordOf(1);
  rec.close(
      r, [&] { ++durable; }, [&] { ++then; });
  CHECK(durable == 1);
  CHECK(then == 1);
  CHECK(progress == 0);
  CHECK_FALSE(std::filesystem::exists(file));
}

TEST_CASE("a round whose state cannot be made durable gets no line and no progress", "[server]") {
  testing::TempDir dir("recorder-fail");
  const auto file = dir.path / "m.jsonl";
  RunRecorder rec(RecorderConfig{file.string(), true, 0, false});
  int progress = 0, then = 0;
  const RunRecorder::Reporting reporting = rec.reportTo([&](const RoundRecord&) { ++progress; });
  RoundRecord r = recordOf(1);
  CHECK_THROWS_AS(rec.close(
                      r, [] { STARLING_THROW(IoError, "the disk is full"); }, [&] { ++then; }),
                  IoError);
  CHECK(then == 0);
  CHECK(progress == 0);
  CHECK_FALSE(std::filesystem::exists(file));
  // A metrics file that cannot be appended to: the error names it, progress is not called.
  RunRecorder bad(
      RecorderConfig{(dir.path / "no-such-folder" / "m.jsonl").string(), true, 0, false});
  const RunRecorder::Reporting bad_reporting =
      bad.reportTo([&](const RoundRecord&) { ++progress; });
  RoundRecord r2 = recordOf(1);
  try {
    bad.close(r2);
    FAIL("appending to a missing folder succeeded");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("no-such-folder") != std::string::npos);
  }
  CHECK(progress == 0);
}

TEST_CASE("an evaluation is due every eval_every rounds, after applied ones where asked",
          "[server]") {
  RunRecorder every3(RecorderConfig{"", true, 3, false});
  CHECK_FALSE(every3.evaluationDue(recordOf(1)));
  CHECK_FALSE(every3.evaluationDue(recordOf(2)));
  CHECK(every3.evaluationDue(recordOf(3)));
  CHECK(every3.evaluationDue(recordOf(6, /*applied=*/false)));
  RunRecorder applied_only(RecorderConfig{"", true, 3, true});
  CHECK(applied_only.evaluationDue(recordOf(3)));
  CHECK_FALSE(applied_only.evaluationDue(recordOf(3, /*applied=*/false)));
  RunRecorder never(RecorderConfig{"", true, 0, false});
  for (uint64_t round = 0; round < 10; ++round) CHECK_FALSE(never.evaluationDue(recordOf(round)));
}

TEST_CASE("a round's wall time counts from begin(), or from the last close", "[server]") {
  RunRecorder rec(RecorderConfig{});
  RoundRecord a = recordOf(1);
  rec.close(a);
  // begin() later than the last close: the next record counts from it, so it is no longer than
  // the time since the last close (measured around it here, on the steady clock).
  const auto t0 = std::chrono::steady_clock::now();
  rec.begin();
  RoundRecord b = recordOf(2);
  rec.close(b);
  const double since_t0 =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(b.wall_seconds >= 0.0);
  CHECK(b.wall_seconds <= since_t0);
}
