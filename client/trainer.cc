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
    STARLING_THROW(ConfigError, "fit: lr x prox_mu = ", lr * prox_mu, " must be below 2 (lr ", lr, ", prox_mu ", prox_mu,
                   "), or every step moves the model further from the global one");
}

uint64_t FitConfig::steps(size_t examples) const {
  return static_cast<uint64_t>(epochs) * ((examples + batch_size - 1) / batch_size);
}

void checkGradientTerms(const FitConfig& cfg, size_t numel) {
  if (cfg.prox_mu > 0)
    STARLING_CHECK_ARG(cfg.prox_anchor.size() == numel, "fit: the proximal anchor has ", cfg.prox_anchor.size(),
                       " floats, the model ", numel);
  STARLING_CHECK_ARG(cfg.correction.empty() || cfg.correction.size() == numel, "fit: the SCAFFOLD correction has ",
                     cfg.correction.size(), " floats, the model ", numel);
}

void checkDataView(const DataView& data, size_t features, uint32_t classes) {
  STARLING_CHECK_ARG(data.dataset != nullptr, "DataView: no dataset");
  const data::Dataset& d = *data.dataset;
  STARLING_CHECK_ARG(!data.indices.empty(),
                     "DataView: no examples (an empty view cannot be trained or evaluated)");
  STARLING_CHECK_ARG(d.features() == features, "DataView: the dataset has ", d.features(),
                     " features per example, the model expects ", features);
  // A Dataset is a plain struct: check that its arrays agree before indexing them.
  STARLING_CHECK_ARG(features > 0 && d.images.size() % features == 0 &&
                         d.images.size() / features == d.labels.size(),
                     "DataView: the dataset has ", d.images.size(), " pixel values for ",
                     d.labels.size(), " labels of ", features, " features");
  for (size_t i : data.indices) {
    STARLING_CHECK_ARG(i < d.size(), "DataView: index ", i, " is out of range for a dataset of ",
                       d.size(), " examples");
    STARLING_CHECK_ARG(d.labels[i] < classes, "DataView: example ", i, " has label ",
                       int{d.labels[i]}, ", the model has ", classes, " classes");
  }
}

const TrainerRegistry& trainers() {
  using Entry = TrainerRegistry::Entry;
  static const TrainerRegistry registry(
      "trainer",
      {
          Entry{"softmax",
                "softmax regression (Eigen): fc.weight [classes, features], fc.bias [classes]", "",
                [](OptionReader&, size_t features, uint32_t classes) -> std::unique_ptr<Trainer> {
                  return std::make_unique<EigenTrainer>(makeSoftmaxModel(features, classes));
                }},
          Entry{"mlp",
                "one ReLU hidden layer (Eigen): fc1 [hidden, features], fc2 [classes, hidden]",
                "hidden=128 (hidden units, >= 1)",
                [](OptionReader& r, size_t features, uint32_t classes) -> std::unique_ptr<Trainer> {
                  const uint32_t hidden = r.count("hidden", 128);
                  return std::make_unique<EigenTrainer>(makeMlpModel(features, classes, hidden));
                }},
      });
  return registry;
}

std::unique_ptr<Trainer> makeTrainer(std::string_view spec, size_t features, uint32_t classes) {
  return trainers().make(spec, features, classes);
}

}  // namespace starling::client
