#include "simulator/scheduler.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "simulator/device_model.h"

using namespace starling;
using namespace starling::simulator;

namespace {

// The makespan the workers would really see: each worker's true seconds per example.
double trueMakespan(const Assignment& a, const std::vector<double>& spe,
                    const std::map<uint64_t, uint64_t>& examples, uint32_t epochs) {
  double worst = 0;
  for (size_t w = 0; w < a.per_worker.size(); ++w) {
    double t = 0;
    for (uint64_t c : a.per_worker[w]) t += spe[w] * static_cast<double>(examples.at(c)) * epochs;
    worst = std::max(worst, t);
  }
  return worst;
}

}  // namespace

TEST_CASE("every job is assigned exactly once, deterministically", "[simulator]") {
  std::vector<ClientJob> jobs;
  for (uint64_t c = 0; c < 37; ++c) jobs.push_back({c * 3 + 1, 50 + (c * 7919) % 400});
  CostModel cost(4);
  for (auto policy :
       {SchedulePolicy::kLpt, SchedulePolicy::kLptMeasured, SchedulePolicy::kRoundRobin}) {
    const Assignment a = schedule(jobs, cost, 2, policy);
    const Assignment b = schedule(jobs, cost, 2, policy);
    CHECK(a.per_worker == b.per_worker);
    std::multiset<uint64_t> seen;
    for (const auto& w : a.per_worker) seen.insert(w.begin(), w.end());
    CHECK(seen.size() == jobs.size());
    for (const auto& j : jobs) CHECK(seen.count(j.client_id) == 1);
  }
  CHECK_THROWS_AS(parseSchedulePolicy("fifo"), ConfigError);
  CHECK(parseSchedulePolicy("lpt") == SchedulePolicy::kLpt);
  CHECK(parseSchedulePolicy("lpt_measured") == SchedulePolicy::kLptMeasured);
  CHECK(parseSchedulePolicy("round_robin") == SchedulePolicy::kRoundRobin);
  for (auto p : {SchedulePolicy::kLpt, SchedulePolicy::kLptMeasured, SchedulePolicy::kRoundRobin})
    CHECK(parseSchedulePolicy(schedulePolicyName(p)) == p);
}

TEST_CASE("lpt's assignment depends on the clients alone, not on measured times", "[simulator]") {
  // A simulator's workers fit the cost model from wall times, which change with the machine's
  // load: under lpt they must not change who trains where (the order of the float sums follows
  // it, and a rerun of a seed must give the same bits).
  std::vector<ClientJob> jobs;
  for (uint64_t c = 0; c < 41; ++c) jobs.push_back({c, 30 + (c * 7919) % 500});
  CostModel fresh(3), skewed(3);
  skewed.observe(0, 1000, 1, 0.1);
  skewed.observe(1, 1000, 1, 0.37);
  skewed.observe(2, 1000, 1, 0.05);
  const Assignment a = schedule(jobs, fresh, 2, SchedulePolicy::kLpt);
  const Assignment b = schedule(jobs, skewed, 2, SchedulePolicy::kLpt);
  CHECK(a.per_worker == b.per_worker);
  // Longest first, each to the least loaded worker in examples, ties to the lower index: the
  // workers' loads differ by at most the largest job.
  std::vector<uint64_t> load;
  for (const auto& w : a.per_worker) {
    uint64_t l = 0;
    for (uint64_t c : w) l += jobs[c].examples;
    load.push_back(l);
  }
  const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
  uint64_t largest = 0;
  for (const auto& j : jobs) largest = std::max(largest, j.examples);
  CHECK(*hi - *lo <= largest);
  // Its predicted seconds are at the mean measured speed.
  const double mean_spe = (1e-4 + 3.7e-4 + 5e-5) / 3;
  for (size_t k = 0; k < load.size(); ++k)
    CHECK(b.predicted_seconds[k] == Approx(mean_spe * static_cast<double>(load[k]) * 2));
  // lpt_measured follows the measured speeds: the slow worker gets less of the work.
  const Assignment m = schedule(jobs, skewed, 2, SchedulePolicy::kLptMeasured);
  CHECK(m.per_worker != b.per_worker);
  uint64_t slow = 0;
  for (uint64_t c : m.per_worker[1]) slow += jobs[c].examples;
  CHECK(slow < load[1]);
}

