// TorchTrainer: client::Trainer over a detail::Net (the LibTorch translation unit of the trainer
// itself; models.cc holds the models).
//
// Storage: the trainer owns one contiguous float tensor flat_ laid out exactly as layout() (the
// parameters, then the float buffers) and one grad_ tensor for the parameter prefix. At
// construction every tensor of the net is rebound onto its slice of flat_ (Tensor::set_data) and
// every parameter's .grad onto its slice of grad_. Autograd accumulates into a defined .grad in
// place, so after backward() the whole gradient sits in grad_ and the SGD step is one fused
// operation over the prefix. fit() and evaluate() copy the caller's buffer in (one memcpy) and
// fit() copies the result out; nothing is reallocated once the batch scratch has grown.
#include "torch_trainer/torch_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/finite.h"
#include "data/sampling.h"
#include "torch_trainer/net.h"

namespace starling::torch_trainer {
namespace {

using client::DataView;
using client::EvalResult;
using client::FitConfig;
using client::FitResult;

constexpr size_t kEvalBatch = 256;  // evaluation batch: bounds scratch, not the result

// How initParameters() fills one tensor of the layout.
struct InitRule {
  enum Kind { kSaved, kUniform } kind = kSaved;
  double bound = 0;  // kUniform: U(-bound, bound)
};

bool endsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class TorchTrainer final : public client::Trainer {
 public:
  TorchTrainer(std::unique_ptr<detail::Net> net, size_t rows, size_t cols, uint32_t classes,
               double momentum)
      : net_(std::move(net)), rows_(rows), cols_(cols), classes_(classes), momentum_(momentum) {
    bind();
  }

  std::string name() const override { return net_->name(); }
  std::string spec() const override {
    std::string s = net_->spec();
    if (momentum_ == 0) return s;
    std::ostringstream m;
    m << "momentum=" << momentum_;
    return s + (s.find(':') == std::string::npos ? ":" : ",") + m.str();
  }
  const ParamLayout& layout() const override { return layout_; }
  size_t features() const override { return rows_ * cols_; }
  uint32_t classes() const override { return classes_; }

  void initParameters(std::span<float> params, uint64_t seed) const override {
    checkParams(params.size());
    for (size_t i = 0; i < layout_.size(); ++i) {
      std::span<float> out = layout_.slice(params, i);
      if (rules_[i].kind == InitRule::kSaved) {
        const auto& t = layout_[i];
        std::copy_n(saved_.begin() + static_cast<std::ptrdiff_t>(t.offset), t.numel, out.begin());
        continue;
      }
      // The stream of the Eigen models' fillUniform: (seed, tensor index).
      RngStream rng(StreamKey{seed, 0, kAnyClient, StreamPurpose::kTraining, i});
      for (float& v : out) v = static_cast<float>((2.0 * rng.uniform() - 1.0) * rules_[i].bound);
    }
  }

  FitResult fit(std::span<float> params, const DataView& data, const FitConfig& cfg,
                RngStream& rng) override;
  EvalResult evaluate(std::span<const float> params, const DataView& data) override;

 private:
  void bind();
  void checkParams(size_t n) const {
    STARLING_CHECK_ARG(n == layout_.numel(), spec(), ": params has ", n,
                       " floats, the model's layout has ", layout_.numel());
  }
  void checkData(const DataView& data) const {
    client::checkDataView(data, features(), classes_);
    if (net_->needsImageShape())
      STARLING_CHECK_ARG(data.dataset->rows == rows_ && data.dataset->cols == cols_,
                         "DataView: the dataset's images are ", data.dataset->rows, "x",
                         data.dataset->cols, ", the model '", spec(), "' was built for ", rows_,
                         "x", cols_);
  }
  void load(std::span<const float> params) {
    std::memcpy(flat_.data_ptr<float>(), params.data(), params.size() * sizeof(float));
  }
  // Copies the examples `order` into the batch scratch; returns x [n, 1, rows, cols] and y [n].
  std::pair<torch::Tensor, torch::Tensor> gather(const data::Dataset& d,
                                                 std::span<const size_t> order);

  std::unique_ptr<detail::Net> net_;
  size_t rows_, cols_;
  uint32_t classes_;
  double momentum_;
  ParamLayout layout_;
  size_t param_numel_ = 0;    // the trainable prefix of the layout
  std::vector<float> saved_;  // every tensor's value at construction
  std::vector<InitRule> rules_;
  torch::Tensor flat_, grad_, velocity_;
  torch::Tensor x_, y_;  // batch scratch, grown on demand
  std::vector<size_t> order_;
};

void TorchTrainer::bind() {
  const detail::NamedTensors params = net_->parameters(), buffers = net_->buffers();
  std::set<const void*> seen;
  for (const auto* list : {&params, &buffers})
    for (const auto& [name, t] : *list) {
      if (!seen.insert(t.unsafeGetTensorImpl()).second)
        STARLING_THROW(ConfigError, net_->spec(), ": tensor '", name,
                       "' is shared with another (tied weights are not supported)");
      std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
      layout_.add(name, std::move(shape));
    }
  param_numel_ =
      params.empty() ? 0 : layout_[params.size() - 1].offset + layout_[params.size() - 1].numel;
  STARLING_ENFORCE(param_numel_ > 0, net_->spec(), ": the model has no parameters");

  flat_ = torch::empty({static_cast<int64_t>(layout_.numel())}, torch::kFloat32);
  grad_ = torch::zeros({static_cast<int64_t>(param_numel_)}, torch::kFloat32);
  saved_.resize(layout_.numel());
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const bool is_param = i < params.size();
    torch::Tensor t = is_param ? params[i].second : buffers[i - params.size()].second;
    const TensorSpec& s = layout_[i];
    const auto off = static_cast<int64_t>(s.offset), n = static_cast<int64_t>(s.numel);
    torch::Tensor slice = flat_.narrow(0, off, n).view(t.sizes());
    slice.copy_(t);
    t.set_data(slice);
    if (is_param) t.mutable_grad() = grad_.narrow(0, off, n).view(t.sizes());
  }
  std::memcpy(saved_.data(), flat_.data_ptr<float>(), saved_.size() * sizeof(float));

