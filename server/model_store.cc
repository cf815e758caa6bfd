#include "server/model_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "compression/bitpack.h"
#include "compression/compressor.h"
#include "compression/sparsify.h"
#include "compression/topk_select.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/half.h"
#include "core/overloaded.h"
#include "protocol/control.h"

namespace starling::server {
namespace cz = starling::compression;

Downlink parseDownlink(std::string_view s) {
  if (s == "dense") return Downlink::kDense;
  if (s == "fp16") return Downlink::kFp16;
  if (s == "delta") return Downlink::kDelta;
  if (s == "topk") return Downlink::kTopK;
  if (s == "q8") return Downlink::kQ8;
  if (s == "q4") return Downlink::kQ4;
  if (s == "stc") return Downlink::kStc;
  if (s == "q3") return Downlink::kQ3;
  if (s == "q2") return Downlink::kQ2;
  if (s == "q3-mirror") return Downlink::kQ3Mirror;
  if (s == "q2-mirror") return Downlink::kQ2Mirror;
  if (s == "stc-mirror") return Downlink::kStcMirror;
  STARLING_THROW(ConfigError,
                 "downlink must be dense, fp16, delta, topk, q8, q4, stc, q3, q2, q3-mirror, "
                 "q2-mirror or stc-mirror, got '",
                 s, "'");
}

uint32_t downlinkLevels(Downlink d) {
  return d == Downlink::kQ8 ? 127u : d == Downlink::kQ4 ? 7u : 0u;
}

uint32_t downlinkBlockBits(Downlink d) {
  return d == Downlink::kQ3 || d == Downlink::kQ3Mirror || d == Downlink::kStcMirror ? 3u
         : d == Downlink::kQ2 || d == Downlink::kQ2Mirror                            ? 2u
                                                                                     : 0u;
}

bool downlinkMirrored(Downlink d) {
  return d == Downlink::kQ3Mirror || d == Downlink::kQ2Mirror || d == Downlink::kStcMirror;
}

bool downlinkPerHeld(Downlink d) {
  return d == Downlink::kDelta || d == Downlink::kTopK || d == Downlink::kStc ||
         downlinkLevels(d) > 0 || downlinkBlockBits(d) > 0;
}

bool wholeModelQuantised(Downlink d) {
  return downlinkLevels(d) > 0 || downlinkBlockBits(d) > 0 || d == Downlink::kStc;
}

bool peerDecodes(Downlink mode, bool qsgd_capable, bool stc_capable, bool block_capable) {
  if (mode == Downlink::kStc) return stc_capable;
  // stc-mirror: ternary refreshes, and the whole model in blocks.
  if (mode == Downlink::kStcMirror) return stc_capable && block_capable;
  if (downlinkBlockBits(mode) > 0) return block_capable;
  return downlinkLevels(mode) == 0 || qsgd_capable;
}

cz::Qsgd quantizePow2(std::span<const float> values, uint32_t s) {
  float max_abs = 0.0f;
  for (float v : values) max_abs = std::max(max_abs, std::fabs(v));
  cz::Qsgd q;
  q.s = s;
  const uint32_t bits = 1 + cz::qsgdLevelBits(s);
  cz::BitWriter w(q.packed, values.size(), bits);
  if (!(max_abs > 0.0f) ||
      !std::isfinite(max_abs)) {  // all zero (a non-finite model is refused upstream)
    for (size_t i = 0; i < values.size(); ++i) w.put(0, bits);
    w.flush();
    return q;
  }
  // u = 2^e, the smallest power of two with u s >= max|v|; norm = u s is exact (s < 2^8).
  int e = 0;
  std::frexp(static_cast<double>(max_abs) / s, &e);  // max/s = m 2^e, m in [0.5, 1)
  double u = std::ldexp(1.0, e);
  if (u / 2 * s >= max_abs) u /= 2;  // max/s a power of two exactly
  q.norm = static_cast<float>(u * s);
  for (float v : values) {
    const auto level = static_cast<uint32_t>(
        std::min<double>(s, std::nearbyint(std::fabs(static_cast<double>(v)) / u)));
    w.put((level << 1) | (v < 0.0f && level != 0 ? 1u : 0u), bits);
  }
  w.flush();
  return q;
}

EncodedModel wholeInBlocks(std::span<const float> values, const ParamLayout& layout,
                           uint32_t bits) {
  STARLING_CHECK_ARG(values.size() == layout.numel(), "a model of ", values.size(),
                     " values for a layout of ", layout.numel());
  EncodedModel out;
  out.tensors.reserve(layout.size());
  for (const TensorSpec& t : layout.tensors())
    out.tensors.push_back(quantizeBlocks(values.subspan(t.offset, t.numel), bits, kDownlinkBlock));
  return out;
}

cz::BlockQ quantizeBlocks(std::span<const float> values, uint32_t bits, uint32_t block) {
  STARLING_CHECK_ARG(bits >= 1 && bits <= 8 && block >= 1 && block <= cz::kBlockQMaxBlock,
                     "block levels of ", bits, " bits in blocks of ", block);
  cz::BlockQ q;
  q.bits = static_cast<uint8_t>(bits);
  q.block = block;
  const size_t n = values.size(), blocks = (n + block - 1) / block;
  q.exps.assign(blocks, cz::kBlockQZero);
  std::vector<uint32_t> codes(n, 0);
  const double count = std::ldexp(1.0, static_cast<int>(bits)), top = count - 1;
  // The code of v on step u: its level's interval [(c - count/2) u, (c + 1 - count/2) u), the
  // ends clipped (the upper level halfway between two). v / u, its floor and the sum are exact (u
  // a power of two).
  const auto code = [&](float v, double u) {
    return static_cast<uint32_t>(std::clamp(std::floor(v / u) + count / 2, 0.0, top));
  };
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * block, hi = std::min(n, lo + block);
    double max_abs = 0.0;
    bool finite = true;
    for (size_t i = lo; i < hi; ++i) {
      finite = finite && std::isfinite(values[i]);
      max_abs = std::max(max_abs, std::fabs(double{values[i]}));
    }
    if (!finite || !(max_abs > 0.0)) continue;  // zeros
    // e0: the smallest e with top 2^(e-1) >= max|v| (no value clipped).
    int k = 0;
    const double m = std::frexp(max_abs / top, &k);  // max / top = m 2^k, m in [0.5, 1)
    const int e0 = m == 0.5 ? k : k + 1;
    int best_e = 0;
    double best = std::numeric_limits<double>::infinity();
    for (int d = 0; d < 4; ++d) {
      const int e = std::clamp(e0 - d, cz::kBlockQMinExp, cz::kBlockQMaxExp);
      const double u = std::ldexp(1.0, e), half = u / 2;
      double sse = 0.0;
      for (size_t i = lo; i < hi; ++i) {
        const double err = values[i] - (2.0 * code(values[i], u) - top) * half;  // exact product
        sse = std::fma(err, err, sse);  // one rounding on every CPU and with any -ffp-contract
      }
      if (sse < best) best = sse, best_e = e;
    }
    q.exps[b] = static_cast<int8_t>(best_e);
    const double u = std::ldexp(1.0, best_e);
    for (size_t i = lo; i < hi; ++i) codes[i] = code(values[i], u);
  }
  cz::BitWriter w(q.packed, n, bits);
  for (uint32_t c : codes) w.put(c, bits);
  w.flush();
  return q;
}

