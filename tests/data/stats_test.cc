#include "data/stats.h"

#include <catch2/catch.hpp>

#include "check_throws.h"

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
