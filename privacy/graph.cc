#include "privacy/graph.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "privacy/crypto.h"

namespace starling::privacy {

std::span<const uint64_t> Neighbourhoods::neighbours(uint64_t id) const {
  const auto it = std::lower_bound(clients.begin(), clients.end(), id);
  STARLING_CHECK_ARG(it != clients.end() && *it == id, "client ", id, " is not in the round");
  return of[static_cast<size_t>(it - clients.begin())];
}

bool Neighbourhoods::adjacent(uint64_t a, uint64_t b) const {
  const auto n = neighbours(a);
  return std::binary_search(n.begin(), n.end(), b);
}

namespace {

// The round's clients ascending, checked.
std::vector<uint64_t> sortedClients(std::span<const uint64_t> clients, uint32_t k) {
  STARLING_CHECK_ARG(clients.size() >= 2, "secure aggregation needs at least 2 clients, got ",
                     clients.size());
  STARLING_CHECK_ARG(k >= 2 && k % 2 == 0, "secagg.neighbours must be even and at least 2, got ",
                     k);
  std::vector<uint64_t> out(clients.begin(), clients.end());
  std::sort(out.begin(), out.end());
  STARLING_CHECK_ARG(std::adjacent_find(out.begin(), out.end()) == out.end(),
                     "a round's clients must be distinct");
  return out;
}

// The cyclic order: a permutation of the positions (Fisher-Yates) drawn from the ChaCha20 stream
// of a key every party derives from the run and the round (public: the graph hides nothing); not
// data::shuffleInPlace, which draws from core/rng's statistical streams.
std::vector<size_t> cyclicOrder(size_t n, uint64_t run_seed, uint64_t round) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  KeyStream draws(publicKey("starling secagg graph v1", run_seed, round), round, MaskStream::kGraph,
                  0);
  for (size_t i = n - 1; i > 0; --i) std::swap(order[i], order[draws.below(i + 1)]);
  return order;
}

// The neighbours of the client at position p of the order.
std::vector<uint64_t> around(const std::vector<uint64_t>& sorted, const std::vector<size_t>& order,
                             size_t p, uint32_t k) {
  const size_t n = sorted.size();
  std::set<uint64_t> mine;
  if (k + 1 >= n) {  // the complete graph
    for (size_t q = 0; q < n; ++q)
      if (q != order[p]) mine.insert(sorted[q]);
  } else {
    const size_t half = std::min<size_t>(k / 2, (n - 1) / 2);
    for (size_t d = 1; d <= half; ++d) {
      mine.insert(sorted[order[(p + d) % n]]);
      mine.insert(sorted[order[(p + n - d) % n]]);
    }
  }
  return {mine.begin(), mine.end()};
}

}  // namespace

Neighbourhoods harary(std::span<const uint64_t> clients, uint32_t k, uint64_t run_seed,
                      uint64_t round) {
  Neighbourhoods g;
  g.clients = sortedClients(clients, k);
  const size_t n = g.clients.size();
  const std::vector<size_t> order = cyclicOrder(n, run_seed, round);
  g.of.assign(n, {});
  for (size_t p = 0; p < n; ++p) g.of[order[p]] = around(g.clients, order, p, k);
  return g;
}

std::vector<uint64_t> hararyNeighbours(std::span<const uint64_t> clients, uint32_t k,
                                       uint64_t run_seed, uint64_t round, uint64_t id) {
  const std::vector<uint64_t> sorted = sortedClients(clients, k);
  const auto it = std::lower_bound(sorted.begin(), sorted.end(), id);
  STARLING_CHECK_ARG(it != sorted.end() && *it == id, "client ", id, " is not in the round");
  const size_t index = static_cast<size_t>(it - sorted.begin());
  const std::vector<size_t> order = cyclicOrder(sorted.size(), run_seed, round);
  const size_t p =
      static_cast<size_t>(std::find(order.begin(), order.end(), index) - order.begin());
  return around(sorted, order, p, k);
}

}  // namespace starling::privacy
