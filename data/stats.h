#pragma once
// What a partition looks like: per-client label histograms, a one-line summary a program prints
// before training ("how skewed is this split?"), and a CSV file of every client's statistics.
#include <cstddef>
#include <cstdint>
#include <iosfwd>
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
  // Examples of each class over all clients together (an example held twice counts twice).
  std::vector<size_t> pooledHistogram() const;
  // Client k's label skew: the total variation distance between its label distribution and the
  // pooled one, 0.5 * sum_c |h_k[c] / n_k - H[c] / N|, in [0, 1] (0: the same mix as the whole
  // partition; near 1: classes the others hardly have). NaN for a client without examples.
  double labelSkew(size_t k) const;
};

// Histograms of `shards` (indices into labels). Throws InvalidArgument for an empty partition,
// an index out of range, num_classes outside [1, 256] or a label >= num_classes.
// Does not require a disjoint cover: it describes whatever it is given.
PartitionStats partitionStats(std::span<const uint8_t> labels, uint32_t num_classes,
                              const Partition& shards);
// The same of a population's shards, a drawn one's drawn client by client.
PartitionStats partitionStats(std::span<const uint8_t> labels, uint32_t num_classes,
                              const ClientShards& shards);

// One line, e.g. "10 clients, 60000 examples; per client: 5212 / 6004 / 6953 examples
// (min / median / max), 3.4 of 10 classes on average".
std::string summary(const PartitionStats& stats);

// Every client's statistics as CSV, one line per client after a header:
//   client,examples,classes_held,label_skew,class_0,...,class_{C-1}
// (label_skew as labelSkew(), empty for a client without examples; class_c: its examples of
// class c).
void writeStatsCsv(const PartitionStats& stats, std::ostream& out);
// The same into a file (replaced); IoError naming the path when it cannot be written.
void writeStatsCsv(const PartitionStats& stats, const std::string& path);

// The split itself, for another program to train on the same shards (bench/peers/ reads it):
// a text file of `#` comment lines (the clients, examples and what made the split, `what`),
// then one line per client, client k on the k-th line: its example indices (0-based rows of the
// training file, ascending, space-separated; an empty line for an empty shard). IoError when
// the file cannot be written; it is written whole or not at all (core/file_io.h).
void writeSplit(const Partition& shards, size_t num_examples, const std::string& what,
                const std::string& path);
void writeSplit(const ClientShards& shards, size_t num_examples, const std::string& what,
                const std::string& path);

}  // namespace starling::data
