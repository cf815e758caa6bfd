#include "data/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace starling::data {

double sampleLogGamma(RngStream& rng, double shape) {
  STARLING_CHECK_ARG(shape > 0 && std::isfinite(shape), "sampleLogGamma: shape ", shape,
                     " must be finite and > 0");
  double log_boost = 0;
  if (shape < 1) {
    // Gamma(a) = Gamma(a + 1) * U^(1/a).
    double u;
    do {
      u = rng.uniform();
    } while (u <= 0);
    log_boost = std::log(u) / shape;
    shape += 1;
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = rng.normal();
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = rng.uniform();
    // The squeeze test accepts most draws without a logarithm.
    if (u < 1.0 - 0.0331 * (x * x) * (x * x) ||
        (u > 0 && std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))))
      return std::log(d * v) + log_boost;
  }
}

void sampleDirichlet(RngStream& rng, double alpha, std::span<double> out) {
  STARLING_CHECK_ARG(!out.empty(), "sampleDirichlet: no components");
  // Normalise in log space: exp(g_k - max) cannot overflow, and the largest term is exactly 1,
  // so the sum is >= 1 however small alpha is.
  constexpr double kLowest = std::numeric_limits<double>::lowest();
  for (double& x : out) x = std::max(sampleLogGamma(rng, alpha), kLowest);
  const double top = *std::max_element(out.begin(), out.end());
  double sum = 0;
  for (double& x : out) sum += (x = std::exp(x - top));
  for (double& x : out) x /= sum;
}

}  // namespace starling::data
