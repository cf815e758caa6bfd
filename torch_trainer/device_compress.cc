#include "torch_trainer/device_compress.h"

#include <torch/torch.h>

#include <map>

#include "compression/exact_sum.h"
#include "compression/lowrank.h"
#include "compression/quantize.h"
#include "core/error.h"
#include "core/rng.h"

namespace starling::torch_trainer {
namespace cz = starling::compression;

torch::Tensor topKIndices(const torch::Tensor& x, int64_t k) {
  STARLING_CHECK_ARG(x.dim() == 1 && x.scalar_type() == torch::kFloat32,
                     "top-k on the device takes a 1-D float32 tensor, got ", x.dim(),
                     " dimensions of ", c10::toString(x.scalar_type()));
  const int64_t n = x.numel();
  STARLING_CHECK_ARG(k >= 0 && k <= n, "top-k on the device: k = ", k, " of ", n, " values");
  const auto opts = torch::TensorOptions(torch::kInt64).device(x.device());
  if (k == 0) return torch::empty({0}, opts);
  if (k == n) return torch::arange(n, opts);
  const torch::Tensor a = x.abs();
  // The k-th largest magnitude t: every value above t is taken, and of those equal to t the
  // lowest-indexed ones until k are (LibTorch's own topk leaves ties in no stated order).
  const torch::Tensor t = std::get<0>(a.topk(k, 0, /*largest=*/true, /*sorted=*/false)).min();
  const torch::Tensor above = a > t;
  const torch::Tensor at = a == t;
  const torch::Tensor need = k - above.sum();
  const torch::Tensor take = above | (at & (at.cumsum(0) <= need));
  torch::Tensor idx = take.nonzero().flatten();  // ascending
  STARLING_ENFORCE(idx.numel() == k, "top-k on the device selected ", idx.numel(), " of ", n,
                   " values, not ", k);
  return idx;
}

namespace {

// Indices (int64, on the device) and their values, moved to the host in one go each.
void download(const torch::Tensor& idx, const torch::Tensor& values, std::vector<uint32_t>& idx_out,
              std::vector<float>& values_out) {
  const torch::Tensor i = idx.to(torch::kCPU).contiguous();
  const torch::Tensor v = values.to(torch::kCPU).contiguous();
  const int64_t* ip = i.data_ptr<int64_t>();
  idx_out.resize(static_cast<size_t>(i.numel()));
  for (size_t j = 0; j < idx_out.size(); ++j) idx_out[j] = static_cast<uint32_t>(ip[j]);
  const float* vp = v.data_ptr<float>();
  values_out.assign(vp, vp + v.numel());
}

// STC's residual on the device: value - sent at the positions sent, sent = +-mu by the value's sign
// (the same float subtraction as the CPU's, so the same bits); exact zeros were not sent and keep
// their value.
void ternaryResidual(torch::Tensor& slice, const torch::Tensor& idx, const torch::Tensor& values,
                     float mu) {
  const torch::Tensor sent = values != 0;
  const torch::Tensor i = idx.masked_select(sent);
  const torch::Tensor v = values.masked_select(sent);
  const torch::Tensor plus = torch::full_like(v, mu), minus = torch::full_like(v, -mu);
  slice.index_copy_(0, i, v - torch::where(torch::signbit(v), minus, plus));
}

void checkAcc(const ParamLayout& layout, const torch::Tensor& acc, const char* who) {
  STARLING_CHECK_ARG(acc.dim() == 1 && acc.scalar_type() == torch::kFloat32 &&
                         acc.is_contiguous() && static_cast<size_t>(acc.numel()) == layout.numel(),
                     who, " on the device: the input must be a contiguous float32 vector of ",
                     layout.numel(), " values (the layout's), got ", acc.numel(), " of ",
                     c10::toString(acc.scalar_type()));
}

std::vector<float> downloadValues(const torch::Tensor& values) {
  const torch::Tensor v = values.to(torch::kCPU).contiguous();
  return {v.data_ptr<float>(), v.data_ptr<float>() + v.numel()};
}

// Rand-k: the host's draw of positions (k of them uploaded), their values downloaded.
std::vector<cz::Payload> encodeRandK(const cz::RandKCompressor& c, const ParamLayout& layout,
                                     torch::Tensor& acc, bool keep_residual,
                                     const cz::RoundContext& ctx) {
  std::vector<cz::Payload> out;
  out.reserve(layout.size());
  std::vector<int64_t> wide;
  for (size_t t = 0; t < layout.size(); ++t) {
    torch::Tensor slice = acc.narrow(0, static_cast<int64_t>(layout[t].offset),
                                     static_cast<int64_t>(layout[t].numel));
    std::vector<uint32_t> idx = c.indicesFor(ctx, t, layout[t].numel);
    wide.assign(idx.begin(), idx.end());
    const torch::Tensor sel =
        torch::from_blob(wide.data(), {static_cast<int64_t>(wide.size())}, torch::kInt64)
            .to(acc.device());
    std::vector<float> values = downloadValues(slice.index_select(0, sel));
    if (keep_residual) slice.index_fill_(0, sel, 0.0f);
    out.emplace_back(cz::Sparse{std::move(idx), std::move(values)});
  }
  return out;
}

// Random-block: the block at the host's offset, wrapping at the tensor's end, downloaded.
std::vector<cz::Payload> encodeRandBlock(const cz::RandBlockCompressor& c,
                                         const ParamLayout& layout, torch::Tensor& acc,
                                         bool keep_residual, const cz::RoundContext& ctx) {
  std::vector<cz::Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const auto n = static_cast<int64_t>(layout[t].numel);
    torch::Tensor slice = acc.narrow(0, static_cast<int64_t>(layout[t].offset), n);
    cz::RandBlock b;
    b.offset = c.offsetFor(ctx, t, layout[t].numel);
    const auto len = static_cast<int64_t>(c.lengthFor(layout[t].numel));
    const int64_t first = std::min<int64_t>(len, n - b.offset);
    torch::Tensor head = slice.narrow(0, b.offset, first), tail = slice.narrow(0, 0, len - first);
    b.values = downloadValues(len == first ? head : torch::cat({head, tail}));
    if (keep_residual) {
      head.zero_();
      tail.zero_();
    }
    out.emplace_back(std::move(b));
  }
  return out;
}

// A logical right shift of int64 values (LibTorch's is arithmetic).
torch::Tensor shiftRight(const torch::Tensor& z, int k) {
  return z.bitwise_right_shift(k).bitwise_and((int64_t{1} << (64 - k)) - 1);
}

// CounterStream's uniforms 0..n-1 (core/rng.h) on the device: SplitMix64 in int64 arithmetic,
// which wraps as uint64 does.
torch::Tensor counterUniforms(uint64_t seed, int64_t n, const torch::Device& device) {
  torch::Tensor z = torch::arange(1, n + 1, torch::TensorOptions(torch::kInt64).device(device))
                        .mul(static_cast<int64_t>(0x9e3779b97f4a7c15ull))
                        .add(static_cast<int64_t>(seed));
  z = z.bitwise_xor(shiftRight(z, 30)).mul(static_cast<int64_t>(0xbf58476d1ce4e5b9ull));
  z = z.bitwise_xor(shiftRight(z, 27)).mul(static_cast<int64_t>(0x94d049bb133111ebull));
  z = z.bitwise_xor(shiftRight(z, 31));
  return shiftRight(z, 11).to(torch::kFloat64).mul(0x1.0p-53);
}

// |x|'s float exponent and significand (the implicit bit set for normal numbers), as int64: the
// terms of compression/exact_sum.h's buckets.
std::pair<torch::Tensor, torch::Tensor> exponentAndSignificand(const torch::Tensor& x) {
  const torch::Tensor bits = x.view(torch::kInt32).bitwise_and(0x7fffffff);
  const torch::Tensor e = bits.bitwise_right_shift(23);
  const torch::Tensor m = bits.bitwise_and(0x7fffff) + (e > 0).to(torch::kInt32) * 0x800000;
  return {e.to(torch::kInt64), m.to(torch::kInt64)};
}

// Buckets summed on the device, read on the host. Each term is below 2^24: below 2^29 terms every
// partial sum is an integer below 2^53, exact in double whatever the order of the additions, so
// bincount's double weights (a shared-memory histogram on a GPU) sum them exactly; more terms go
// through int64 scatter_add (exact too, but one global atomic per term).
cz::ExponentBuckets bucketSums(const torch::Tensor& e, const torch::Tensor& terms) {
  torch::Tensor sums;
  if (terms.numel() < (int64_t{1} << 29))
    sums = torch::bincount(e, terms.to(torch::kFloat64), 256).to(torch::kInt64);
  else
    sums = torch::zeros({256}, terms.options()).scatter_add_(0, e, terms);
  const torch::Tensor host = sums.to(torch::kCPU).contiguous();
  cz::ExponentBuckets b{};
  for (size_t j = 0; j < b.size(); ++j) b[j] = static_cast<uint64_t>(host.data_ptr<int64_t>()[j]);
  return b;
}

// `fields` (int32, each below 2^bits) packed LSB-first, `bits` a field, as compression's BitWriter
// packs them; the bytes downloaded. In passes of 2^20 fields (a multiple of 8, so every pass but
// the last ends on a byte), so that the bits spread out on the device stay within 2^20 x bits.
std::vector<uint8_t> packBits(const torch::Tensor& fields, int64_t bits) {
  constexpr int64_t kPass = int64_t{1} << 20;
  const int64_t n = fields.numel();
  const auto i32 = torch::TensorOptions(torch::kInt32).device(fields.device());
  const torch::Tensor shifts = torch::arange(bits, i32);
  const torch::Tensor weights =
      torch::tensor({1, 2, 4, 8, 16, 32, 64, 128}, torch::kInt32).to(fields.device());
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>((n * bits + 7) / 8));
  for (int64_t at = 0; at < n; at += kPass) {
    const torch::Tensor f = fields.narrow(0, at, std::min(kPass, n - at));
    const int64_t total = f.numel() * bits, bytes = (total + 7) / 8;
    const torch::Tensor flat =
        bits == 1 ? f : f.unsqueeze(1).bitwise_right_shift(shifts).bitwise_and(1).flatten();
    torch::Tensor padded = torch::zeros({bytes * 8}, i32);
    padded.narrow(0, 0, total).copy_(flat);
    const torch::Tensor packed =
        (padded.view({bytes, 8}) * weights).sum(1).to(torch::kUInt8).to(torch::kCPU).contiguous();
    out.insert(out.end(), packed.data_ptr<uint8_t>(), packed.data_ptr<uint8_t>() + bytes);
  }
  return out;
}