const char* downlinkName(Downlink d) {
  switch (d) {
    case Downlink::kDense:
      return "dense";
    case Downlink::kFp16:
      return "fp16";
    case Downlink::kDelta:
      return "delta";
    case Downlink::kTopK:
      return "topk";
    case Downlink::kQ8:
      return "q8";
    case Downlink::kQ4:
      return "q4";
    case Downlink::kStc:
      return "stc";
    case Downlink::kQ3:
      return "q3";
    case Downlink::kQ2:
      return "q2";
    case Downlink::kQ3Mirror:
      return "q3-mirror";
    case Downlink::kQ2Mirror:
      return "q2-mirror";
    case Downlink::kStcMirror:
      return "stc-mirror";
  }
  return "?";
}

ModelStore::ModelStore(std::shared_ptr<const ParamLayout> layout, size_t history,
                       double topk_density, uint32_t quant_levels)
    : layout_(std::move(layout)),
      history_(history),
      density_(topk_density),
      levels_(quant_levels),
      refresh_history_(quant_levels > 0 ? 1 : 0) {
  STARLING_CHECK_ARG(density_ >= 0.0 && density_ <= 1.0, "downlink density must be in (0, 1], got ",
                     density_);
  STARLING_CHECK_ARG(levels_ == 0 || (density_ == 0.0 && levels_ < 256),
                     "a quantised downlink has 1 to 255 levels and no density");
  versions_.push_back(Version{0, std::vector<float>(layout_->numel())});
}

