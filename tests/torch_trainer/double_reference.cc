#include "torch_trainer/double_reference.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "data/sampling.h"

namespace starling::testing {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kUnit = 0x1p-24;  // float32's unit roundoff

// Identity in value and gradient, but for a random relative error: x (1 + fwd r) forward and
// g (1 + bwd r') backward, r and r' standard normal (Monte Carlo arithmetic).
struct Perturb : torch::autograd::Function<Perturb> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, double fwd, double bwd) {
    ctx->saved_data["bwd"] = bwd;
    return fwd == 0 ? x.clone() : x * (1 + fwd * torch::randn_like(x));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const double bwd = ctx->saved_data["bwd"].toDouble();
    Tensor gi = bwd == 0 ? g[0] : g[0] * (1 + bwd * torch::randn_like(g[0]));
    return {gi, Tensor(), Tensor()};
  }
};

// The models' operations, perturbed as a float32 computation rounds them when `mca`.
struct Ops {
  bool mca = false;

  // The rounding of a sum of n terms (forward or in the gradient): sqrt(1 + log2 n) units, as a
  // pairwise or blocked sum's error grows (Higham and Mary 2019) -- the kernels of both trainers
  // (Eigen's and oneDNN's) sum in blocks and trees. sqrt(n) (a recursive sum's bound) was tried
  // and is no model of them: it flips so many of ResNet's ReLUs after BatchNorm that ten steps of
  // Monte Carlo samples differed by 50%, where both trainers stay within 1e-5 of the exact result.
  double scale(int64_t n) const {
    return mca ? kUnit * std::sqrt(1 + std::log2(static_cast<double>(n))) : 0.0;
  }
  Tensor p(const Tensor& x, int64_t fwd_terms, int64_t bwd_terms) const {
    if (!mca) return x;
    return Perturb::apply(x, fwd_terms ? scale(fwd_terms) : 0.0,
                          bwd_terms ? scale(bwd_terms) : 0.0);
  }

  Tensor conv(const Tensor& x, const Tensor& w, const c10::optional<Tensor>& b, int64_t stride,
              int64_t pad) const {
    const int64_t batch = x.size(0), cin = w.size(1), cout = w.size(0), k = w.size(2) * w.size(3);
    const int64_t ho = (x.size(2) + 2 * pad - w.size(2)) / stride + 1,
                  wo = (x.size(3) + 2 * pad - w.size(3)) / stride + 1;
    const int64_t per_weight = batch * ho * wo;
    const Tensor y = torch::conv2d(p(x, 0, cout * k), p(w, 0, per_weight),
                                   b ? c10::optional<Tensor>(p(*b, 0, per_weight)) : c10::nullopt,
                                   at::IntArrayRef(stride), at::IntArrayRef(pad));
    return p(y, cin * k, 0);
  }
  Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) const {
    const int64_t batch = x.size(0);
    const Tensor y = torch::linear(p(x, 0, w.size(0)), p(w, 0, batch), p(b, 0, batch));
    return p(y, w.size(1), 0);
  }
  // BatchNorm over (N, H, W) per channel, PyTorch's (eps 1e-5, momentum 0.1); in training the
  // batch statistics normalize and the running ones move (without gradient).
  Tensor bn(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& mean, Tensor& var,
            bool training) const {
    const int64_t n = x.size(0) * x.size(2) * x.size(3);
    const auto c = [](const Tensor& t) { return t.view({1, -1, 1, 1}); };
    Tensor y;
    if (training) {
      const Tensor xi = p(x, 0, n);
      const Tensor m = p(xi.mean({0, 2, 3}, true), n, 0);
      const Tensor v = p((xi - m).pow(2).mean({0, 2, 3}, true), n, 0);
      y = (xi - m) / torch::sqrt(v + 1e-5) * c(p(w, 0, n)) + c(p(b, 0, n));
      torch::NoGradGuard no_grad;
      const Tensor unbiased = v.view(-1) * (static_cast<double>(n) / static_cast<double>(n - 1));
      const double k = 0.1f;  // the trainers' momentum is a float
      mean = round((1 - k) * mean + k * round(m.view(-1)));
      var = round((1 - k) * var + k * round(unbiased));
    } else {
      y = (x - c(mean)) / torch::sqrt(c(var) + 1e-5) * c(w) + c(b);
    }
    return p(y, n, 0);
  }
  Tensor meanPool(const Tensor& x) const {
    return p(p(x, 0, 1).mean({2, 3}), x.size(2) * x.size(3), 0);
  }
  Tensor loss(const Tensor& logits, const Tensor& y) const {
    const Tensor l = torch::cross_entropy_loss(p(logits, 0, logits.size(1)), y);
    return p(l, logits.size(0) * logits.size(1), 0);
  }
  // A value stored as float32 (MCA); exact otherwise.
  Tensor round(const Tensor& t) const {
    return mca ? t.to(torch::kFloat32).to(torch::kFloat64) : t;
  }
};

