#include "compression/compressor.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/finite.h"
#include "core/half.h"

namespace starling::compression {
namespace {

const uint32_t kMaxInputBits = floatBits(kMaxCompressMagnitude);

uint32_t absBits(float x) { return floatBits(x) & 0x7fffffffu; }

// Throws naming the first value of `v` above kMaxCompressMagnitude or not finite.
[[noreturn]] void tooLarge(const Compressor& c, std::span<const float> v, const char* what) {
  for (size_t i = 0; i < v.size(); ++i)
    STARLING_CHECK_ARG(absBits(v[i]) <= kMaxInputBits, c.name(), ": ", what, " value ", i, " (",
                       v[i], ") is not finite or exceeds ", kMaxCompressMagnitude,
                       what[0] == 'r' ? " (diverged?)" : "");
  STARLING_THROW(InternalError, c.name(), ": a value over the bound was not found again");
}

void checkUpdate(const Compressor& c, const ParamLayout& layout, std::span<const float> update) {
  STARLING_CHECK_ARG(update.size() == layout.numel(), c.name(), ": update has ", update.size(),
                     " floats, the layout needs ", layout.numel());
  uint32_t worst = 0;
  for (float x : update) worst = std::max(worst, absBits(x));  // vectorises: an integer max
  if (worst > kMaxInputBits) tooLarge(c, update, "update");
}

// a = r + u; returns the largest |a| as bits (NaN and inf compare above every finite value). A
// model far larger than the caches is written with non-temporal stores: the workspace is a second
// buffer (what keeps the strong guarantee), and ordinary stores would first read each of its
// cache lines from memory (write-allocate), a third more traffic than forming the sum in place.
uint32_t addInto(float* a, const float* r, const float* u, size_t n) {
  size_t i = 0;
  uint32_t worst = 0;
#if defined(__AVX2__)
  constexpr size_t kStreamBytes = size_t{16} << 20;
  if (n * sizeof(float) >= kStreamBytes) {
    for (; i < n && reinterpret_cast<uintptr_t>(a + i) % 32 != 0; ++i) {
      a[i] = r[i] + u[i];
      worst = std::max(worst, absBits(a[i]));
    }
    const __m256i mask = _mm256_set1_epi32(0x7fffffff);
    __m256i m = _mm256_setzero_si256();
    for (; i + 8 <= n; i += 8) {
      const __m256 s = _mm256_add_ps(_mm256_loadu_ps(r + i), _mm256_loadu_ps(u + i));
      _mm256_stream_ps(a + i, s);
      m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(s), mask));
    }
    _mm_sfence();
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m);
    for (uint32_t l : lanes) worst = std::max(worst, l);
  }
#endif
  for (; i < n; ++i) {
    a[i] = r[i] + u[i];
    worst = std::max(worst, absBits(a[i]));
  }
  return worst;
}

}  // namespace

void ResidualState::save(ByteWriter& w) const {
  w.floats(values);
  w.u64(round);
}

void ResidualState::load(ByteReader& r, uint32_t version) {
  if (version != 1 && version != 2) r.fail("residual version ", version, " not supported");
  r.floats(values);
  // What a compressor keeps is always within its input bound (compressor.h); anything else is a
  // corrupt or foreign state, refused here rather than after a round of training.
  for (size_t i = 0; i < values.size(); ++i)
    if (!(std::fabs(values[i]) <= kMaxCompressMagnitude))
      r.fail("error-feedback residual value ", i, " (", values[i], ") is not finite or exceeds ",
             kMaxCompressMagnitude);
  round = version >= 2 ? r.u64() : 0;
}

void ErrorFeedback::validate(const std::string& who) const {
  if (!(decay >= 1e-6 && decay <= 1.0))
    STARLING_THROW(ConfigError, who, ": ef_decay must be in [1e-6, 1], got ", decay);
  if (!(preview >= 0.0 && preview <= 1.0))
    STARLING_THROW(ConfigError, who, ": ef_preview must be in [0, 1], got ", preview);
  if (!on && (decay != 1.0 || preview != 0.0 || max_age != 0))
    STARLING_THROW(ConfigError, who, ": ef_decay, ef_preview and ef_max_age need ef=true");
}

