#include "data/partition.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "check_throws.h"
#include "core/rng.h"
#include "data/stats.h"

using namespace starling;
using namespace starling::data;
using Catch::Matchers::Contains;

namespace {

// n labels of `classes` classes in a seeded random order, every class about equally frequent.
std::vector<uint8_t> randomLabels(size_t n, uint32_t classes, uint64_t seed) {
  RngStream r(StreamKey{seed, 0, 0, StreamPurpose::kTest, 0});
  std::vector<uint8_t> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = static_cast<uint8_t>(i % classes);
  for (size_t i = n; i > 1; --i) std::swap(y[i - 1], y[r.below(i)]);
  return y;
}

// Every index in [0, n) exactly once over all shards, each shard ascending.
bool isSortedDisjointCover(const Partition& p, size_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& shard : p) {
    if (!std::is_sorted(shard.begin(), shard.end())) return false;
    for (size_t i : shard) {
      if (i >= n || seen[i]++) return false;
    }
  }
  return std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; });
}

double meanClassesHeld(const std::vector<uint8_t>& y, uint32_t classes, const Partition& p) {
  return partitionStats(y, classes, p).meanClassesHeld();
}

}  // namespace

TEST_CASE("every partitioner yields a disjoint cover, reproducible from its seed", "[data]") {
  const auto y = randomLabels(1000, 10, 1);
  for (const char* spec :
       {"iid", "dirichlet", "dirichlet:alpha=0.1,min_size=5", "dirichlet:alpha=1,balance=true",
        "shards", "shards:per_client=3", "quantity", "quantity:alpha=0.2,min_size=10"}) {
    INFO(spec);
    const auto part = makePartitioner(spec);
    for (size_t clients : {1, 7, 20}) {
      INFO(clients << " clients");
      const Partition a = part->split(y, 10, clients, 42);
      REQUIRE(a.size() == clients);
      CHECK(isSortedDisjointCover(a, y.size()));
      CHECK(a == part->split(y, 10, clients, 42));
      if (clients > 1) CHECK(a != part->split(y, 10, clients, 43));
    }
  }
}

TEST_CASE("iid shards differ in size by at most one", "[data]") {
  const auto y = randomLabels(1003, 10, 2);
  const auto iid = makePartitioner("iid");
  for (size_t clients : {1, 10, 17, 1003}) {
    const Partition p = iid->split(y, 10, clients, 5);
    const auto [lo, hi] = std::minmax_element(
        p.begin(), p.end(), [](const auto& a, const auto& b) { return a.size() < b.size(); });
    CHECK(hi->size() - lo->size() <= 1);
    CHECK(lo->size() >= 1);
  }
  // And each shard looks like the whole: with 100 examples per client, all 10 classes appear.
  CHECK(meanClassesHeld(y, 10, iid->split(y, 10, 10, 5)) == 10.0);
}

TEST_CASE("Dirichlet label skew grows as alpha shrinks", "[data]") {
  const auto y = randomLabels(5000, 10, 3);
  double skewed = 0, flat = 0;
  for (uint64_t seed = 0; seed < 5; ++seed) {
    skewed +=
        meanClassesHeld(y, 10, makePartitioner("dirichlet:alpha=0.05")->split(y, 10, 20, seed));
    flat += meanClassesHeld(y, 10, makePartitioner("dirichlet:alpha=100")->split(y, 10, 20, seed));
  }
  skewed /= 5;
  flat /= 5;
  CHECK(skewed < 4.0);  // about 2 classes per client
  CHECK(flat > 9.9);    // nearly every class everywhere

  // The limit alpha -> 0: each class goes (nearly) whole to one client. Drawn in log space, so
  // even alpha = 1e-4 gives proportions, not 0/0.
  const Partition p = makePartitioner("dirichlet:alpha=0.0001")->split(y, 10, 20, 9);
  REQUIRE(isSortedDisjointCover(p, y.size()));
  const auto st = partitionStats(y, 10, p);
  for (uint32_t c = 0; c < 10; ++c) {
    size_t top = 0;
    for (const auto& h : st.histograms) top = std::max(top, h[c]);
    CHECK(top >= 495);  // of 500
  }
}

