#pragma once
// SecAgg+'s communication graph (Bell et al. 2020): each of a round's n clients masks with, and
// shares its secrets among, only k neighbours rather than all n - 1, which makes a client's work
// O(k) = O(log n). The graph is the Harary graph H(k, n) laid on a random cyclic order of the
// clients: client at position p is a neighbour of the k/2 before and the k/2 after it. The order is
// drawn from the round's public seed (the run seed and the round: every party computes the same
// graph; a server that chooses the run seed or the round's clients chooses the order, not the
// graph's shape). k is even and below n; with n <= k + 1 every client is a
// neighbour of every other (the complete graph: SecAgg).
#include <cstdint>
#include <span>
#include <vector>

namespace starling::privacy {

struct Neighbourhoods {
  std::vector<uint64_t> clients;          // the round's clients, ascending
  std::vector<std::vector<uint64_t>> of;  // of[i]: the neighbours of clients[i], ascending
  // The neighbours of `id` (InvalidArgument for a client not in the round).
  std::span<const uint64_t> neighbours(uint64_t id) const;
  bool adjacent(uint64_t a, uint64_t b) const;
};

// `clients`: distinct ids (any order). InvalidArgument for fewer than 2 clients, an odd or zero k.
Neighbourhoods harary(std::span<const uint64_t> clients, uint32_t k, uint64_t run_seed,
                      uint64_t round);
// The neighbours of `id` alone, ascending: harary(...).neighbours(id), without keeping the rest
// (what a client needs: O(n) time, O(k) memory). InvalidArgument as harary's, or for an id that
// is not one of the clients.
std::vector<uint64_t> hararyNeighbours(std::span<const uint64_t> clients, uint32_t k,
                                       uint64_t run_seed, uint64_t round, uint64_t id);

}  // namespace starling::privacy
