#pragma once
// Random draws that must give the same result with every compiler and standard library: a
// partition or a training run is reproduced from its seed on any machine. The algorithms of
// std::shuffle and std::*_distribution are left to each library (libstdc++ and libc++ differ),
// so Starling draws with its own code from an RngStream.
//
// Integer draws (shuffles) are bit-exact everywhere. The gamma draw uses log/sqrt/exp, which are
// correctly rounded or within one ulp in glibc on every architecture; a different libm could in
// principle round differently in the last bit.
#include <cstddef>
#include <span>
#include <utility>

#include "core/rng.h"

namespace starling::data {

// Fisher-Yates: every permutation equally likely, n - 1 draws of rng.below().
template <class T>
void shuffleInPlace(std::span<T> v, RngStream& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

// log of one Gamma(shape, 1) draw (Marsaglia & Tsang 2000, with their boost for shape < 1
// applied in log space so that a tiny shape never underflows to 0). shape must be > 0.
double sampleLogGamma(RngStream& rng, double shape);

// One draw of Dirichlet(alpha, ..., alpha) with out.size() components into `out` (finite,
// >= 0, summing to 1 up to rounding). alpha must be > 0; out must not be empty.
void sampleDirichlet(RngStream& rng, double alpha, std::span<double> out);

}  // namespace starling::data