TEST_CASE("Dirichlet min_size redraws until every client has enough, or says it cannot", "[data]") {
  const auto y = randomLabels(2000, 10, 4);
  const Partition p = makePartitioner("dirichlet:alpha=0.1,min_size=20")->split(y, 10, 20, 1);
  CHECK(isSortedDisjointCover(p, y.size()));
  for (const auto& s : p) CHECK(s.size() >= 20);
  // Without the option, the same alpha leaves some client short.
  const Partition q = makePartitioner("dirichlet:alpha=0.1")->split(y, 10, 20, 1);
  CHECK(std::any_of(q.begin(), q.end(), [](const auto& s) { return s.size() < 20; }));

  // More than there is: refused at once.
  CHECK_THROWS_MATCHING(makePartitioner("dirichlet:min_size=101")->split(y, 10, 20, 1), ConfigError,
                        Contains("min_size=101") && Contains("2000 examples"));
  // Possible in principle (exactly 10 each) but hopeless with alpha = 0.01: bounded, then refused.
  const auto small = randomLabels(100, 10, 5);
  CHECK_THROWS_MATCHING(
      makePartitioner("dirichlet:alpha=0.01,min_size=10")->split(small, 10, 10, 1), ConfigError,
      Contains("no draw in 1000") && Contains("raise alpha"));
}

TEST_CASE("Dirichlet balance keeps shards from growing past n / clients", "[data]") {
  const auto y = randomLabels(2000, 10, 6);
  size_t plain_max = 0, balanced_max = 0;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    for (const auto& s : makePartitioner("dirichlet:alpha=0.3")->split(y, 10, 10, seed))
      plain_max = std::max(plain_max, s.size());
    for (const auto& s :
         makePartitioner("dirichlet:alpha=0.3,balance=true")->split(y, 10, 10, seed))
      balanced_max = std::max(balanced_max, s.size());
  }
  CHECK(balanced_max < plain_max);
}

TEST_CASE("shards gives each client at most 2 * per_client classes", "[data]") {
  // 10 classes of 200: shards of 50 never straddle more than two classes.
  const auto y = randomLabels(2000, 10, 7);
  for (uint32_t per_client : {1u, 2u, 3u, 4u}) {  // 3: shards of 66 or 67 that straddle classes
    INFO("per_client " << per_client);
    const auto part = makePartitioner("shards:per_client=" + std::to_string(per_client));
    const Partition p = part->split(y, 10, 10, 3);
    const auto st = partitionStats(y, 10, p);
    const size_t shard_lo = 2000 / (10 * per_client),
                 shard_hi = (2000 + 10 * per_client - 1) / (10 * per_client);
    for (size_t k = 0; k < p.size(); ++k) {
      CHECK(st.classes_held[k] <= 2 * per_client);
      CHECK(p[k].size() >= per_client * shard_lo);  // per_client near-equal shards
      CHECK(p[k].size() <= per_client * shard_hi);
    }
  }
  // Far more skewed than iid on the same data.
  CHECK(meanClassesHeld(y, 10, makePartitioner("shards")->split(y, 10, 100, 1)) <= 2.0);
  CHECK(meanClassesHeld(y, 10, makePartitioner("iid")->split(y, 10, 100, 1)) > 8.0);
}

