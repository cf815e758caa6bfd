#pragma once
// Trainer: local training of one model on one client's data, the part of a federated client that
// knows the model. The simulator and the deployed client both drive a Trainer; the Eigen trainers
// here (softmax, logreg, mlp, cnn, resnet) need no LibTorch, and torch_trainer/ implements the
// same interface, with the same models, on LibTorch.
//
// Contract shared by every implementation:
// - The model's parameters are one flat float buffer read through layout(); the trainer holds no
//   parameters itself. fit() trains the buffer it is given in place (the caller passes a copy of
//   the global model), evaluate() only reads it.
// - A trainer holds options and scratch buffers but no per-client state, so one object (the
//   simulator's model replica) serves many clients one after another.
// - Not thread-safe: use one trainer per thread.
// - Every random draw comes from the RngStream the caller passes (or from the seed of
//   initParameters), so a run is reproduced from its seeds whatever the scheduling.
// - Arguments are checked before anything is touched: a bad FitConfig is a ConfigError; an empty
//   view, an index or label out of range, data of the wrong width, a params span of the wrong
//   size are InvalidArgument. If training diverges (a non-finite loss or parameter), fit() throws
//   DivergenceError (an Error) and leaves params as they were on entry.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/metric.h"
#include "core/param_layout.h"
#include "core/registry.h"
#include "core/rng.h"
#include "data/idx.h"

namespace starling::client {

// Thrown by fit() when training diverges: the loss or a parameter became NaN or infinite
// (usually a learning rate too high for the data). params are left as they were on entry.
class DivergenceError : public Error {
 public:
  using Error::Error;
};

// Thrown by fit() when FitConfig::stop was set (the program is stopping): params are left as they
// were on entry. An Error, not a divergence: nothing is wrong with the model or the data.
class TrainingStopped : public Error {
 public:
  using Error::Error;
};

// The examples a client owns: indices into a data set that outlives the view. Indices may repeat
// (sampling with replacement) and need not be sorted.
struct DataView {
  const data::Dataset* dataset = nullptr;
  std::span<const size_t> indices;

  size_t size() const { return indices.size(); }
};

// Local training hyperparameters; checked by check() (ConfigError naming the bad value).
struct FitConfig {
  uint32_t epochs = 1;  // passes over the client's examples, >= 1
  uint32_t batch_size =
      32;           // examples per SGD step (the last step of an epoch may have fewer), >= 1
  double lr = 0.1;  // SGD step size, > 0 and finite as a float
  // Extra terms of every SGD step's gradient (both off by default):
  // - FedProx (Li et al., MLSys 2020): the proximal term mu/2 ||w - anchor||^2 adds
  //   prox_mu (w - prox_anchor); the anchor is the round's global model. prox_mu in [0, 1e4].
  // - SCAFFOLD (Karimireddy et al., ICML 2020): adds `correction` = c - c_i, the server's control
  //   variate minus the client's. Empty: none.
  // The spans are the caller's (ClientAlgorithm sets them per client); a trainer checks that they
  // have layout().numel() floats (InvalidArgument) and applies them to every trained parameter.
  // Trainers train a copy of params, so an anchor that aliases params stays at its value on entry.
  double prox_mu = 0.0;
  std::span<const float> prox_anchor{};
  std::span<const float> correction{};
  // When set, fit() reads it before every batch and, once it is true, throws TrainingStopped
  // (a deployed client's SIGTERM ends a long local epoch within one batch). Null: never stops.
  const std::atomic<bool>* stop = nullptr;

  void check() const;
  // Steps of one fit over `examples` examples: epochs x ceil(examples / batch_size).
  uint64_t steps(size_t examples) const;
};

// Checks the extra gradient terms of `cfg` against a model of `numel` parameters.
void checkGradientTerms(const FitConfig& cfg, size_t numel);

struct FitResult {
  // The client's number of examples (the view's size): the weight FedAvg gives its update. Not
  // multiplied by the epochs.
  uint64_t num_examples = 0;
  // At least "train_loss": the mean cross-entropy over every example seen during fit, each taken
  // with the parameters before the step that used it (as training loss is usually reported).
  // The Eigen trainers also report "train_accuracy", measured the same way.
  std::vector<Metric> metrics;
};

struct EvalResult {
  uint64_t num_examples = 0;
  double loss = 0;      // mean cross-entropy
  double accuracy = 0;  // fraction of examples whose arg-max class is the label (ties: lowest)
};

class Trainer {
 public:
  virtual ~Trainer() = default;

