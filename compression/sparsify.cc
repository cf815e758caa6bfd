#include "compression/sparsify.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_set>

#include "compression/rice.h"
#include "compression/topk_select.h"
#include "core/error.h"
#include "core/rng.h"

namespace starling::compression {
namespace {

void checkDensity(double d, const char* who) {
  if (!(d > 0.0 && d <= 1.0))
    STARLING_THROW(ConfigError, who, ": density must be in (0, 1], got ", d);
}

// Sends input[idx]; a kept residual (the same memory as input) has the sent positions zeroed.
Sparse gather(std::span<const float> input, std::span<float> residual, std::vector<uint32_t> idx) {
  Sparse s;
  s.values.resize(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) s.values[i] = input[idx[i]];
  if (!residual.empty())
    for (uint32_t i : idx) residual[i] = 0.0f;
  s.indices = std::move(idx);
  return s;
}

// STC: sends sign(input[i]) * mu for the non-zero i in idx (ternaryPayload); a kept residual (the
// same memory as input) keeps input[i] - sent[i]. Drops the exact zeros from idx in place (the
// caller's buffer is reused).
Ternary gatherTernary(std::span<const float> input, std::span<float> residual,
                      std::vector<uint32_t>& idx) {
  std::vector<float> values(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) values[j] = input[idx[j]];
  Ternary x = ternaryPayload(idx, values);
  if (!residual.empty())
    for (size_t j = 0; j < idx.size(); ++j)
      residual[idx[j]] = values[j] - (std::signbit(values[j]) ? -x.mu : x.mu);
  return x;
}

std::span<float> sliceOrEmpty(const ParamLayout& layout, std::span<float> residual, size_t t) {
  return residual.empty() ? residual : layout.slice(residual, t);
}

}  // namespace

void TopKOptions::validate() const {
  const char* who = ternary ? "stc" : "topk";
  checkDensity(density, who);
  if (ternary && scope != Scope::kLayer)
    STARLING_THROW(ConfigError, "stc: one mu per tensor needs scope=layer");
  ef.validate(who);
}
void RandomSparsifyOptions::validate() const {
  checkDensity(density, "randk/randblock");
  ef.validate("randk/randblock");
}

TopKCompressor::TopKCompressor(TopKOptions o) : opt_(o) { opt_.validate(); }

std::string TopKCompressor::spec() const {
  std::ostringstream os;
  if (opt_.ternary)
    os << "stc:density=" << exactText(opt_.density) << opt_.ef.specText();
  else
    os << "topk:density=" << exactText(opt_.density)
       << ",scope=" << (opt_.scope == TopKOptions::Scope::kLayer ? "layer" : "global")
       << opt_.ef.specText();
  return os.str();
}

void TopKCompressor::checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                                   const RoundContext& /*ctx*/) const {
  if (opt_.ternary) {
    const auto* x = std::get_if<TernaryView>(&p);
    if (!x) unexpected(layout, t, p, "ternary");
    const size_t k = countForDensity(opt_.density, layout[t].numel);
    // Exactly k, less the exact zeros among them: never more.
    if (x->count > k)
      failInput(Errc::kRoundMismatch, "tensor ", t, " '", layout[t].name, "' carries ", x->count,
                " ternary entries, ", spec(), " sends at most ", k);
    return;
  }
  const auto* s = std::get_if<SparseView>(&p);
  if (!s) unexpected(layout, t, p, "sparse");
  // Layer scope sends exactly k per tensor; global scope splits one k over the tensors.
  const size_t k = opt_.scope == TopKOptions::Scope::kLayer
                       ? countForDensity(opt_.density, layout[t].numel)
                       : countForDensity(opt_.density, layout.numel());
  if (opt_.scope == TopKOptions::Scope::kLayer ? s->indices.size() != k : s->indices.size() > k)
    failInput(Errc::kRoundMismatch, "tensor ", t, " '", layout[t].name, "' carries ",
              s->indices.size(), " top-k entries, ", spec(), " sends ",
              opt_.scope == TopKOptions::Scope::kLayer ? "" : "at most ", k);
}