ModelStore ModelStore::forDownlink(std::shared_ptr<const ParamLayout> layout, Downlink mode,
                                   size_t history, double density) {
  if (mode == Downlink::kStc) {
    // One version kept (x-hat); `history` refreshes instead; the whole model in q8.
    STARLING_CHECK_ARG(density > 0.0 && history > 0 && history <= protocol::kMaxRefreshChain,
                       "the stc downlink needs a density and a history of 1 to ",
                       protocol::kMaxRefreshChain, " refreshes (a client takes no longer chain)");
    ModelStore m(std::move(layout), 0, density, 0);
    m.ternary_ = true;
    m.levels_ = downlinkLevels(Downlink::kQ8);
    m.refresh_history_ = history;
    return m;
  }
  // The mirrored downlinks encode against each client's copy (server/client_copies.h): the
  // store is the model alone.
  if (downlinkMirrored(mode)) return ModelStore(std::move(layout), 0);
  if (const uint32_t bits = downlinkBlockBits(mode); bits > 0) {
    ModelStore m(std::move(layout), 0, 0.0, 0);
    m.block_bits_ = bits;
    m.refresh_history_ = 1;
    return m;
  }
  return ModelStore(std::move(layout),
                    mode == Downlink::kDelta || mode == Downlink::kTopK ? history : 0,
                    mode == Downlink::kTopK ? density : 0.0, downlinkLevels(mode));
}

void ModelStore::set(std::vector<float> model, uint64_t version) {
  STARLING_CHECK_ARG(model.size() == layout_->numel(), "model of ", model.size(),
                     " values, layout has ", layout_->numel());
  const bool first = versions_.size() == 1 && versions_.back().version == 0;
  if (first) return reset(std::move(model), version);
  STARLING_CHECK_ARG(version > versions_.back().version, "model version ", version,
                     " does not follow ", versions_.back().version);
  std::vector<float> next;
  if (!lossy()) {
    next = std::move(model);
  } else if (levels_ > 0 || block_bits_ > 0) {
    // q8, q4, q3, q2 and stc: x-hat += a refresh of x - x-hat, tensor by tensor (the residual
    // stays in x - x-hat): the residual quantised, or its stc payload.
    server_ = std::move(model);
    next = versions_.back().values;
    Refresh r;
    r.from = versions_.back().version;
    std::vector<float> residual;
    for (const auto& t : layout_->tensors()) {
      residual.resize(t.numel);
      for (size_t j = 0; j < t.numel; ++j) residual[j] = server_[t.offset + j] - next[t.offset + j];
      cz::Payload p = ternary_ ? cz::Payload(cz::ternaryTopK(
                                     residual, cz::countForDensity(density_, t.numel), version))
                      : block_bits_ > 0
                          ? cz::Payload(quantizeBlocks(residual, block_bits_, kDownlinkBlock))
                          : cz::Payload(quantizePow2(residual, levels_));
      cz::accumulatePayload(cz::view(p), t, std::span<float>(next).subspan(t.offset, t.numel),
                            1.0f);
      r.bytes += cz::payloadDataBytes(p) + kTensorOverheadBytes;
      r.tensors.push_back(std::move(p));
    }
    refreshes_.push_back(std::move(r));
    while (refreshes_.size() > refresh_history_) refreshes_.pop_front();
  } else {
    // x-hat refreshed where it is furthest from x: the residual x - x-hat, top-k over the model.
    server_ = std::move(model);
    next = versions_.back().values;
    std::vector<float> residual(server_.size());
    for (size_t i = 0; i < residual.size(); ++i) residual[i] = server_[i] - next[i];
    compression::selectTopK(residual, compression::countForDensity(density_, residual.size()),
                            picked_, version);
    for (uint32_t i : picked_) next[i] = server_[i];
  }
  if (history_ == 0) versions_.clear();
  versions_.push_back(Version{version, std::move(next)});
  while (versions_.size() > history_ + 1) versions_.pop_front();
}