  virtual std::string name() const = 0;
  // The full spec with every option, e.g. "mlp:hidden=200".
  virtual std::string spec() const = 0;
  // SGD momentum of fit() (0: plain SGD, what SCAFFOLD needs; checkScaffoldTrainer asks this).
  virtual double momentum() const { return 0.0; }
  // The parameters' names and shapes; params spans must have layout().numel() floats.
  virtual const ParamLayout& layout() const = 0;
  // Input width and number of classes the model was built for.
  virtual size_t features() const = 0;
  virtual uint32_t classes() const = 0;

  // Writes initial parameters, a pure function of the seed (every party that starts from the
  // same seed gets the same model).
  virtual void initParameters(std::span<float> params, uint64_t seed) const = 0;

  // Trains params in place on the view's examples; draws the shuffling from rng.
  virtual FitResult fit(std::span<float> params, const DataView& data, const FitConfig& cfg,
                        RngStream& rng) = 0;

  // Loss and accuracy of params on the view's examples. Deterministic; draws nothing.
  virtual EvalResult evaluate(std::span<const float> params, const DataView& data) = 0;
};

// Checks the shared preconditions of fit/evaluate for a model of `features` inputs and `classes`
// classes (InvalidArgument with the offending value): a dataset is set and consistent, the view
// is non-empty, every index is in range, every label of the view is < classes. A dataset that
// holds bytes (Dataset::pixels) passes only for a trainer that `reads_bytes`.
void checkDataView(const DataView& data, size_t features, uint32_t classes,
                   bool reads_bytes = false);

// Registry of the LibTorch-free trainers; factories take (rows, cols, classes) of the data (a
// flat model reads rows * cols features). The built-in models are the LibTorch trainer's
// (torch_trainer/), with the same names, layouts, initialisation and training step, so a spec
// means the same model in the simulator and on a deployed client:
//   softmax              softmax regression initialised at zero: "fc.weight", "fc.bias"
//   logreg               softmax regression initialised as PyTorch's Linear (initLikePyTorch)
//   mlp:hidden=200       one ReLU hidden layer: "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"
//   cnn                  McMahan et al. 2017's CNN (client/cnn_model.cc)
//   resnet               ResNet-8 with BatchNorm (client/resnet_model.cc)
// Every entry takes momentum=M (SGD momentum in [0, 1), restarted each fit).
using TrainerRegistry = Registry<Trainer, size_t, size_t, uint32_t>;
const TrainerRegistry& trainers();

// makeTrainer("cnn", 28, 28, 10). ConfigError for a bad spec or an image too small for the
// model; InvalidArgument for no features, classes < 2 or a model too large for a ParamLayout.
std::unique_ptr<Trainer> makeTrainer(std::string_view spec, size_t rows, size_t cols,
                                     uint32_t classes);
// A flat input of `features` values (rows 1): makeTrainer("mlp:hidden=64", 784, 10).
std::unique_ptr<Trainer> makeTrainer(std::string_view spec, size_t features, uint32_t classes);
// The data set's image shape and classes.
std::unique_ptr<Trainer> makeTrainer(std::string_view spec, const data::Dataset& d);

// PyTorch's default initialisation of Linear and Conv layers, the rule of every built-in model of
// both trainers (Eigen here, LibTorch in torch_trainer/), so the same seed gives the same model.
// Among the first `trainable` tensors of the layout, a tensor named "...weight" with 2 or more
// dimensions draws U(-b, b) with b = 1 / sqrt(fan_in), fan_in = numel / shape[0] (Kaiming-uniform
// with a = sqrt(5)), and a 1-dimensional "...bias" whose "...weight" has 2 or more dimensions draws
// with that weight's bound. Each tensor i draws from the stream (seed, i) of core/rng.h
// (StreamPurpose::kTraining), value by value: (2u - 1) b.
// pytorchInitBound: the bound of tensor i, 0 where the rule keeps the constructed value.
double pytorchInitBound(const ParamLayout& layout, size_t trainable, size_t i);
// Overwrites the tensors the rule draws, leaves the others as they are.
void initLikePyTorch(const ParamLayout& layout, size_t trainable, std::span<float> params,
                     uint64_t seed);

}  // namespace starling::client