std::string exactText(double v) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

std::string ErrorFeedback::specText() const {
  if (!on) return ",ef=false";
  return ",ef=true,ef_decay=" + exactText(decay) + ",ef_preview=" + exactText(preview) +
         ",ef_max_age=" + std::to_string(max_age);
}

const ErrorFeedback& Compressor::feedback() const {
  static const ErrorFeedback kOff;
  return kOff;
}

void SharedSupport::gather(std::span<const float> dense, std::span<float> out) const {
  STARLING_CHECK_ARG(out.size() == size(dense.size()), "a shared support of ", size(dense.size()),
                     " values gathered into ", out.size());
  if (all) {
    std::copy(dense.begin(), dense.end(), out.begin());
    return;
  }
  for (size_t j = 0; j < positions.size(); ++j) {
    STARLING_CHECK_ARG(positions[j] < dense.size(), "a shared support's position ", positions[j],
                       " is outside a model of ", dense.size(), " values");
    out[j] = dense[positions[j]];
  }
}

void SharedSupport::scatter(std::span<const float> values, std::span<float> dense) const {
  STARLING_CHECK_ARG(values.size() == size(dense.size()), "a shared support of ",
                     size(dense.size()), " values scattered from ", values.size());
  if (all) {
    std::copy(values.begin(), values.end(), dense.begin());
    return;
  }
  for (uint32_t p : positions)  // all checked before `dense` changes
    STARLING_CHECK_ARG(p < dense.size(), "a shared support's position ", p,
                       " is outside a model of ", dense.size(), " values");
  std::fill(dense.begin(), dense.end(), 0.0f);
  for (size_t j = 0; j < positions.size(); ++j) dense[positions[j]] = values[j];
}

std::string Compressor::secureRefusal() const {
  if (supportIsShared() && phases() == 1 && !sharesFactors()) return {};
  return "its clients send values on supports (or scales) of their own, and a coordinate only "
         "one client touched is that client's value in the sum: it cannot be aggregated "
         "securely";
}

size_t Compressor::secureSize(const ParamLayout& layout, const RoundContext& ctx) const {
  return sharedSupport(layout, ctx).size(layout.numel());
}

std::vector<float> Compressor::secureValues(const ParamLayout& layout, const RoundContext& ctx,
                                            const std::vector<Payload>& update) const {
  const SharedSupport support = sharedSupport(layout, ctx);
  std::vector<float> dense(layout.numel());
  densifyUpdate(layout, update, dense);
  if (support.all) return dense;
  std::vector<float> out(support.size(dense.size()));
  support.gather(dense, out);
  return out;
}

std::vector<Payload> Compressor::securePayloads(const ParamLayout& layout, const RoundContext& ctx,
                                                std::span<const float> sum) const {
  // The sum on the round's shared support, every other coordinate 0 (no client sent one).
  std::vector<float> dense(layout.numel());
  sharedSupport(layout, ctx).scatter(sum, dense);
  std::vector<Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const auto v = layout.slice(std::span<const float>(dense), t);
    out.emplace_back(DenseF32{std::vector<float>(v.begin(), v.end())});
  }
  return out;
}

SharedSupport Compressor::sharedSupport(const ParamLayout&, const RoundContext&) const {
  STARLING_THROW(InvalidArgument, spec(),
                 " chooses each client's support (or scale): no support is shared by the round");
}

const ResidualState* Compressor::liveResidual(const ClientState& state, uint64_t round) const {
  const ErrorFeedback& ef = feedback();
  if (!ef.on) return nullptr;
  const ResidualState* r = state.find<ResidualState>(kResidualComponent);
  if (!r || ef.max_age == 0 || r->round == 0 || round == r->round) return r;
  // Written in a later round than this one: a state from another run (rounds restart at 1) or a
  // server that went back. Its age is unknown, so a bounded age does not keep it.
  if (round < r->round) return nullptr;
  return round - r->round > ef.max_age ? nullptr : r;
}

