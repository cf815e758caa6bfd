#include "split/split_model.h"

#include <torch/torch.h>

#include <algorithm>

#include "core/error.h"
#include "torch_trainer/torch_trainer.h"

namespace starling::split {
namespace {

// Leaf tensors over a copy of `params` laid out by `layout`, with gradients when asked.
std::vector<torch::Tensor> leaves(const ParamLayout& layout, std::span<const float> params, bool grad) {
  std::vector<torch::Tensor> out;
  out.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto& t = layout[i];
    auto v = torch::from_blob(const_cast<float*>(params.data() + t.offset), t.shape, torch::kFloat32).clone();
    if (grad) v.requires_grad_(true);
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<float> flatGrads(const ParamLayout& layout, const std::vector<torch::Tensor>& ts) {
  std::vector<float> out(layout.numel(), 0.0f);
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto g = ts[i].grad();
    if (!g.defined()) continue;
    const auto c = g.contiguous();
    std::copy_n(c.data_ptr<float>(), layout[i].numel, out.begin() + static_cast<std::ptrdiff_t>(layout[i].offset));
  }
  return out;
}

torch::Tensor conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  return torch::conv2d(x, w, b, /*stride=*/1, /*padding=*/2);
}

// The CNN in stages: 0 conv1+pool, 1 conv2+pool, 2 flatten+fc1+relu, 3 fc2. Stage s uses the
// tensors 2s and 2s+1 of the whole layout.
torch::Tensor cnnStage(int s, const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& b) {
  switch (s) {
    case 0: return torch::max_pool2d(torch::relu(conv(h, w, b)), 2);
    case 1: return torch::max_pool2d(torch::relu(conv(h, w, b)), 2);
    case 2: return torch::relu(torch::linear(h.flatten(1), w, b));
    default: return torch::linear(h, w, b);
  }
}

}  // namespace

struct SplitModel::Impl {
  std::string model, cut;
  size_t rows = 0, cols = 0;
  uint32_t classes = 0;
  int cut_stage = 0;  // stages [0, cut_stage] run on the edge
  uint32_t rank = 0;  // weight-side cut: the next stage's projection split at this rank
  std::unique_ptr<client::Trainer> whole;
  ParamLayout bottom, top;
  size_t act = 0;
  // The last edge forward pass.
  std::vector<torch::Tensor> edge_params;
  torch::Tensor edge_out;
  size_t edge_n = 0;

  torch::Tensor input(std::span<const float> x, size_t n) const {
    return torch::from_blob(const_cast<float*>(x.data()),
                            {static_cast<int64_t>(n), 1, static_cast<int64_t>(rows), static_cast<int64_t>(cols)},
                            torch::kFloat32);
  }
  torch::Tensor runBottom(const std::vector<torch::Tensor>& p, const torch::Tensor& x) const {
    torch::Tensor h = x;
    for (int s = 0; s <= cut_stage; ++s) h = cnnStage(s, h, p[2 * s], p[2 * s + 1]);
    h = h.flatten(1);
    if (rank) h = torch::linear(h, p[2 * static_cast<size_t>(cut_stage + 1)]);  // S_r V_r^T
    return h;
  }
  // Top stages from the flat activations a [n, act].
  torch::Tensor runTop(const std::vector<torch::Tensor>& p, const torch::Tensor& a) const {
    torch::Tensor h = a;
    int first = cut_stage + 1;
    size_t i = 0;
    if (rank) {
      // U_r and the projection's bias finish the layer that was split (fc1 has its ReLU).
      h = torch::linear(h, p[0], p[1]);
      if (first == 2) h = torch::relu(h);
      ++first;
      i = 2;
    } else if (cut_stage == 0) {
      h = a.view({a.size(0), 32, static_cast<int64_t>(rows / 2), static_cast<int64_t>(cols / 2)});
    }
    for (int s = first; s < 4; ++s, i += 2) h = cnnStage(s, h, p[i], p[i + 1]);
    return h;
  }
};

std::vector<std::string> SplitModel::cutPoints(const std::string& model) {
  if (model == "cnn") return {"conv1", "conv2", "fc1"};
  STARLING_THROW(ConfigError, "split: model '", model, "' has no cut points (models with cut points: cnn)");
}

