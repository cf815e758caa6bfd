// The built-in LibTorch models and the TorchScript loader (one of the two LibTorch translation
// units of this module, with torch_trainer.cc).
#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>

#include "core/error.h"
#include "torch_trainer/net.h"

namespace starling::torch_trainer::detail {
namespace {

// A named tensor of the given shape, appended to `list`. Values are placeholders replaced by
// initParameters(); `fill` is what the PyTorch module would construct deterministically
// (BatchNorm's weight and running_var are 1), which initParameters keeps.
torch::Tensor add(NamedTensors& list, std::string name, std::initializer_list<int64_t> shape,
                  bool trainable, float fill = 0.0f) {
  torch::Tensor t = torch::full(shape, fill, torch::dtype(torch::kFloat32));
  if (trainable) t.requires_grad_(true);
  list.emplace_back(std::move(name), t);
  return t;
}

// conv2d with explicit stride and padding (a literal 0 padding is ambiguous with the string form).
torch::Tensor conv(const torch::Tensor& x, const torch::Tensor& w,
                   const c10::optional<torch::Tensor>& b, int64_t stride, int64_t pad) {
  return torch::conv2d(x, w, b, at::IntArrayRef(stride), at::IntArrayRef(pad));
}

class BuiltinNet : public Net {
 public:
  void setTraining(bool on) override { training_ = on; }
  NamedTensors parameters() override { return params_; }
  NamedTensors buffers() override { return buffers_; }

 protected:
  NamedTensors params_, buffers_;
  bool training_ = true;
};

// logreg, or softmax: the same model started at zero (the Eigen client's softmax; its loss is
// convex), so that one configuration file runs in the simulator and on deployed clients.
class Logreg final : public BuiltinNet {
 public:
  Logreg(size_t features, uint32_t classes, bool zero_init) : zero_init_(zero_init) {
    const auto f = static_cast<int64_t>(features), c = static_cast<int64_t>(classes);
    w_ = add(params_, "fc.weight", {c, f}, true);
    b_ = add(params_, "fc.bias", {c}, true);
  }
  std::string name() const override { return zero_init_ ? "softmax" : "logreg"; }
  std::string spec() const override { return name(); }
  bool initFromSavedValues() const override { return zero_init_; }
  bool needsImageShape() const override { return false; }
  torch::Tensor forward(const torch::Tensor& x) override {
    return torch::linear(x.flatten(1), w_, b_);
  }

 private:
  bool zero_init_;
  torch::Tensor w_, b_;
};

class Mlp final : public BuiltinNet {
 public:
  Mlp(size_t features, uint32_t classes, uint32_t hidden) : hidden_(hidden) {
    const auto f = static_cast<int64_t>(features), c = static_cast<int64_t>(classes),
               h = static_cast<int64_t>(hidden);
    w1_ = add(params_, "fc1.weight", {h, f}, true);
    b1_ = add(params_, "fc1.bias", {h}, true);
    w2_ = add(params_, "fc2.weight", {c, h}, true);
    b2_ = add(params_, "fc2.bias", {c}, true);
  }
  std::string name() const override { return "mlp"; }
  std::string spec() const override { return "mlp:hidden=" + std::to_string(hidden_); }
  bool needsImageShape() const override { return false; }
  torch::Tensor forward(const torch::Tensor& x) override {
    return torch::linear(torch::relu(torch::linear(x.flatten(1), w1_, b1_)), w2_, b2_);
  }

 private:
  uint32_t hidden_;
  torch::Tensor w1_, b1_, w2_, b2_;
};

// McMahan et al. 2017's CNN with the "same" padding of their TensorFlow code.
class Cnn final : public BuiltinNet {
 public:
  Cnn(size_t rows, size_t cols, uint32_t classes) {
    const auto c = static_cast<int64_t>(classes);
    const auto flat = static_cast<int64_t>(64 * (rows / 4) * (cols / 4));
    w1_ = add(params_, "conv1.weight", {32, 1, 5, 5}, true);
    b1_ = add(params_, "conv1.bias", {32}, true);
    w2_ = add(params_, "conv2.weight", {64, 32, 5, 5}, true);
    b2_ = add(params_, "conv2.bias", {64}, true);
    w3_ = add(params_, "fc1.weight", {512, flat}, true);
    b3_ = add(params_, "fc1.bias", {512}, true);
    w4_ = add(params_, "fc2.weight", {c, 512}, true);
    b4_ = add(params_, "fc2.bias", {c}, true);
  }
  std::string name() const override { return "cnn"; }
  std::string spec() const override { return "cnn"; }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor h = torch::max_pool2d(torch::relu(conv(x, w1_, b1_, 1, 2)), 2);
    h = torch::max_pool2d(torch::relu(conv(h, w2_, b2_, 1, 2)), 2);
    return torch::linear(torch::relu(torch::linear(h.flatten(1), w3_, b3_)), w4_, b4_);
  }