// QSGD: the norm from exact square sums (buckets on the device), the levels and their stochastic
// rounding on the device from the same counter-based draws, the fields packed there.
std::vector<cz::Payload> encodeQsgd(const cz::QsgdCompressor& c, const ParamLayout& layout,
                                    torch::Tensor& acc, bool keep_residual,
                                    const cz::RoundContext& ctx) {
  std::vector<cz::Payload> out;
  out.reserve(layout.size());
  const uint32_t s = c.options().levels;
  const auto bits = static_cast<int64_t>(1 + cz::qsgdLevelBits(s));
  for (size_t t = 0; t < layout.size(); ++t) {
    const auto n = static_cast<int64_t>(layout[t].numel);
    torch::Tensor slice = acc.narrow(0, static_cast<int64_t>(layout[t].offset), n);
    cz::Qsgd q;
    q.s = s;
    {  // the norm; its int64 temporaries are freed before the levels' are made
      const auto [e, m] = exponentAndSignificand(slice);
      const torch::Tensor sq = m * m;  // below 2^48
      const cz::SquareBuckets squares{bucketSums(e, sq.bitwise_right_shift(24)),
                                      bucketSums(e, sq.bitwise_and(0xffffff))};
      q.norm = static_cast<float>(std::sqrt(cz::roundSquareBuckets(squares)));
    }
    const double scale = q.norm > 0.0f ? static_cast<double>(s) / q.norm : 0.0;
    const float unit = q.norm / static_cast<float>(s);
    // As the host: r = |v| * scale in double, level = r truncated, one more with probability
    // r - level (value i's draw), at most s.
    const torch::Tensor r = slice.to(torch::kFloat64).abs().mul(scale);
    torch::Tensor level = r.to(torch::kInt64);
    const CounterStream draws(
        StreamKey{ctx.run_seed, ctx.round, ctx.client_id, StreamPurpose::kQsgd, t});
    const torch::Tensor up = (level < static_cast<int64_t>(s))
                                 .logical_and(counterUniforms(draws.seed(), n, acc.device()) <
                                              r - level.to(torch::kFloat64));
    level = (level + up.to(torch::kInt64)).clamp_max(static_cast<int64_t>(s));
    const torch::Tensor neg = slice < 0;
    q.packed = packBits((level * 2 + neg.to(torch::kInt64)).to(torch::kInt32), bits);
    if (keep_residual) {
      // The host's residual: value - (negative ? -sent : sent), sent = unit * level in float.
      const torch::Tensor sent = level.to(torch::kFloat32).mul(unit);
      slice.sub_(torch::where(neg, -sent, sent));
    }
    out.emplace_back(std::move(q));
  }
  return out;
}

