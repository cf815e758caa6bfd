#include "compression/compressor.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/finite.h"

namespace starling::compression {
namespace {

constexpr uint32_t kStateMagic = 0x53434c53;  // "SLCS"
constexpr uint32_t kStateVersion = 1;

void put(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}
template <class T>
void putPod(std::vector<uint8_t>& out, T v) {
  put(out, &v, sizeof(T));
}
void putFloats(std::vector<uint8_t>& out, const std::vector<float>& v) {
  putPod<uint64_t>(out, v.size());
  put(out, v.data(), v.size() * sizeof(float));
}

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  void get(void* p, size_t n) {
    if (n > b_.size() - pos_) STARLING_THROW(IoError, "client state: truncated at byte ", pos_, " of ", b_.size());
    std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
  }
  template <class T>
  T pod() {
    T v;
    get(&v, sizeof(T));
    return v;
  }
  std::vector<float> floats() {
    const uint64_t n = pod<uint64_t>();
    if (n > (b_.size() - pos_) / sizeof(float))
      STARLING_THROW(IoError, "client state: a vector claims ", n, " floats, only ", b_.size() - pos_, " bytes left");
    std::vector<float> v(n);
    get(v.data(), n * sizeof(float));
    return v;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

}  // namespace

size_t countForDensity(double density, size_t n) {
  if (n == 0) return 0;
  const double k = std::llround(density * static_cast<double>(n));
  return static_cast<size_t>(std::clamp(k, 1.0, static_cast<double>(n)));
}

size_t ClientState::memoryBytes() const {
  size_t b = residual.capacity() * sizeof(float);
  for (const auto& f : factors) b += f.capacity() * sizeof(float);
  return b;
}

std::vector<uint8_t> ClientState::serialize() const {
  std::vector<uint8_t> out;
  out.reserve(32 + memoryBytes());
  putPod(out, kStateMagic);
  putPod(out, kStateVersion);
  putPod(out, layout_fingerprint);
  putPod(out, pending_phase);
  putFloats(out, residual);
  putPod<uint64_t>(out, factors.size());
  for (const auto& f : factors) putFloats(out, f);
  return out;
}

ClientState ClientState::deserialize(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  if (r.pod<uint32_t>() != kStateMagic) STARLING_THROW(IoError, "client state: bad magic (not a Starling client state)");
  const uint32_t version = r.pod<uint32_t>();
  if (version != kStateVersion)
    STARLING_THROW(IoError, "client state: version ", version, " not supported (expected ", kStateVersion, ")");
  ClientState s;
  s.layout_fingerprint = r.pod<uint64_t>();
  s.pending_phase = r.pod<uint8_t>();
  s.residual = r.floats();
  const uint64_t nf = r.pod<uint64_t>();
  if (nf > bytes.size() / 8) STARLING_THROW(IoError, "client state: claims ", nf, " factor vectors");
  s.factors.resize(nf);
  for (auto& f : s.factors) f = r.floats();
  if (!r.done()) STARLING_THROW(IoError, "client state: trailing bytes after the last field");
  return s;
}

ClientState Compressor::initialState(const ParamLayout& layout) const {
  ClientState s;
  s.layout_fingerprint = layout.fingerprint();
  if (usesErrorFeedback()) s.residual.assign(layout.numel(), 0.0f);
  initState(layout, s);
  return s;
}

std::vector<Payload> Compressor::compress(const ParamLayout& layout, std::span<const float> update,
                                          ClientState& state, const RoundContext& ctx) const {
  STARLING_CHECK_ARG(update.size() == layout.numel(), name(), ": update has ", update.size(),
                     " floats, the layout needs ", layout.numel());
  STARLING_CHECK_ARG(state.layout_fingerprint == layout.fingerprint(), name(),
                     ": client state belongs to another model (fingerprint ", state.layout_fingerprint,
                     " vs ", layout.fingerprint(), ")");
  const bool ef = usesErrorFeedback();
  STARLING_CHECK_ARG(!ef || state.residual.size() == layout.numel(), name(), ": client state residual has ",
                     state.residual.size(), " floats, expected ", layout.numel());
  if (!allFinite(update)) {
    for (size_t i = 0; i < update.size(); ++i)
      STARLING_CHECK_ARG(std::isfinite(update[i]), name(), ": update value ", i, " is not finite (", update[i], ")");
  }
  // Everything a caller can get wrong is checked before the state changes.
  checkRound(layout, state, ctx);
  if (ef) {
    float* r = state.residual.data();
    for (size_t i = 0; i < update.size(); ++i) r[i] += update[i];
    return compressAccumulated(layout, state.residual, state, ctx);
  }
  // No EF: compressors only read `acc` (see compressAccumulated's contract), so no copy is made.
  return compressAccumulated(layout, std::span<float>(const_cast<float*>(update.data()), update.size()), state, ctx);
}

}  // namespace starling::compression