void ModelStore::reset(std::vector<float> model, uint64_t version, std::vector<float> broadcast) {
  STARLING_CHECK_ARG(model.size() == layout_->numel(), "model of ", model.size(),
                     " values, layout has ", layout_->numel());
  STARLING_CHECK_ARG(version > 0, "model version 0 is reserved for 'none'");
  STARLING_CHECK_ARG(broadcast.empty() || (lossy() && broadcast.size() == model.size()),
                     "a broadcast model is only given to a lossy store, and of the model's size");
  versions_.clear();
  refreshes_.clear();
  if (lossy()) {
    versions_.push_back(Version{version, broadcast.empty() ? model : std::move(broadcast)});
    server_ = std::move(model);
  } else {
    versions_.push_back(Version{version, std::move(model)});
  }
}

EncodedModel ModelStore::encodeFor(uint64_t held, Downlink mode) const {
  EncodedModel out;
  const auto& cur = versions_.back().values;
  const auto& tensors = layout_->tensors();
  if (mode == Downlink::kStc) {
    STARLING_CHECK_ARG(ternary_, "an stc task from a store of another downlink");
    if (held != 0 && held == version()) {  // nothing to refresh: an empty delta
      out.base_version = held;
      for (size_t i = 0; i < tensors.size(); ++i) out.tensors.push_back(cz::Sparse{});
      return out;
    }
    if (const size_t first = chainStart(held); first < refreshes_.size()) {
      out.base_version = held;
      for (size_t r = first; r < refreshes_.size(); ++r)
        out.tensors.insert(out.tensors.end(), refreshes_[r].tensors.begin(),
                           refreshes_[r].tensors.end());
      return out;
    }
    for (const auto& t : tensors)
      out.tensors.push_back(
          quantizePow2(std::span<const float>(cur).subspan(t.offset, t.numel), levels_));
    return out;
  }
  if (downlinkMirrored(mode)) {
    // Here only what a client without a copy is sent: the whole model in blocks (base 0).
    // Against a client's copy: ClientCopies::encode.
    STARLING_CHECK_ARG(!lossy(), "a ", downlinkName(mode),
                       " task from a store of another downlink");
    return wholeInBlocks(cur, *layout_, downlinkBlockBits(mode));
  }
  // q8, q4, q3 and q2: the store keeps one refresh.
  const uint32_t levels = downlinkLevels(mode), bits = downlinkBlockBits(mode);
  if (levels > 0 || bits > 0) {
    STARLING_CHECK_ARG(levels == levels_ && bits == block_bits_ && !ternary_, "a ",
                       downlinkName(mode), " task from a store of another downlink");
    if (held != 0 && held == version()) {  // nothing to refresh: an empty delta
      out.base_version = held;
      for (size_t i = 0; i < tensors.size(); ++i) out.tensors.push_back(cz::Sparse{});
    } else if (held != 0 && !refreshes_.empty() && held == refreshes_.back().from) {
      // One version behind: the refresh, exact.
      out.base_version = held;
      out.tensors = refreshes_.back().tensors;
    } else if (bits > 0) {  // the whole broadcast model, block by block (q3 and q2)
      out = wholeInBlocks(cur, *layout_, bits);
    } else {  // the whole broadcast model, quantised (q8 and q4)
      for (const auto& t : tensors)
        out.tensors.push_back(
            quantizePow2(std::span<const float>(cur).subspan(t.offset, t.numel), levels));
    }
    return out;
  }
  // A client that holds the current version gets an empty delta (an evaluation task, a round that
  // was not applied), not the whole model.
  if ((mode == Downlink::kDelta || mode == Downlink::kTopK) && held != 0) {
    for (const auto& v : versions_) {
      if (v.version != held) continue;
      // Changed coordinates with their new values: 8 bytes each, so worth it below half changed.
      size_t changed = 0;
      for (size_t i = 0; i < cur.size(); ++i)
        changed += std::memcmp(&cur[i], &v.values[i], sizeof(float)) != 0;
      if (2 * changed >= cur.size()) break;
      out.base_version = held;
      for (const auto& t : tensors) {
        cz::Sparse s;
        for (size_t j = 0; j < t.numel; ++j)
          if (std::memcmp(&cur[t.offset + j], &v.values[t.offset + j], sizeof(float)) != 0) {
            s.indices.push_back(static_cast<uint32_t>(j));
            s.values.push_back(cur[t.offset + j]);
          }
        out.tensors.push_back(std::move(s));
      }
      return out;
    }
  }
  for (const auto& t : tensors) {
    const std::span<const float> src(cur.data() + t.offset, t.numel);
    if (mode == Downlink::kFp16) {
      cz::DenseF16 h;
      h.values.resize(t.numel);
      for (size_t j = 0; j < t.numel; ++j) h.values[j] = floatToHalf(src[j]);
      out.tensors.push_back(std::move(h));
    } else {
      out.tensors.push_back(cz::DenseF32{std::vector<float>(src.begin(), src.end())});
    }
  }
  return out;
}

