#include "data/stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/file_io.h"

namespace starling::data {

size_t PartitionStats::total() const {
  return std::accumulate(sizes.begin(), sizes.end(), size_t{0});
}

size_t PartitionStats::minSize() const {
  return sizes.empty() ? 0 : *std::min_element(sizes.begin(), sizes.end());
}

size_t PartitionStats::maxSize() const {
  return sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
}

double PartitionStats::medianSize() const {
  if (sizes.empty()) return 0;
  std::vector<size_t> s = sizes;
  std::sort(s.begin(), s.end());
  const size_t m = s.size() / 2;
  return s.size() % 2 ? static_cast<double>(s[m])
                      : (static_cast<double>(s[m - 1]) + static_cast<double>(s[m])) / 2;
}

double PartitionStats::meanClassesHeld() const {
  if (classes_held.empty()) return 0;
  const double sum = std::accumulate(classes_held.begin(), classes_held.end(), 0.0);
  return sum / static_cast<double>(classes_held.size());
}

std::vector<size_t> PartitionStats::pooledHistogram() const {
  std::vector<size_t> h(num_classes, 0);
  for (const auto& hk : histograms)
    for (size_t c = 0; c < hk.size() && c < h.size(); ++c) h[c] += hk[c];
  return h;
}

namespace {

// Client k's total variation distance to the pooled histogram of n_all examples; NaN without
// examples.
double skewAgainst(const PartitionStats& st, size_t k, const std::vector<size_t>& pooled,
                   double n_all) {
  if (st.sizes[k] == 0) return std::numeric_limits<double>::quiet_NaN();
  const double n_k = static_cast<double>(st.sizes[k]);
  double tv = 0;
  for (size_t c = 0; c < st.num_classes; ++c)
    tv += std::fabs(static_cast<double>(st.histograms[k][c]) / n_k -
                    static_cast<double>(pooled[c]) / n_all);
  return tv / 2;
}

}  // namespace

double PartitionStats::labelSkew(size_t k) const {
  STARLING_CHECK_ARG(k < clients(), "labelSkew: client ", k, " of only ", clients());
  return skewAgainst(*this, k, pooledHistogram(), static_cast<double>(total()));
}

namespace {
// The statistics of `clients` shards, client k's given by shardOf(k).
template <class ShardOf>
PartitionStats statsOf(std::span<const uint8_t> labels, uint32_t num_classes, size_t clients,
                       const ShardOf& shardOf) {
  STARLING_CHECK_ARG(clients > 0, "partitionStats: the partition has no clients");
  STARLING_CHECK_ARG(num_classes >= 1 && num_classes <= 256, "partitionStats: num_classes ",
                     num_classes, " is not in [1, 256]");
  PartitionStats st;
  st.num_classes = num_classes;
  st.histograms.assign(clients, std::vector<size_t>(num_classes, 0));
  for (size_t k = 0; k < clients; ++k) {
    const std::span<const size_t> shard = shardOf(k);
    for (size_t i : shard) {
      STARLING_CHECK_ARG(i < labels.size(), "partitionStats: client ", k, " holds example ", i,
                         " of only ", labels.size());
      STARLING_CHECK_ARG(labels[i] < num_classes, "partitionStats: label ", int{labels[i]},
                         " of example ", i, " is not below num_classes ", num_classes);
      ++st.histograms[k][labels[i]];
    }
    st.sizes.push_back(shard.size());
    st.classes_held.push_back(static_cast<uint32_t>(std::count_if(
        st.histograms[k].begin(), st.histograms[k].end(), [](size_t c) { return c > 0; })));
  }
  return st;
}
}  // namespace

PartitionStats partitionStats(std::span<const uint8_t> labels, uint32_t num_classes,
                              const Partition& shards) {
  return statsOf(labels, num_classes, shards.size(),
                 [&](size_t k) { return std::span<const size_t>(shards[k]); });
}

PartitionStats partitionStats(std::span<const uint8_t> labels, uint32_t num_classes,
                              const ClientShards& shards) {
  std::vector<size_t> scratch;
  return statsOf(labels, num_classes, shards.size(),
                 [&](size_t k) { return shards.shard(k, scratch); });
}

std::string summary(const PartitionStats& st) {
  const double median = st.medianSize();  // a whole number or one half
  char med[32], buf[256];
  std::snprintf(med, sizeof med,
                median == static_cast<double>(static_cast<size_t>(median)) ? "%.0f" : "%.1f",
                median);
  std::snprintf(
      buf, sizeof buf,
      "%zu clients, %zu examples; per client: %zu / %s / %zu examples (min / median / max), "
      "%.1f of %u classes on average",
      st.clients(), st.total(), st.minSize(), med, st.maxSize(), st.meanClassesHeld(),
      st.num_classes);
  return buf;
}

void writeStatsCsv(const PartitionStats& st, std::ostream& out) {
  out << "client,examples,classes_held,label_skew";
  for (uint32_t c = 0; c < st.num_classes; ++c) out << ",class_" << c;
  out << '\n';
  const std::vector<size_t> pooled = st.pooledHistogram();
  const double n_all = static_cast<double>(st.total());
  char skew[32];
  for (size_t k = 0; k < st.clients(); ++k) {
    const double tv = skewAgainst(st, k, pooled, n_all);
    skew[0] = '\0';
    if (!std::isnan(tv)) std::snprintf(skew, sizeof skew, "%.6f", tv);
    out << k << ',' << st.sizes[k] << ',' << st.classes_held[k] << ',' << skew;
    for (size_t h : st.histograms[k]) out << ',' << h;
    out << '\n';
  }
}

void writeStatsCsv(const PartitionStats& st, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) STARLING_THROW(IoError, path, ": cannot write the per-client statistics");
  writeStatsCsv(st, out);
  out.flush();
  if (!out) STARLING_THROW(IoError, path, ": writing the per-client statistics failed");
}

void writeSplit(const Partition& shards, size_t num_examples, const std::string& what,
                const std::string& path) {
  writeSplit(ClientShards(shards), num_examples, what, path);
}

void writeSplit(const ClientShards& shards, size_t num_examples, const std::string& what,
                const std::string& path) {
  std::string out = "# starling split: " + std::to_string(shards.size()) + " clients, " +
                    std::to_string(num_examples) + " training examples; " + what + "\n";
  out += "# line k after these comments: client k's example indices (rows of the training file)\n";
  std::vector<size_t> scratch;
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::span<const size_t> shard = shards.shard(k, scratch);
    for (size_t i = 0; i < shard.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(shard[i]);
    }
    out += '\n';
  }
  writeFileAtomic(path, std::span(reinterpret_cast<const uint8_t*>(out.data()), out.size()));
}

}  // namespace starling::data
