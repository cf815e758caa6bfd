#pragma once
// Shamir's t-out-of-n secret sharing of 32-byte secrets (a client's mask key and self-mask seed),
// over the prime field GF(p), p = 2^61 - 1 (a Mersenne prime: reduction is two shifts and an add).
// A secret is 8 limbs of 32 bits, each shared by its own random polynomial of degree t - 1 with the
// limb as constant term; recipient j's share is the 8 values at its point x_j >= 1. Any t shares
// give the secret back (Lagrange interpolation at 0); t - 1 give no information. The coefficients
// come from libsodium's randombytes.
//
// combine() checks what it is given: distinct non-zero points, every value in the field, at least
// t shares, and, when it has more than t, that every share lies on the polynomial the first t
// define (a share that was altered, or came from another secret, is InvalidArgument: "inconsistent
// shares"), and that each limb fits 32 bits.
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "privacy/crypto.h"

namespace starling::privacy {

inline constexpr uint64_t kShamirPrime = (uint64_t{1} << 61) - 1;

struct Share {
  uint64_t x = 0;               // the recipient's point, 1 .. p - 1
  std::array<uint64_t, 8> y{};  // the 8 limbs' polynomials at x
  static constexpr size_t kBytes = 8 + 8 * 8;
  std::array<uint8_t, kBytes> bytes() const;  // little-endian x, then y
  // InvalidArgument for a point of 0 or beyond the field, or a value beyond it.
  static Share fromBytes(std::span<const uint8_t> b);
};

// One share per point of `xs` (distinct, 1 .. p - 1), any `threshold` (1 .. xs.size()) of which
// give `secret` back.
std::vector<Share> shamirSplit(const Key32& secret, uint32_t threshold,
                               std::span<const uint64_t> xs);
// The secret of `shares` (at least `threshold` of them; see the top of the file for the checks).
Key32 shamirCombine(std::span<const Share> shares, uint32_t threshold);

// The secret of `shares` when some of them may be wrong (a revealer that lies): each limb's
// polynomial is decoded by Berlekamp-Welch, which corrects up to floor((m - threshold) / 2) wrong
// shares among m, and `wrong` names the points of the shares not on the decoded polynomials (a
// share wrong in any limb), ascending. The same checks as shamirCombine on the points and values;
// InvalidArgument when more shares are wrong than can be corrected ("too many inconsistent
// shares") or a limb is not 32 bits. With m = threshold nothing can be detected: the caller
// checks the secret against its commitment.
struct Recovered {
  Key32 secret{};
  std::vector<uint64_t> wrong;
};
Recovered shamirRecover(std::span<const Share> shares, uint32_t threshold);

namespace detail {
uint64_t fieldMul(uint64_t a, uint64_t b);
uint64_t fieldAdd(uint64_t a, uint64_t b);
uint64_t fieldSub(uint64_t a, uint64_t b);
uint64_t fieldInverse(uint64_t a);  // a != 0
// sum_k coeffs[k] x^k in GF(p).
uint64_t evaluate(std::span<const uint64_t> coeffs, uint64_t x);
// f(at) of the polynomial of degree < points.size() through (xs[i], ys[i]).
uint64_t interpolate(std::span<const uint64_t> xs, std::span<const uint64_t> ys, uint64_t at);
// The coefficients of the polynomial P of degree < k that agrees with all but at most
// floor((n - k) / 2) of the n points (xs[i], ys[i]) (Berlekamp-Welch), or nullopt when none does.
std::optional<std::vector<uint64_t>> decodeReedSolomon(std::span<const uint64_t> xs,
                                                       std::span<const uint64_t> ys, size_t k);
}  // namespace detail

}  // namespace starling::privacy
