#include "data/stats.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/error.h"

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

PartitionStats partitionStats(std::span<const uint8_t> labels, uint32_t num_classes,
                              const Partition& shards) {
  STARLING_CHECK_ARG(!shards.empty(), "partitionStats: the partition has no clients");
  STARLING_CHECK_ARG(num_classes >= 1 && num_classes <= 256, "partitionStats: num_classes ",
                     num_classes, " is not in [1, 256]");
  PartitionStats st;
  st.num_classes = num_classes;
  st.histograms.assign(shards.size(), std::vector<size_t>(num_classes, 0));
  for (size_t k = 0; k < shards.size(); ++k) {
    for (size_t i : shards[k]) {
      STARLING_CHECK_ARG(i < labels.size(), "partitionStats: client ", k, " holds example ", i,
                         " of only ", labels.size());
      STARLING_CHECK_ARG(labels[i] < num_classes, "partitionStats: label ", int{labels[i]},
                         " of example ", i, " is not below num_classes ", num_classes);
      ++st.histograms[k][labels[i]];
    }
    st.sizes.push_back(shards[k].size());
    st.classes_held.push_back(static_cast<uint32_t>(std::count_if(
        st.histograms[k].begin(), st.histograms[k].end(), [](size_t c) { return c > 0; })));
  }
  return st;
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

}  // namespace starling::data