// Sign: |v|'s significands summed per exponent on the device (integer sums, in any order the
// same), the sum rounded on the host as SignCompressor rounds it; the bits packed on the device.
std::vector<cz::Payload> encodeSign(const ParamLayout& layout, torch::Tensor& acc,
                                    bool keep_residual) {
  std::vector<cz::Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const auto n = static_cast<int64_t>(layout[t].numel);
    torch::Tensor slice = acc.narrow(0, static_cast<int64_t>(layout[t].offset), n);
    const auto [e, m] = exponentAndSignificand(slice);
    cz::Sign s;
    s.scale = static_cast<float>(cz::roundBuckets(bucketSums(e, m)) / static_cast<double>(n));
    const torch::Tensor neg = slice < 0;  // as the host: -0 is not negative
    s.bits = packBits(neg.to(torch::kInt32), 1);
    if (keep_residual) {
      // The host's residual: value - (negative ? -scale : scale), the same float subtraction.
      const torch::Tensor plus = torch::full_like(slice, s.scale);
      slice.sub_(torch::where(neg, -plus, plus));
    }
    out.emplace_back(std::move(s));
  }
  return out;
}

// ---- PowerSGD and ACP-SGD: compression/lowrank.h's products in the same order ----

// Terms (doubles) in flight at once in a product: 128 MB.
constexpr int64_t kProductTerms = int64_t{1} << 24;

