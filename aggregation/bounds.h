#pragma once
// Bounded influence: the limits a round enforces on every update before it is added, so that no
// accepted update can make an aggregate non-finite or dominate it.
//
// A client's update is accepted only if every decoded value has |v| <= max_abs_value (for
// low-rank payloads the bound is on the expanded product P Q^T, through max_i ||P_i|| *
// max_j ||Q_j||; for sign and QSGD on scale and norm * level / s), its L2 norm is <=
// max_update_norm, and it claims 1..max_examples examples (and no more than the server knows of
// that client, ClientLimits). Since weight * value <= max_examples * max_abs_value <= 1e30 and
// weight * norm <= max_examples * max_update_norm <= 1e30 (both checked at configuration; a QSGD
// payload's unit is weight * norm / s), a float sum of 10^8 such terms stays finite.
//
// What the bounds guarantee is a finite aggregate and a cap on each client's pull: a client of
// weight w_i moves the mean by at most (w_i / W) * max_update_norm. Whether that is "dominating"
// depends on the honest updates' scale, which the bounds do not know: to keep one client from
// outweighing the others, set max_update_norm near the honest scale or clip (rule option clip=),
// and pass what the server knows of each client's data (ClientLimits).
#include <cstdint>
#include <string>

namespace starling::aggregation {

struct ValidationBounds {
  double max_abs_value = 1e4;          // largest |decoded value| an update may carry
  double max_update_norm = 1e5;        // largest L2 norm of a decoded update (one phase's payloads)
  uint64_t max_examples = 10'000'000;  // the weight cap: examples one client may claim
  double max_metric_abs = 1e9;         // largest |metric value|
  uint64_t max_partial_count = 100'000'000;  // updates one partial aggregate may claim to hold
  // A re-sparsified partial (exportSparse with the edge's own residual) may carry mass its edge
  // dropped in earlier rounds: its values and norm may exceed total weight x bound by this factor.
  // Dense partials and factor sums get no slack.
  double max_partial_slack = 8.0;
  // ConfigError naming the field on a non-finite, non-positive or overflow-prone value.
  void validate() const;
  std::string describe() const;
};

// What the server knows of one client: 0 = nothing beyond the round's bounds.
struct ClientLimits {
  uint64_t max_examples = 0;
};

}  // namespace starling::aggregation