  // PyTorch's defaults for Linear and Conv: weight Kaiming-uniform with a = sqrt(5), i.e.
  // U(+-1/sqrt(fan_in)), bias U(+-1/sqrt(fan_in)) with the weight's fan_in. Every other tensor
  // (BatchNorm's weight 1, bias 0, running statistics; a TorchScript module's saved values) keeps
  // its constructed value.
  rules_.assign(layout_.size(), InitRule{});
  if (net_->initFromSavedValues()) return;
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorSpec& s = layout_[i];
    if (s.shape.size() >= 2 && endsWith(s.name, "weight")) {
      rules_[i] = {InitRule::kUniform, 1.0 / std::sqrt(static_cast<double>(s.cols()))};
    } else if (s.shape.size() == 1 && endsWith(s.name, "bias")) {
      const std::string weight = s.name.substr(0, s.name.size() - 4) + "weight";
      if (const auto w = layout_.find(weight); w && layout_[*w].shape.size() >= 2)
        rules_[i] = {InitRule::kUniform, 1.0 / std::sqrt(static_cast<double>(layout_[*w].cols()))};
    }
  }
}

std::pair<torch::Tensor, torch::Tensor> TorchTrainer::gather(const data::Dataset& d,
                                                             std::span<const size_t> order) {
  const size_t f = features(), n = order.size();
  if (!x_.defined() || static_cast<size_t>(x_.size(0)) < n) {
    x_ = torch::empty({static_cast<int64_t>(n), static_cast<int64_t>(f)}, torch::kFloat32);
    y_ = torch::empty({static_cast<int64_t>(n)}, torch::kInt64);
  }
  float* x = x_.data_ptr<float>();
  int64_t* y = y_.data_ptr<int64_t>();
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(x + i * f, d.images.data() + order[i] * f, f * sizeof(float));
    y[i] = d.labels[order[i]];
  }
  const auto rows = static_cast<int64_t>(n);
  return {x_.narrow(0, 0, rows)
              .view({rows, 1, static_cast<int64_t>(rows_), static_cast<int64_t>(cols_)}),
          y_.narrow(0, 0, rows)};
}