// compression::halvingSum along `dim` of x (double), in place on x's storage: the same tree.
torch::Tensor halvingSum(torch::Tensor x, int64_t dim) {
  int64_t n = x.size(dim);
  STARLING_ENFORCE(n > 0, "a product of no terms");
  while (n > 1) {
    const int64_t h = n / 2;
    x.narrow(dim, 0, h).add_(x.narrow(dim, h, h));
    if (n % 2 != 0) x.narrow(dim, h, 1).copy_(x.narrow(dim, 2 * h, 1));
    n -= h;
    x = x.narrow(dim, 0, n);
  }
  return x.squeeze(dim);
}

// A chunk length of `total` items of `terms_each` terms, within kProductTerms.
int64_t chunkOf(int64_t total, int64_t terms_each) {
  return std::clamp<int64_t>(kProductTerms / std::max<int64_t>(terms_each, 1), 1,
                             std::max<int64_t>(total, 1));
}

// A host factor (dim x r floats) as doubles on the device.
torch::Tensor uploadFactor(const std::vector<float>& f, int64_t dim, int64_t r,
                           const torch::Device& device) {
  return torch::from_blob(const_cast<float*>(f.data()), {dim, r}, torch::kFloat32)
      .to(device, torch::kFloat64);
}

// The lanes' sums along `dim` of x (double, contiguous), compression/lowrank.h's order: the
// terms padded with +0 to a whole number of `groups` x kProductLanes, viewed as [groups, lanes]
// (interleaved: term t in lane t mod L) or [lanes, groups] (chunked: lane l holds a run of
// terms), each lane summed from +0 in its terms' order, one add per group; then the lanes by
// halvingSum. A lane's sum is never -0, so the padding's +0 changes nothing.
torch::Tensor laneSum(torch::Tensor x, int64_t dim, bool interleaved) {
  constexpr auto L = static_cast<int64_t>(cz::kProductLanes);
  const int64_t n = x.size(dim), groups = (n + L - 1) / L;
  if (groups * L != n) {
    std::vector<int64_t> pad_shape = x.sizes().vec();
    pad_shape[static_cast<size_t>(dim)] = groups * L - n;
    x = torch::cat({x, torch::zeros(pad_shape, x.options())}, dim);
  }
  std::vector<int64_t> shape = x.sizes().vec();
  shape[static_cast<size_t>(dim)] = interleaved ? L : groups;
  shape.insert(shape.begin() + dim, interleaved ? groups : L);
  x = x.view(shape);
  const int64_t group_dim = interleaved ? dim : dim + 1;
  torch::Tensor lanes = torch::zeros_like(x.select(group_dim, 0));
  for (int64_t g = 0; g < groups; ++g) lanes.add_(x.select(group_dim, g));
  return halvingSum(lanes, dim);
}

