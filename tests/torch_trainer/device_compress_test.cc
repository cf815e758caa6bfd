// The device's top-k selection and top-k / stc encoding (torch_trainer/device_compress.h) against
// the CPU compressors, here on CPU tensors; test_torch_gpu runs the same checks on a GPU.
#include "torch_trainer/device_compress_check.h"

using namespace starling;

TEST_CASE("topKIndices selects selectTopK's positions, ties to the lower index",
          "[torch_trainer][device_compress]") {
  testing::checkTopKIndicesOrder(torch::Device(torch::kCPU));
}

TEST_CASE("encodeTopK sends the CPU compressor's payloads and keeps its residual, bit for bit",
          "[torch_trainer][device_compress]") {
  testing::checkDeviceTopKMatchesCpu(torch::Device(torch::kCPU));
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
