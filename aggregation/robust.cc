#include "aggregation/robust.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace starling::aggregation {
namespace {

size_t checkUpdates(const DenseUpdates& u, const char* rule) {
  STARLING_CHECK_ARG(!u.empty(), rule, ": the round has no updates");
  const size_t d = u[0].size();
  for (size_t i = 1; i < u.size(); ++i)
    STARLING_CHECK_ARG(u[i].size() == d, rule, ": update ", i, " has ", u[i].size(),
                       " values, update 0 has ", d);
  return d;
}

void checkKrum(size_t n, uint32_t f, const char* rule) {
  STARLING_CHECK_ARG(n >= 2 * static_cast<size_t>(f) + 3, rule, " with f=", f,
                     " needs at least 2f+3 = ", 2 * static_cast<size_t>(f) + 3,
                     " updates, the round has ", n);
}

double squaredDistance(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return s;
}

// Krum scores of the updates listed in `ids`, n = ids.size(), over k = max(1, n - f - 2) nearest
// neighbours (k = n - f - 2 whenever n >= 2f + 3, which Krum itself requires; Bulyan's later
// passes run on fewer updates).
std::vector<double> scoresOf(const DenseUpdates& u, const std::vector<size_t>& ids, uint32_t f) {
  const size_t n = ids.size();
  if (n == 1) return {0.0};
  const long long kk = static_cast<long long>(n) - static_cast<long long>(f) - 2;
  const size_t k = static_cast<size_t>(std::max<long long>(1, kk));
  std::vector<std::vector<double>> dist(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      // A NaN distance would compare false with everything and tie in the sort: count it as
      // infinitely far instead (callers reject non-finite updates before, this is defence in
      // depth).
      const double d = squaredDistance(u[ids[i]], u[ids[j]]);
      dist[i][j] = dist[j][i] = std::isnan(d) ? INFINITY : d;
    }
  std::vector<double> scores(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> others;
    others.reserve(n - 1);
    for (size_t j = 0; j < n; ++j)
      if (j != i) others.push_back(dist[i][j]);
    std::partial_sort(others.begin(), others.begin() + static_cast<ptrdiff_t>(k), others.end());
    scores[i] = std::accumulate(others.begin(), others.begin() + static_cast<ptrdiff_t>(k), 0.0);
  }
  return scores;
}

std::vector<size_t> lowest(const std::vector<double>& scores, size_t m) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  order.resize(m);
  return order;
}

}  // namespace

std::vector<float> coordinateMedian(const DenseUpdates& u) {
  const size_t d = checkUpdates(u, "median"), n = u.size();
  std::vector<float> out(d), col(n);
  for (size_t j = 0; j < d; ++j) {
    for (size_t i = 0; i < n; ++i) col[i] = u[i][j];
    auto mid = col.begin() + static_cast<ptrdiff_t>(n / 2);
    std::nth_element(col.begin(), mid, col.end());
    if (n % 2) {
      out[j] = *mid;
    } else {
      const float hi = *mid;
      const float lo = *std::max_element(col.begin(), mid);
      out[j] = static_cast<float>((static_cast<double>(lo) + hi) / 2.0);
    }
  }
  return out;
}

std::vector<float> trimmedMean(const DenseUpdates& u, double beta) {
  const size_t d = checkUpdates(u, "trimmed_mean"), n = u.size();
  STARLING_CHECK_ARG(beta >= 0.0 && beta < 0.5, "trimmed_mean: beta must be in [0, 0.5), got ",
                     beta);
  const size_t cut = static_cast<size_t>(beta * static_cast<double>(n));
  STARLING_CHECK_ARG(n > 2 * cut, "trimmed_mean: cutting ", cut, " at each end leaves nothing of ",
                     n, " updates");
  std::vector<float> out(d), col(n);
  for (size_t j = 0; j < d; ++j) {
    for (size_t i = 0; i < n; ++i) col[i] = u[i][j];
    std::sort(col.begin(), col.end());
    double s = 0;
    for (size_t i = cut; i < n - cut; ++i) s += col[i];
    out[j] = static_cast<float>(s / static_cast<double>(n - 2 * cut));
  }
  return out;
}