size_t countForDensity(double density, size_t n) {
  if (n == 0) return 0;
  const double k = std::llround(density * static_cast<double>(n));
  return static_cast<size_t>(std::clamp(k, 1.0, static_cast<double>(n)));
}

SharedFactors Compressor::initialShared(const ParamLayout& layout, uint64_t /*run_seed*/) const {
  SharedFactors s;
  s.factors.resize(layout.size());
  return s;
}

SharedFactors Compressor::nextShared(const ParamLayout& layout, const RoundContext& /*ctx*/,
                                     const SharedFactors& /*current*/,
                                     std::span<const std::span<const float>> /*factor_sums*/,
                                     double /*total_weight*/) const {
  return initialShared(layout, 0);
}

void Compressor::unexpected(const ParamLayout& layout, size_t t, const PayloadView& p,
                            const char* want) const {
  failInput(Errc::kUnexpectedEncoding, "tensor ", t, " '", layout[t].name, "' arrived as ",
            encodingName(p), "; ", spec(), " sends ", want);
}

std::vector<Payload> Compressor::compress(const ParamLayout& layout, std::span<const float> update,
                                          const RoundContext& ctx) const {
  checkUpdate(*this, layout, update);
  RoundContext c = ctx;
  c.phase = 0;
  const ClientState empty(layout.fingerprint());
  // Two-phase compressors compress in their one-phase form here, which needs no round state.
  if (phases() == 1) checkRound(layout, empty, c);
  StagedState ignored;
  return encode(layout, update, {}, empty, c, ignored);
}

void Compressor::checkFeedbackCall(const ParamLayout& layout, const ClientState& state,
                                   const RoundContext& ctx,
                                   const std::function<void()>& check_update) const {
  STARLING_CHECK_ARG(state.layoutFingerprint() == layout.fingerprint(), name(),
                     ": client state belongs to another model (fingerprint ",
                     state.layoutFingerprint(), " vs ", layout.fingerprint(), ")");
  STARLING_CHECK_ARG(ctx.phase < phases(), name(), ": phase ", ctx.phase, " does not exist (",
                     phases(), " phase", phases() == 1 ? "" : "s", " per round)");
  check_update();
  const ResidualState* kept = state.find<ResidualState>(kResidualComponent);
  STARLING_CHECK_ARG(!kept || kept->values.size() == layout.numel(), name(),
                     ": the client state's residual has ", kept ? kept->values.size() : 0,
                     " floats, the layout needs ", layout.numel());
  // Everything a caller can get wrong is checked before anything changes.
  checkRound(layout, state, ctx);
}

void Compressor::commitKept(ClientState& state, StagedState& staged, std::vector<float>& kept,
                            uint64_t round) const {
  // All or nothing. New components are installed first (the only step that can throw); an
  // existing residual then swaps buffers with `kept`, which cannot throw.
  ResidualState* target = state.find<ResidualState>(kResidualComponent);
  if (!target) {
    auto& r = staged.stage<ResidualState>(std::string(kResidualComponent));
    r.values.swap(kept);
    r.round = round;
  }
  state.commit(staged.items());
  if (target) {
    target->values.swap(kept);
    target->round = round;
  }
}

const ResidualState* Compressor::beginFeedback(const ParamLayout& layout, const ClientState& state,
                                               const RoundContext& ctx,
                                               const std::function<void()>& check_update) const {
  STARLING_CHECK_ARG(ctx.phase == 0, name(), ": error feedback formed outside the compressor ",
                     "takes phase 0, not phase ", ctx.phase);
  checkFeedbackCall(layout, state, ctx, check_update);
  return liveResidual(state, ctx.round);
}

