#include "compression/quantize.h"

#include <cmath>
#include <sstream>

#include "compression/bitpack.h"
#include "compression/exact_sum.h"
#include "core/error.h"
#include "core/rng.h"

namespace starling::compression {

std::string SignCompressor::spec() const { return "sign:" + opt_.ef.specText().substr(1); }

void SignCompressor::checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                                   const RoundContext& /*ctx*/) const {
  if (!std::holds_alternative<SignView>(p)) unexpected(layout, t, p, "sign");
}

std::vector<Payload> SignCompressor::encode(const ParamLayout& layout, std::span<const float> input,
                                            std::span<float> residual, const ClientState& /*state*/,
                                            const RoundContext& /*ctx*/,
                                            StagedState& /*staged*/) const {
  std::vector<Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    auto v = layout.slice(input, t);
    auto res = residual.empty() ? residual : layout.slice(residual, t);
    const size_t n = v.size();
    // Correctly rounded, so the same on any CPU and on the device (exact_sum.h).
    const double l1 = exactAbsSum(v);
    Sign s;
    s.scale = static_cast<float>(l1 / static_cast<double>(n));
    s.bits.assign(packedBytes(n, 1), 0);
    for (size_t i = 0; i < n; ++i) {
      const bool neg = v[i] < 0.0f;
      s.bits[i >> 3] |= static_cast<uint8_t>(neg) << (i & 7);
      if (!res.empty()) res[i] = v[i] - (neg ? -s.scale : s.scale);
    }
    out.emplace_back(std::move(s));
  }
  return out;
}

void QsgdOptions::validate() const {
  if (levels == 0 || levels > 0xffffu)
    STARLING_THROW(ConfigError, "qsgd: levels must be in [1, 65535], got ", levels);
  ef.validate("qsgd");
}

QsgdCompressor::QsgdCompressor(QsgdOptions o) : opt_(o) { opt_.validate(); }

std::string QsgdCompressor::spec() const {
  std::ostringstream os;
  os << "qsgd:levels=" << opt_.levels << opt_.ef.specText();
  return os.str();
}

void QsgdCompressor::checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                                   const RoundContext& /*ctx*/) const {
  const auto* q = std::get_if<QsgdView>(&p);
  if (!q) unexpected(layout, t, p, "qsgd");
  if (q->s != opt_.levels)
    failInput(Errc::kRoundMismatch, "tensor ", t, " '", layout[t].name, "' uses s=", q->s, ", ",
              spec(), " sends s=", opt_.levels);
}

std::vector<Payload> QsgdCompressor::encode(const ParamLayout& layout, std::span<const float> input,
                                            std::span<float> residual, const ClientState& /*state*/,
                                            const RoundContext& ctx,
                                            StagedState& /*staged*/) const {
  std::vector<Payload> out;
  out.reserve(layout.size());
  const uint32_t s = opt_.levels;
  const uint32_t bits = 1 + qsgdLevelBits(s);
  for (size_t t = 0; t < layout.size(); ++t) {
    auto v = layout.slice(input, t);
    auto res = residual.empty() ? residual : layout.slice(residual, t);
    const size_t n = v.size();
    Qsgd q;
    q.s = s;
    // The sum of squares exact and rounded once (no float overflow for values near 1e30, and the
    // same on any device, exact_sum.h); one counter-based draw per value, so the device can draw
    // the same numbers.
    q.norm = static_cast<float>(std::sqrt(exactSquareSum(v)));
    const CounterStream draws(
        StreamKey{ctx.run_seed, ctx.round, ctx.client_id, StreamPurpose::kQsgd, t});
    BitWriter w(q.packed, n, bits);
    const double scale = q.norm > 0.0f ? static_cast<double>(s) / q.norm : 0.0;
    const float unit = q.norm / static_cast<float>(s);
    for (size_t i = 0; i < n; ++i) {
      const double r = std::fabs(v[i]) * scale;
      auto level = static_cast<uint32_t>(r);
      if (level < s && draws.uniformAt(i) < r - level) ++level;
      if (level > s) level = s;
      const bool neg = v[i] < 0.0f;
      w.put((level << 1) | static_cast<uint32_t>(neg), bits);
      if (!res.empty()) {
        const float sent = unit * static_cast<float>(level);
        res[i] = v[i] - (neg ? -sent : sent);
      }
    }
    w.flush();
    out.emplace_back(std::move(q));
  }
  return out;
}

}  // namespace starling::compression
