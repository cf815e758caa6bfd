#pragma once
// The LibTorch trainer: client::Trainer implemented with LibTorch models, for the simulator and a
// LibTorch-built client. This header includes no LibTorch (the models live behind a pimpl in
// torch_trainer/*.cc), so a target that only creates trainers compiles fast.
//
// Models are picked by spec from torchTrainers() and built for an input of rows x cols pixels
// (one channel) and `classes` classes: the factories take (rows, cols, classes), the shape of a
// data::Dataset (makeTorchTrainer(spec, dataset) reads them from it). The CNN and the ResNet need
// the image shape; logreg and mlp only use rows * cols.
//
//   logreg                  softmax regression: fc.weight [classes, features], fc.bias
//   mlp:hidden=200          fc1 [hidden, features] + ReLU + fc2 [classes, hidden]
//   cnn                     McMahan et al. 2017: conv5x5x32 "same" + ReLU + maxpool2, conv5x5x64
//                           "same" + ReLU + maxpool2, fc 512 + ReLU, fc classes (1,663,370
//                           parameters for 28x28x1 and 10 classes)
//   resnet                  ResNet-8: conv3x3x16 + BN + ReLU, three stages of one basic block
//                           (16, 32, 64 channels; strides 1, 2, 2), global average pool, fc
//   torchscript:path=FILE,input=image
//                           a module saved with torch.jit.save; forward(x) -> logits [N, classes]
//                           with x [N, 1, rows, cols] (input=image) or [N, rows*cols]
//                           (input=flat); init=file (default: the saved values) or init=seed
// Every spec also accepts momentum=0 (SGD momentum in [0, 1); the velocity starts at zero in each
// fit, since a trainer keeps no per-client state).
//
// Layout (docs/models.md): every parameter in named_parameters() order under LibTorch's names
// ("conv1.weight", "layer1.0.bn1.bias", ...), then every float buffer in named_buffers() order
// (BatchNorm's running_mean and running_var). Buffers travel and are averaged like parameters
// (what FedAvg implementations usually do); SGD never changes them, BatchNorm's forward pass in
// training mode does. Integer buffers (num_batches_tracked) are left out: with BatchNorm's default
// momentum they do not affect the model.
//
// Training: fit() copies the flat buffer into the model's own contiguous parameter storage (the
// module's tensors are views of it; gradients likewise, so one SGD step is one fused operation
// over the whole buffer), shuffles the view with the given stream (Fisher-Yates, as the Eigen
// trainers), runs minibatch SGD on the mean cross-entropy with the model in training mode, and
// copies the result back.
//
// Device (torch_trainer/device.h): a trainer lives on one device, the CPU by default. On a GPU the
// model, its gradient and momentum, the client's data (the data set is copied to the GPU once,
// when the trainer first sees it), the batches and the training loop stay there; the loss and the
// accuracy are summed on the device and read once per fit, and the only other waits are one
// upload of the shuffled order per epoch and the copy back. The CPU runs the same code. train_loss
// and train_accuracy are as client/trainer.h defines them (each example taken with the parameters
// before its step; accuracy by arg-max, lowest index on ties). A non-finite batch loss (found when
// the losses are read at the end) or a non-finite parameter at the end throws
// client::DivergenceError and leaves params untouched. evaluate() runs in eval mode (BatchNorm uses
// its running statistics) in fixed batches without gradients and changes nothing.
//
// Determinism: initParameters() is a pure function of the seed (Starling's RngStream, never
// LibTorch's global generator); fit() is a pure function of (params, data, config, stream) for a
// given LibTorch thread count, on a GPU only once useReproducibleCuda() (device.h) made cuDNN
// deterministic (starling-sim and starling-split do), and then equal to the CPU's to float
// rounding, not bit for bit. A data set must not be edited in place while a GPU trainer uses it:
// the trainer keeps a copy of the last two it saw and notices changes of the labels and of a
// sample of the pixels only.
//
// Threads: the trainer never changes LibTorch's process-wide thread count. The program (the
// simulator's worker process) calls setThreads() from torch_trainer/threads.h once at start.
// Not thread-safe: one trainer per thread (client/trainer.h).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "client/trainer.h"
#include "core/registry.h"
#include "data/idx.h"
#include "torch_trainer/device.h"

namespace starling::torch_trainer {

// Factories take (rows, cols, classes) of the input images and the device to train on.
using TorchTrainerRegistry = Registry<client::Trainer, size_t, size_t, uint32_t, Device>;
const TorchTrainerRegistry& torchTrainers();

// makeTorchTrainer("cnn", 28, 28, 10). ConfigError for a bad spec or an unusable TorchScript
// module (no forward method, wrong output shape, non-float parameters); IoError for a model file
// that is missing or unreadable; InvalidArgument for rows or cols 0, classes < 2, or an image too
// small for the model.
// The device must be one chooseDevice() returned (a GPU that exists).
std::unique_ptr<client::Trainer> makeTorchTrainer(std::string_view spec, size_t rows, size_t cols,
                                                  uint32_t classes, const Device& device = {});
// The same with (rows, cols, num_classes) of a data set.
std::unique_ptr<client::Trainer> makeTorchTrainer(std::string_view spec, const data::Dataset& d,
                                                  const Device& device = {});

}  // namespace starling::torch_trainer
