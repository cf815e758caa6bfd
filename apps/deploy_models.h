#pragma once
// The models a deployed program builds (starling-server for the layout and the initial model,
// starling-client to train): the Eigen trainers of client/trainer.h, with no LibTorch. The
// LibTorch-backed builds of the same programs, starling-server-torch and starling-client-torch
// (built where LibTorch is found; for devices that can carry it), also build the LibTorch
// trainer's TorchScript models (torchscript:path=FILE,..., torch_trainer/torch_trainer.h) on the
// CPU; every other spec stays on the Eigen trainers, which train the built-in models to the same
// numbers. Two implementations of this header: deploy_models_eigen.cc and deploy_models_torch.cc,
// one linked into each program.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "client/trainer.h"
#include "data/idx.h"

namespace starling::apps {

// Whether this program was built with LibTorch (the *-torch programs).
bool deployedWithTorch();

// ConfigError for a bad spec (naming the LibTorch-backed programs for a torchscript spec in a
// build without LibTorch), IoError for a model file that cannot be read.
std::unique_ptr<client::Trainer> makeDeployedTrainer(const std::string& spec, size_t rows,
                                                     size_t cols, uint32_t classes);
std::unique_ptr<client::Trainer> makeDeployedTrainer(const std::string& spec,
                                                     const data::Dataset& d);

// The --help text of the models this program builds.
std::string deployedModelsHelp();

// The spec's model name (before the ':').
inline std::string modelName(const std::string& spec) { return spec.substr(0, spec.find(':')); }

}  // namespace starling::apps
