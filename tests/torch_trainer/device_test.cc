// Choosing the device (torch_trainer/device.h) from made-up inventories, the real inventory of
// this build, and the device-generic trainer on the CPU.
#include "torch_trainer/device.h"

#include <catch2/catch.hpp>

#include "check_throws.h"
#include "client/synthetic.h"
#include "torch_trainer/blobs.h"
#include "torch_trainer/torch_trainer.h"

using namespace starling;
using namespace starling::torch_trainer;
using Catch::Matchers::Contains;

namespace {

DeviceInventory gpus(int n, std::string visible = "", bool set = false) {
  return DeviceInventory{true, n, std::move(visible), set};
}

Device cuda(int i) { return Device{Device::Kind::kCuda, i}; }

}  // namespace

TEST_CASE("auto takes a GPU when LibTorch sees one, the CPU otherwise, cpu is always the CPU",
          "[torch_trainer]") {
  CHECK(chooseDevice("auto", DeviceInventory{}, {}) == Device{});
  CHECK(chooseDevice("auto", gpus(0), {}) == Device{});
  CHECK(chooseDevice("auto", DeviceInventory{false, 2, "", false}, {}) ==
        Device{});  // no CUDA in LibTorch
  CHECK(chooseDevice("auto", gpus(2), {}) == cuda(0));
  CHECK(chooseDevice("cpu", gpus(4), {3, 4, 1}) == Device{});
  CHECK(Device{}.str() == "cpu");
  CHECK(cuda(3).str() == "cuda:3");
}

TEST_CASE("workers bind GPU local rank / workers_per_gpu", "[torch_trainer]") {
  // 4 workers on a machine with 2 visible GPUs, 2 per GPU: ranks 0,1 -> 0; 2,3 -> 1.
  for (int r = 0; r < 4; ++r) {
    INFO("local rank " << r);
    CHECK(chooseDevice("cuda", gpus(2), {r, 4, 2}) == cuda(r / 2));
    CHECK(chooseDevice("auto", gpus(2), {r, 4, 2}) == cuda(r / 2));
  }
  // One per GPU.
  CHECK(chooseDevice("cuda", gpus(8), {5, 8, 1}) == cuda(5));
  // auto shares too few GPUs among more workers instead of failing: 2 workers on 1 GPU (the
  // default sim.workers = 2 on a one-GPU machine), 6 on 4 (2, 2, 2 on GPUs 0 to 2), 3 on 2.
  CHECK(chooseDevice("auto", gpus(1), {1, 2, 1}) == cuda(0));
  for (int r = 0; r < 6; ++r) CHECK(chooseDevice("auto", gpus(4), {r, 6, 1}) == cuda(r / 2));
  CHECK(chooseDevice("auto", gpus(2), {2, 3, 1}) == cuda(1));
  CHECK(chooseDevice("auto", gpus(2), {5, 0, 1}) == cuda(1));  // workers unknown: ranks wrap around
  // The launcher did not say how many share the machine: the rank alone decides.
  CHECK(chooseDevice("cuda", gpus(2), {3, 0, 2}) == cuda(1));
  // cuda:N pins every worker to one GPU.
  CHECK(chooseDevice("cuda:1", gpus(2), {0, 4, 1}) == cuda(1));
}