SplitModel::SplitModel(const std::string& model, const std::string& cut, size_t rows, size_t cols, uint32_t classes,
                       uint32_t weight_rank)
    : impl_(std::make_unique<Impl>()) {
  const auto cuts = cutPoints(model);
  const auto it = std::find(cuts.begin(), cuts.end(), cut);
  if (it == cuts.end()) {
    std::string list;
    for (const auto& c : cuts) list += (list.empty() ? "" : ", ") + c;
    STARLING_THROW(ConfigError, "split: '", cut, "' is not a cut point of ", model, " (", list, ")");
  }
  STARLING_CHECK_ARG(rows % 4 == 0 && cols % 4 == 0 && rows > 0 && cols > 0, "split: the cnn needs image sides that ",
                     "are multiples of 4, got ", rows, "x", cols);
  Impl& m = *impl_;
  m.model = model;
  m.cut = cut;
  m.rows = rows;
  m.cols = cols;
  m.classes = classes;
  m.cut_stage = static_cast<int>(it - cuts.begin());
  m.whole = torch_trainer::makeTorchTrainer(model, rows, cols, classes);
  const ParamLayout& full = m.whole->layout();
  STARLING_ENFORCE(full.size() == 8, "split: the cnn's layout has ", full.size(), " tensors, 8 expected");
  const size_t split_at = 2 * static_cast<size_t>(m.cut_stage + 1);
  m.act = m.cut_stage == 0 ? 32 * (rows / 2) * (cols / 2) : m.cut_stage == 1 ? 64 * (rows / 4) * (cols / 4) : 512;
  if (weight_rank == 0) {
    for (size_t i = 0; i < full.size(); ++i) (i < split_at ? m.bottom : m.top).add(full[i].name, full[i].shape);
    return;
  }
  // The weight-side cut: the projection right after the cut is linear for conv2 (fc1) and fc1 (fc2).
  if (m.cut_stage == 0)
    STARLING_THROW(ConfigError, "split: a weight-side cut needs a linear layer after the cut; after conv1 comes conv2 ",
                   "(cut at conv2 or fc1)");
  const auto& w = full[split_at];  // the projection's weight, out x in
  const auto out = static_cast<uint32_t>(w.shape[0]), in = static_cast<uint32_t>(w.shape[1]);
  if (weight_rank > std::min(out, in))
    STARLING_THROW(ConfigError, "split: weight rank ", weight_rank, " exceeds ", w.name, "'s ", out, " x ", in);
  m.rank = weight_rank;
  const std::string layer = w.name.substr(0, w.name.find('.'));
  for (size_t i = 0; i < split_at; ++i) m.bottom.add(full[i].name, full[i].shape);
  m.bottom.add(layer + ".svd_v", {static_cast<int64_t>(weight_rank), static_cast<int64_t>(in)});
  m.top.add(layer + ".svd_u", {static_cast<int64_t>(out), static_cast<int64_t>(weight_rank)});
  for (size_t i = split_at + 1; i < full.size(); ++i) m.top.add(full[i].name, full[i].shape);
  m.act = weight_rank;
}

SplitModel::~SplitModel() = default;

const ParamLayout& SplitModel::full() const { return impl_->whole->layout(); }
const ParamLayout& SplitModel::bottom() const { return impl_->bottom; }
const ParamLayout& SplitModel::top() const { return impl_->top; }
size_t SplitModel::activationSize() const { return impl_->act; }
size_t SplitModel::features() const { return impl_->rows * impl_->cols; }
uint32_t SplitModel::classes() const { return impl_->classes; }

std::pair<std::vector<float>, std::vector<float>> SplitModel::cutParameters(std::span<const float> whole) const {
  const Impl& m = *impl_;
  const ParamLayout& f = full();
  STARLING_CHECK_ARG(whole.size() == f.numel(), "split: ", whole.size(), " parameters, the model has ", f.numel());
  const size_t split_at = 2 * static_cast<size_t>(m.cut_stage + 1);
  const size_t prefix = f[split_at - 1].offset + f[split_at - 1].numel;
  std::vector<float> bottom(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(prefix));
  if (!m.rank) return {std::move(bottom), std::vector<float>(whole.begin() + static_cast<std::ptrdiff_t>(prefix), whole.end())};
  // W = U S V^T, truncated: the edge gets S_r V_r^T, the cloud U_r.
  const auto& ws = f[split_at];
  torch::NoGradGuard no_grad;
  const auto w = torch::from_blob(const_cast<float*>(whole.data() + ws.offset), ws.shape, torch::kFloat32).to(torch::kFloat64);
  const auto [u, sv, vh] = torch::linalg::svd(w, /*full_matrices=*/false, c10::nullopt);
  const int64_t r = m.rank;
  const auto v_part = (sv.slice(0, 0, r).unsqueeze(1) * vh.slice(0, 0, r)).to(torch::kFloat32).contiguous();
  const auto u_part = u.slice(1, 0, r).to(torch::kFloat32).contiguous();
  bottom.insert(bottom.end(), v_part.data_ptr<float>(), v_part.data_ptr<float>() + v_part.numel());
  std::vector<float> top(u_part.data_ptr<float>(), u_part.data_ptr<float>() + u_part.numel());
  top.insert(top.end(), whole.begin() + static_cast<std::ptrdiff_t>(ws.offset + ws.numel), whole.end());
  STARLING_ENFORCE(bottom.size() == m.bottom.numel() && top.size() == m.top.numel(), "split: weight-side cut sizes");
  return {std::move(bottom), std::move(top)};
}

