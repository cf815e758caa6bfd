#pragma once
// Robust aggregation rules over the dense updates of one round. They need every update of the
// round at once: memory is O(n * model) floats (n = updates in the round), unlike the streaming
// FedAvg of partial.h. As users of Flower and others expect, median, trimmed mean and Krum ignore
// example counts; Multi-Krum averages the updates it keeps by their weights.
//
//   median        per coordinate, the median (mean of the two middle values for even n)
//   trimmed_mean  per coordinate, drop c = int(beta * n) smallest and c largest, mean the rest;
//                 needs n - 2c >= 1
//   krum          score_i = sum of squared L2 distances to its n - f - 2 nearest other updates;
//                 the update with the lowest score (ties: lowest index); needs n >= 2f + 3
//   multikrum     the m lowest scores (m = 0: n - f), weighted mean; needs n >= 2f + 3
//   bulyan        select theta = n - 2f updates by repeated Krum (each time over the remaining
//                 ones), then per coordinate mean the beta = theta - 2f values closest to the
//                 median of the selected; needs n >= 4f + 3
//   clipUpdate    scales an update down to L2 norm <= max_norm (applied before any rule)
#include <cstdint>
#include <span>
#include <vector>

namespace starling::aggregation {

using DenseUpdates = std::vector<std::vector<float>>;

std::vector<float> coordinateMedian(const DenseUpdates& u);
std::vector<float> trimmedMean(const DenseUpdates& u, double beta);
std::vector<double> krumScores(const DenseUpdates& u, uint32_t f);
// Indices of the m updates with the lowest Krum scores, lowest score first (ties: lower index).
std::vector<size_t> krumSelect(const DenseUpdates& u, uint32_t f, size_t m);
std::vector<float> krum(const DenseUpdates& u, uint32_t f);
std::vector<float> multiKrum(const DenseUpdates& u, const std::vector<double>& weights, uint32_t f,
                             size_t m);
std::vector<float> bulyan(const DenseUpdates& u, uint32_t f);
// Returns the factor applied (1 when the norm was already within max_norm).
double clipUpdate(std::span<float> u, double max_norm);

}  // namespace starling::aggregation