std::vector<double> krumScores(const DenseUpdates& u, uint32_t f) {
  checkUpdates(u, "krum");
  checkKrum(u.size(), f, "krum");
  std::vector<size_t> ids(u.size());
  std::iota(ids.begin(), ids.end(), 0);
  return scoresOf(u, ids, f);
}

std::vector<size_t> krumSelect(const DenseUpdates& u, uint32_t f, size_t m) {
  auto scores = krumScores(u, f);
  STARLING_CHECK_ARG(m >= 1 && m <= u.size(), "multikrum: m=", m, " must be in [1, ", u.size(),
                     "]");
  return lowest(scores, m);
}

std::vector<float> krum(const DenseUpdates& u, uint32_t f) { return u[krumSelect(u, f, 1)[0]]; }

std::vector<float> multiKrum(const DenseUpdates& u, const std::vector<double>& weights, uint32_t f,
                             size_t m) {
  STARLING_CHECK_ARG(weights.size() == u.size(), "multikrum: ", weights.size(), " weights for ",
                     u.size(), " updates");
  if (m == 0) m = u.size() - f;
  const auto keep = krumSelect(u, f, m);
  std::vector<double> acc(u[0].size(), 0.0);
  double total = 0;
  for (size_t i : keep) {
    total += weights[i];
    for (size_t j = 0; j < acc.size(); ++j) acc[j] += weights[i] * u[i][j];
  }
  STARLING_CHECK_ARG(total > 0, "multikrum: the kept updates have zero total weight");
  std::vector<float> out(acc.size());
  for (size_t j = 0; j < acc.size(); ++j) out[j] = static_cast<float>(acc[j] / total);
  return out;
}

std::vector<float> bulyan(const DenseUpdates& u, uint32_t f) {
  const size_t d = checkUpdates(u, "bulyan"), n = u.size();
  STARLING_CHECK_ARG(n >= 4 * static_cast<size_t>(f) + 3, "bulyan with f=", f,
                     " needs at least 4f+3 = ", 4 * static_cast<size_t>(f) + 3,
                     " updates, the round has ", n);
  const size_t theta = n - 2 * f, beta = theta - 2 * f;
  std::vector<size_t> remaining(n), selected;
  std::iota(remaining.begin(), remaining.end(), 0);
  while (selected.size() < theta) {
    // Krum over the remaining updates.
    const std::vector<double> scores = scoresOf(u, remaining, f);
    const size_t best = lowest(scores, 1)[0];
    selected.push_back(remaining[best]);
    remaining.erase(remaining.begin() + static_cast<ptrdiff_t>(best));
  }
  std::vector<float> out(d);
  std::vector<float> col(theta);
  for (size_t j = 0; j < d; ++j) {
    for (size_t i = 0; i < theta; ++i) col[i] = u[selected[i]][j];
    std::sort(col.begin(), col.end());
    const double med = theta % 2 ? col[theta / 2]
                                 : (static_cast<double>(col[theta / 2 - 1]) + col[theta / 2]) / 2.0;
    // The beta values closest to the median form a contiguous window of the sorted column.
    size_t lo = 0;
    double best = INFINITY;
    for (size_t s = 0; s + beta <= theta; ++s) {
      const double spread = std::max(std::fabs(col[s] - med), std::fabs(col[s + beta - 1] - med));
      if (spread < best) {
        best = spread;
        lo = s;
      }
    }
    double sum = 0;
    for (size_t i = lo; i < lo + beta; ++i) sum += col[i];
    out[j] = static_cast<float>(sum / static_cast<double>(beta));
  }
  return out;
}

double clipUpdate(std::span<float> u, double max_norm) {
  STARLING_CHECK_ARG(max_norm > 0 && std::isfinite(max_norm),
                     "clip: max_norm must be finite and > 0, got ", max_norm);
  double sq = 0;
  for (float x : u) sq += static_cast<double>(x) * x;
  const double norm = std::sqrt(sq);
  if (norm <= max_norm) return 1.0;
  const double s = max_norm / norm;
  for (float& x : u) x = static_cast<float>(x * s);
  return s;
}

}  // namespace starling::aggregation