void Compressor::endFeedback(const ParamLayout& layout, ClientState& state, const RoundContext& ctx,
                             std::vector<float>& kept, StagedState& staged) const {
  if (!keepsBuffer()) {
    STARLING_CHECK_ARG(kept.empty(), name(), ": keeps no residual (error feedback is off), given ",
                       kept.size(), " floats");
    state.commit(staged.items());
    return;
  }
  STARLING_CHECK_ARG(kept.size() == layout.numel(), name(), ": a kept residual of ", kept.size(),
                     " floats, the layout needs ", layout.numel());
  commitKept(state, staged, kept, ctx.round);
}

std::vector<Payload> Compressor::compressWithFeedback(const ParamLayout& layout,
                                                      std::span<const float> update,
                                                      ClientState& state, const RoundContext& ctx,
                                                      Workspace* workspace,
                                                      FeedbackStats* stats) const {
  checkFeedbackCall(layout, state, ctx, [&] {
    if (ctx.phase == 0)
      checkUpdate(*this, layout, update);
    else
      STARLING_CHECK_ARG(update.empty(), name(), ": phase ", ctx.phase,
                         " continues from the state and takes no update");
  });
  const ResidualState* kept = state.find<ResidualState>(kResidualComponent);

  // A call keeps a buffer when error feedback is on, or when a later phase continues from it.
  const bool keeps = keepsBuffer();
  StagedState staged;
  if (!keeps) {
    std::vector<Payload> out = encode(layout, update, {}, state, ctx, staged);
    state.commit(staged.items());  // e.g. local PowerSGD's warm-start factors without EF
    return out;
  }

  Workspace local;
  std::vector<float>& acc = (workspace ? workspace : &local)->acc;
  acc.resize(layout.numel());  // may throw: nothing has changed yet
  const size_t n = acc.size();
  float* a = acc.data();
  // Phase 0 adds the residual when it is live (error feedback on, not older than ef_max_age).
  const ResidualState* live = ctx.phase == 0 ? liveResidual(state, ctx.round) : nullptr;
  if (ctx.phase > 0) {
    STARLING_CHECK_ARG(kept != nullptr, name(), ": phase ", ctx.phase,
                       " without a kept buffer from phase 0");
    std::copy(kept->values.begin(), kept->values.end(), a);
  } else if (live) {
    const float* r = live->values.data();
    // Bounded inputs keep every compressor's arithmetic finite (compressor.h).
    if (addInto(a, r, update.data(), n) > kMaxInputBits) tooLarge(*this, acc, "residual + update");
  } else {
    std::copy(update.begin(), update.end(), a);
  }
  std::vector<Payload> out = encode(layout, acc, acc, state, ctx, staged);
  const bool last_phase = ctx.phase + 1 == phases();
  if (stats && ctx.phase == 0 && phases() == 1) {
    // sent = update + old residual - what is kept, before any decay.
    // In float, as acc was formed: a coordinate left unsent gives exactly 0.
    double l2 = 0, s2 = 0, f2 = 0, k2 = 0;
    const float* r = live ? live->values.data() : nullptr;
    const double alpha = usesErrorFeedback() ? feedback().preview : 0.0;
    for (size_t i = 0; i < n; ++i) {
      const float sent = (r ? r[i] + update[i] : update[i]) - a[i];
      const double moved = update[i] + (r ? alpha * r[i] : 0.0);
      l2 += moved * moved;
      s2 += static_cast<double>(sent) * sent;
      if (sent != 0.0f) f2 += moved * moved;
      k2 += static_cast<double>(a[i]) * a[i];
    }
    const double decay = usesErrorFeedback() ? feedback().decay : 1.0;
    *stats = FeedbackStats{std::sqrt(l2), std::sqrt(s2), std::sqrt(f2), decay * std::sqrt(k2),
                           residualAge(live, ctx.round)};
  }
  if (usesErrorFeedback() && last_phase && feedback().decay != 1.0) {
    const float d = static_cast<float>(feedback().decay);
    for (size_t i = 0; i < n; ++i) a[i] *= d;
  }

  commitKept(state, staged, acc, ctx.round);
  return out;
}

}  // namespace starling::compression
