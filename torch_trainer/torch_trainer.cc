// TorchTrainer: client::Trainer over a detail::Net (the LibTorch translation unit of the trainer
// itself; models.cc holds the models).
//
// Storage: the trainer owns one contiguous float tensor flat_ on its device, laid out exactly as
// layout() (the parameters, then the float buffers), and one grad_ tensor for the parameter
// prefix. At construction every tensor of the net is rebound onto its slice of flat_
// (Tensor::set_data) and every parameter's .grad onto its slice of grad_. Autograd accumulates into
// a defined .grad in place, so after backward() the whole gradient sits in grad_ and the SGD step
// is one fused operation over the prefix. fit() and evaluate() copy the caller's buffer in (one
// copy) and fit() copies the result out; nothing is reallocated once the batch scratch has grown.
//
// Device-generic: the same code runs on the CPU and on a GPU. The client's data are
// indexed on the device (a view of the data set's memory on the CPU, a copy made once per data set
// on a GPU), each epoch's shuffled order is uploaded once, batches are gathered by index_select
// into device scratch, and the loss sum and the correct count accumulate in device tensors that
// are read once per fit. The only host synchronisations of a fit are the order's upload per epoch
// and the final read-back; on the CPU they cost nothing.
#include "torch_trainer/torch_trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/finite.h"
#include "core/framed_file.h"
#include "data/sampling.h"
#include "torch_trainer/net.h"
#include "torch_trainer/trainer_device.h"

namespace starling::torch_trainer {
namespace {

using client::DataView;
using client::EvalResult;
using client::FitConfig;
using client::FitResult;

constexpr size_t kEvalBatch = 256;  // evaluation batch: bounds scratch, not the result

class TorchTrainer final : public client::Trainer {
 public:
  TorchTrainer(std::unique_ptr<detail::Net> net, size_t rows, size_t cols, uint32_t classes,
               double momentum, const Device& device)
      : net_(std::move(net)),
        rows_(rows),
        cols_(cols),
        classes_(classes),
        momentum_(momentum),
        device_(device.cuda()
                    ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device.index))
                    : torch::Device(torch::kCPU)) {
    bind();
    if (device_.is_cuda()) trialForward();
  }

  std::string name() const override { return net_->name(); }
  double momentum() const override { return momentum_; }
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

  // The constructed values, then PyTorch's Linear/Conv defaults (client::initLikePyTorch) unless
  // the net keeps its saved values (TorchScript's init=file).
  void initParameters(std::span<float> params, uint64_t seed) const override {
    checkParams(params.size());
    std::copy(saved_.begin(), saved_.end(), params.begin());
    if (!net_->initFromSavedValues()) client::initLikePyTorch(layout_, trainable_, params, seed);
  }

  FitResult fit(std::span<float> params, const DataView& data, const FitConfig& cfg,
                RngStream& rng) override;
  EvalResult evaluate(std::span<const float> params, const DataView& data) override;

  // fit() from `start` with the trained model left on the device (trainer_device.h).
  FitResult fitOnDevice(std::span<const float> start, const DataView& data, const FitConfig& cfg,
                        RngStream& rng, torch::Tensor* start_copy) {
    FitResult r = train(start, data, cfg, rng, start_copy);
    if (!torch::isfinite(flat_).all().item<bool>())
      diverged(cfg, "a parameter is not finite after the last step");
    return r;
  }
  const torch::Tensor& values() const { return flat_; }