// The parameters of a layout as double tensors: the trained ones are leaves that take gradients,
// the running statistics plain tensors that the forward pass of a training step replaces.
struct Model {
  const ReferenceConfig& cfg;
  const ParamLayout& layout;
  std::vector<Tensor> tensors;  // layout order
  size_t trained = 0;           // the first `trained` tensors are trained

  Model(const ReferenceConfig& c, const ParamLayout& l, const std::vector<double>& flat)
      : cfg(c), layout(l) {
    for (size_t i = 0; i < l.size(); ++i) {
      std::vector<int64_t> shape(l[i].shape.begin(), l[i].shape.end());
      Tensor t = torch::from_blob(const_cast<double*>(flat.data()) + l[i].offset,
                                  {static_cast<int64_t>(l[i].numel)}, torch::kFloat64)
                     .clone()
                     .view(shape);
      if (l[i].name.find("running_") == std::string::npos) {
        STARLING_ENFORCE(trained == i, "a trained tensor after a buffer: ", l[i].name);
        t.requires_grad_(true);
        ++trained;
      }
      tensors.push_back(t);
    }
  }
  Tensor& at(const std::string& name) {
    const auto i = layout.find(name);
    STARLING_ENFORCE(i.has_value(), "the reference model has no tensor ", name);
    return tensors[*i];
  }

  Tensor forward(const Ops& o, const Tensor& x, bool training) {
    const int64_t batch = x.size(0);
    if (cfg.model == "logreg") return o.linear(x.view({batch, -1}), at("fc.weight"), at("fc.bias"));
    if (cfg.model == "mlp") {
      const Tensor h = torch::relu(o.linear(x.view({batch, -1}), at("fc1.weight"), at("fc1.bias")));
      return o.linear(h, at("fc2.weight"), at("fc2.bias"));
    }
    if (cfg.model == "cnn") {
      Tensor h =
          torch::max_pool2d(torch::relu(o.conv(x, at("conv1.weight"), at("conv1.bias"), 1, 2)), 2);
      h = torch::max_pool2d(torch::relu(o.conv(h, at("conv2.weight"), at("conv2.bias"), 1, 2)), 2);
      h = torch::relu(o.linear(h.flatten(1), at("fc1.weight"), at("fc1.bias")));
      return o.linear(h, at("fc2.weight"), at("fc2.bias"));
    }
    STARLING_ENFORCE(cfg.model == "resnet", "no reference for model ", cfg.model);
    const auto norm = [&](const Tensor& t, const std::string& p) {
      return o.bn(t, at(p + ".weight"), at(p + ".bias"), at(p + ".running_mean"),
                  at(p + ".running_var"), training);
    };
    Tensor h = torch::relu(norm(o.conv(x, at("conv1.weight"), c10::nullopt, 1, 1), "bn1"));
    for (int s = 0; s < 3; ++s) {
      const std::string p = "layer" + std::to_string(s + 1) + ".0.";
      const int64_t stride = s == 0 ? 1 : 2;
      Tensor y =
          torch::relu(norm(o.conv(h, at(p + "conv1.weight"), c10::nullopt, stride, 1), p + "bn1"));
      y = norm(o.conv(y, at(p + "conv2.weight"), c10::nullopt, 1, 1), p + "bn2");
      const Tensor skip =
          layout.find(p + "downsample.0.weight")
              ? norm(o.conv(h, at(p + "downsample.0.weight"), c10::nullopt, stride, 0),
                     p + "downsample.1")
              : h;
      h = torch::relu(y + skip);
    }
    return o.linear(o.meanPool(h), at("fc.weight"), at("fc.bias"));
  }

