#pragma once
// Internal to torch_trainer/ (includes LibTorch; never include it from a public header).
//
// Net: what the LibTorch trainer drives. A Net owns its tensors but not their values' layout:
// the trainer rebinds every tensor onto views of its one flat storage (Tensor::set_data), so the
// Net only promises that forward() reads the tensors it listed, and that training mode updates
// its float buffers in place (BatchNorm's running statistics).
//
// Built-in nets are written with functional ops over explicitly named tensors (no nn::Module):
// their constructors draw nothing from LibTorch's global generator, and the names are those the
// equivalent PyTorch module would give ("conv1.weight", "layer2.0.downsample.1.running_var").
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace starling::torch_trainer::detail {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

class Net {
 public:
  virtual ~Net() = default;
  virtual std::string name() const = 0;
  virtual std::string spec() const = 0;
  // Logits [N, classes] for x [N, 1, rows, cols] (contiguous).
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  virtual void setTraining(bool on) = 0;
  // Trainable tensors, then float buffers, in layout order. The tensors alias the net's own.
  virtual NamedTensors parameters() = 0;
  virtual NamedTensors buffers() = 0;
  // True when initParameters() keeps the constructed values for every tensor (TorchScript's
  // init=file); otherwise the PyTorch-default rule of torch_trainer.cc applies.
  virtual bool initFromSavedValues() const { return false; }
  // True when the input's image shape matters (not only rows * cols): the trainer then checks a
  // data set's rows and cols, not only its number of features.
  virtual bool needsImageShape() const { return true; }
  // Moves whatever the net holds besides the listed tensors onto `device` (a TorchScript module's
  // integer buffers and constants); the trainer moves the listed tensors itself.
  virtual void to(const torch::Device& /*device*/) {}
};

// The built-in models (models.cc). Sizes are checked by the caller (torch_trainer.cc).
// zero_init: "softmax", the same model started at zero (the Eigen client's softmax).
std::unique_ptr<Net> makeLogreg(size_t rows, size_t cols, uint32_t classes, bool zero_init = false);
std::unique_ptr<Net> makeMlp(size_t rows, size_t cols, uint32_t classes, uint32_t hidden);
std::unique_ptr<Net> makeCnn(size_t rows, size_t cols, uint32_t classes);
std::unique_ptr<Net> makeResnet(size_t rows, size_t cols, uint32_t classes);

// A TorchScript module from `path` (models.cc): IoError when the file is missing or not a
// loadable module, ConfigError when it has no forward method, non-float32 parameters, or its
// forward does not map a batch of two inputs to logits [2, classes].
std::unique_ptr<Net> loadScript(const std::string& path, bool flat_input, bool init_from_file,
                                size_t rows, size_t cols, uint32_t classes);

}  // namespace starling::torch_trainer::detail