 private:
  // Everything of fit() but the copy back: the trained model is in flat_. With `start_copy`, the
  // start as loaded is copied there on the device (one buffer, kept between calls) before training.
  FitResult train(std::span<const float> start, const DataView& data, const FitConfig& cfg,
                  RngStream& rng, torch::Tensor* start_copy = nullptr);
  [[noreturn]] void diverged(const FitConfig& cfg, const std::string& what) const {
    STARLING_THROW(client::DivergenceError, spec(), ": training diverged: ", what,
                   " (learning rate ", cfg.lr,
                   " too high for this model and data?); the parameters are left as they were");
  }
  void bind();
  void checkParams(size_t n) const {
    STARLING_CHECK_ARG(n == layout_.numel(), spec(), ": params has ", n,
                       " floats, the model's layout has ", layout_.numel());
  }
  void checkData(const DataView& data) const {
    client::checkDataView(data, features(), classes_, /*reads_bytes=*/true);
    if (net_->needsImageShape())
      STARLING_CHECK_ARG(data.dataset->rows == rows_ && data.dataset->cols == cols_,
                         "DataView: the dataset's images are ", data.dataset->rows, "x",
                         data.dataset->cols, ", the model '", spec(), "' was built for ", rows_,
                         "x", cols_);
  }
  // A forward pass on two zero images on the device, so that a model that cannot run there (a
  // TorchScript module that makes CPU tensors in forward, which Module::to does not move) is a
  // ConfigError now rather than a failure in the middle of a round.
  void trialForward() {
    torch::NoGradGuard no_grad;
    net_->setTraining(false);
    try {
      net_->forward(torch::zeros({2, 1, static_cast<int64_t>(rows_), static_cast<int64_t>(cols_)},
                                 flat_.options()));
    } catch (const std::exception& e) {
      std::string what = e.what();
      if (const auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
      STARLING_THROW(ConfigError, net_->spec(), ": the model does not run on ", device_.str(), ": ",
                     what);
    }
    net_->setTraining(true);
  }
  // A tensor over host memory (no copy).
  static torch::Tensor hostView(std::span<const float> v) {
    return torch::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())},
                            torch::kFloat32);
  }
  void load(std::span<const float> params) { flat_.copy_(hostView(params)); }
  // The trained values on the host: flat_ itself on the CPU, a copy on a GPU.
  std::span<const float> hostValues();
  // The caller's host span on the device: a view on the CPU, a copy into `buf` on a GPU.
  torch::Tensor onDevice(std::span<const float> v, torch::Tensor& buf);
  // Makes images_ and labels_ index the data set `d` on the device (from the cache when it holds
  // it).
  void attach(const data::Dataset& d);
  // Uploads `order` as the int64 index tensor order_dev_ (one copy; the host waits for it).
  void uploadOrder(std::span<const size_t> order);
  // The examples order_dev_[start, start + n) gathered into the batch scratch: x [n, 1, rows,
  // cols] and y [n].
  std::pair<torch::Tensor, torch::Tensor> gather(size_t start, size_t n);

  std::unique_ptr<detail::Net> net_;
  size_t rows_, cols_;
  uint32_t classes_;
  double momentum_;
  torch::Device device_;
  ParamLayout layout_;
  size_t param_numel_ = 0;    // the trainable prefix of the layout
  std::vector<float> saved_;  // every tensor's value at construction
  size_t trainable_ = 0;      // the layout's first tensors are the trainable ones
  torch::Tensor flat_, grad_, velocity_;
  torch::Tensor host_;                 // GPU only: the trained values copied back
  torch::Tensor anchor_, correction_;  // GPU only: FedProx's anchor, SCAFFOLD's correction
  torch::Tensor x_, y_;                // batch scratch on the device, grown on demand
  // The attached data set: images [N, features] (float32, or uint8 for a data set that holds
  // bytes) and labels [N] (int64) on the device.
  torch::Tensor images_, labels_;
  // A data set that holds bytes: batch scratch of bytes and of their indices into lut_, the 256
  // values byte / 255.0f computed on the host (a CUDA division by a scalar multiplies by its
  // reciprocal, which differs from the division in the last bit for half the bytes).
  torch::Tensor xb_, xi_, lut_;
  // What identifies a data set, and the last two attached (a worker's training set and its test
  // set: an evaluation round does not evict the training set from a GPU).
  struct DataKey {
    const void* images = nullptr;
    bool bytes = false;
    const uint8_t* labels = nullptr;
    size_t size = 0, features = 0;
    uint64_t checksum = 0;
    bool operator==(const DataKey&) const = default;
  };
  struct Attached {
    DataKey key;
    torch::Tensor images, labels;
  };
  std::array<Attached, 2> attached_;  // [0] the most recent
  std::vector<size_t> order_;
  std::vector<int64_t> order64_;
  torch::Tensor order_dev_;
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

  net_->to(device_);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  flat_ = torch::empty({static_cast<int64_t>(layout_.numel())}, opts);
  grad_ = torch::zeros({static_cast<int64_t>(param_numel_)}, opts);
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
  const torch::Tensor host = flat_.to(torch::kCPU);
  std::memcpy(saved_.data(), host.data_ptr<float>(), saved_.size() * sizeof(float));

  trainable_ = params.size();
}