// The product whose terms run along `dim` of m (float [rows, cols]), in chunks of the other
// dimension, downloaded: dim 1, P = M Q (factorProduct, f = Q double [cols, r], lanes
// interleaved); dim 0, Q = M^T P (transposedFactorProduct, f = P double [rows, r], lanes in runs).
// Either is float [rows or cols, r], row-major.
std::vector<float> product(const torch::Tensor& m, const torch::Tensor& f, int64_t dim) {
  const int64_t other = 1 - dim, n = m.size(other), step = chunkOf(n, m.size(dim) * f.size(1));
  std::vector<torch::Tensor> parts;
  for (int64_t a = 0; a < n; a += step) {
    const torch::Tensor terms =
        m.narrow(other, a, std::min(step, n - a)).to(torch::kFloat64).unsqueeze(2) *
        f.unsqueeze(other);
    parts.push_back(laneSum(terms, dim, /*interleaved=*/dim == 1).to(torch::kFloat32));
  }
  return downloadValues(torch::cat(parts, 0).flatten());
}

// M = M - P Q^T in place (subtractFactorProduct): p double [rows, r], q double [cols, r].
void subtractPQt(torch::Tensor m, const torch::Tensor& p, const torch::Tensor& q) {
  const int64_t rows = m.size(0), step = chunkOf(rows, m.size(1) * p.size(1));
  for (int64_t a = 0; a < rows; a += step) {
    const int64_t len = std::min(step, rows - a);
    torch::Tensor part = m.narrow(0, a, len);
    const torch::Tensor s = halvingSum(p.narrow(0, a, len).unsqueeze(1) * q.unsqueeze(0), 2);
    part.copy_(part.to(torch::kFloat64).sub_(s));
  }
}

// A tensor sent whole, its kept part cleared (the host's denseAndClear).
cz::DenseF32 denseOnDevice(torch::Tensor slice, bool keep_residual) {
  cz::DenseF32 d{downloadValues(slice)};
  if (keep_residual) slice.zero_();
  return d;
}