 private:
  torch::Tensor w1_, b1_, w2_, b2_, w3_, b3_, w4_, b4_;
};

// ResNet-8: a ResNet (He et al. 2016, the CIFAR variant's shape) with one basic block per stage.
// Convolutions have no bias (BatchNorm follows each); BatchNorm has PyTorch's defaults
// (momentum 0.1, eps 1e-5).
class Resnet final : public BuiltinNet {
 public:
  Resnet(uint32_t classes) {
    conv1_ = add(params_, "conv1.weight", {16, 1, 3, 3}, true);
    bn1_ = bn("bn1", 16);
    int64_t in = 16;
    for (int s = 0; s < 3; ++s) {
      const int64_t out = int64_t{16} << s;
      const std::string p = "layer" + std::to_string(s + 1) + ".0.";
      Block b;
      b.stride = s == 0 ? 1 : 2;
      b.conv1 = add(params_, p + "conv1.weight", {out, in, 3, 3}, true);
      b.bn1 = bn(p + "bn1", out);
      b.conv2 = add(params_, p + "conv2.weight", {out, out, 3, 3}, true);
      b.bn2 = bn(p + "bn2", out);
      if (b.stride != 1 || in != out) {
        b.down = add(params_, p + "downsample.0.weight", {out, in, 1, 1}, true);
        b.down_bn = bn(p + "downsample.1", out);
      }
      blocks_.push_back(std::move(b));
      in = out;
    }
    fc_w_ = add(params_, "fc.weight", {static_cast<int64_t>(classes), 64}, true);
    fc_b_ = add(params_, "fc.bias", {static_cast<int64_t>(classes)}, true);
    // PyTorch lists a module's parameters before its buffers (both in registration order).
    for (auto& [name, t] : bn_buffers_) buffers_.emplace_back(name, t);
  }
  std::string name() const override { return "resnet"; }
  std::string spec() const override { return "resnet"; }
  torch::Tensor forward(const torch::Tensor& x) override {
    torch::Tensor h = torch::relu(norm(conv(x, conv1_, c10::nullopt, 1, 1), bn1_));
    for (const Block& b : blocks_) {
      torch::Tensor o = torch::relu(norm(conv(h, b.conv1, c10::nullopt, b.stride, 1), b.bn1));
      o = norm(conv(o, b.conv2, c10::nullopt, 1, 1), b.bn2);
      const torch::Tensor skip =
          b.down.defined() ? norm(conv(h, b.down, c10::nullopt, b.stride, 0), b.down_bn) : h;
      h = torch::relu(o + skip);
    }
    return torch::linear(h.mean({2, 3}), fc_w_, fc_b_);
  }

 private:
  struct Bn {
    torch::Tensor weight, bias, mean, var;
  };
  struct Block {
    int64_t stride = 1;
    torch::Tensor conv1, conv2, down;
    Bn bn1, bn2, down_bn;
  };
  Bn bn(const std::string& prefix, int64_t channels) {
    Bn b;
    b.weight = add(params_, prefix + ".weight", {channels}, true, 1.0f);
    b.bias = add(params_, prefix + ".bias", {channels}, true);
    b.mean = add(bn_buffers_, prefix + ".running_mean", {channels}, false);
    b.var = add(bn_buffers_, prefix + ".running_var", {channels}, false, 1.0f);
    return b;
  }
  torch::Tensor norm(const torch::Tensor& x, const Bn& b) const {
    return torch::batch_norm(x, b.weight, b.bias, b.mean, b.var, training_, 0.1, 1e-5,
                             at::globalContext().userEnabledCuDNN());
  }