TEST_CASE("device settings no worker can meet are ConfigErrors that say what to change",
          "[torch_trainer]") {
  const auto error = [](std::string_view s, const DeviceInventory& inv, const WorkerPlacement& p) {
    try {
      chooseDevice(s, inv, p);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    FAIL("no ConfigError for device " << s);
    return std::string();
  };
  CHECK_THAT(error("gpu", gpus(1), {}), Contains("'gpu' is not one of auto, cpu, cuda, cuda:N"));
  CHECK_THAT(error("cuda:x", gpus(1), {}), Contains("GPU index must be a number"));
  CHECK_THAT(error("cuda:-1", gpus(1), {}), Contains("GPU index must be a number"));
  CHECK_THAT(error("cuda:", gpus(1), {}), Contains("GPU index must be a number"));
  // A CPU-only LibTorch (Debian's).
  CHECK_THAT(error("cuda", DeviceInventory{}, {}),
             Contains("has no CUDA") && Contains("docs/gpu.md"));
  CHECK_THAT(error("cuda:0", DeviceInventory{}, {}), Contains("has no CUDA"));
  // A CUDA LibTorch without a driver, or with every GPU hidden.
  CHECK_THAT(error("cuda", gpus(0), {}), Contains("sees no GPU") && Contains("no NVIDIA driver"));
  CHECK_THAT(error("cuda", gpus(0, "", true), {}), Contains("CUDA_VISIBLE_DEVICES=''"));
  // A worker count per GPU that does not divide the workers.
  CHECK_THAT(error("cuda", gpus(2), {0, 3, 2}),
             Contains("workers_per_gpu = 2 does not divide the 3 workers on this machine"));
  CHECK_THAT(error("cuda", gpus(4), {0, 6, 4}), Contains("does not divide"));
  CHECK_THAT(error("cuda", gpus(2), {0, 1, 0}), Contains("workers_per_gpu = 0 must be at least 1"));
  // More workers than the GPUs can take.
  CHECK_THAT(
      error("cuda", gpus(2, "0,1", true), {0, 6, 2}),
      Contains("6 workers on this machine at workers_per_gpu = 2 need 3 GPUs, but 2 are visible") &&
          Contains("CUDA_VISIBLE_DEVICES='0,1'"));
  CHECK_THAT(error("cuda", gpus(1), {2, 0, 2}),
             Contains("local rank 2 at workers_per_gpu = 2 needs GPU 1, but 1 is visible"));
  CHECK_THAT(error("cuda:2", gpus(2), {}), Contains("only 2 GPUs are visible"));
}

TEST_CASE("this build's own inventory: cuda fails with the reason, auto falls back to the CPU",
          "[torch_trainer]") {
  const DeviceInventory inv = deviceInventory();
  INFO("cuda_built " << inv.cuda_built << ", gpus " << inv.gpus);
  if (inv.gpus == 0) {
    CHECK(chooseDevice("auto") == Device{});
    // Debian's CPU LibTorch, or a CUDA LibTorch on a machine without a GPU (CI's second build).
    CHECK_THROWS_MATCHING(chooseDevice("cuda"), ConfigError,
                          Contains(inv.cuda_built ? "sees no GPU" : "has no CUDA"));
  } else {
    CHECK(chooseDevice("auto").cuda());
  }
}

TEST_CASE("the LibTorch trainer notices a data set changed in place between fits",
          "[torch_trainer]") {
  // The trainer keeps the data set's labels (and, on a GPU, its images) on the device between
  // fits; a data set edited in place must not train on the stale copy.
  data::Dataset d = testing::blobImages(48, 12, 12, 3, 4);
  const auto idx = testing::allIndices(d);
  auto t = makeTorchTrainer("cnn", d);
  std::vector<float> global(t->layout().numel());
  t->initParameters(global, 1);
  const client::FitConfig cfg{.epochs = 1, .batch_size = 8, .lr = 0.05};
  const auto fit = [&](client::Trainer& tr) {
    std::vector<float> p = global;
    RngStream rng(StreamKey{1, 1, 0, StreamPurpose::kTraining, 0});
    tr.fit(p, client::DataView{&d, idx}, cfg, rng);
    return p;
  };
  const auto before = fit(*t);
  for (auto& y : d.labels) y = static_cast<uint8_t>((y + 1) % 3);  // same buffer, other labels
  const auto after = fit(*t);
  CHECK(after != before);
  auto fresh = makeTorchTrainer("cnn", d);
  CHECK(fit(*fresh) == after);
}