TEST_CASE("partitioner arguments and options are checked", "[data]") {
  const auto y = randomLabels(50, 5, 8);
  const auto iid = makePartitioner("iid");
  CHECK_THROWS_MATCHING(iid->split(y, 5, 0, 1), ConfigError, Contains("0 clients"));
  CHECK_THROWS_MATCHING(iid->split(y, 5, 51, 1), ConfigError,
                        Contains("51 clients but only 50 examples"));
  CHECK_THROWS_MATCHING(makePartitioner("dirichlet")->split(y, 5, 51, 1), ConfigError,
                        Contains("51 clients"));
  CHECK_THROWS_MATCHING(iid->split(y, 4, 5, 1), InvalidArgument,
                        Contains("not below num_classes 4"));
  CHECK_THROWS_AS(iid->split(y, 0, 5, 1), InvalidArgument);
  CHECK_THROWS_MATCHING(makePartitioner("shards:per_client=2")->split(y, 5, 26, 1), ConfigError,
                        Contains("only 50 examples"));

  CHECK_THROWS_MATCHING(makePartitioner("dirichlet:alpha=0"), ConfigError, Contains("alpha=0"));
  CHECK_THROWS_MATCHING(makePartitioner("dirichlet:alpha=-1"), ConfigError, Contains("> 0"));
  CHECK_THROWS_MATCHING(makePartitioner("dirichlet:alpha=nan"), ConfigError, Contains("finite"));
  CHECK_THROWS_MATCHING(makePartitioner("dirichlet:alpha=inf"), ConfigError, Contains("finite"));
  CHECK_THROWS_MATCHING(makePartitioner("dirichlet:beta=1"), ConfigError,
                        Contains("unknown option 'beta'"));
  CHECK_THROWS_MATCHING(makePartitioner("shards:per_client=0"), ConfigError,
                        Contains("per_client=0"));
  CHECK_THROWS_MATCHING(makePartitioner("iid:alpha=1"), ConfigError, Contains("unknown option"));
  CHECK_THROWS_MATCHING(makePartitioner("niid"), ConfigError,
                        Contains("iid, dirichlet, quantity, shards, sampled"));
}

TEST_CASE("a partitioner's spec rebuilds the same partitioner", "[data]") {
  const auto y = randomLabels(300, 3, 9);
  for (const char* spec :
       {"iid", "dirichlet:alpha=0.3", "dirichlet:alpha=0.125,min_size=2,balance=true",
        "shards:per_client=3", "sampled:size=7"}) {
    const auto a = makePartitioner(spec);
    const auto b = makePartitioner(a->spec());
    CHECK(b->spec() == a->spec());
    CHECK(a->split(y, 3, 5, 1) == b->split(y, 3, 5, 1));
  }
  CHECK(makePartitioner("dirichlet:alpha=0.3")->spec() ==
        "dirichlet:alpha=0.3,min_size=0,balance=false");
  CHECK(partitioners().names() == "iid, dirichlet, quantity, shards, sampled");
}

TEST_CASE(
    "quantity skew: sizes spread as alpha shrinks, every client gets min_size, labels stay mixed",
    "[data]") {
  const auto y = randomLabels(6000, 10, 3);
  auto spread = [&](const char* spec) {
    const Partition p = makePartitioner(spec)->split(y, 10, 30, 5);
    size_t lo = y.size(), hi = 0;
    for (const auto& s : p) {
      lo = std::min(lo, s.size());
      hi = std::max(hi, s.size());
    }
    return std::make_pair(lo, hi);
  };
  const auto [lo_skew, hi_skew] = spread("quantity:alpha=0.1,min_size=20");
  const auto [lo_flat, hi_flat] = spread("quantity:alpha=100,min_size=20");
  CHECK(lo_skew >= 20);
  CHECK(hi_skew - lo_skew > 4 * (hi_flat - lo_flat));
  // Labels iid: a client of many examples holds (almost) every class.
  const Partition p = makePartitioner("quantity:alpha=100")->split(y, 10, 30, 5);
  CHECK(meanClassesHeld(y, 10, p) > 9.5);
  CHECK_THROWS_AS(makePartitioner("quantity:alpha=0"), ConfigError);
  CHECK_THROWS_WITH(makePartitioner("quantity:min_size=300")->split(y, 10, 30, 5),
                    Contains("need 9000"));
}

