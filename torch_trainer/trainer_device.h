#pragma once
// The LibTorch trainer's model on its device, for the round on the device (device_round.cc):
// internal to torch_trainer/ and its tests. Includes LibTorch's tensor type.
#include <torch/types.h>

#include <span>

#include "client/trainer.h"
#include "core/rng.h"

namespace starling::torch_trainer::detail {

// Whether `t` is a LibTorch trainer (makeTorchTrainer's).
bool isTorchTrainer(const client::Trainer& t);

// Trainer::fit from `start` (what fit's params hold on entry) with the trained model left on the
// trainer's device instead of copied back; deviceValues(t) is then that model. The same checks and
// the same DivergenceError (a non-finite loss or parameter). InvalidArgument when `t` is not a
// LibTorch trainer. With `start_on_device`, the start model as the fit loaded it is copied there
// on the device (reusing the tensor when it fits), so that the caller need not upload it again.
client::FitResult fitOnDevice(client::Trainer& t, std::span<const float> start,
                              const client::DataView& data, const client::FitConfig& cfg,
                              RngStream& rng, torch::Tensor* start_on_device = nullptr);

// The trainer's flat tensor of its values on its device, in layout order (parameters, then float
// buffers): what the last fit or evaluate loaded or trained; overwritten by the next.
torch::Tensor deviceValues(client::Trainer& t);

}  // namespace starling::torch_trainer::detail
