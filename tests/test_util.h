#pragma once
// Helpers shared by the tests: layouts, seeded random vectors, dense decoding of whole updates,
// error-code and byte-level comparisons.
#include <cmath>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include "compression/compressor.h"
#include "compression/payload.h"
#include "compression/registry.h"
#include "core/client_state.h"
#include "core/input_error.h"
#include "core/param_layout.h"
#include "core/rng.h"

namespace starling::testing {

inline ParamLayout smallCnnLayout() {
  ParamLayout l;
  l.add("conv1.weight", {16, 1, 5, 5});
  l.add("conv1.bias", {16});
  l.add("fc1.weight", {64, 256});
  l.add("fc1.bias", {64});
  l.add("fc2.weight", {10, 64});
  l.add("fc2.bias", {10});
  return l;
}

inline std::vector<float> randomVector(size_t n, uint64_t seed, double scale = 1.0) {
  RngStream r(StreamKey{seed, 0, 0, StreamPurpose::kTest, 0});
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(r.normal() * scale);
  return v;
}

// Dense sum of all tensors' payloads, in layout order.
inline std::vector<float> densify(const ParamLayout& layout,
                                  const std::vector<compression::Payload>& payloads,
                                  const compression::SharedFactors* shared = nullptr) {
  std::vector<float> out(layout.numel());
  compression::densifyUpdate(layout, payloads, out, shared);
  return out;
}

inline double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

inline double maxAbs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

inline double norm2(const std::vector<float>& a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

// What running f did, as text for CHECK(... == ...): "no error", the errcName of an InputError's
// code, or "<other exception>: what()". Comparing the text (not a bool) shows the actual outcome
// when a check fails.
template <class F>
std::string errcOf(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return errcName(e.code());
  } catch (const std::exception& e) {
    return std::string("<other exception>: ") + e.what();
  }
  return "no error";
}

// The error-feedback residual a state holds, or zeros when it holds none.
inline std::vector<float> residualOf(const ClientState& s, size_t numel) {
  const auto* r = s.find<compression::ResidualState>(compression::kResidualComponent);
  return r ? r->values : std::vector<float>(numel, 0.0f);
}

// The serialized form of a state (what the strong-guarantee tests compare byte for byte).
inline std::vector<uint8_t> stateBytes(const ClientState& s) {
  std::vector<uint8_t> b;
  s.saveTo(b);
  return b;
}

// Bitwise equality of two payloads (floats compared by their bits, so -0 != +0 and NaN == NaN).
inline bool sameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}
inline bool samePayload(const compression::Payload& a, const compression::Payload& b) {
  namespace cz = compression;
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        const T& y = std::get<T>(b);
        if constexpr (std::is_same_v<T, cz::DenseF32>)
          return sameBits(x.values, y.values);
        else if constexpr (std::is_same_v<T, cz::DenseF16> || std::is_same_v<T, cz::DenseBF16>)
          return x.values == y.values;
        else if constexpr (std::is_same_v<T, cz::Sparse>)
          return x.indices == y.indices && sameBits(x.values, y.values);
        else if constexpr (std::is_same_v<T, cz::RandBlock>)
          return x.offset == y.offset && sameBits(x.values, y.values);
        else if constexpr (std::is_same_v<T, cz::LowRank>)
          return x.rows == y.rows && x.cols == y.cols && x.rank == y.rank && sameBits(x.p, y.p) &&
                 sameBits(x.q, y.q);
        else if constexpr (std::is_same_v<T, cz::Sign>)
          return std::memcmp(&x.scale, &y.scale, 4) == 0 && x.bits == y.bits;
        else if constexpr (std::is_same_v<T, cz::Ternary>)
          return x.count == y.count && std::memcmp(&x.mu, &y.mu, 4) == 0 && x.rice == y.rice &&
                 x.positions == y.positions && x.signs == y.signs;
        else if constexpr (std::is_same_v<T, cz::BlockQ>)
          return x.bits == y.bits && x.block == y.block && x.exps == y.exps && x.packed == y.packed;
        else
          return std::memcmp(&x.norm, &y.norm, 4) == 0 && x.s == y.s && x.packed == y.packed;
      },
      a);
}
inline bool samePayloads(const std::vector<compression::Payload>& a,
                         const std::vector<compression::Payload>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!samePayload(a[i], b[i])) return false;
  return true;
}

// 64-bit FNV-1a of bytes (golden values of encoded messages).
inline uint64_t fnv1a(std::span<const uint8_t> bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

// Every compressor configuration the contract tests run: each registered compressor with its
// defaults and with its error-feedback option flipped, plus the other top-k scope and PowerSGD's
// local mode (with and without error feedback and warm start).
inline std::vector<std::string> allCompressorSpecs() {
  std::vector<std::string> specs;
  for (const auto& e : compression::compressors().entries()) {
    specs.push_back(e.name);
    if (e.options.find("ef=true") != std::string::npos) specs.push_back(e.name + ":ef=false");
    if (e.options.find("ef=false") != std::string::npos) specs.push_back(e.name + ":ef=true");
  }
  // Error feedback's variants (compressor.h): a decayed residual, step-ahead training, a bounded
  // residual age, on one-phase and two-phase compressors.
  for (const char* s :
       {"topk:scope=global", "topk:scope=global,ef=false", "powersgd:mode=local",
        "powersgd:mode=local,ef=false", "powersgd:mode=local,warm_start=false",
        "randblock:ef_decay=0.5,ef_preview=0", "topk:ef_decay=0.75,ef_max_age=2",
        "acpsgd:ef_decay=0.5,ef_preview=1", "powersgd:ef_decay=0.5", "sign:ef_decay=0.9",
        "qsgd:ef=true,ef_decay=0.5,ef_max_age=1", "randblock:offset=client"})
    specs.emplace_back(s);
  return specs;
}

}  // namespace starling::testing
