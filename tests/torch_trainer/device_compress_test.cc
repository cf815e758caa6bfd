// The device's top-k selection and its top-k, stc, rand-k, random-block, sign and QSGD encodings
// (torch_trainer/device_compress.h) against the CPU compressors, here on CPU tensors;
// test_torch_gpu runs the same checks on a GPU.
#include <set>

#include "torch_trainer/device_compress_check.h"

using namespace starling;

TEST_CASE("topKIndices selects selectTopK's positions, ties to the lower index",
          "[torch_trainer][device_compress]") {
  testing::checkTopKIndicesOrder(torch::Device(torch::kCPU));
}

TEST_CASE("encodeTopK sends the CPU compressor's payloads and keeps its residual, bit for bit",
          "[torch_trainer][device_compress][isa]") {
  testing::checkDeviceTopKMatchesCpu(torch::Device(torch::kCPU));
}

TEST_CASE("encodeOnDevice sends rand-k's, random-block's, sign's and QSGD's payloads, bit for bit",
          "[torch_trainer][device_compress][isa]") {
  testing::checkDeviceEncodeMatchesCpu(torch::Device(torch::kCPU));
}

TEST_CASE(
    "encodeOnDevice sends PowerSGD's and ACP-SGD's factors and keeps their buffers, bit for "
    "bit",
    "[torch_trainer][device_compress][isa]") {
  testing::checkDeviceLowRankMatchesCpu(torch::Device(torch::kCPU));
}

TEST_CASE("the device encodes only what it serves, refusing the others",
          "[torch_trainer][device_compress]") {
  const ParamLayout layout = testing::smallCnnLayout();
  torch::Tensor acc = torch::zeros({static_cast<int64_t>(layout.numel())});
  for (const char* spec : {"none", "fp16", "bf16"}) {
    INFO(spec);
    const auto comp = compression::makeCompressor(spec);
    CHECK_FALSE(torch_trainer::encodesOnDevice(*comp));
    CHECK_THROWS_AS(torch_trainer::encodeOnDevice(*comp, layout, acc, true, {}), InvalidArgument);
  }
  const auto sign = compression::makeCompressor("sign");
  torch::Tensor short_acc = torch::zeros({static_cast<int64_t>(layout.numel()) - 1});
  CHECK_THROWS_AS(torch_trainer::encodeOnDevice(*sign, layout, short_acc, true, {}),
                  InvalidArgument);
  torch::Tensor doubles = torch::zeros({static_cast<int64_t>(layout.numel())}, torch::kFloat64);
  CHECK_THROWS_AS(torch_trainer::encodeOnDevice(*sign, layout, doubles, true, {}), InvalidArgument);
  // PowerSGD stages its state (it has nowhere else to go), and only phase 0 has an update.
  const auto power = compression::makeCompressor("powersgd:rank=2,mode=local");
  CHECK_THROWS_AS(torch_trainer::encodeOnDevice(*power, layout, acc, true, {}), InvalidArgument);
  const auto acp = compression::makeCompressor("acpsgd:rank=2");
  const compression::SharedFactors shared = acp->initialShared(layout, 1);
  compression::StagedState staged;
  CHECK_NOTHROW(torch_trainer::encodeOnDevice(*acp, layout, acc, true, {1, 1, 0, 0, &shared},
                                              nullptr, &staged));
  CHECK_THROWS_AS(torch_trainer::encodeOnDevice(*acp, layout, acc, true, {1, 1, 1, 0, &shared},
                                                nullptr, &staged),
                  InvalidArgument);
  // Shared factors that do not fit the model are refused before anything is read from them: one
  // float short, none at all, or two-phase PowerSGD's phase P given the P side.
  compression::SharedFactors short_factor = shared;
  for (auto& f : short_factor.factors)
    if (!f.empty()) f.pop_back();
  CHECK_THROWS_AS(torch_trainer::encodeOnDevice(*acp, layout, acc, true,
                                                {1, 1, 0, 0, &short_factor}, nullptr, &staged),
                  InvalidArgument);
  CHECK_THROWS_AS(torch_trainer::encodeOnDevice(*acp, layout, acc, true, {1, 1, 0, 0, nullptr},
                                                nullptr, &staged),
                  InvalidArgument);
  const auto two_phase = compression::makeCompressor("powersgd:rank=2");
  compression::SharedFactors p_side = shared;
  p_side.fixed = compression::SharedFactors::Side::kP;
  CHECK_THROWS_AS(torch_trainer::encodeOnDevice(*two_phase, layout, acc, true,
                                                {1, 1, 0, 0, &p_side}, nullptr, &staged),
                  InvalidArgument);
}

TEST_CASE("every registered compressor has a device twin or is listed as the host's",
          "[torch_trainer][device_compress]") {
  // The dense ones have nothing to select on the device; a compressor added to the registry
  // without a twin (torch_trainer/device_compress.cc) or a place in this list fails here.
  const std::set<std::string> host_only{"none", "fp16", "bf16"};
  for (const auto& spec : testing::allCompressorSpecs()) {
    INFO(spec);
    const auto comp = compression::makeCompressor(spec);
    CHECK(torch_trainer::encodesOnDevice(*comp) != host_only.contains(comp->name()));
  }
}

TEST_CASE("the device's top-k refuses inputs of the wrong shape, type or size",
          "[torch_trainer][device_compress]") {
  const torch::Tensor x = torch::ones({4, 3});
  CHECK_THROWS_AS(torch_trainer::topKIndices(x, 2), InvalidArgument);
  CHECK_THROWS_AS(torch_trainer::topKIndices(torch::ones({5}, torch::kFloat64), 2),
                  InvalidArgument);
  CHECK_THROWS_AS(torch_trainer::topKIndices(torch::ones({5}), 6), InvalidArgument);
  CHECK_THROWS_AS(torch_trainer::topKIndices(torch::ones({5}), -1), InvalidArgument);
  const ParamLayout layout = testing::smallCnnLayout();
  torch::Tensor short_acc = torch::zeros({static_cast<int64_t>(layout.numel()) - 1});
  CHECK_THROWS_AS(torch_trainer::encodeTopK({}, layout, short_acc, true), InvalidArgument);
  torch::Tensor strided =
      torch::zeros({static_cast<int64_t>(layout.numel()) * 2}).slice(0, 0, {}, 2);
  CHECK_THROWS_AS(torch_trainer::encodeTopK({}, layout, strided, true), InvalidArgument);
}
