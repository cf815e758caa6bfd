#pragma once
// A named scalar a client reports with its update (train_loss, accuracy, ...) or an evaluation
// produces. Aggregates keep weighted sums of declared metric names only (aggregation/).
#include <string>

namespace starling {

struct Metric {
  std::string name;
  double value = 0.0;
};

}  // namespace starling