std::span<const float> TorchTrainer::hostValues() {
  if (device_.is_cpu()) return {flat_.data_ptr<float>(), layout_.numel()};
  if (!host_.defined())
    host_ = torch::empty({static_cast<int64_t>(layout_.numel())},
                         torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true));
  host_.copy_(flat_);  // waits for the device: the values are read right after
  return {host_.data_ptr<float>(), layout_.numel()};
}

torch::Tensor TorchTrainer::onDevice(std::span<const float> v, torch::Tensor& buf) {
  if (device_.is_cpu()) return hostView(v);
  if (!buf.defined()) buf = torch::empty({static_cast<int64_t>(v.size())}, flat_.options());
  buf.copy_(hostView(v));
  return buf;
}

void TorchTrainer::attach(const data::Dataset& d) {
  const size_t f = d.features(), n = d.size();
  // The labels in full and up to 4,096 pixels spread over the images: another data set, or this
  // one with other labels, differs somewhere in them. (An edit of pixels outside the sample goes
  // unseen on a GPU, which keeps its copy: replace a data set rather than edit it in place.)
  // The labels through frameChecksum's four lanes of words (a fit of a small client attaches the
  // data set again: byte by byte this was a tenth of a 60-example client's time on Fashion-MNIST).
  uint64_t sum = 1469598103934665603ull;
  const auto mix = [&sum](uint64_t v) { sum = (sum ^ v) * 1099511628211ull; };
  mix(frameChecksum(d.labels));
  const bool bytes = d.holdsBytes();
  const size_t pixels = bytes ? d.pixels.size() : d.images.size(),
               stride = std::max<size_t>(1, pixels / 4096);
  for (size_t i = 0; i < pixels; i += stride) {
    uint32_t bits = 0;
    if (bytes)
      bits = d.pixels[i];
    else
      std::memcpy(&bits, &d.images[i], 4);
    mix(bits);
  }
  const DataKey key{bytes ? static_cast<const void*>(d.pixels.data()) : d.images.data(),
                    bytes,
                    d.labels.data(),
                    n,
                    f,
                    sum};
  if (attached_[1].images.defined() && attached_[1].key == key)
    std::swap(attached_[0], attached_[1]);
  if (!(attached_[0].images.defined() && attached_[0].key == key)) {
    const auto rows = static_cast<int64_t>(n), cols = static_cast<int64_t>(f);
    // On the CPU a view of the data set's own memory; on a GPU one copy of it, kept while it is
    // one of the last two used. Both tensors are made before anything is replaced.
    const torch::Tensor host =
        bytes ? torch::from_blob(const_cast<uint8_t*>(d.pixels.data()), {rows, cols}, torch::kUInt8)
              : hostView(d.images).view({rows, cols});
    Attached a{key, device_.is_cpu() ? host : host.to(device_),
               torch::from_blob(const_cast<uint8_t*>(d.labels.data()), {rows}, torch::kUInt8)
                   .to(torch::TensorOptions().dtype(torch::kInt64).device(device_))};
    attached_[1] = std::move(attached_[0]);
    attached_[0] = std::move(a);
  }
  images_ = attached_[0].images;
  labels_ = attached_[0].labels;
}

