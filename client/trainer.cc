#include "client/trainer.h"

#include <cmath>
#include <limits>

#include "client/eigen_model.h"
#include "client/eigen_trainer.h"
#include "core/error.h"

namespace starling::client {

void FitConfig::check() const {
  if (epochs == 0) STARLING_THROW(ConfigError, "fit: epochs=0 must be at least 1");
  if (batch_size == 0) STARLING_THROW(ConfigError, "fit: batch_size=0 must be at least 1");
  // Trainers step in float: an lr past the float range would become infinite.
  if (!std::isfinite(lr) || lr <= 0 || lr > std::numeric_limits<float>::max())
    STARLING_THROW(ConfigError, "fit: learning rate lr=", lr,
                   " must be a finite number > 0 (and a finite float)");
  if (!(prox_mu >= 0 && prox_mu <= 1e4))
    STARLING_THROW(ConfigError, "fit: proximal term prox_mu=", prox_mu, " must be in [0, 10000]");
  // The proximal term alone scales w - anchor by (1 - lr mu) each step: it diverges from 2 on.
  if (lr * prox_mu >= 2)
    STARLING_THROW(ConfigError, "fit: lr x prox_mu = ", lr * prox_mu, " must be below 2 (lr ", lr,
                   ", prox_mu ", prox_mu,
                   "), or every step moves the model further from the global one");
}

uint64_t FitConfig::steps(size_t examples) const {
  return static_cast<uint64_t>(epochs) * ((examples + batch_size - 1) / batch_size);
}

void checkGradientTerms(const FitConfig& cfg, size_t numel) {
  if (cfg.prox_mu > 0)
    STARLING_CHECK_ARG(cfg.prox_anchor.size() == numel, "fit: the proximal anchor has ",
                       cfg.prox_anchor.size(), " floats, the model ", numel);
  STARLING_CHECK_ARG(cfg.correction.empty() || cfg.correction.size() == numel,
                     "fit: the SCAFFOLD correction has ", cfg.correction.size(),
                     " floats, the model ", numel);
}

void checkDataView(const DataView& data, size_t features, uint32_t classes, bool reads_bytes) {
  STARLING_CHECK_ARG(data.dataset != nullptr, "DataView: no dataset");
  const data::Dataset& d = *data.dataset;
  STARLING_CHECK_ARG(
      reads_bytes || !d.holdsBytes(),
      "DataView: the dataset holds its examples as bytes (data::IdxOptions::keep_bytes), "
      "which only the LibTorch trainer reads");
  const size_t values = d.holdsBytes() ? d.pixels.size() : d.images.size();
  STARLING_CHECK_ARG(!data.indices.empty(),
                     "DataView: no examples (an empty view cannot be trained or evaluated)");
  STARLING_CHECK_ARG(d.features() == features, "DataView: the dataset has ", d.features(),
                     " features per example, the model expects ", features);
  // A Dataset is a plain struct: check that its arrays agree before indexing them.
  STARLING_CHECK_ARG(features > 0 && values % features == 0 && values / features == d.labels.size(),
                     "DataView: the dataset has ", values, " pixel values for ", d.labels.size(),
                     " labels of ", features, " features");
  for (size_t i : data.indices) {
    STARLING_CHECK_ARG(i < d.size(), "DataView: index ", i, " is out of range for a dataset of ",
                       d.size(), " examples");
    STARLING_CHECK_ARG(d.labels[i] < classes, "DataView: example ", i, " has label ",
                       int{d.labels[i]}, ", the model has ", classes, " classes");
  }
}

double pytorchInitBound(const ParamLayout& layout, size_t trainable, size_t i) {
  STARLING_CHECK_ARG(trainable <= layout.size() && i < layout.size(), "pytorchInitBound: tensor ",
                     i, " of ", trainable, " trainable in a layout of ", layout.size());
  if (i >= trainable) return 0;
  const TensorSpec& s = layout[i];
  const auto endsWith = [](const std::string& name, std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (s.shape.size() >= 2 && endsWith(s.name, "weight"))
    return 1.0 / std::sqrt(static_cast<double>(s.cols()));
  if (s.shape.size() == 1 && endsWith(s.name, "bias")) {
    const std::string weight = s.name.substr(0, s.name.size() - 4) + "weight";
    if (const auto w = layout.find(weight); w && *w < trainable && layout[*w].shape.size() >= 2)
      return 1.0 / std::sqrt(static_cast<double>(layout[*w].cols()));
  }
  return 0;
}

void initLikePyTorch(const ParamLayout& layout, size_t trainable, std::span<float> params,
                     uint64_t seed) {
  STARLING_CHECK_ARG(params.size() == layout.numel(), "initLikePyTorch: params has ", params.size(),
                     " floats, the layout ", layout.numel());
  for (size_t i = 0; i < trainable; ++i) {
    const double bound = pytorchInitBound(layout, trainable, i);
    if (bound == 0) continue;
    RngStream rng(StreamKey{seed, 0, kAnyClient, StreamPurpose::kTraining, i});
    for (float& v : layout.slice(params, i))
      v = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
  }
}

namespace {

double readMomentum(OptionReader& r) {
  const double m = r.number("momentum", 0.0);
  if (!(m >= 0 && m < 1))
    STARLING_THROW(ConfigError, "trainer: momentum=", m, " must be in [0, 1)");
  return m;
}

// A flat model reads rows * cols features (0 is the model's InvalidArgument).
size_t flatFeatures(size_t rows, size_t cols) { return rows * cols; }

constexpr const char* kMomentumOption = "momentum=0 (SGD momentum in [0, 1), restarted each fit)";

}  // namespace

const TrainerRegistry& trainers() {
  using Entry = TrainerRegistry::Entry;
  using Made = std::unique_ptr<Trainer>;
  static const TrainerRegistry registry(
      "trainer",
      {
          Entry{"softmax",
                "softmax regression (Eigen), initialised at zero: fc.weight [classes, features], "
                "fc.bias [classes]",
                kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes) -> Made {
                  const double m = readMomentum(r);
                  return std::make_unique<EigenTrainer>(
                      makeSoftmaxModel(flatFeatures(rows, cols), classes), m);
                }},
          Entry{"logreg",
                "softmax regression (Eigen), initialised as PyTorch's Linear: fc.weight [classes, "
                "features], fc.bias [classes]",
                kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes) -> Made {
                  const double m = readMomentum(r);
                  return std::make_unique<EigenTrainer>(
                      makeLogregModel(flatFeatures(rows, cols), classes), m);
                }},
          Entry{"mlp",
                "one ReLU hidden layer (Eigen): fc1 [hidden, features], fc2 [classes, hidden]",
                std::string("hidden=200 (hidden units, >= 1), ") + kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes) -> Made {
                  const uint32_t hidden = r.count("hidden", 200);
                  const double m = readMomentum(r);
                  return std::make_unique<EigenTrainer>(
                      makeMlpModel(flatFeatures(rows, cols), classes, hidden), m);
                }},
          Entry{"cnn",
                "McMahan et al. 2017 CNN (Eigen): 2 x (conv5x5 'same' + ReLU + maxpool2; 32, 64 "
                "channels), fc 512 + ReLU, fc classes (1,663,370 parameters at 28x28, 10 classes)",
                kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes) -> Made {
                  const double m = readMomentum(r);
                  return std::make_unique<EigenTrainer>(makeCnnModel(rows, cols, classes), m);
                }},
          Entry{"resnet",
                "ResNet-8 (Eigen): conv3x3 16 + BN, 3 stages of one basic block (16/32/64 "
                "channels), global average pool, fc; BatchNorm running statistics travel in the "
                "layout",
                kMomentumOption,
                [](OptionReader& r, size_t rows, size_t cols, uint32_t classes) -> Made {
                  const double m = readMomentum(r);
                  return std::make_unique<EigenTrainer>(makeResnetModel(rows, cols, classes), m);
                }},
      });
  return registry;
}

std::unique_ptr<Trainer> makeTrainer(std::string_view spec, size_t rows, size_t cols,
                                     uint32_t classes) {
  return trainers().make(spec, rows, cols, classes);
}

std::unique_ptr<Trainer> makeTrainer(std::string_view spec, size_t features, uint32_t classes) {
  return trainers().make(spec, size_t{1}, features, classes);
}

std::unique_ptr<Trainer> makeTrainer(std::string_view spec, const data::Dataset& d) {
  return trainers().make(spec, d.rows, d.cols, d.num_classes);
}

}  // namespace starling::client