TEST_CASE("lpt_measured's makespan beats round-robin on workers of unlike speeds", "[simulator]") {
  // Quantity skew: a few clients hold most examples (a Zipf-like pool), two workers, one slower.
  RngStream rng(StreamKey{7, 0, 0, StreamPurpose::kTest, 0});
  std::vector<ClientJob> jobs;
  std::map<uint64_t, uint64_t> examples;
  for (uint64_t c = 0; c < 40; ++c) {
    const uint64_t n = 20 + static_cast<uint64_t>(3000.0 / static_cast<double>(1 + rng.below(40)));
    jobs.push_back({c, n});
    examples[c] = n;
  }
  const std::vector<double> spe = {1e-4, 2e-4};  // worker 1 is half as fast
  CostModel cost(2);
  // The cost model learns each worker's speed from one observed job.
  cost.observe(0, 1000, 1, 0.1);
  cost.observe(1, 1000, 1, 0.2);
  CHECK(cost.secondsPerExample(1) == Approx(2e-4));
  const double lpt =
      trueMakespan(schedule(jobs, cost, 1, SchedulePolicy::kLptMeasured), spe, examples, 1);
  const double rr =
      trueMakespan(schedule(jobs, cost, 1, SchedulePolicy::kRoundRobin), spe, examples, 1);
  CHECK(lpt < rr);
  // And LPT is close to the ideal split of the total work between the two speeds.
  double work = 0;
  for (const auto& j : jobs) work += static_cast<double>(j.examples);
  const double ideal = work / (1 / spe[0] + 1 / spe[1]);
  const uint64_t biggest = std::max_element(jobs.begin(), jobs.end(), [](auto& a, auto& b) {
                             return a.examples < b.examples;
                           })->examples;
  CHECK(lpt <= ideal + spe[1] * static_cast<double>(biggest));
}

TEST_CASE("the cost model smooths observations and ignores nonsense", "[simulator]") {
  CostModel c(2, 1e-3, 0.5);
  CHECK(c.estimate(0, 100, 2) == Approx(0.2));
  c.observe(0, 100, 1, 0.01);  // first observation replaces the prior
  CHECK(c.secondsPerExample(0) == Approx(1e-4));
  c.observe(0, 100, 1, 0.03);  // then an average
  CHECK(c.secondsPerExample(0) == Approx(2e-4));
  c.observe(0, 0, 1, 5.0);
  c.observe(0, 100, 1, -1.0);
  c.observe(0, 100, 1, std::nan(""));
  CHECK(c.secondsPerExample(0) == Approx(2e-4));
  CHECK(c.secondsPerExample(1) == Approx(1e-3));
  CHECK_THROWS_AS(CostModel(0), InvalidArgument);
}

TEST_CASE("a simulated round lasts until its last accepted client, the deadline drops stragglers",
          "[simulator]") {
  const DeviceProfile fast{2.0, 1e6, 1.0}, slow{0.5, 1e5, 1.0};
  const ClientTiming a = timeClient(fast, 1, 1000, 2, 1e-3, 100'000, 50'000);
  CHECK(a.compute_seconds == Approx(1.0));    // 1000 x 2 x 1e-3 / 2
  CHECK(a.transfer_seconds == Approx(0.15));  // 150 kB at 1 MB/s
  const ClientTiming b = timeClient(slow, 2, 1000, 2, 1e-3, 100'000, 50'000);
  CHECK(b.total() == Approx(4.0 + 1.5));
  const ClientTiming c = timeClient(fast, 3, 500, 2, 1e-3, 100'000, 50'000);
  const std::vector<ClientTiming> all{a, b, c};
  RoundTiming r = simulateRound(all, 3, 0);
  CHECK(r.accepted == std::vector<uint64_t>{3, 1, 2});
  CHECK(r.seconds == Approx(5.5));
  r = simulateRound(all, 3, 2.0);  // the slow client misses the deadline
  CHECK(r.accepted == std::vector<uint64_t>{3, 1});
  CHECK(r.dropped == std::vector<uint64_t>{2});
  CHECK(r.seconds == Approx(1.15));
  r = simulateRound(all, 1, 0);  // over-commitment: the fastest one is enough
  CHECK(r.accepted == std::vector<uint64_t>{3});
  CHECK(r.dropped.size() == 2);
  r = simulateRound(all, 3, 0.1);  // nobody in time: the round took the deadline
  CHECK(r.accepted.empty());
  CHECK(r.seconds == Approx(0.1));
}