  std::vector<double> flat() const {
    std::vector<double> out(layout.numel());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor t = tensors[i].detach().contiguous().view(-1);
      std::copy_n(t.data_ptr<double>(), t.numel(),
                  out.begin() + static_cast<long>(layout[i].offset));
    }
    return out;
  }
};

// The batch's images (float32 as the trainers see them, exact in double) and labels.
std::pair<Tensor, Tensor> batch(const data::Dataset& d, std::span<const size_t> idx) {
  const auto n = static_cast<int64_t>(idx.size());
  const size_t f = d.features();
  Tensor x = torch::empty({n, 1, static_cast<int64_t>(d.rows), static_cast<int64_t>(d.cols)},
                          torch::kFloat64);
  Tensor y = torch::empty({n}, torch::kInt64);
  double* px = x.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    const size_t e = idx[static_cast<size_t>(i)];
    for (size_t k = 0; k < f; ++k)
      px[static_cast<size_t>(i) * f + k] =
          d.holdsBytes() ? static_cast<double>(static_cast<float>(d.pixels[e * f + k]) / 255.0f)
                         : static_cast<double>(d.images[e * f + k]);
    y[i] = static_cast<int64_t>(d.labels[e]);
  }
  return {x, y};
}

Tensor vec(std::span<const float> v, size_t n) {
  std::vector<double> d(v.begin(), v.begin() + static_cast<long>(n));
  return torch::tensor(d, torch::kFloat64);
}

}  // namespace

ReferenceResult referenceFit(const ReferenceConfig& cfg, const ParamLayout& layout,
                             const data::Dataset& d, std::span<const size_t> indices,
                             std::span<const float> start, RngStream rng, const Mca* mca) {
  STARLING_ENFORCE(start.size() == layout.numel(), "start has ", start.size(), " values");
  const Ops o{mca != nullptr};
  if (mca) torch::manual_seed(mca->seed);
  Model m(cfg, layout, std::vector<double>(start.begin(), start.end()));
  const size_t n_trained = layout[m.trained - 1].offset + layout[m.trained - 1].numel;
  // The trainers' scalars are float32.
  const double lr = static_cast<float>(cfg.lr), mu = static_cast<float>(cfg.prox_mu),
               momentum = static_cast<float>(cfg.momentum);
  const Tensor anchor = mu > 0 ? vec(cfg.anchor, n_trained) : Tensor();
  const Tensor correction = cfg.correction.empty() ? Tensor() : vec(cfg.correction, n_trained);
  Tensor velocity = torch::zeros({static_cast<int64_t>(n_trained)}, torch::kFloat64);
  std::vector<size_t> order(indices.begin(), indices.end());
  ReferenceResult r;
  double loss_sum = 0;
  size_t seen = 0;
  for (uint32_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    data::shuffleInPlace(std::span<size_t>(order), rng);
    for (size_t s = 0; s < order.size(); s += cfg.batch_size) {
      const size_t n = std::min<size_t>(cfg.batch_size, order.size() - s);
      const auto [x, y] = batch(d, std::span<const size_t>(order).subspan(s, n));
      for (size_t i = 0; i < m.trained; ++i) m.tensors[i].mutable_grad() = Tensor();
      const Tensor logits = m.forward(o, x, true);
      const Tensor loss = o.loss(logits, y);
      loss.backward();
      torch::NoGradGuard no_grad;
      loss_sum += loss.item<double>() * static_cast<double>(n);
      seen += n;
      r.correct += static_cast<size_t>(logits.argmax(1).eq(y).sum().item<int64_t>());
      std::vector<Tensor> pieces, grads;
      for (size_t i = 0; i < m.trained; ++i) {
        pieces.push_back(m.tensors[i].view(-1));
        grads.push_back(m.tensors[i].grad().reshape(-1));
      }
      const Tensor p = torch::cat(pieces);
      Tensor g = o.round(torch::cat(grads));
      if (mu > 0) g = o.round(g + o.round(mu * o.round(p - anchor)));  // FedProx
      if (correction.defined()) g = o.round(g + correction);           // SCAFFOLD
      if (momentum > 0) {
        velocity = o.round(o.round(momentum * velocity) + g);
        g = velocity;
      }
      const Tensor next = o.round(p - o.round(lr * g));
      int64_t off = 0;
      for (size_t i = 0; i < m.trained; ++i) {
        const int64_t k = m.tensors[i].numel();
        m.tensors[i].copy_(next.narrow(0, off, k).view_as(m.tensors[i]));
        off += k;
      }
    }
  }
  r.params = m.flat();
  r.train_loss = loss_sum / static_cast<double>(std::max<size_t>(seen, 1));
  return r;
}