void TorchTrainer::uploadOrder(std::span<const size_t> order) {
  order64_.assign(order.begin(), order.end());
  const torch::Tensor host =
      torch::from_blob(order64_.data(), {static_cast<int64_t>(order64_.size())}, torch::kInt64);
  if (device_.is_cpu()) {
    order_dev_ = host;
    return;
  }
  if (!order_dev_.defined() || order_dev_.numel() < host.numel())
    order_dev_ =
        torch::empty({host.numel()}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
  order_dev_.narrow(0, 0, host.numel())
      .copy_(host);  // pageable memory: the host waits for the copy
}

std::pair<torch::Tensor, torch::Tensor> TorchTrainer::gather(size_t start, size_t n) {
  const auto rows = static_cast<int64_t>(n), f = static_cast<int64_t>(features());
  if (!x_.defined() || x_.size(0) < rows) {
    x_ = torch::empty({rows, f}, flat_.options());
    y_ = torch::empty({rows}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
  }
  const torch::Tensor idx = order_dev_.narrow(0, static_cast<int64_t>(start), rows);
  torch::Tensor x = x_.narrow(0, 0, rows), y = y_.narrow(0, 0, rows);
  if (images_.scalar_type() == torch::kUInt8) {
    // Bytes: gathered as bytes, then looked up in lut_: the float loader's value exactly, on every
    // device.
    if (!lut_.defined()) {
      std::array<float, 256> values;
      for (size_t k = 0; k < values.size(); ++k) values[k] = static_cast<float>(k) / 255.0f;
      lut_ = torch::from_blob(values.data(), {256}, torch::kFloat32)
                 .to(device_, /*non_blocking=*/false,
                     /*copy=*/true);
    }
    if (!xb_.defined() || xb_.size(0) < rows) {
      xb_ = torch::empty({rows, f}, images_.options());
      xi_ = torch::empty({rows * f}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
    }
    torch::Tensor xb = xb_.narrow(0, 0, rows), xi = xi_.narrow(0, 0, rows * f);
    torch::index_select_out(xb, images_, 0, idx);
    xi.copy_(xb.view({-1}));
    torch::Tensor flat = x.view({-1});
    torch::index_select_out(flat, lut_, 0, xi);
  } else {
    torch::index_select_out(x, images_, 0, idx);
  }
  torch::index_select_out(y, labels_, 0, idx);
  return {x.view({rows, 1, static_cast<int64_t>(rows_), static_cast<int64_t>(cols_)}), y};
}

FitResult TorchTrainer::fit(std::span<float> params, const DataView& data, const FitConfig& cfg,
                            RngStream& rng) {
  // params stay untouched until the copy back: a divergence needs no rollback
  FitResult r = train(params, data, cfg, rng);
  const std::span<const float> trained = hostValues();
  if (!allFinite(trained)) diverged(cfg, "a parameter is not finite after the last step");
  std::copy(trained.begin(), trained.end(), params.begin());
  return r;
}

FitResult TorchTrainer::train(std::span<const float> from, const DataView& data,
                              const FitConfig& cfg, RngStream& rng, torch::Tensor* start_copy) {
  cfg.check();
  checkParams(from.size());
  client::checkGradientTerms(cfg, from.size());
  checkData(data);
  attach(*data.dataset);
  load(from);
  if (start_copy) {
    if (!start_copy->defined() || !start_copy->is_same_size(flat_) ||
        start_copy->device() != flat_.device())
      *start_copy = torch::empty_like(flat_);
    start_copy->copy_(flat_);  // on the device: no second copy from the host
  }
  order_.assign(data.indices.begin(), data.indices.end());

  net_->setTraining(true);
  torch::Tensor step_params = flat_.narrow(0, 0, static_cast<int64_t>(param_numel_));
  if (momentum_ > 0) {
    if (!velocity_.defined()) velocity_ = torch::empty_like(grad_);
    velocity_.zero_();
  }
  // FedProx's anchor and SCAFFOLD's correction, over the trained parameters (the prefix of the
  // flat buffer; running statistics after it are not trained).
  const auto prefix = static_cast<int64_t>(param_numel_);
  const auto mu = static_cast<float>(cfg.prox_mu);
  torch::Tensor anchor, correction;
  if (mu > 0) anchor = onDevice(cfg.prox_anchor.first(param_numel_), anchor_).narrow(0, 0, prefix);
  if (!cfg.correction.empty())
    correction = onDevice(cfg.correction.first(param_numel_), correction_).narrow(0, 0, prefix);
  // Summed on the device, read once at the end: the batch losses (each as a double times its
  // examples, as client/trainer.h defines train_loss) and the correct predictions.
  const torch::Tensor loss_sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
  const torch::Tensor correct =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
  size_t seen = 0;
  for (uint32_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    data::shuffleInPlace(std::span<size_t>(order_), rng);
    uploadOrder(order_);
    for (size_t start = 0; start < order_.size(); start += cfg.batch_size) {
      if (cfg.stop && cfg.stop->load(std::memory_order_relaxed))  // a host flag: no device sync
        STARLING_THROW(client::TrainingStopped, spec(), ": training stopped at epoch ", epoch + 1,
                       ", example ", start, " of ", order_.size(),
                       "; the parameters are left as they were");
      const size_t n = std::min<size_t>(cfg.batch_size, order_.size() - start);
      const auto [x, y] = gather(start, n);
      grad_.zero_();
      const torch::Tensor logits = net_->forward(x);
      const torch::Tensor loss = torch::cross_entropy_loss(logits, y);
      {
        torch::NoGradGuard no_grad;
        loss_sum.add_(loss.detach().to(torch::kFloat64), static_cast<double>(n));
        correct.add_(logits.argmax(1).eq(y).sum());
      }
      seen += n;
      loss.backward();
      torch::NoGradGuard no_grad;
      if (mu > 0) grad_.add_(step_params, mu).add_(anchor, -mu);  // FedProx: + mu (w - anchor)
      if (correction.defined()) grad_.add_(correction);           // SCAFFOLD
      if (momentum_ > 0) {
        velocity_.mul_(momentum_).add_(grad_);
        step_params.add_(velocity_, -cfg.lr);
      } else {
        step_params.add_(grad_, -cfg.lr);
      }
    }
  }
  // A non-finite batch loss makes the sum non-finite; training went on to the end, but nothing of
  // it reaches params.
  const double loss_total = loss_sum.item<double>();
  if (!std::isfinite(loss_total))
    diverged(cfg, ::starling::detail::concat("a batch loss was ", loss_total, " (over ", cfg.epochs,
                                             " epoch", cfg.epochs == 1 ? "" : "s", " of ",
                                             order_.size(), " examples)"));

  FitResult r;
  r.num_examples = data.size();
  r.metrics = {
      {"train_loss", loss_total / static_cast<double>(seen)},
      {"train_accuracy", static_cast<double>(correct.item<int64_t>()) / static_cast<double>(seen)}};
  return r;
}

EvalResult TorchTrainer::evaluate(std::span<const float> params, const DataView& data) {
  checkParams(params.size());
  checkData(data);
  attach(*data.dataset);
  load(params);
  net_->setTraining(false);
  torch::NoGradGuard no_grad;
  uploadOrder(data.indices);
  const torch::Tensor loss_sum =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
  const torch::Tensor correct =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
  for (size_t start = 0; start < data.indices.size(); start += kEvalBatch) {
    const size_t n = std::min(kEvalBatch, data.indices.size() - start);
    const auto [x, y] = gather(start, n);
    const torch::Tensor logits = net_->forward(x);
    loss_sum.add_(torch::cross_entropy_loss(logits, y, {}, at::Reduction::Sum).to(torch::kFloat64));
    correct.add_(logits.argmax(1).eq(y).sum());
  }
  EvalResult r;
  r.num_examples = data.size();
  r.loss = loss_sum.item<double>() / static_cast<double>(data.size());
  r.accuracy = static_cast<double>(correct.item<int64_t>()) / static_cast<double>(data.size());
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
                                      uint32_t classes, double momentum, const Device& device) {
  return std::make_unique<TorchTrainer>(std::move(net), rows, cols, classes, momentum, device);
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
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes,
                   const Device& device) -> Made {
                  const double m = readMomentum(r);
                  checkShape("logreg", rows, cols, classes, 1);
                  checkNumel("logreg", classes, rows * cols);
                  return wrap(detail::makeLogreg(rows, cols, classes), rows, cols, classes, m,
                              device);
                }},
          Entry{"softmax",
                "softmax regression (LibTorch) initialised at zero, as the Eigen client's softmax: "
                "fc.weight [classes, features], fc.bias",
                kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes,
                   const Device& device) -> Made {
                  const double m = readMomentum(r);
                  checkShape("softmax", rows, cols, classes, 1);
                  checkNumel("softmax", classes, rows * cols);
                  return wrap(detail::makeLogreg(rows, cols, classes, /*zero_init=*/true), rows,
                              cols, classes, m, device);
                }},
          Entry{"mlp",
                "one ReLU hidden layer (LibTorch): fc1 [hidden, features], fc2 [classes, hidden]",
                std::string("hidden=200 (hidden units, >= 1), ") + kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes,
                   const Device& device) -> Made {
                  const uint32_t hidden = r.count("hidden", 200);
                  const double m = readMomentum(r);
                  if (hidden == 0)
                    STARLING_THROW(ConfigError, "torch trainer 'mlp': hidden=0 must be at least 1");
                  checkShape("mlp", rows, cols, classes, 1);
                  checkNumel("mlp", hidden, rows * cols);
                  return wrap(detail::makeMlp(rows, cols, classes, hidden), rows, cols, classes, m,
                              device);
                }},
          Entry{"cnn",
                "McMahan et al. 2017 CNN: 2 x (conv5x5 'same' + ReLU + maxpool2; 32, 64 channels), "
                "fc 512 + ReLU, fc classes (1,663,370 parameters at 28x28, 10 classes)",
                kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes,
                   const Device& device) -> Made {
                  const double m = readMomentum(r);
                  checkShape("cnn", rows, cols, classes, 4);
                  checkNumel("cnn", 512, 64 * (rows / 4) * (cols / 4));
                  return wrap(detail::makeCnn(rows, cols, classes), rows, cols, classes, m, device);
                }},
          Entry{"resnet",
                "ResNet-8: conv3x3 16 + BN, 3 stages of one basic block (16/32/64 channels), "
                "global average pool, fc; BatchNorm running statistics travel in the layout",
                kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes,
                   const Device& device) -> Made {
                  const double m = readMomentum(r);
                  checkShape("resnet", rows, cols, classes, 1);
                  return wrap(detail::makeResnet(rows, cols, classes), rows, cols, classes, m,
                              device);
                }},
          Entry{"torchscript",
                "a module saved with torch.jit.save: forward(x) -> logits [N, classes]",
                std::string("path=FILE (required), input=image (image: x is [N, 1, rows, cols]; "
                            "flat: [N, rows*cols]), init=file (file: the saved values; seed: "
                            "PyTorch's Linear/Conv defaults from the seed), ") +
                    kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes,
                   const Device& device) -> Made {
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
                              rows, cols, classes, m, device);
                }},
      });
  return registry;
}

