// apps/deploy_models.h for starling-server-torch and starling-client-torch: TorchScript models on
// LibTorch (CPU), every other model on the Eigen trainers.
#include "apps/deploy_models.h"
#include "torch_trainer/torch_trainer.h"

namespace starling::apps {

bool deployedWithTorch() { return true; }

std::unique_ptr<client::Trainer> makeDeployedTrainer(const std::string& spec, size_t rows,
                                                     size_t cols, uint32_t classes) {
  if (modelName(spec) == "torchscript")
    return torch_trainer::makeTorchTrainer(spec, rows, cols, classes, torch_trainer::Device{});
  return client::makeTrainer(spec, rows, cols, classes);
}

std::unique_ptr<client::Trainer> makeDeployedTrainer(const std::string& spec,
                                                     const data::Dataset& d) {
  if (modelName(spec) == "torchscript")
    return torch_trainer::makeTorchTrainer(spec, d, torch_trainer::Device{});
  return client::makeTrainer(spec, d);
}

std::string deployedModelsHelp() {
  return client::trainers().help() +
         "\n                                    torchscript (LibTorch, this build only): "
         "torchscript:path=FILE,input=image|flat,init=file|seed, a module saved with "
         "torch.jit.save (torch_trainer/torch_trainer.h)";
}

}  // namespace starling::apps