double referenceLoss(const ReferenceConfig& cfg, const ParamLayout& layout, const data::Dataset& d,
                     std::span<const size_t> indices, std::span<const float> params) {
  Model m(cfg, layout, std::vector<double>(params.begin(), params.end()));
  const auto [x, y] = batch(d, indices);
  torch::NoGradGuard no_grad;
  return Ops{}.loss(m.forward(Ops{}, x, false), y).item<double>();
}

Reference::Reference(const ReferenceConfig& cfg, const ParamLayout& layout, const data::Dataset& d,
                     std::span<const size_t> indices, std::span<const float> start,
                     const RngStream& rng)
    : layout_(layout),
      start_(start.begin(), start.end()),
      exact_(referenceFit(cfg, layout, d, indices, start, rng)),
      examples_(indices.size() * cfg.epochs),
      spread_(layout.size(), 0.0) {
  for (int k = 0; k < kMcaSamples; ++k) {
    const Mca mca{static_cast<uint64_t>(k) + 1};
    const ReferenceResult sample = referenceFit(cfg, layout, d, indices, start, rng, &mca);
    const std::vector<float> as_float(sample.params.begin(), sample.params.end());  // exact
    const std::vector<double> dist = distances(as_float);
    for (size_t t = 0; t < dist.size(); ++t) spread_[t] = std::max(spread_[t], dist[t]);
    loss_spread_ = std::max(loss_spread_, std::abs(sample.train_loss / exact_.train_loss - 1));
    correct_spread_ = std::max(correct_spread_, sample.correct > exact_.correct
                                                    ? sample.correct - exact_.correct
                                                    : exact_.correct - sample.correct);
  }
}

std::vector<double> Reference::distances(std::span<const float> got) const {
  std::vector<double> out;
  const std::vector<double>& exact = exact_.params;
  for (size_t t = 0; t < layout_.size(); ++t) {
    double diff = 0, step = 0;
    for (size_t i = layout_[t].offset; i < layout_[t].offset + layout_[t].numel; ++i) {
      diff += (got[i] - exact[i]) * (got[i] - exact[i]);
      step += (exact[i] - start_[i]) * (exact[i] - start_[i]);
    }
    out.push_back(std::sqrt(diff) / std::max(std::sqrt(step), 1e-300));
  }
  return out;
}

std::vector<Verdict> Reference::judge(std::span<const float> got) const {
  const std::vector<double> dist = distances(got);
  std::vector<Verdict> out;
  for (size_t t = 0; t < layout_.size(); ++t)
    out.push_back({layout_[t].name, dist[t], kMcaFactor * spread_[t]});
  return out;
}

std::vector<Verdict> Reference::judgeMetrics(double train_loss, double train_accuracy) const {
  const double correct = std::round(train_accuracy * static_cast<double>(examples_));
  return {{"train_loss", std::abs(train_loss / exact_.train_loss - 1), kMcaFactor * loss_spread_},
          {"correct predictions", std::abs(correct - static_cast<double>(exact_.correct)),
           static_cast<double>(correct_spread_)}};
}

}  // namespace starling::testing
