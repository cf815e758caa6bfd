#pragma once
// A double-precision reference of the built-in models' local training (logreg, mlp, cnn, resnet),
// written apart from both trainers: LibTorch's functional ops in float64, which run PyTorch's own
// native kernels (oneDNN computes float32 only), so neither the Eigen client nor the LibTorch
// trainer (oneDNN on the CPU) checks itself against its own arithmetic.
//
// It answers two questions the parity tests ask of a float32 trainer:
// - what the step is: referenceFit() without `mca`, the same SGD (momentum, FedProx, SCAFFOLD,
//   BatchNorm's batch statistics and running averages) on the same batches in the same order;
// - what float32 arithmetic of that computation can promise: referenceFit() with `mca`, the same
//   computation with Monte Carlo arithmetic (Parker 1997; the method of Verificarlo and CADNA):
//   every value a float32 trainer rounds is perturbed by a random relative error of its rounding's
//   size, sqrt(n) units of float32 rounding (2^-24) for a sum of n terms (the probabilistic bound
//   of Higham and Mary 2019), and every stored parameter, velocity and running statistic is rounded
//   to float32. A few such samples spread as a float32 computation of the same step may:
//   cancellation (the conv1 gradient over many images) widens the spread, and so does a max-pool
//   window whose two largest inputs, or a ReLU input, lie within rounding of each other (a
//   near-tie), where a float32 trainer may route the gradient either way and the step moves by a
//   finite amount.
// MCA perturbs only values, never a decision the trainers do not take: the ops that round nothing
// (ReLU, max-pooling, the ordering of the batches) are exact here too.
//
// Only this test binary links it (a LibTorch translation unit); its header includes no LibTorch.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/param_layout.h"
#include "core/rng.h"
#include "data/idx.h"

namespace starling::testing {

struct ReferenceConfig {
  std::string model;    // "logreg", "mlp", "cnn" or "resnet"
  uint32_t hidden = 0;  // mlp
  double momentum = 0;
  double lr = 0.1;
  uint32_t batch_size = 32, epochs = 1;
  double prox_mu = 0;
  std::vector<float> anchor, correction;  // empty: none (layout().numel() floats otherwise)
};

// Monte Carlo arithmetic: `seed` draws the perturbations of one sample.
struct Mca {
  uint64_t seed = 1;
};

struct ReferenceResult {
  std::vector<double> params;  // and buffers, in layout order
  double train_loss = 0;       // the batch losses, weighted by their examples (client/trainer.h)
  size_t correct = 0;          // the training batches' correct predictions
};

// fit() of `start` on the examples `indices` of `d`, each epoch shuffled by `rng` as the trainers
// shuffle (data::shuffleInPlace on a copy of `indices`, epoch by epoch). Exact in double without
// `mca`; one Monte Carlo sample with it.
ReferenceResult referenceFit(const ReferenceConfig& cfg, const ParamLayout& layout,
                             const data::Dataset& d, std::span<const size_t> indices,
                             std::span<const float> start, RngStream rng, const Mca* mca = nullptr);

// The mean cross-entropy of `params` over `indices` in evaluation mode (BatchNorm on its running
// statistics), in double.
double referenceLoss(const ReferenceConfig& cfg, const ParamLayout& layout, const data::Dataset& d,
                     std::span<const size_t> indices, std::span<const float> params);

// A float32 trainer's result against the reference: a tensor, or a metric of the fit.
struct Verdict {
  std::string name;
  double error = 0;      // tensors: ||got - exact|| / ||exact - start||, relative to the step;
                         // train_loss: relative; correct predictions: their count's difference
  double tolerance = 0;  // what float32 arithmetic can promise: kMcaFactor times the largest
                         // such distance of a Monte Carlo sample to the exact result
                         // (predictions: the largest difference itself, a count)
  bool ok() const { return error <= tolerance; }
};
inline constexpr double kMcaFactor = 3.0;
inline constexpr int kMcaSamples = 6;

// The exact result and kMcaSamples Monte Carlo samples of the same fit, ready to judge trainers.
class Reference {
 public:
  Reference(const ReferenceConfig& cfg, const ParamLayout& layout, const data::Dataset& d,
            std::span<const size_t> indices, std::span<const float> start, const RngStream& rng);
  // One verdict per tensor of the layout.
  std::vector<Verdict> judge(std::span<const float> got) const;
  // train_loss and the number of correct training predictions (train_accuracy x examples).
  std::vector<Verdict> judgeMetrics(double train_loss, double train_accuracy) const;
  const ReferenceResult& exact() const { return exact_; }

 private:
  std::vector<double> distances(std::span<const float> got) const;

  const ParamLayout& layout_;
  std::vector<double> start_;
  ReferenceResult exact_;
  size_t examples_ = 0;
  std::vector<double> spread_;  // per tensor: the largest sample distance, relative to the step
  double loss_spread_ = 0;
  size_t correct_spread_ = 0;
};

}  // namespace starling::testing
