#include "data/stats.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "check_throws.h"
#include "data/idx_files.h"

using namespace starling;
using namespace starling::data;
using Catch::Matchers::Contains;

TEST_CASE("partition statistics of a hand-made split", "[data]") {
  const std::vector<uint8_t> y{0, 0, 1, 2, 2, 2};
  const Partition p{{0, 1}, {2, 3, 4}, {5}};
  const PartitionStats st = partitionStats(y, 4, p);
  CHECK(st.histograms ==
        std::vector<std::vector<size_t>>{{2, 0, 0, 0}, {0, 1, 2, 0}, {0, 0, 1, 0}});
  CHECK(st.sizes == std::vector<size_t>{2, 3, 1});
  CHECK(st.classes_held == std::vector<uint32_t>{1, 2, 1});
  CHECK(st.clients() == 3);
  CHECK(st.total() == 6);
  CHECK(st.minSize() == 1);
  CHECK(st.maxSize() == 3);
  CHECK(st.medianSize() == 2.0);
  CHECK(st.meanClassesHeld() == Approx(4.0 / 3.0));
  CHECK(summary(st) ==
        "3 clients, 6 examples; per client: 1 / 2 / 3 examples (min / median / max), 1.3 of 4 "
        "classes on average");

  // An even number of clients: the median is the mean of the middle two.
  const PartitionStats even = partitionStats(y, 3, Partition{{0}, {1, 2}, {3, 4, 5}, {}});
  CHECK(even.medianSize() == 1.5);
  CHECK(even.minSize() == 0);
  CHECK_THAT(summary(even), Contains("0 / 1.5 / 3 examples"));
}

TEST_CASE("partition statistics reject what they cannot describe", "[data]") {
  const std::vector<uint8_t> y{0, 1, 2};
  CHECK_THROWS_MATCHING(partitionStats(y, 3, Partition{{0, 3}}), InvalidArgument,
                        Contains("example 3 of only 3"));
  CHECK_THROWS_MATCHING(partitionStats(y, 2, Partition{{2}}), InvalidArgument, Contains("label 2"));
  CHECK_THROWS_AS(partitionStats(y, 3, Partition{}), InvalidArgument);
  CHECK_THROWS_AS(partitionStats(y, 0, Partition{{0}}), InvalidArgument);
}

TEST_CASE("label skew is the total variation distance to the pooled label mix", "[data]") {
  const std::vector<uint8_t> y{0, 0, 1, 1, 2, 2, 0, 1};
  // Client 0 holds two of each class, client 1 one example of class 0, client 2 example 7 (class 1)
  // twice, client 3 nothing: pooled, class 0: 3, class 1: 4, class 2: 2 of 9.
  const Partition p{{0, 2, 4, 1, 3, 5}, {6}, {7, 7}, {}};
  const PartitionStats st = partitionStats(y, 3, p);
  CHECK(st.pooledHistogram() == std::vector<size_t>{2 + 1, 2 + 2, 2});
  const double pool[3] = {3.0 / 9, 4.0 / 9, 2.0 / 9};
  CHECK(st.labelSkew(0) ==
        Approx(0.5 * (std::fabs(2.0 / 6 - pool[0]) + std::fabs(2.0 / 6 - pool[1]) +
                      std::fabs(2.0 / 6 - pool[2]))));
  CHECK(st.labelSkew(1) == Approx(1 - pool[0]));  // one class: 1 - its share of the pool
  CHECK(st.labelSkew(2) == Approx(1 - pool[1]));
  CHECK(std::isnan(st.labelSkew(3)));
  CHECK_THROWS_AS(st.labelSkew(4), InvalidArgument);
  // A client whose mix is the pool's has no skew.
  const PartitionStats same = partitionStats(y, 3, Partition{{0, 2, 4}, {1, 3, 5}});
  CHECK(same.labelSkew(0) == Approx(0).margin(1e-12));
  CHECK(same.labelSkew(1) == Approx(0).margin(1e-12));
}

TEST_CASE("the per-client statistics CSV holds every client's counts", "[data]") {
  std::vector<uint8_t> y(500);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<uint8_t>((i * 7) % 4);
  Partition p(37);
  for (size_t i = 0; i < y.size(); ++i) p[(i * i) % 36].push_back(i);  // client 36 stays empty
  const PartitionStats st = partitionStats(y, 4, p);
  testing::TempDir dir;
  writeStatsCsv(st, dir.file("stats.csv"));
  std::ifstream in(dir.file("stats.csv"));
  std::string line;
  REQUIRE(std::getline(in, line));
  CHECK(line == "client,examples,classes_held,label_skew,class_0,class_1,class_2,class_3");
  size_t k = 0;
  for (; std::getline(in, line); ++k) {
    INFO("line " << line);
    REQUIRE(k < st.clients());
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cells.push_back(c);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    REQUIRE(cells.size() == 8);
    CHECK(std::stoul(cells[0]) == k);
    CHECK(std::stoul(cells[1]) == p[k].size());
    size_t sum = 0, held = 0;
    for (size_t c = 0; c < 4; ++c) {
      const size_t count = std::stoul(cells[4 + c]);
      CHECK(count == st.histograms[k][c]);
      sum += count;
      held += count > 0;
    }
    CHECK(sum == p[k].size());
    CHECK(std::stoul(cells[2]) == held);
    if (p[k].empty())
      CHECK(cells[3].empty());
    else
      CHECK(std::stod(cells[3]) == Approx(st.labelSkew(k)).margin(1e-6));
  }
  CHECK(k == 37);
  CHECK_THROWS_MATCHING(writeStatsCsv(st, dir.file("no-such-folder/stats.csv")), IoError,
                        Contains("no-such-folder/stats.csv"));
}
