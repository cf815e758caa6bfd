// server/fleet_metrics.h's status page facts without a fleet (starling-sim's use): the rounds kept
// and their running byte total, the simulated pool, the ETA, and JSON that any parser takes (no
// NaN, strings escaped); core/json_text.h's two writers. The fleet's side (peers, subtrees,
// progress) is tested against live federations in test_python_operations.
#include "server/fleet_metrics.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <thread>

#include "core/json_text.h"

using namespace starling;

namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

server::RoundRecord record(uint64_t round) {
  server::RoundRecord r;
  r.round = round;
  r.applied = true;
  r.clients_completed = 3;
  r.uplink_bytes = 100 * round;
  r.downlink_bytes = 7;
  if (round % 10 == 0) r.test_accuracy = 0.5;
  return r;
}

}  // namespace

TEST_CASE("JSON text: strings escaped, numbers that read back, no NaN", "[server][ops]") {
  std::string s;
  appendJsonString(s, std::string("a\"b\\c\n\t\x01\x7f") + "\xc3\xa9");
  CHECK(s == "\"a\\\"b\\\\c\\n\\t\\u0001\\u007f\xc3\xa9\"");
  for (const double v : {0.1, 1.0 / 3.0, 1e300, -2.5e-308, 123456789.0, 0.0}) {
    std::string n;
    appendJsonNumber(n, v);
    INFO(n);
    CHECK(std::strtod(n.c_str(), nullptr) == v);
    CHECK(n.find_first_not_of("0123456789.e+-") == std::string::npos);
  }
  for (const double v : {std::nan(""), std::numeric_limits<double>::infinity(),
                         -std::numeric_limits<double>::infinity()}) {
    std::string n;
    appendJsonNumber(n, v);
    CHECK(n == "null");
  }
}

TEST_CASE("the status page keeps the last rounds, their running bytes, and the simulated pool",
          "[server][ops]") {
  server::FleetMetrics m(std::make_shared<ops::Registry>(), "simulation", "mlp \"quoted\"\n",
                         "00ff");
  m.setPlannedRounds(20'000);
  m.setSimulated(1000, 50);
  m.setEta(std::nan(""));  // no estimate yet reads as null, not NaN
  std::string j = m.statusJson();
  CHECK(j.find("\"model\":\"mlp \\\"quoted\\\"\\n\"") != std::string::npos);
  CHECK(j.find("\"eta_seconds\":null") != std::string::npos);
  CHECK(j.find("NaN") == std::string::npos);
  CHECK(j.find("\"clients\":{\"registered\":1000,\"online\":1000,\"in_round\":50}") !=
        std::string::npos);
  CHECK(j.find("\"rounds\":[]") != std::string::npos);

  // More rounds than are kept, with a reader rendering all along (the rounds' thread never waits
  // for it: the JSON is rendered from chunks no writer changes).
  std::atomic<bool> done{false};
  std::atomic<size_t> renders{0}, whole{0};  // (Catch2 asserts on this thread only)
  std::thread reader([&] {
    while (!done) {
      const std::string r = m.statusJson();
      whole += r.front() == '{' && r.back() == '}' && r.find("\"rounds\":[") != std::string::npos;
      ++renders;
    }
  });
  const uint64_t n = 10'300;
  for (uint64_t r = 1; r <= n; ++r) {
    m.roundStarted(r);
    m.roundRecorded(record(r));
  }
  m.setEta(12.5);
  done = true;
  reader.join();
  CHECK(renders > 0);
  CHECK(whole == renders);
  j = m.statusJson();
  const size_t kept = count(j, "{\"round\":");
  CHECK(kept >= server::FleetMetrics::kMaxRounds);
  CHECK(kept < server::FleetMetrics::kMaxRounds + server::FleetMetrics::kRoundChunk);
  // The last round is there, the first kept is the one after those dropped, and each round's
  // running total counts every round before it, dropped or not.
  const uint64_t first = n - kept + 1;
  CHECK(j.find("{\"round\":" + std::to_string(first) + ",") != std::string::npos);
  CHECK(j.find("{\"round\":" + std::to_string(first - 1) + ",") == std::string::npos);
  uint64_t total = 0;
  for (uint64_t r = 1; r <= n; ++r) total += 100 * r + 7;
  CHECK(j.find("\"total_bytes\":" + std::to_string(total) + ",") != std::string::npos);
  CHECK(j.find("\"bytes\":{\"in\":0,\"out\":0,\"rounds\":" + std::to_string(total) + "}") !=
        std::string::npos);
  CHECK(j.find("\"number\":" + std::to_string(n) + ",\"planned\":20000") != std::string::npos);
  CHECK(j.find("\"eta_seconds\":12.5") != std::string::npos);
  CHECK(count(j, "\"accuracy\":0.5") == count(j, "\"accuracy\":") - count(j, "\"accuracy\":null"));
  CHECK(count(j, "\"accuracy\":0.5") >= kept / 10);
  CHECK(m.registry()
            .gauge("starling_eta_seconds", "starling-sim: the seconds left, estimated.")
            .value() == 12.5);
}

TEST_CASE("DP's gauges come with their record's fields only", "[server][ops]") {
  server::FleetMetrics m(std::make_shared<ops::Registry>(), "root", "mlp", "00ff");
  server::RoundRecord plain;
  plain.round = 1;
  m.roundRecorded(plain);
  std::string t = m.registry().render(false);
  CHECK(t.find("starling_dp_epsilon") == std::string::npos);
  CHECK(t.find("starling_dp_clip") == std::string::npos);
  server::RoundRecord dp;
  dp.round = 2;
  dp.dp_epsilon = 0.25;
  dp.dp_clip = 0.75;
  m.roundRecorded(dp);
  t = m.registry().render(false);
  CHECK(t.find("starling_dp_epsilon 0.25") != std::string::npos);
  CHECK(t.find("starling_dp_clip 0.75") != std::string::npos);
}