// PowerSGD (either mode) and ACP-SGD, as lowrank.cc encodes them: the products on the device,
// the factors (rows x r or cols x r floats) crossing; local PowerSGD's P orthogonalized on the
// host by the same function. Two-phase PowerSGD's phase P leaves M in acc for phase Q.
std::vector<cz::Payload> encodeLowRank(const cz::Compressor& c, const ParamLayout& layout,
                                       torch::Tensor& acc, bool keep_residual,
                                       const cz::RoundContext& ctx, const ClientState* state,
                                       cz::StagedState* staged) {
  const auto* power = dynamic_cast<const cz::PowerSgdCompressor*>(&c);
  const cz::LowRankOptions& o = *cz::lowRankOptionsOf(c);
  const bool local = power && (!o.two_phase || !keep_residual);
  const bool phase_p = power && !local;
  STARLING_CHECK_ARG(ctx.phase == 0, c.name(), " on the device: phase ", ctx.phase,
                     " has no update to encode");
  STARLING_CHECK_ARG(!power || staged != nullptr, c.name(),
                     " on the device: the client's staged state is needed");
  // The shared factors (ACP-SGD, phase P), checked as compressWithFeedback's checkRound checks
  // them: the uploads below read each at its tensor's size.
  static const cz::SharedFactors kNone;
  const cz::SharedFactors& shared = ctx.shared ? *ctx.shared : kNone;
  const bool fixed_q = phase_p || shared.fixed == cz::SharedFactors::Side::kQ;
  if (!local)
    cz::checkSharedFactors(layout, o, ctx.shared,
                           fixed_q ? cz::SharedFactors::Side::kQ : cz::SharedFactors::Side::kP,
                           c.name().c_str());
  cz::PowerSgdState* next = nullptr;
  if (phase_p) {
    next = &staged->stage<cz::PowerSgdState>(std::string(cz::kPowerSgdComponent));
    next->pending_phase = 1;
  } else if (local && o.warm_start && staged) {
    next = &staged->stage<cz::PowerSgdState>(std::string(cz::kPowerSgdComponent));
    next->factors.resize(layout.size());
  }
  std::vector<cz::Payload> out;
  out.reserve(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const TensorSpec& spec = layout[t];
    torch::Tensor slice =
        acc.narrow(0, static_cast<int64_t>(spec.offset), static_cast<int64_t>(spec.numel));
    const bool factored = local ? cz::lowRankCompressible(spec, o.rank, o.min_compression_rate)
                                : t < shared.factors.size() && !shared.factors[t].empty();
    if (!factored) {
      out.emplace_back(denseOnDevice(slice, keep_residual));
      continue;
    }
    const uint32_t r = cz::effectiveRank(spec, o.rank);
    const auto rows = static_cast<int64_t>(spec.rows()), cols = static_cast<int64_t>(spec.cols());
    const torch::Tensor m = slice.view({rows, cols});
    cz::LowRank l{static_cast<uint32_t>(rows), static_cast<uint32_t>(cols), r, {}, {}};
    if (local) {
      l.p = product(
          m, uploadFactor(power->localStartFactor(layout, t, state, ctx), cols, r, acc.device()),
          1);
      cz::orthogonalize(l.p.data(), static_cast<size_t>(rows), r);
      const torch::Tensor p = uploadFactor(l.p, rows, r, acc.device());
      l.q = product(m, p, 0);
      if (keep_residual) {
        if (o.ef.on)
          subtractPQt(m, p, uploadFactor(l.q, cols, r, acc.device()));
        else
          slice.zero_();
      }
      if (next) next->factors[t] = l.q;
    } else if (fixed_q) {
      const torch::Tensor q = uploadFactor(shared.factors[t], cols, r, acc.device());
      l.p = product(m, q, 1);
      if (keep_residual && !phase_p) subtractPQt(m, uploadFactor(l.p, rows, r, acc.device()), q);
    } else {
      const torch::Tensor p = uploadFactor(shared.factors[t], rows, r, acc.device());
      l.q = product(m, p, 0);
      if (keep_residual) subtractPQt(m, p, uploadFactor(l.q, cols, r, acc.device()));
    }
    out.emplace_back(std::move(l));
  }
  return out;
}

}  // namespace