TEST_CASE(
    "sampled: a pool larger than the data set, each client drawing size examples with replacement",
    "[data]") {
  const uint32_t classes = 5;
  const auto y = randomLabels(200, classes, 11);
  const auto part = makePartitioner("sampled:size=40");
  CHECK(part->withReplacement());
  CHECK_FALSE(makePartitioner("iid")->withReplacement());
  const size_t clients = 2000;  // ten times more clients than examples
  const Partition a = part->split(y, classes, clients, 7);
  REQUIRE(a.size() == clients);
  std::vector<size_t> drawn(y.size(), 0);
  bool repeats = false;
  for (const auto& s : a) {
    REQUIRE(s.size() == 40);
    CHECK(std::is_sorted(s.begin(), s.end()));
    for (size_t i = 0; i < s.size(); ++i) {
      REQUIRE(s[i] < y.size());
      ++drawn[s[i]];
      if (i > 0 && s[i] == s[i - 1]) repeats = true;
    }
  }
  CHECK(repeats);  // with replacement: 40 draws of 200 repeat one in about 98% of the clients
  // Deterministic from the seed; another seed gives other draws.
  CHECK(a == part->split(y, classes, clients, 7));
  CHECK(a != part->split(y, classes, clients, 8));
  // A client's draws depend on the seed and its id only, not on the pool size.
  const Partition small = part->split(y, classes, 10, 7);
  for (size_t k = 0; k < 10; ++k) CHECK(small[k] == a[k]);
  // Uniform over the examples: 80,000 draws of 200 examples, 400 expected each (sd 20).
  const auto [lo, hi] = std::minmax_element(drawn.begin(), drawn.end());
  CHECK(*lo > 300);
  CHECK(*hi < 500);
  // So the label mix of the pool follows the data set's, and each client's is a sample of it.
  const PartitionStats st = partitionStats(y, classes, a);
  const auto pooled = st.pooledHistogram();
  std::vector<size_t> data_counts(classes, 0);
  for (uint8_t c : y) ++data_counts[c];
  double mean_skew = 0;
  for (uint32_t c = 0; c < classes; ++c) {
    const double expected = static_cast<double>(data_counts[c]) / y.size();
    CHECK(static_cast<double>(pooled[c]) / st.total() == Approx(expected).margin(0.01));
  }
  for (size_t k = 0; k < clients; ++k) mean_skew += st.labelSkew(k) / clients;
  // 40 draws of 5 classes: a client's distance to the pool is sampling noise (about 0.1), far
  // from the 0.8 of a one-class client.
  CHECK(mean_skew < 0.2);
  CHECK(meanClassesHeld(y, classes, a) > 4.5);
}