std::vector<Payload> TopKCompressor::encode(const ParamLayout& layout, std::span<const float> input,
                                            std::span<float> residual, const ClientState& /*state*/,
                                            const RoundContext& ctx,
                                            StagedState& /*staged*/) const {
  std::vector<Payload> out;
  out.reserve(layout.size());
  std::vector<uint32_t> idx;
  if (opt_.scope == TopKOptions::Scope::kLayer) {
    for (size_t t = 0; t < layout.size(); ++t) {
      auto v = layout.slice(input, t);
      selectTopK(v, countForDensity(opt_.density, v.size()), idx, ctx.run_seed ^ ctx.round);
      if (opt_.ternary)
        out.emplace_back(gatherTernary(v, sliceOrEmpty(layout, residual, t), idx));
      else
        out.emplace_back(gather(v, sliceOrEmpty(layout, residual, t), idx));
    }
    return out;
  }
  // Global scope: one exact selection over the flat buffer, split per tensor (indices ascending,
  // so each tensor's share is a contiguous run).
  selectTopK(input, countForDensity(opt_.density, input.size()), idx, ctx.run_seed ^ ctx.round);
  size_t pos = 0;
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    const size_t end = spec.offset + spec.numel;
    std::vector<uint32_t> local;
    while (pos < idx.size() && idx[pos] < end)
      local.push_back(static_cast<uint32_t>(idx[pos++] - spec.offset));
    out.emplace_back(
        gather(layout.slice(input, t), sliceOrEmpty(layout, residual, t), std::move(local)));
  }
  return out;
}

Ternary ternaryPayload(std::vector<uint32_t>& idx, std::vector<float>& values) {
  STARLING_CHECK_ARG(idx.size() == values.size(), "stc: ", idx.size(), " positions with ",
                     values.size(), " values");
  // An exact zero that top-k picked (a tensor with fewer than k non-zeros) is not sent: as +-mu it
  // would move a coordinate that had nothing to say.
  size_t kept = 0;
  for (size_t j = 0; j < idx.size(); ++j)
    if (values[j] != 0.0f) {
      idx[kept] = idx[j];
      values[kept++] = values[j];
    }
  idx.resize(kept);
  values.resize(kept);
  double sum = 0.0;
  for (float v : values) sum += std::fabs(static_cast<double>(v));
  Ternary x;
  x.count = static_cast<uint32_t>(kept);
  x.mu = kept == 0 ? 0.0f : static_cast<float>(sum / static_cast<double>(kept));
  x.rice = static_cast<uint8_t>(bestRiceParameter(idx));
  x.positions = riceEncode(idx, x.rice);
  x.signs.assign(packedBytes(kept, 1), 0);
  for (size_t j = 0; j < kept; ++j)
    if (std::signbit(values[j])) x.signs[j >> 3] |= static_cast<uint8_t>(1u << (j & 7));
  return x;
}

Ternary ternaryTopK(std::span<const float> values, size_t k, uint64_t tie_seed) {
  std::vector<uint32_t> idx;
  selectTopK(values, std::min(k, values.size()), idx, tie_seed);
  return gatherTernary(values, {}, idx);
}

std::vector<uint32_t> sampleIndices(size_t n, size_t k, uint64_t run_seed, uint64_t round,
                                    uint64_t client, uint64_t sub) {
  RngStream rng(StreamKey{run_seed, round, client, StreamPurpose::kRandK, sub});
  std::vector<uint32_t> idx;
  idx.reserve(k);
  if (k * 16 <= n) {
    // Floyd: k draws, each adds exactly one new element.
    std::unordered_set<uint32_t> seen;
    seen.reserve(k * 2);
    for (size_t j = n - k; j < n; ++j) {
      const auto t = static_cast<uint32_t>(rng.below(j + 1));
      const uint32_t pick = seen.insert(t).second ? t : static_cast<uint32_t>(j);
      if (pick != t) seen.insert(pick);
      idx.push_back(pick);
    }
    std::sort(idx.begin(), idx.end());
  } else {
    // Selection sampling (Knuth's Algorithm S): one pass, already ascending.
    size_t needed = k;
    for (size_t i = 0; i < n && needed > 0; ++i) {
      if (rng.below(n - i) < needed) {
        idx.push_back(static_cast<uint32_t>(i));
        --needed;
      }
    }
  }
  return idx;
}

RandKCompressor::RandKCompressor(RandomSparsifyOptions o) : opt_(o) { opt_.validate(); }

std::string RandKCompressor::spec() const {
  std::ostringstream os;
  os << "randk:density=" << exactText(opt_.density)
     << ",positions=" << (opt_.shared_positions ? "shared" : "client") << opt_.ef.specText();
  return os.str();
}

void RandKCompressor::checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                                    const RoundContext& /*ctx*/) const {
  const auto* s = std::get_if<SparseView>(&p);
  if (!s) unexpected(layout, t, p, "sparse");
  const size_t k = countForDensity(opt_.density, layout[t].numel);
  if (s->indices.size() != k)
    failInput(Errc::kRoundMismatch, "tensor ", t, " '", layout[t].name, "' carries ",
              s->indices.size(), " random-k entries, ", spec(), " sends ", k);
}