size_t ModelStore::chainStart(uint64_t held) const {
  if (held == 0) return refreshes_.size();
  // q8's whole model: a byte a value, its norm and levels, and the task's tables per tensor.
  const size_t whole = layout_->numel() + layout_->size() * (8 + kTensorOverheadBytes);
  size_t bytes = 0;
  for (size_t r = refreshes_.size(); r-- > 0;) {
    bytes += refreshes_[r].bytes;
    if (bytes >= whole) break;
    if (refreshes_[r].from == held) return r;
  }
  return refreshes_.size();
}

uint64_t ModelStore::baseFor(uint64_t held, Downlink mode) const {
  if (held == 0 || downlinkMirrored(mode)) return 0;
  if (mode == Downlink::kStc)
    return held == version() || chainStart(held) < refreshes_.size() ? held : 0;
  if (downlinkLevels(mode) > 0 || downlinkBlockBits(mode) > 0)
    return held == version() || (!refreshes_.empty() && held == refreshes_.back().from) ? held : 0;
  if (mode != Downlink::kDelta && mode != Downlink::kTopK) return 0;
  for (const auto& v : versions_)
    if (v.version == held) return held;
  return 0;
}

std::span<const float> ModelStore::clientModel(uint64_t held, Downlink mode,
                                               WholeModelCache& cache) const {
  if (!wholeModelQuantised(mode) || baseFor(held, mode) != 0) return current();
  if (cache.version != version()) {
    const EncodedModel m = encodeFor(0, mode);
    cache.values.assign(layout_->numel(), 0.0f);
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      const TensorSpec& t = layout_->tensors()[i];
      cz::accumulatePayload(cz::view(m.tensors[i]), t,
                            std::span<float>(cache.values).subspan(t.offset, t.numel), 1.0f);
    }
    cache.version = version();
  }
  return cache.values;
}

namespace {
constexpr uint8_t kRefreshQsgd = 1, kRefreshTernary = 2, kRefreshBlock = 3;
}  // namespace

std::vector<uint8_t> ModelStore::saveRefreshes() const {
  std::vector<uint8_t> out;
  if (refreshes_.empty()) return out;
  ByteWriter w(out);
  w.u64(refreshes_.size());
  for (const Refresh& r : refreshes_) {
    w.u64(r.from);
    for (const cz::Payload& p : r.tensors) {
      if (const auto* q = std::get_if<cz::Qsgd>(&p)) {
        w.u8(kRefreshQsgd);
        w.u32(q->s);
        w.f32(q->norm);
        w.u64(q->packed.size());
        w.bytes(q->packed.data(), q->packed.size());
      } else if (const auto* b = std::get_if<cz::BlockQ>(&p)) {
        w.u8(kRefreshBlock);
        w.u8(b->bits);
        w.u32(b->block);
        w.u64(b->exps.size());
        w.bytes(reinterpret_cast<const uint8_t*>(b->exps.data()), b->exps.size());
        w.u64(b->packed.size());
        w.bytes(b->packed.data(), b->packed.size());
      } else {
        const auto& x = std::get<cz::Ternary>(p);
        w.u8(kRefreshTernary);
        w.u32(x.count);
        w.f32(x.mu);
        w.u8(x.rice);
        w.u64(x.positions.size());
        w.bytes(x.positions.data(), x.positions.size());
        w.u64(x.signs.size());
        w.bytes(x.signs.data(), x.signs.size());
      }
    }
  }
  return out;
}

