// SecAgg+'s graph (privacy/graph.h): k neighbours each, symmetric, connected, the same for every
// party from the round's seed, another each round.
#include "privacy/graph.h"

#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <set>
#include <vector>

#include "core/error.h"

using namespace starling;
using namespace starling::privacy;

namespace {
std::vector<uint64_t> ids(size_t n) {
  std::vector<uint64_t> v;
  for (size_t i = 0; i < n; ++i) v.push_back(1000 + 7 * i);
  return v;
}
bool connected(const Neighbourhoods& g) {
  std::set<uint64_t> seen{g.clients[0]};
  std::vector<uint64_t> todo{g.clients[0]};
  while (!todo.empty()) {
    const uint64_t c = todo.back();
    todo.pop_back();
    for (uint64_t d : g.neighbours(c))
      if (seen.insert(d).second) todo.push_back(d);
  }
  return seen.size() == g.clients.size();
}
}  // namespace

TEST_CASE("graph: every client has k neighbours, the relation is symmetric and connected",
          "[privacy][graph]") {
  for (size_t n : {9u, 10u, 100u, 1001u})
    for (uint32_t k : {2u, 4u, 8u}) {
      INFO(n << " clients, k = " << k);
      const Neighbourhoods g = harary(ids(n), k, 42, 3);
      REQUIRE(g.clients.size() == n);
      for (uint64_t c : g.clients) {
        const auto nb = g.neighbours(c);
        CHECK(nb.size() == k);
        for (uint64_t d : nb) {
          CHECK(d != c);
          CHECK(g.adjacent(d, c));
        }
      }
      CHECK(connected(g));
    }
}

TEST_CASE("graph: few clients are the complete graph", "[privacy][graph]") {
  const Neighbourhoods g = harary(ids(5), 8, 1, 1);
  for (uint64_t c : g.clients) CHECK(g.neighbours(c).size() == 4);
  CHECK_THROWS_AS(harary(ids(1), 4, 1, 1), InvalidArgument);
  CHECK_THROWS_AS(harary(ids(10), 3, 1, 1), InvalidArgument);
  CHECK_THROWS_AS(harary(ids(10), 0, 1, 1), InvalidArgument);
  std::vector<uint64_t> dup{1, 2, 2};
  CHECK_THROWS_AS(harary(dup, 2, 1, 1), InvalidArgument);
  CHECK_THROWS_AS(g.neighbours(7), InvalidArgument);
}

TEST_CASE("graph: the same for every party from the round's seed, another each round",
          "[privacy][graph]") {
  std::vector<uint64_t> shuffled = ids(50);
  std::reverse(shuffled.begin(), shuffled.end());
  const Neighbourhoods a = harary(ids(50), 6, 9, 4), b = harary(shuffled, 6, 9, 4),
                       c = harary(ids(50), 6, 9, 5), d = harary(ids(50), 6, 10, 4);
  CHECK(a.of == b.of);  // the order the ids are given in does not matter
  CHECK(a.of != c.of);
  CHECK(a.of != d.of);
}

TEST_CASE("graph: a client's own neighbours alone are its row of the whole graph",
          "[privacy][graph]") {
  for (const auto& [n, k] : std::vector<std::pair<uint64_t, uint32_t>>{{100, 8}, {5, 8}, {31, 6}}) {
    std::vector<uint64_t> ids;
    for (uint64_t i = 0; i < n; ++i) ids.push_back(3 * i + 7);
    const Neighbourhoods g = harary(ids, k, 11, 4);
    for (uint64_t id : ids) {
      const std::vector<uint64_t> mine = hararyNeighbours(ids, k, 11, 4, id);
      const auto row = g.neighbours(id);
      REQUIRE(std::vector<uint64_t>(row.begin(), row.end()) == mine);
    }
    // Another round's graph is another: the row is not the same by construction.
    size_t differ = 0;
    for (uint64_t id : ids) {
      const auto row = g.neighbours(id);
      differ +=
          std::vector<uint64_t>(row.begin(), row.end()) != hararyNeighbours(ids, k, 11, 5, id);
    }
    CHECK((n <= k + 1 ? differ == 0 : differ > 0));
  }
  CHECK_THROWS_AS(hararyNeighbours(std::vector<uint64_t>{1, 2, 3}, 2, 1, 1, 4), InvalidArgument);
}

// What a signed round's survivors step leaves an equivocating server (privacy/secagg.h): clients
// reveal only under a survivors list that t of their neighbours signed alike, so the most it reads
// is the sum of a group in which every member has t neighbours (t > k / 2). In the Harary graph
// (whose order the server may choose through the round's seed; the order only relabels the
// graph), every such group holds more than half of the round's clients: so at most one per
// round, and never a small one. Every subset checked, on the graph the parties derive, for the
// sizes below (a check of these cases, not a proof for every n and k).
TEST_CASE("graph: a group whose every member has t > k / 2 neighbours in it is most of the round",
          "[privacy][graph][secagg]") {
  struct Case {
    size_t n;
    uint32_t k, t;
    // The smallest such group, from an independent search on the circulant graph C_n(1..k/2)
    // (for k = 4 by hand too: a client outside it has all its neighbours inside, so outsiders
    // are at least 5 apart).
    size_t least;
  };
  for (const Case c :
       {Case{10, 4, 3, 8}, Case{11, 4, 3, 9}, Case{12, 4, 3, 10}, Case{13, 4, 3, 11},
        Case{13, 6, 4, 9}, Case{14, 6, 4, 10}, Case{15, 6, 4, 10}, Case{16, 8, 5, 11},
        Case{18, 8, 5, 12}, Case{20, 10, 6, 12}, Case{9, 8, 5, 6}}) {
    INFO(c.n << " clients, k = " << c.k << ", t = " << c.t);
    {
      const Neighbourhoods g = harary(ids(c.n), c.k, 42, 1);
      std::vector<uint32_t> adj(c.n, 0);  // bitmask of each client's neighbours, by index
      for (size_t i = 0; i < c.n; ++i)
        for (uint64_t d : g.neighbours(g.clients[i])) {
          const auto j =
              std::lower_bound(g.clients.begin(), g.clients.end(), d) - g.clients.begin();
          adj[i] |= uint32_t{1} << j;
        }
      size_t smallest = c.n;
      for (uint32_t s = 1; s < (uint32_t{1} << c.n); ++s) {
        bool closed = true;
        for (size_t i = 0; i < c.n && closed; ++i)
          if ((s >> i & 1) && static_cast<uint32_t>(std::popcount(adj[i] & s)) < c.t)
            closed = false;
        if (closed) smallest = std::min<size_t>(smallest, static_cast<size_t>(std::popcount(s)));
      }
      CHECK(2 * smallest > c.n);
      CHECK(smallest == c.least);
    }
  }
}