namespace {

using Encoder = std::vector<cz::Payload> (*)(const cz::Compressor&, const ParamLayout&,
                                             torch::Tensor&, bool, const cz::RoundContext&,
                                             const ClientState*, cz::StagedState*);

// The host compressor a registry name builds (compression/registry.cc): a row of the table below
// whose class is not that name's is a programming error, reported as one.
template <class C>
const C& hostCompressor(const cz::Compressor& c) {
  const auto* host = dynamic_cast<const C*>(&c);
  STARLING_ENFORCE(host != nullptr, "the device twin of '", c.name(),
                   "' expects another host compressor class");
  return *host;
}

// The device twin of each host compressor that has one, by its registry name, one row per
// compressor of compression/registry.cc: what encodeOnDevice runs. A compressor without a row is
// encoded on the host (none, fp16, bf16: dense, nothing to select); a new compressor gets a row
// here or stays on the host (tests/torch_trainer/device_compress_test.cc lists which).
const std::map<std::string, Encoder, std::less<>>& deviceTwins() {
  static const std::map<std::string, Encoder, std::less<>> twins{
      {"topk",
       [](const cz::Compressor& c, const ParamLayout& layout, torch::Tensor& acc, bool keep,
          const cz::RoundContext&, const ClientState*, cz::StagedState*) {
         return encodeTopK(hostCompressor<cz::TopKCompressor>(c).options(), layout, acc, keep);
       }},
      {"stc",  // top-k's selection, ternary values (TopKOptions::ternary)
       [](const cz::Compressor& c, const ParamLayout& layout, torch::Tensor& acc, bool keep,
          const cz::RoundContext&, const ClientState*, cz::StagedState*) {
         return encodeTopK(hostCompressor<cz::TopKCompressor>(c).options(), layout, acc, keep);
       }},
      {"randk",
       [](const cz::Compressor& c, const ParamLayout& layout, torch::Tensor& acc, bool keep,
          const cz::RoundContext& ctx, const ClientState*, cz::StagedState*) {
         checkAcc(layout, acc, c.name().c_str());
         return encodeRandK(hostCompressor<cz::RandKCompressor>(c), layout, acc, keep, ctx);
       }},
      {"randblock",
       [](const cz::Compressor& c, const ParamLayout& layout, torch::Tensor& acc, bool keep,
          const cz::RoundContext& ctx, const ClientState*, cz::StagedState*) {
         checkAcc(layout, acc, c.name().c_str());
         return encodeRandBlock(hostCompressor<cz::RandBlockCompressor>(c), layout, acc, keep, ctx);
       }},
      {"sign",
       [](const cz::Compressor& c, const ParamLayout& layout, torch::Tensor& acc, bool keep,
          const cz::RoundContext&, const ClientState*, cz::StagedState*) {
         (void)hostCompressor<cz::SignCompressor>(c);
         checkAcc(layout, acc, c.name().c_str());
         return encodeSign(layout, acc, keep);
       }},
      {"qsgd",
       [](const cz::Compressor& c, const ParamLayout& layout, torch::Tensor& acc, bool keep,
          const cz::RoundContext& ctx, const ClientState*, cz::StagedState*) {
         checkAcc(layout, acc, c.name().c_str());
         return encodeQsgd(hostCompressor<cz::QsgdCompressor>(c), layout, acc, keep, ctx);
       }},
      {"powersgd",  // phase 0 of either mode
       [](const cz::Compressor& c, const ParamLayout& layout, torch::Tensor& acc, bool keep,
          const cz::RoundContext& ctx, const ClientState* state, cz::StagedState* staged) {
         checkAcc(layout, acc, c.name().c_str());
         return encodeLowRank(c, layout, acc, keep, ctx, state, staged);
       }},
      {"acpsgd",
       [](const cz::Compressor& c, const ParamLayout& layout, torch::Tensor& acc, bool keep,
          const cz::RoundContext& ctx, const ClientState* state, cz::StagedState* staged) {
         checkAcc(layout, acc, c.name().c_str());
         return encodeLowRank(c, layout, acc, keep, ctx, state, staged);
       }},
  };
  return twins;
}

}  // namespace