TEST_CASE("device populations: sampled deterministically, or read from a trace with clear errors",
          "[simulator]") {
  DeviceDistributions d;
  d.speed_sigma = 0.5;
  d.bandwidth_sigma = 1.0;
  d.availability = 0.3;
  const auto p = DevicePopulation::sample(200, d, 9);
  const auto q = DevicePopulation::sample(201, d, 9);
  for (uint64_t c = 0; c < 200; ++c) {
    CHECK(p[c].speed == q[c].speed);  // one more client changes nobody else
    CHECK(p[c].speed > 0);
  }
  size_t avail = 0;
  for (uint64_t c = 0; c < 200; ++c) avail += p.available(c, 5, 9);
  CHECK(avail > 30);
  CHECK(avail < 90);  // about 30% of 200
  CHECK(p.available(3, 5, 9) == p.available(3, 5, 9));
  CHECK_FALSE(p.alwaysAvailable());
  CHECK(DevicePopulation::sample(3, DeviceDistributions{}, 1).alwaysAvailable());
  // Ten million devices, none held: each client's profile is its own stream's, whatever the
  // population's size or availability.
  DeviceDistributions always = d;
  always.availability = 1.0;
  const auto big = DevicePopulation::sample(10'000'000, always, 9);
  CHECK(big.size() == 10'000'000);
  CHECK(big.alwaysAvailable());
  for (uint64_t c : {0, 17, 199}) {
    CHECK(big[c].speed == p[c].speed);
    CHECK(big[c].bandwidth == p[c].bandwidth);
  }
  CHECK(big[9'999'999].speed != big[9'999'998].speed);
  CHECK_THROWS_AS(big[10'000'000], InvalidArgument);
  d.availability = 0;
  CHECK_THROWS_AS(DevicePopulation::sample(3, d, 1), ConfigError);

  const auto dir =
      std::filesystem::temp_directory_path() / ("starling-trace-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream((dir / name).string()) << text;
    return (dir / name).string();
  };
  const auto good =
      write("good.csv", "# a trace\nclient,speed,bandwidth,availability\n1,0.5,1e6,1\n0,2,5e5,0\n");
  const auto t = DevicePopulation::fromCsv(good, 2);
  CHECK(t[1].speed == 0.5);
  CHECK(t[0].bandwidth == 5e5);
  CHECK_FALSE(t.available(0, 1, 1));
  CHECK(t.available(1, 1, 1));
  CHECK_FALSE(t.alwaysAvailable());  // client 0's availability is 0
  CHECK_THROWS_WITH(DevicePopulation::fromCsv(good, 3), Catch::Contains("client 2 is missing"));
  CHECK_THROWS_WITH(
      DevicePopulation::fromCsv(
          write("dup.csv", "client,speed,bandwidth,availability\n0,1,1,1\n0,1,1,1\n"), 2),
      Catch::Contains("appears twice"));
  CHECK_THROWS_WITH(DevicePopulation::fromCsv(
                        write("neg.csv", "client,speed,bandwidth,availability\n0,-1,1,1\n"), 1),
                    Catch::Contains(":2: speed must be positive"));
  CHECK_THROWS_WITH(DevicePopulation::fromCsv(write("hdr.csv", "id,speed\n0,1\n"), 1),
                    Catch::Contains("header"));
  CHECK_THROWS_AS(DevicePopulation::fromCsv((dir / "none.csv").string(), 1), IoError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("availability over time: windows that repeat every period, with clear errors",
          "[simulator]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("starling-windows-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream((dir / name).string()) << text;
    return (dir / name).string();
  };
  DevicePopulation p = DevicePopulation::sample(3, DeviceDistributions{}, 1);
  CHECK_FALSE(p.hasWindows());
  CHECK(p.onlineAt(2, 1e9));
  CHECK(p.nextOnline(2, 7.5) == 7.5);
  // The fingerprint a checkpoint keeps: the same population, the same; another speed, another
  // client count, or windows of time (below), another.
  const uint64_t plain = p.fingerprint();
  CHECK(DevicePopulation::sample(3, DeviceDistributions{}, 1).fingerprint() == plain);
  DeviceDistributions faster;
  faster.speed_median = 1.5;
  CHECK(DevicePopulation::sample(3, faster, 1).fingerprint() != plain);
  CHECK(DevicePopulation::sample(4, DeviceDistributions{}, 1).fingerprint() != plain);
  // Client 0: online [10, 20] and [50, 60] of every 100 s; client 1: [0, 30] and [90, 100], so it
  // is online across the turn of its period; client 2: always.
  p.loadWindows(write(
      "w.csv",
      "# windows\nclient,period,start,end\n0,100,50,60\n0,100,10,20\n1,100,0,30\n1,100,90,100\n"
      "2,40,0,40\n"));
  CHECK(p.hasWindows());
  const uint64_t windowed = p.fingerprint();
  CHECK(windowed != plain);
  DevicePopulation shorter = DevicePopulation::sample(3, DeviceDistributions{}, 1);
  shorter.loadWindows(
      write("w2.csv",  // client 2's window one second shorter
            "client,period,start,end\n0,100,50,60\n0,100,10,20\n1,100,0,30\n1,100,90,100\n"
            "2,40,0,39\n"));
  CHECK(shorter.fingerprint() != windowed);
  CHECK_FALSE(p.onlineAt(0, 5));
  CHECK(p.onlineAt(0, 10));
  CHECK(p.onlineAt(0, 20));
  CHECK_FALSE(p.onlineAt(0, 35));
  CHECK(p.onlineAt(0, 255));  // 55 in its third period
  CHECK(p.nextOnline(0, 5) == 10);
  CHECK(p.nextOnline(0, 15) == 15);
  CHECK(p.nextOnline(0, 35) == 50);
  CHECK(p.nextOnline(0, 75) == 110);  // the next period's first interval
  CHECK(p.nextOffline(0, 15) == Approx(20).epsilon(1e-12));
  CHECK(p.nextOffline(0, 15) > 20);                           // just after its window's end
  CHECK(p.nextOffline(0, 35) == 35);                          // offline already
  CHECK(p.nextOffline(1, 95) == Approx(130).epsilon(1e-12));  // through the turn, to 100 + 30
  CHECK(p.nextOffline(2, 3) == std::numeric_limits<double>::infinity());
  CHECK(p.longestOnline(0) == Approx(10).epsilon(1e-12));
  CHECK(p.longestOnline(1) == Approx(40).epsilon(1e-12));  // [90, 100] then [0, 30]
  CHECK(p.longestOnline(2) == std::numeric_limits<double>::infinity());
  // Bad files, each named by line.
  CHECK_THROWS_WITH(
      p.loadWindows(write("miss.csv", "client,period,start,end\n0,10,0,5\n1,10,0,5\n")),
      Catch::Contains("client 2 has no interval"));
  CHECK_THROWS_WITH(
      p.loadWindows(write("per.csv", "client,period,start,end\n0,10,0,5\n0,20,6,8\n")),
      Catch::Contains(":3: client 0 has two periods"));
  CHECK_THROWS_WITH(p.loadWindows(write("ord.csv", "client,period,start,end\n0,10,6,5\n")),
                    Catch::Contains(":2: the interval must satisfy"));
  CHECK_THROWS_WITH(p.loadWindows(write("zero.csv", "client,period,start,end\n0,10,3,3\n")),
                    Catch::Contains(":2: the interval must satisfy"));
  CHECK_THROWS_WITH(p.loadWindows(write("turn.csv", "client,period,start,end\n0,10,10,10\n")),
                    Catch::Contains("never reaches"));
  CHECK_THROWS_WITH(p.loadWindows(write("big.csv", "client,period,start,end\n0,10,0,11\n")),
                    Catch::Contains("end <= period"));
  CHECK_THROWS_WITH(p.loadWindows(write("id.csv", "client,period,start,end\n3,10,0,1\n")),
                    Catch::Contains("not below the 3 clients"));
  CHECK_THROWS_WITH(p.loadWindows(write("hdr.csv", "client,start,end\n")),
                    Catch::Contains("header"));
  CHECK_THROWS_AS(p.loadWindows((dir / "none.csv").string()), IoError);
  CHECK(p.onlineAt(0, 15));  // a refused file leaves the windows as they were
  CHECK_FALSE(p.onlineAt(0, 5));
  // Windows replace the availability probabilities.
  DeviceDistributions half;
  half.availability = 0.5;
  DevicePopulation q = DevicePopulation::sample(1, half, 1);
  CHECK_THROWS_WITH(q.loadWindows(write("one.csv", "client,period,start,end\n0,10,0,5\n")),
                    Catch::Contains("must be 1"));
  std::filesystem::remove_all(dir);
}