std::string SplitModel::describe() const {
  if (impl_->rank)
    return impl_->model + " cut at " + impl_->cut + " with the next projection split at rank " +
           std::to_string(impl_->rank) + ": " + std::to_string(impl_->act) + " values per example, " +
           std::to_string(impl_->bottom.numel()) + " parameters on the edge, " + std::to_string(impl_->top.numel()) +
           " in the cloud";
  return impl_->model + " cut at " + impl_->cut + ": " + std::to_string(impl_->act) + " values per example, " +
         std::to_string(impl_->bottom.numel()) + " parameters on the edge, " + std::to_string(impl_->top.numel()) +
         " in the cloud";
}

std::vector<float> SplitModel::initParameters(uint64_t seed) const {
  std::vector<float> p(full().numel());
  impl_->whole->initParameters(p, seed);
  return p;
}

std::vector<float> SplitModel::edgeForward(std::span<const float> bottom_params, std::span<const float> x, size_t n) {
  Impl& m = *impl_;
  STARLING_CHECK_ARG(bottom_params.size() == m.bottom.numel(), "split edge: ", bottom_params.size(),
                     " bottom parameters, the cut needs ", m.bottom.numel());
  STARLING_CHECK_ARG(n > 0 && x.size() == n * features(), "split edge: ", x.size(), " input values for ", n,
                     " examples of ", features());
  m.edge_params = leaves(m.bottom, bottom_params, true);
  m.edge_out = m.runBottom(m.edge_params, m.input(x, n));
  m.edge_n = n;
  const auto c = m.edge_out.detach().contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + n * m.act);
}

std::vector<float> SplitModel::edgeBackward(std::span<const float> grad_activations) {
  Impl& m = *impl_;
  STARLING_CHECK_ARG(m.edge_out.defined(), "split edge: a backward pass without a forward pass");
  STARLING_CHECK_ARG(grad_activations.size() == m.edge_n * m.act, "split edge: an activation gradient of ",
                     grad_activations.size(), " values, the forward pass produced ", m.edge_n * m.act);
  const auto g = torch::from_blob(const_cast<float*>(grad_activations.data()),
                                  {static_cast<int64_t>(m.edge_n), static_cast<int64_t>(m.act)}, torch::kFloat32);
  m.edge_out.backward(g);
  auto out = flatGrads(m.bottom, m.edge_params);
  m.edge_out = torch::Tensor();
  m.edge_params.clear();
  return out;
}

SplitModel::CloudResult SplitModel::cloudStep(std::span<const float> top_params, std::span<const float> activations,
                                              std::span<const uint8_t> labels, size_t n) {
  Impl& m = *impl_;
  STARLING_CHECK_ARG(top_params.size() == m.top.numel(), "split cloud: ", top_params.size(),
                     " top parameters, the cut needs ", m.top.numel());
  STARLING_CHECK_ARG(n > 0 && activations.size() == n * m.act && labels.size() == n, "split cloud: ",
                     activations.size(), " activation values and ", labels.size(), " labels for ", n,
                     " examples of ", m.act);
  for (uint8_t l : labels) STARLING_CHECK_ARG(l < m.classes, "split cloud: label ", int{l}, " of ", m.classes, " classes");
  auto params = leaves(m.top, top_params, true);
  auto a = torch::from_blob(const_cast<float*>(activations.data()), {static_cast<int64_t>(n), static_cast<int64_t>(m.act)},
                            torch::kFloat32)
               .clone()
               .requires_grad_(true);
  std::vector<int64_t> y(labels.begin(), labels.end());
  const auto target = torch::tensor(y, torch::kInt64);
  const auto logits = m.runTop(params, a);
  const auto loss = torch::nn::functional::cross_entropy(logits, target);
  loss.backward();
  CloudResult r;
  r.loss = loss.item<double>();
  r.correct = static_cast<size_t>(logits.argmax(1).eq(target).sum().item<int64_t>());
  r.grad_top = flatGrads(m.top, params);
  const auto ga = a.grad().contiguous();
  r.grad_activations.assign(ga.data_ptr<float>(), ga.data_ptr<float>() + n * m.act);
  return r;
}

SplitModel::CloudResult SplitModel::evaluate(std::span<const float> bottom_params, std::span<const float> top_params,
                                             std::span<const float> x, std::span<const uint8_t> labels, size_t n) {
  Impl& m = *impl_;
  STARLING_CHECK_ARG(bottom_params.size() == m.bottom.numel() && top_params.size() == m.top.numel(),
                     "split evaluate: parameter sizes do not fit the cut");
  STARLING_CHECK_ARG(x.size() == n * features() && labels.size() == n, "split evaluate: ", x.size(), " inputs and ",
                     labels.size(), " labels for ", n, " examples");
  torch::NoGradGuard no_grad;
  const auto bp = leaves(m.bottom, bottom_params, false), tp = leaves(m.top, top_params, false);
  std::vector<int64_t> y(labels.begin(), labels.end());
  const auto target = torch::tensor(y, torch::kInt64);
  const auto logits = m.runTop(tp, m.runBottom(bp, m.input(x, n)));
  CloudResult r;
  r.loss = torch::nn::functional::cross_entropy(logits, target).item<double>();
  r.correct = static_cast<size_t>(logits.argmax(1).eq(target).sum().item<int64_t>());
  return r;
}

}  // namespace starling::split
