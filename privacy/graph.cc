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

Neighbourhoods harary(std::span<const uint64_t> clients, uint32_t k, uint64_t run_seed,
                      uint64_t round) {
  STARLING_CHECK_ARG(clients.size() >= 2, "secure aggregation needs at least 2 clients, got ",
                     clients.size());
  STARLING_CHECK_ARG(k >= 2 && k % 2 == 0, "secagg.neighbours must be even and at least 2, got ",
                     k);
  Neighbourhoods g;
  g.clients.assign(clients.begin(), clients.end());
  std::sort(g.clients.begin(), g.clients.end());
  STARLING_CHECK_ARG(std::adjacent_find(g.clients.begin(), g.clients.end()) == g.clients.end(),
                     "a round's clients must be distinct");
  const size_t n = g.clients.size();
  // The cyclic order: a permutation of the positions (Fisher-Yates) drawn from the ChaCha20 stream
  // of a key every party derives from the run and the round (public: the graph hides nothing);
  // not data::shuffleInPlace, which draws from core/rng's statistical streams.
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  KeyStream draws(publicKey("starling secagg graph v1", run_seed, round), round, MaskStream::kGraph,
                  0);
  for (size_t i = n - 1; i > 0; --i) std::swap(order[i], order[draws.below(i + 1)]);
  g.of.assign(n, {});
  const size_t half = std::min<size_t>(k / 2, (n - 1) / 2);
  const bool complete = k + 1 >= n;
  for (size_t p = 0; p < n; ++p) {
    std::set<uint64_t> mine;
    if (complete) {
      for (size_t q = 0; q < n; ++q)
        if (q != order[p]) mine.insert(g.clients[q]);
    } else {
      for (size_t d = 1; d <= half; ++d) {
        mine.insert(g.clients[order[(p + d) % n]]);
        mine.insert(g.clients[order[(p + n - d) % n]]);
      }
    }
    g.of[order[p]].assign(mine.begin(), mine.end());
  }
  return g;
}

}  // namespace starling::privacy
