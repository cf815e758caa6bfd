#pragma once
// What a partition looks like: per-client label histograms and a one-line summary a program
// prints before training ("how skewed is this split?").
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/partition.h"

namespace starling::data {

struct PartitionStats {
  // histograms[k][c] = examples of class c that client k owns.
  std::vector<std::vector<size_t>> histograms;
  std::vector<size_t> sizes;           // examples per client
  std::vector<uint32_t> classes_held;  // classes with >= 1 example, per client
  uint32_t num_classes = 0;

  size_t clients() const { return sizes.size(); }
  size_t total() const;  // examples over all clients
  size_t minSize() const;
  size_t maxSize() const;
  double medianSize() const;  // the mean of the two middle sizes when the count is even
  double meanClassesHeld() const;
};

// Histograms of `shards` (indices into labels). Throws InvalidArgument for an empty partition,
// an index out of range, num_classes outside [1, 256] or a label >= num_classes.
// Does not require a disjoint cover: it describes whatever it is given.
PartitionStats partitionStats(std::span<const uint8_t> labels, uint32_t num_classes,
                              const Partition& shards);

// One line, e.g. "10 clients, 60000 examples; per client: 5212 / 6004 / 6953 examples
// (min / median / max), 3.4 of 10 classes on average".
std::string summary(const PartitionStats& stats);

}  // namespace starling::data