namespace detail {

bool isTorchTrainer(const client::Trainer& t) {
  return dynamic_cast<const TorchTrainer*>(&t) != nullptr;
}

namespace {
TorchTrainer& torchTrainer(client::Trainer& t) {
  auto* tt = dynamic_cast<TorchTrainer*>(&t);
  STARLING_CHECK_ARG(tt != nullptr, t.spec(), " is not a LibTorch trainer");
  return *tt;
}
}  // namespace

client::FitResult fitOnDevice(client::Trainer& t, std::span<const float> start,
                              const client::DataView& data, const client::FitConfig& cfg,
                              RngStream& rng, torch::Tensor* start_on_device) {
  return torchTrainer(t).fitOnDevice(start, data, cfg, rng, start_on_device);
}

torch::Tensor deviceValues(client::Trainer& t) { return torchTrainer(t).values(); }

}  // namespace detail

std::unique_ptr<client::Trainer> makeTorchTrainer(std::string_view spec, size_t rows, size_t cols,
                                                  uint32_t classes, const Device& device) {
  return torchTrainers().make(spec, rows, cols, classes, device);
}

std::unique_ptr<client::Trainer> makeTorchTrainer(std::string_view spec, const data::Dataset& d,
                                                  const Device& device) {
  return makeTorchTrainer(spec, d.rows, d.cols, d.num_classes, device);
}

}  // namespace starling::torch_trainer