FitResult TorchTrainer::fit(std::span<float> params, const DataView& data, const FitConfig& cfg,
                            RngStream& rng) {
  cfg.check();
  checkParams(params.size());
  client::checkGradientTerms(cfg, params.size());
  checkData(data);
  const data::Dataset& d = *data.dataset;
  load(params);  // params stay untouched until the copy back: a divergence needs no rollback
  order_.assign(data.indices.begin(), data.indices.end());
  const auto diverged = [&](const std::string& what) {
    STARLING_THROW(client::DivergenceError, spec(), ": training diverged: ", what,
                   " (learning rate ", cfg.lr,
                   " too high for this model and data?); the parameters were restored");
  };

  net_->setTraining(true);
  torch::Tensor step_params = flat_.narrow(0, 0, static_cast<int64_t>(param_numel_));
  if (momentum_ > 0) {
    if (!velocity_.defined()) velocity_ = torch::empty_like(grad_);
    velocity_.zero_();
  }
  // FedProx's anchor and SCAFFOLD's correction, over the trained parameters (the prefix of the
  // flat buffer; running statistics after it are not trained). Views of the caller's memory.
  const auto prefix = static_cast<int64_t>(param_numel_);
  const auto mu = static_cast<float>(cfg.prox_mu);
  torch::Tensor anchor, correction;
  if (mu > 0) anchor = torch::from_blob(const_cast<float*>(cfg.prox_anchor.data()), {prefix}, torch::kFloat32);
  if (!cfg.correction.empty())
    correction = torch::from_blob(const_cast<float*>(cfg.correction.data()), {prefix}, torch::kFloat32);
  double loss_sum = 0;
  int64_t correct = 0;
  size_t seen = 0;
  for (uint32_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    data::shuffleInPlace(std::span<size_t>(order_), rng);
    for (size_t start = 0; start < order_.size(); start += cfg.batch_size) {
      const size_t n = std::min<size_t>(cfg.batch_size, order_.size() - start);
      const auto [x, y] = gather(d, std::span<const size_t>(order_).subspan(start, n));
      grad_.zero_();
      const torch::Tensor logits = net_->forward(x);
      const torch::Tensor loss = torch::cross_entropy_loss(logits, y);
      const double batch_loss = loss.item<double>();
      if (!std::isfinite(batch_loss))
        diverged(::starling::detail::concat("the loss is ", batch_loss, " at epoch ", epoch + 1,
                                            ", examples ", start, "..", start + n - 1));
      loss_sum += batch_loss * static_cast<double>(n);
      correct += logits.argmax(1).eq(y).sum().item<int64_t>();
      seen += n;
      loss.backward();
      torch::NoGradGuard no_grad;
      if (mu > 0) grad_.add_(step_params, mu).add_(anchor, -mu);  // FedProx: + mu (w - anchor)
      if (correction.defined()) grad_.add_(correction);  // SCAFFOLD
      if (momentum_ > 0) {
        velocity_.mul_(momentum_).add_(grad_);
        step_params.add_(velocity_, -cfg.lr);
      } else {
        step_params.add_(grad_, -cfg.lr);
      }
    }
  }
  const std::span<const float> trained(flat_.data_ptr<float>(), layout_.numel());
  if (!allFinite(trained)) diverged("a parameter is not finite after the last step");
  std::copy(trained.begin(), trained.end(), params.begin());

  FitResult r;
  r.num_examples = data.size();
  r.metrics = {{"train_loss", loss_sum / static_cast<double>(seen)},
               {"train_accuracy", static_cast<double>(correct) / static_cast<double>(seen)}};
  return r;
}

EvalResult TorchTrainer::evaluate(std::span<const float> params, const DataView& data) {
  checkParams(params.size());
  checkData(data);
  load(params);
  net_->setTraining(false);
  torch::NoGradGuard no_grad;
  double loss_sum = 0;
  int64_t correct = 0;
  for (size_t start = 0; start < data.indices.size(); start += kEvalBatch) {
    const size_t n = std::min(kEvalBatch, data.indices.size() - start);
    const auto [x, y] = gather(*data.dataset, data.indices.subspan(start, n));
    const torch::Tensor logits = net_->forward(x);
    loss_sum += torch::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).item<double>();
    correct += logits.argmax(1).eq(y).sum().item<int64_t>();
  }
  EvalResult r;
  r.num_examples = data.size();
  r.loss = loss_sum / static_cast<double>(data.size());
  r.accuracy = static_cast<double>(correct) / static_cast<double>(data.size());
  return r;
}

// ---- construction and the registry ----

void checkShape(const char* model, size_t rows, size_t cols, uint32_t classes, size_t min_side) {
  STARLING_CHECK_ARG(rows >= 1 && cols >= 1, model, ": the images are ", rows, "x", cols,
                     " (0 pixels)");
  STARLING_CHECK_ARG(classes >= 2, model, ": a classifier needs at least 2 classes, got ", classes);
  STARLING_CHECK_ARG(rows >= min_side && cols >= min_side, model, ": images of ", rows, "x", cols,
                     " are too small; the model needs at least ", min_side, "x", min_side);
}

// A weight matrix of rows x cols must fit a ParamLayout tensor (checked before allocating it).
void checkNumel(const char* model, size_t rows, size_t cols) {
  STARLING_CHECK_ARG(cols == 0 || rows <= ParamLayout::kMaxTensorNumel / cols, model,
                     ": a weight of ", rows, "x", cols,
                     " is past the largest tensor a layout holds");
}