std::vector<Payload> RandKCompressor::encode(const ParamLayout& layout,
                                             std::span<const float> input,
                                             std::span<float> residual,
                                             const ClientState& /*state*/, const RoundContext& ctx,
                                             StagedState& /*staged*/) const {
  std::vector<Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    auto v = layout.slice(input, t);
    out.emplace_back(gather(v, sliceOrEmpty(layout, residual, t), indicesFor(ctx, t, v.size())));
  }
  return out;
}

std::vector<uint32_t> RandKCompressor::indicesFor(const RoundContext& ctx, size_t tensor_index,
                                                  size_t numel) const {
  return sampleIndices(numel, countForDensity(opt_.density, numel), ctx.run_seed, ctx.round,
                       opt_.shared_positions ? kAnyClient : ctx.client_id, tensor_index);
}

SharedSupport RandKCompressor::sharedSupport(const ParamLayout& layout,
                                             const RoundContext& ctx) const {
  STARLING_CHECK_ARG(opt_.shared_positions, spec(),
                     " draws each client's positions: no support is shared");
  SharedSupport s{false, {}};
  for (size_t t = 0; t < layout.size(); ++t)
    for (uint32_t i : indicesFor(ctx, t, layout[t].numel))
      s.positions.push_back(static_cast<uint32_t>(layout[t].offset + i));
  return s;
}

RandBlockCompressor::RandBlockCompressor(RandomSparsifyOptions o) : opt_(o) { opt_.validate(); }

std::string RandBlockCompressor::spec() const {
  std::ostringstream os;
  os << "randblock:density=" << exactText(opt_.density)
     << ",offset=" << (opt_.per_client_offset ? "client" : "shared") << opt_.ef.specText();
  return os.str();
}

uint32_t RandBlockCompressor::offsetFor(const RoundContext& ctx, size_t tensor_index,
                                        size_t numel) const {
  if (!opt_.per_client_offset) return blockOffset(ctx.run_seed, ctx.round, tensor_index, numel);
  RngStream rng(
      StreamKey{ctx.run_seed, ctx.round, ctx.client_id, StreamPurpose::kRandBlock, tensor_index});
  return static_cast<uint32_t>(rng.below(numel));
}

uint32_t RandBlockCompressor::blockOffset(uint64_t run_seed, uint64_t round, size_t tensor_index,
                                          size_t numel) {
  RngStream rng(StreamKey{run_seed, round, kAnyClient, StreamPurpose::kRandBlock, tensor_index});
  return static_cast<uint32_t>(rng.below(numel));
}

SharedSupport RandBlockCompressor::sharedSupport(const ParamLayout& layout,
                                                 const RoundContext& ctx) const {
  STARLING_CHECK_ARG(!opt_.per_client_offset, spec(),
                     " places each client's block: no support is shared");
  SharedSupport s{false, {}};
  for (size_t t = 0; t < layout.size(); ++t) {
    const size_t n = layout[t].numel, len = lengthFor(n), at = offsetFor(ctx, t, n);
    for (size_t j = 0; j < len; ++j)
      s.positions.push_back(static_cast<uint32_t>(layout[t].offset + (at + j) % n));
  }
  return s;
}

void RandBlockCompressor::checkReceived(const ParamLayout& layout, size_t t, const PayloadView& p,
                                        const RoundContext& ctx) const {
  const auto* b = std::get_if<RandBlockView>(&p);
  if (!b) unexpected(layout, t, p, "randblock");
  const size_t n = layout[t].numel;
  const uint32_t want = offsetFor(ctx, t, n);
  if (b->offset != want || b->values.size() != lengthFor(n))
    failInput(Errc::kRoundMismatch, "tensor ", t, " '", layout[t].name, "' carries a block of ",
              b->values.size(), " values at offset ", b->offset, "; round ", ctx.round, " fixes ",
              countForDensity(opt_.density, n), " values at offset ", want);
}

std::vector<Payload> RandBlockCompressor::encode(
    const ParamLayout& layout, std::span<const float> input, std::span<float> residual,
    const ClientState& /*state*/, const RoundContext& ctx, StagedState& /*staged*/) const {
  std::vector<Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    auto v = layout.slice(input, t);
    const size_t n = v.size();
    const size_t len = lengthFor(n);
    RandBlock b;
    b.offset = offsetFor(ctx, t, n);
    b.values.resize(len);
    const size_t first = std::min(len, n - b.offset);
    std::copy_n(v.begin() + b.offset, first, b.values.begin());
    std::copy_n(v.begin(), len - first, b.values.begin() + static_cast<ptrdiff_t>(first));
    if (!residual.empty()) {
      auto r = layout.slice(residual, t);
      std::fill_n(r.begin() + b.offset, first, 0.0f);
      std::fill_n(r.begin(), len - first, 0.0f);
    }
    out.emplace_back(std::move(b));
  }
  return out;
}

}  // namespace starling::compression