  NamedTensors bn_buffers_;
  torch::Tensor conv1_, fc_w_, fc_b_;
  Bn bn1_;
  std::vector<Block> blocks_;
};

// ---- TorchScript ----

class ScriptNet final : public Net {
 public:
  ScriptNet(torch::jit::Module m, std::string spec, bool flat_input, bool init_from_file)
      : m_(std::move(m)), spec_(std::move(spec)), flat_(flat_input), from_file_(init_from_file) {}
  std::string name() const override { return "torchscript"; }
  std::string spec() const override { return spec_; }
  bool initFromSavedValues() const override { return from_file_; }
  bool needsImageShape() const override { return !flat_; }
  torch::Tensor forward(const torch::Tensor& x) override {
    args_.clear();
    args_.emplace_back(flat_ ? x.flatten(1) : x);
    return m_.forward(args_).toTensor();
  }
  void setTraining(bool on) override { m_.train(on); }
  void to(const torch::Device& device) override { m_.to(device); }
  NamedTensors parameters() override {
    NamedTensors out;
    for (const auto& p : m_.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
    return out;
  }
  NamedTensors buffers() override {
    NamedTensors out;
    for (const auto& b : m_.named_buffers(/*recurse=*/true))
      if (b.value.scalar_type() == torch::kFloat32) out.emplace_back(b.name, b.value);
    return out;
  }

 private:
  torch::jit::Module m_;
  std::string spec_;
  bool flat_, from_file_;
  std::vector<torch::jit::IValue> args_;
};

std::string firstLine(const char* what) {
  std::string s(what);
  if (const auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace

std::unique_ptr<Net> makeLogreg(size_t rows, size_t cols, uint32_t classes, bool zero_init) {
  return std::make_unique<Logreg>(rows * cols, classes, zero_init);
}
std::unique_ptr<Net> makeMlp(size_t rows, size_t cols, uint32_t classes, uint32_t hidden) {
  return std::make_unique<Mlp>(rows * cols, classes, hidden);
}
std::unique_ptr<Net> makeCnn(size_t rows, size_t cols, uint32_t classes) {
  return std::make_unique<Cnn>(rows, cols, classes);
}
std::unique_ptr<Net> makeResnet(size_t, size_t, uint32_t classes) {
  return std::make_unique<Resnet>(classes);
}

std::unique_ptr<Net> loadScript(const std::string& path, bool flat_input, bool init_from_file,
                                size_t rows, size_t cols, uint32_t classes) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    STARLING_THROW(IoError, "torchscript: model file '", path, "' does not exist");
  if (!std::filesystem::is_regular_file(path, ec) || !std::ifstream(path).good())
    STARLING_THROW(IoError, "torchscript: model file '", path, "' cannot be read");
  torch::jit::Module m;
  try {
    m = torch::jit::load(path, torch::Device(torch::kCPU));
  } catch (const std::exception& e) {
    STARLING_THROW(
        IoError, "torchscript: '", path,
        "' is not a TorchScript module (write it with torch.jit.save): ", firstLine(e.what()));
  }
  if (!m.find_method("forward"))
    STARLING_THROW(ConfigError, "torchscript: the module in '", path, "' has no forward method");
  size_t count = 0, trainable = 0;
  for (const auto& p : m.named_parameters(true)) {
    trainable += p.value.requires_grad() ? 1 : 0;
    if (p.value.scalar_type() != torch::kFloat32)
      STARLING_THROW(ConfigError, "torchscript: parameter '", p.name, "' of '", path, "' is ",
                     c10::toString(p.value.scalar_type()),
                     ", not float32 (convert the module with .float() before saving)");
    ++count;
  }
  if (count == 0)
    STARLING_THROW(ConfigError, "torchscript: the module in '", path, "' has no parameters");
  // requires_grad as saved: a frozen parameter travels in the layout but SGD leaves it alone.
  if (trainable == 0)
    STARLING_THROW(ConfigError, "torchscript: no parameter of the module in '", path,
                   "' requires grad (all frozen); in C++, register_parameter(name, "
                   "tensor.requires_grad_(true), false)");

  // A trial forward pass on two zero inputs, in eval mode (no buffer changes), checks the
  // contract now rather than in the middle of a round.
  const auto n = static_cast<int64_t>(2), r = static_cast<int64_t>(rows),
             c = static_cast<int64_t>(cols);
  const torch::Tensor x = flat_input ? torch::zeros({n, r * c}) : torch::zeros({n, 1, r, c});
  const std::string shape =
      (flat_input ? "[2, " + std::to_string(r * c) + "] (input=flat)"
                  : "[2, 1, " + std::to_string(r) + ", " + std::to_string(c) + "] (input=image)");
  torch::jit::IValue out;
  {
    torch::NoGradGuard no_grad;
    m.eval();
    try {
      out = m.forward({x});
    } catch (const std::exception& e) {
      STARLING_THROW(ConfigError, "torchscript: forward of '", path, "' fails on an input ", shape,
                     ": ", firstLine(e.what()));
    }
    m.train();
  }
  if (!out.isTensor())
    STARLING_THROW(ConfigError, "torchscript: forward of '", path, "' returns ", out.tagKind(),
                   ", not a Tensor of logits");
  const torch::Tensor y = out.toTensor();
  if (y.dim() != 2 || y.size(0) != 2 || y.size(1) != static_cast<int64_t>(classes) ||
      y.scalar_type() != torch::kFloat32)
    STARLING_THROW(ConfigError, "torchscript: forward of '", path, "' maps an input ", shape,
                   " to ", c10::toString(y.scalar_type()), " ", y.sizes(), "; expected float [2, ",
                   classes, "] (logits for ", classes, " classes)");

  std::string spec = "torchscript:path=" + path + ",input=" + (flat_input ? "flat" : "image") +
                     ",init=" + (init_from_file ? "file" : "seed");
  return std::make_unique<ScriptNet>(std::move(m), std::move(spec), flat_input, init_from_file);
}

}  // namespace starling::torch_trainer::detail
