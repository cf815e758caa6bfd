#pragma once
// The round on the device: a client's phase-0 training, update and compression where the
// LibTorch trainer trains, for top-k and stc (layer or global scope), rand-k, random-block, sign,
// QSGD, PowerSGD (phase P or the local form) and ACP-SGD (device_compress.h's encodesOnDevice),
// with or without error feedback, any ef_decay,
// ef_preview and ef_max_age. The trained model stays on the device; update = trained - start,
// residual + update, the magnitude checks, the encoding, the kept residual and error feedback's
// diagnostics are formed there; the host receives the payload (indices and values, a block, or the
// packed bits and the exponent sums of sign's scale or QSGD's norm, or the low-rank factors) and
// the kept residual (two-phase PowerSGD: M, for phase Q on the host), which it stores. The result
// is ClientAlgorithm's host path's: the same payloads and residual bit for bit (the diagnostics to
// double rounding).
//
// In a SCAFFOLD round the training is corrected by c - c_i as on the host, and the control change
// -c - update / (K lr) (client::controlChange) is formed on the device too and brought to the host
// with the payload: the same bits.
//
// starling-sim takes it with `sim.device_round` (auto: on a GPU). Other compressors stay on the
// host (ClientAlgorithm::setDeviceUpdate). This header includes no LibTorch.
#include <memory>

#include "client/algorithm.h"

namespace starling::torch_trainer {

// The device round of `trainer`, which must be a LibTorch trainer (makeTorchTrainer) and outlive
// it. InvalidArgument for any other trainer.
std::unique_ptr<client::DeviceUpdate> makeDeviceUpdate(client::Trainer& trainer);

}  // namespace starling::torch_trainer