double readMomentum(OptionReader& r) {
  const double m = r.number("momentum", 0.0);
  if (m < 0 || m >= 1)
    STARLING_THROW(ConfigError, "torch trainer: momentum=", m, " must be in [0, 1)");
  return m;
}

constexpr const char* kMomentumOption = "momentum=0 (SGD momentum in [0, 1), restarted each fit)";

std::unique_ptr<client::Trainer> wrap(std::unique_ptr<detail::Net> net, size_t rows, size_t cols,
                                      uint32_t classes, double momentum) {
  return std::make_unique<TorchTrainer>(std::move(net), rows, cols, classes, momentum);
}

}  // namespace

const TorchTrainerRegistry& torchTrainers() {
  using Entry = TorchTrainerRegistry::Entry;
  using Made = std::unique_ptr<client::Trainer>;
  static const TorchTrainerRegistry registry(
      "torch trainer",
      {
          Entry{"logreg", "softmax regression (LibTorch): fc.weight [classes, features], fc.bias",
                kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes) -> Made {
                  const double m = readMomentum(r);
                  checkShape("logreg", rows, cols, classes, 1);
                  checkNumel("logreg", classes, rows * cols);
                  return wrap(detail::makeLogreg(rows, cols, classes), rows, cols, classes, m);
                }},
          Entry{"mlp",
                "one ReLU hidden layer (LibTorch): fc1 [hidden, features], fc2 [classes, hidden]",
                std::string("hidden=200 (hidden units, >= 1), ") + kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes) -> Made {
                  const uint32_t hidden = r.count("hidden", 200);
                  const double m = readMomentum(r);
                  if (hidden == 0)
                    STARLING_THROW(ConfigError, "torch trainer 'mlp': hidden=0 must be at least 1");
                  checkShape("mlp", rows, cols, classes, 1);
                  checkNumel("mlp", hidden, rows * cols);
                  return wrap(detail::makeMlp(rows, cols, classes, hidden), rows, cols, classes, m);
                }},
          Entry{"cnn",
                "McMahan et al. 2017 CNN: 2 x (conv5x5 'same' + ReLU + maxpool2; 32, 64 channels), "
                "fc 512 + ReLU, fc classes (1,663,370 parameters at 28x28, 10 classes)",
                kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes) -> Made {
                  const double m = readMomentum(r);
                  checkShape("cnn", rows, cols, classes, 4);
                  checkNumel("cnn", 512, 64 * (rows / 4) * (cols / 4));
                  return wrap(detail::makeCnn(rows, cols, classes), rows, cols, classes, m);
                }},
          Entry{"resnet",
                "ResNet-8: conv3x3 16 + BN, 3 stages of one basic block (16/32/64 channels), "
                "global average pool, fc; BatchNorm running statistics travel in the layout",
                kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes) -> Made {
                  const double m = readMomentum(r);
                  checkShape("resnet", rows, cols, classes, 1);
                  return wrap(detail::makeResnet(rows, cols, classes), rows, cols, classes, m);
                }},
          Entry{"torchscript",
                "a module saved with torch.jit.save: forward(x) -> logits [N, classes]",
                std::string("path=FILE (required), input=image (image: x is [N, 1, rows, cols]; "
                            "flat: [N, rows*cols]), init=file (file: the saved values; seed: "
                            "PyTorch's Linear/Conv defaults from the seed), ") +
                    kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes) -> Made {
                  const std::string path = r.text("path", "");
                  const std::string input = r.choice("input", "image", {"image", "flat"});
                  const std::string init = r.choice("init", "file", {"file", "seed"});
                  const double m = readMomentum(r);
                  if (path.empty())
                    STARLING_THROW(ConfigError,
                                   "torch trainer 'torchscript': path=FILE is required");
                  checkShape("torchscript", rows, cols, classes, 1);
                  return wrap(detail::loadScript(path, input == "flat", init == "file", rows, cols,
                                                 classes),
                              rows, cols, classes, m);
                }},
      });
  return registry;
}

std::unique_ptr<client::Trainer> makeTorchTrainer(std::string_view spec, size_t rows, size_t cols,
                                                  uint32_t classes) {
  return torchTrainers().make(spec, rows, cols, classes);
}

std::unique_ptr<client::Trainer> makeTorchTrainer(std::string_view spec, const data::Dataset& d) {
  return makeTorchTrainer(spec, d.rows, d.cols, d.num_classes);
}

}  // namespace starling::torch_trainer