TEST_CASE(
    "a population's shards: a rule that draws each client's shard alone is drawn whenever asked, "
    "the same as split() gives, and the others are held",
    "[data]") {
  const uint32_t classes = 5;
  const auto y = randomLabels(200, classes, 11);
  const std::shared_ptr<const Partitioner> sampled = makePartitioner("sampled:size=40");
  CHECK(sampled->drawsEachClient());
  CHECK(sampled->drawer(y, classes, 7)->size() == 40);
  const size_t clients = 700;
  const ClientShards drawn = ClientShards::make(sampled, y, classes, clients, 7);
  CHECK(drawn.drawn());
  REQUIRE(drawn.size() == clients);
  const Partition whole = sampled->split(y, classes, clients, 7);
  std::vector<size_t> scratch;
  for (size_t k = 0; k < clients; ++k) {
    const auto got = drawn.shard(k, scratch);
    REQUIRE(std::vector<size_t>(got.begin(), got.end()) == whole[k]);
    CHECK(drawn.examples(k) == 40);
  }
  // The statistics and the split file of a drawn pool are those of the partition it draws.
  const PartitionStats a = partitionStats(y, classes, drawn), b = partitionStats(y, classes, whole);
  CHECK(a.histograms == b.histograms);
  CHECK(a.sizes == b.sizes);
  // A rule that splits the data set is split once and held.
  for (const char* spec : {"iid", "dirichlet:alpha=0.5"}) {
    INFO(spec);
    const std::shared_ptr<const Partitioner> rule = makePartitioner(spec);
    CHECK_FALSE(rule->drawsEachClient());
    CHECK_THROWS_AS(rule->drawer(y, classes, 7), InvalidArgument);
    const ClientShards held = ClientShards::make(rule, y, classes, 20, 7);
    CHECK_FALSE(held.drawn());
    const Partition want = rule->split(y, classes, 20, 7);
    for (size_t k = 0; k < 20; ++k) {
      const auto got = held.shard(k, scratch);
      CHECK(std::vector<size_t>(got.begin(), got.end()) == want[k]);
      CHECK(held.examples(k) == want[k].size());
    }
  }
  // split()'s checks either way; a client past the pool is refused.
  CHECK_THROWS_MATCHING(ClientShards::make(sampled, y, classes, 0, 7), ConfigError,
                        Contains("0 clients"));
  CHECK_THROWS_MATCHING(ClientShards::make(sampled, {}, classes, 5, 7), ConfigError,
                        Contains("no examples"));
  CHECK_THROWS_AS(ClientShards::make(sampled, y, 2, 5, 7), InvalidArgument);  // labels up to 4
  CHECK_THROWS_MATCHING(ClientShards::make(makePartitioner("iid"), y, classes, 201, 7), ConfigError,
                        Contains("201 clients but only 200 examples"));
  CHECK_THROWS_AS(drawn.shard(clients, scratch), InvalidArgument);
  CHECK_THROWS_AS(drawn.examples(clients), InvalidArgument);
  // Ten million clients: any one's shard, as the rule's drawer draws it alone.
  const ClientShards huge = ClientShards::make(sampled, y, classes, 10'000'000, 7);
  const auto last = huge.shard(9'999'999, scratch);
  std::vector<size_t> alone;
  sampled->drawer(y, classes, 7)->draw(9'999'999, alone);
  CHECK(std::vector<size_t>(last.begin(), last.end()) == alone);
  CHECK(alone.size() == 40);
}