bool encodesOnDevice(const cz::Compressor& c) {
  if (!deviceTwins().contains(c.name())) return false;
  // A compressor of several phases only as PowerSGD's phase 0 (its later phase is the host's).
  return c.phases() == 1 || cz::lowRankOptionsOf(c) != nullptr;
}

std::vector<cz::Payload> encodeOnDevice(const cz::Compressor& c, const ParamLayout& layout,
                                        torch::Tensor& acc, bool keep_residual,
                                        const cz::RoundContext& ctx, const ClientState* state,
                                        cz::StagedState* staged) {
  STARLING_CHECK_ARG(encodesOnDevice(c), "the device does not encode ", c.spec());
  return deviceTwins().find(c.name())->second(c, layout, acc, keep_residual, ctx, state, staged);
}

std::vector<cz::Payload> encodeTopK(const cz::TopKOptions& opt, const ParamLayout& layout,
                                    torch::Tensor& acc, bool keep_residual) {
  checkAcc(layout, acc, "top-k");
  // Indices travel as u32 (the CPU's selectTopK requires as much): a tensor is bounded by
  // ParamLayout, global scope selects over the whole buffer.
  STARLING_CHECK_ARG(
      opt.scope == cz::TopKOptions::Scope::kLayer || layout.numel() < (uint64_t{1} << 32),
      "topk:scope=global over ", layout.numel(), " values: at most 2^32 - 1");
  std::vector<cz::Payload> out;
  out.reserve(layout.size());
  std::vector<uint32_t> idx;
  std::vector<float> values;
  if (opt.scope == cz::TopKOptions::Scope::kLayer) {
    for (size_t t = 0; t < layout.size(); ++t) {
      const auto off = static_cast<int64_t>(layout[t].offset);
      const auto n = static_cast<int64_t>(layout[t].numel);
      torch::Tensor slice = acc.narrow(0, off, n);
      const torch::Tensor sel = topKIndices(
          slice, static_cast<int64_t>(cz::countForDensity(opt.density, layout[t].numel)));
      const torch::Tensor vals = slice.index_select(0, sel);
      download(sel, vals, idx, values);
      if (opt.ternary) {
        cz::Ternary x = cz::ternaryPayload(idx, values);
        if (keep_residual && x.count > 0) ternaryResidual(slice, sel, vals, x.mu);
        out.emplace_back(std::move(x));
      } else {
        if (keep_residual) slice.index_fill_(0, sel, 0.0f);
        out.emplace_back(cz::Sparse{std::move(idx), std::move(values)});
      }
    }
    return out;
  }
  STARLING_CHECK_ARG(!opt.ternary, "stc: one mu per tensor needs scope=layer");
  // Global scope: one selection over the whole buffer, split per tensor (indices ascending, so each
  // tensor's share is a contiguous run of the downloaded ones).
  const torch::Tensor sel =
      topKIndices(acc, static_cast<int64_t>(cz::countForDensity(opt.density, layout.numel())));
  std::vector<uint32_t> all;
  std::vector<float> all_values;
  download(sel, acc.index_select(0, sel), all, all_values);
  if (keep_residual) acc.index_fill_(0, sel, 0.0f);
  size_t pos = 0;
  for (size_t t = 0; t < layout.size(); ++t) {
    const size_t begin = pos, end = layout[t].offset + layout[t].numel;
    while (pos < all.size() && all[pos] < end) ++pos;
    cz::Sparse s;
    s.indices.reserve(pos - begin);
    for (size_t j = begin; j < pos; ++j)
      s.indices.push_back(static_cast<uint32_t>(all[j] - layout[t].offset));
    s.values.assign(all_values.begin() + static_cast<std::ptrdiff_t>(begin),
                    all_values.begin() + static_cast<std::ptrdiff_t>(pos));
    out.emplace_back(std::move(s));
  }
  return out;
}

}  // namespace starling::torch_trainer
