#pragma once
// The compressors' heavy part where the data lives ("the round on the device"): the exact
// top-k selection and the gathering of the sent values run on the tensor's device (a GPU, or the
// CPU), and only the k indices and values cross to the host, where the payload is built by the
// same code as the CPU compressor's; rand-k, random-block, sign, QSGD, PowerSGD and ACP-SGD
// likewise (encodeOnDevice).
// The payloads are those of compression::TopKCompressor for the same input, bit for bit: the same
// positions (selectTopK's total order, ties to the lower index, not LibTorch's topk order), the
// same values, STC's mu summed on the host in the same order; and the kept residual the same
// floats. The CPU suite checks this on CPU tensors, test_torch_gpu on a GPU.
//
// The round on the device (device_round.h) encodes with it. Unlike most of torch_trainer/'s headers
// this one includes LibTorch's tensor type: include it from LibTorch translation units only.
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "compression/sparsify.h"
#include "core/param_layout.h"

namespace starling::torch_trainer {

// The k largest magnitudes of `x` (1-D float32, finite, on any device) in selectTopK's order:
// |a| > |b|, or |a| == |b| and a's index lower. Returns their indices ascending, int64, on x's
// device; one wait for the device (the count of the selection). InvalidArgument for another shape
// or dtype, or k past x's size.
torch::Tensor topKIndices(const torch::Tensor& x, int64_t k);

// TopKCompressor's encoding (options `opt`: topk at layer or global scope, or stc) of `acc`, a
// contiguous 1-D float32 tensor of layout.numel() values on any device, each |value| <=
// compression::kMaxCompressMagnitude (the caller checks, as compressWithFeedback does). With
// `keep_residual`, acc becomes in place what the compressor keeps: the sent positions zeroed
// (topk), or value - sent (stc), before error feedback's decay (which the caller applies, as
// Compressor::compressWithFeedback does after encode). InvalidArgument for an acc of the wrong
// shape or dtype, or global scope over 2^32 values or more.
std::vector<compression::Payload> encodeTopK(const compression::TopKOptions& opt,
                                             const ParamLayout& layout, torch::Tensor& acc,
                                             bool keep_residual);

// Whether encodeOnDevice takes `c`: top-k and stc (encodeTopK), rand-k, random-block, sign and
// QSGD, each of one phase; PowerSGD (phase 0 of either mode) and ACP-SGD.
bool encodesOnDevice(const compression::Compressor& c);

// c's encoding of `acc` (as encodeTopK: a contiguous 1-D float32 tensor of layout.numel() values on
// any device, each |value| <= kMaxCompressMagnitude) in the round and client of `ctx`, bit for bit
// the payloads c.compress would make, with only the payload crossing to the host: rand-k's indices
// drawn on the host from the same stream (k of them go to the device), random-block's offset from
// the same stream, sign's bits packed on the device and its scale from the correctly rounded sum
// (compression/exact_sum.h: 256 exponent buckets filled on the device), QSGD's norm the same way
// (two bucket sets of squares), its levels rounded on the device with the same counter-based
// draws (core/rng.h's CounterStream) and packed there. With `keep_residual`, acc becomes what c
// keeps before error feedback's decay: the sent positions zeroed (rand-k, random-block), value -
// sent (sign, QSGD), M - P Q^T (ACP-SGD, local PowerSGD; M itself in two-phase PowerSGD's phase P).
// PowerSGD and ACP-SGD compute compression/lowrank.h's products (factorProduct and the others)
// on the device in the host's order, each entry rounded once, so that only the factors cross;
// local PowerSGD's P is orthogonalized on the host. PowerSGD reads its warm factors from `state`
// (may be null: the seeded ones) and stages its factors and pending phase in `staged`, which it
// requires. InvalidArgument for a compressor encodesOnDevice refuses, an acc of the wrong shape or
// dtype, or a phase past 0.
std::vector<compression::Payload> encodeOnDevice(const compression::Compressor& c,
                                                 const ParamLayout& layout, torch::Tensor& acc,
                                                 bool keep_residual,
                                                 const compression::RoundContext& ctx,
                                                 const ClientState* state = nullptr,
                                                 compression::StagedState* staged = nullptr);

}  // namespace starling::torch_trainer