void ModelStore::writeRefreshes(ByteWriter& w) const {
  const std::vector<uint8_t> bytes = saveRefreshes();
  w.u64(bytes.size());
  if (!bytes.empty()) w.bytes(bytes.data(), bytes.size());
}

std::vector<uint8_t> ModelStore::readRefreshes(ByteReader& r) {
  const uint64_t n = r.u64();
  const auto v = r.view(static_cast<size_t>(std::min<uint64_t>(n, r.remaining())));
  if (v.size() != n) r.fail("downlink refreshes of ", n, " bytes are truncated");
  return {v.begin(), v.end()};
}

void ModelStore::loadRefreshes(std::span<const uint8_t> bytes, const std::string& what) {
  if (bytes.empty()) return;
  ByteReader r(bytes, what);
  const size_t keeps = ternary_ ? refresh_history_ : levels_ > 0 || block_bits_ > 0 ? 1 : 0;
  const uint64_t count = r.u64();
  if (count > keeps)
    r.fail(count, " downlink refreshes, a store of this downlink keeps ", keeps,
           " (resume with the same downlink.mode and downlink.history)");
  const auto blob = [&] {
    const uint64_t n = r.u64();
    const auto v = r.view(static_cast<size_t>(std::min<uint64_t>(n, r.remaining())));
    if (v.size() != n) r.fail("a payload of ", n, " bytes is truncated");
    return std::vector<uint8_t>(v.begin(), v.end());
  };
  std::deque<Refresh> loaded;
  for (uint64_t i = 0; i < count; ++i) {
    Refresh f;
    f.from = r.u64();
    if (f.from == 0 || f.from >= version() || (!loaded.empty() && f.from <= loaded.back().from))
      r.fail("a downlink refresh from version ", f.from, " (the refreshes go up from 1 to below ",
             "the model's version ", version(), ")");
    for (const TensorSpec& t : layout_->tensors()) {
      const uint8_t tag = r.u8();
      cz::Payload p;
      if (tag == kRefreshQsgd && !ternary_ && block_bits_ == 0) {
        cz::Qsgd q;
        q.s = r.u32();
        q.norm = r.f32();
        q.packed = blob();
        if (q.s != levels_) r.fail("a refresh of ", q.s, " levels, this downlink's has ", levels_);
        p = std::move(q);
      } else if (tag == kRefreshBlock && block_bits_ > 0) {
        cz::BlockQ q;
        q.bits = r.u8();
        q.block = r.u32();
        const std::vector<uint8_t> exps = blob();
        q.exps.assign(exps.begin(), exps.end());
        q.packed = blob();
        if (q.bits != block_bits_ || q.block != kDownlinkBlock)
          r.fail("a refresh of ", int{q.bits}, " bits in blocks of ", q.block, ", this downlink's ",
                 block_bits_, " in blocks of ", kDownlinkBlock);
        p = std::move(q);
      } else if (tag == kRefreshTernary && ternary_) {
        cz::Ternary x;
        x.count = r.u32();
        x.mu = r.f32();
        x.rice = r.u8();
        x.positions = blob();
        x.signs = blob();
        p = std::move(x);
      } else {
        r.fail("a refresh of kind ", int{tag}, " for the ",
               ternary_          ? "stc"
               : block_bits_ > 0 ? "block-scaled"
                                 : "quantised",
               " downlink (resume with the same downlink.mode)");
      }
      try {
        cz::validatePayload(cz::view(p), t);
      } catch (const starling::Error& e) {
        r.fail("tensor '", t.name, "': ", e.what());
      }
      f.bytes += cz::payloadDataBytes(p) + kTensorOverheadBytes;
      f.tensors.push_back(std::move(p));
    }
    loaded.push_back(std::move(f));
  }
  r.finish();
  refreshes_ = std::move(loaded);
}

}  // namespace starling::server
