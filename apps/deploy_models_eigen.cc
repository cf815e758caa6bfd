// apps/deploy_models.h for starling-server and starling-client: the Eigen trainers only.
#include "apps/deploy_models.h"
#include "core/error.h"

namespace starling::apps {
namespace {

void refuseTorch(const std::string& spec) {
  if (modelName(spec) == "torchscript")
    STARLING_THROW(ConfigError, "model.spec = '", spec,
                   "': TorchScript models need LibTorch; run starling-server-torch and "
                   "starling-client-torch (built where LibTorch is found, docs/deployment.md)");
}

}  // namespace

bool deployedWithTorch() { return false; }

std::unique_ptr<client::Trainer> makeDeployedTrainer(const std::string& spec, size_t rows,
                                                     size_t cols, uint32_t classes) {
  refuseTorch(spec);
  return client::makeTrainer(spec, rows, cols, classes);
}

std::unique_ptr<client::Trainer> makeDeployedTrainer(const std::string& spec,
                                                     const data::Dataset& d) {
  refuseTorch(spec);
  return client::makeTrainer(spec, d);
}

std::string deployedModelsHelp() { return client::trainers().help(); }

}  // namespace starling::apps