TEST_CASE(
    "sampled with label skew: classes=m draws each client's examples from m classes of its own, "
    "alpha from its own Dirichlet proportions, each drawn alone as split() draws it",
    "[data]") {
  const uint32_t classes = 10;
  const auto y = randomLabels(3000, classes, 5);
  const size_t clients = 2000;
  std::vector<size_t> scratch;
  // classes=2: at most two classes a client, every class somewhere in the pool.
  {
    const std::shared_ptr<const Partitioner> rule = makePartitioner("sampled:size=50,classes=2");
    const Partition a = rule->split(y, classes, clients, 3);
    const ClientShards drawn = ClientShards::make(rule, y, classes, clients, 3);
    std::vector<size_t> pool_classes(classes, 0);
    for (size_t k = 0; k < clients; ++k) {
      REQUIRE(a[k].size() == 50);
      std::set<uint8_t> held;
      for (size_t i : a[k]) held.insert(y[i]);
      CHECK(held.size() <= 2);
      for (uint8_t c : held) ++pool_classes[c];
      const auto d = drawn.shard(k, scratch);
      REQUIRE(std::vector<size_t>(d.begin(), d.end()) == a[k]);
    }
    // Each class is one of a client's two with probability 1/5: 400 of 2,000 expected.
    for (size_t c : pool_classes) CHECK(c > 250);
    CHECK(meanClassesHeld(y, classes, a) > 1.8);  // two, or one when 50 draws missed the other
    CHECK_THROWS_MATCHING(makePartitioner("sampled:size=5,classes=11")->split(y, classes, 4, 3),
                          ConfigError, Contains("classes=11 but the data set has 10 classes"));
    // A class without examples is never drawn: nine classes present of ten, all nine a client.
    std::vector<uint8_t> nine = y;
    for (auto& l : nine) l = l == 9 ? 0 : l;
    const Partition p9 = makePartitioner("sampled:size=400,classes=9")->split(nine, classes, 20, 3);
    for (const auto& s : p9) {
      std::set<uint8_t> held;
      for (size_t i : s) held.insert(nine[i]);
      CHECK(held.size() == 9);
      CHECK_FALSE(held.count(9));
    }
    CHECK_THROWS_MATCHING(makePartitioner("sampled:size=5,classes=10")->split(nine, classes, 4, 3),
                          ConfigError, Contains("the data set has 9 classes with examples"));
    CHECK_THROWS_AS(makePartitioner("sampled:size=5,alpha=1e-200"), ConfigError);
  }
  // alpha: small, a few classes dominate each client; large, close to the pool's mix.
  const auto skew = [&](const std::string& spec) {
    const Partition p = makePartitioner(spec)->split(y, classes, clients, 3);
    const PartitionStats st = partitionStats(y, classes, p);
    double mean = 0;
    for (size_t k = 0; k < clients; ++k) mean += st.labelSkew(k) / clients;
    return mean;
  };
  const double strong = skew("sampled:size=50,alpha=0.1"), weak = skew("sampled:size=50,alpha=100"),
               none = skew("sampled:size=50");
  CHECK(strong > 0.6);  // Dirichlet(0.1) over 10 classes: one or two classes a client
  CHECK(weak < 0.25);   // 50 draws of a near-uniform mix: sampling noise only
  CHECK(none < 0.25);
  const std::shared_ptr<const Partitioner> rule = makePartitioner("sampled:size=50,alpha=0.1");
  const ClientShards drawn = ClientShards::make(rule, y, classes, clients, 3);
  const Partition a = rule->split(y, classes, clients, 3);
  for (size_t k : {size_t{0}, size_t{999}, clients - 1}) {
    const auto d = drawn.shard(k, scratch);
    CHECK(std::vector<size_t>(d.begin(), d.end()) == a[k]);
  }
}

TEST_CASE("sampled: options and arguments are checked", "[data]") {
  CHECK_THROWS_MATCHING(makePartitioner("sampled"), ConfigError, Contains("size=N is required"));
  CHECK_THROWS_MATCHING(makePartitioner("sampled:size=0"), ConfigError,
                        Contains("size=N is required"));
  CHECK_THROWS_AS(makePartitioner("sampled:size=-3"), ConfigError);
  CHECK_THROWS_MATCHING(makePartitioner("sampled:size=4,beta=1"), ConfigError,
                        Contains("unknown option"));
  CHECK(makePartitioner("sampled:size=4,alpha=1")->spec() == "sampled:size=4,alpha=1");
  CHECK(makePartitioner("sampled:size=4,classes=2")->spec() == "sampled:size=4,classes=2");
  CHECK_THROWS_MATCHING(makePartitioner("sampled:size=4,alpha=1,classes=2"), ConfigError,
                        Contains("give one"));
  CHECK_THROWS_AS(makePartitioner("sampled:size=4,alpha=-1"), ConfigError);
  const auto part = makePartitioner("sampled:size=3");
  CHECK(part->spec() == "sampled:size=3");
  const std::vector<uint8_t> y{0, 1, 1};
  CHECK_THROWS_MATCHING(part->split(y, 2, 0, 1), ConfigError, Contains("0 clients"));
  CHECK_THROWS_MATCHING(part->split({}, 2, 4, 1), ConfigError, Contains("no examples"));
  CHECK_THROWS_AS(part->split(y, 1, 4, 1), InvalidArgument);  // label 1 of 1 class
  // One example: every draw is it.
  const Partition one = part->split(std::vector<uint8_t>{0}, 1, 5, 1);
  for (const auto& s : one) CHECK(s == std::vector<size_t>{0, 0, 0});
}
