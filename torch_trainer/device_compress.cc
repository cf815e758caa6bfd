#include "torch_trainer/device_compress.h"

#include <torch/torch.h>

#include "core/error.h"

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

}  // namespace

std::vector<cz::Payload> encodeTopK(const cz::TopKOptions& opt, const ParamLayout& layout,
                                    torch::Tensor& acc, bool keep_residual) {
  STARLING_CHECK_ARG(acc.dim() == 1 && acc.scalar_type() == torch::kFloat32 &&
                         acc.is_contiguous() && static_cast<size_t>(acc.numel()) == layout.numel(),
                     "top-k on the device: the input must be a contiguous float32 vector of ",
                     layout.numel(), " values (the layout's), got ", acc.numel(), " of ",
                     c10::toString(acc.scalar_type()));
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
