#pragma once
// The sum of |v| over floats, correctly rounded to double: the same double whatever the order of
// the additions, so a CPU and a GPU (or two vector widths) give the same bits. Each float |v| is
// m * 2^(max(e, 1) - 150) with e its 8-bit exponent and m its 24-bit significand (the implicit bit
// set for e > 0); the significands are summed exactly in 64-bit integers, one bucket per exponent
// (order-free, as integer sums are), and the buckets are combined exactly and rounded once, to
// nearest with ties to even. Sign's scale (quantize.h) is this sum over numel; the round on the
// device (torch_trainer/device_compress.h) fills the same buckets there and finishes here. The sum
// of squares below serves QSGD's norm alike.
#include <array>
#include <cstdint>
#include <span>

namespace starling::compression {

// One bucket per float exponent: bucket e holds the sum of the significands m of the values whose
// exponent is e (the infinities' and NaNs' exponent, 255, included as given: callers bound their
// inputs first).
using ExponentBuckets = std::array<uint64_t, 256>;

// Adds |v|'s significands to `b`. Exact for fewer than 2^40 values in all.
void addAbsSignificands(std::span<const float> v, ExponentBuckets& b);

// sum over e of b[e] * 2^(max(e, 1) - 150), correctly rounded to double (round to nearest, ties
// to even). Finite for fewer than 2^40 finite floats (at most about 2^168).
double roundBuckets(const ExponentBuckets& b);

// sum |v_i|, correctly rounded to double: roundBuckets after addAbsSignificands.
double exactAbsSum(std::span<const float> v);

// The sum of v^2 the same way: a float's square m^2 * 2^(2 max(e, 1) - 300) is exact in 48 bits,
// split as hi * 2^24 + lo so that each half sums in 64 bits; QSGD's norm is its square root.
struct SquareBuckets {
  ExponentBuckets hi{}, lo{};
};
void addSquaredSignificands(std::span<const float> v, SquareBuckets& b);
double roundSquareBuckets(const SquareBuckets& b);
double exactSquareSum(std::span<const float> v);

}  // namespace starling::compression
