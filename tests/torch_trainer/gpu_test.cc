// The LibTorch trainer, one simulated round, the split cloud's step and the device's top-k on a GPU
// against the same on the CPU.
//
// Its own main: without a GPU LibTorch can use, every run exits with 77, which ctest reports as
// "Skipped" (SKIP_RETURN_CODE, label gpu), so a machine without one never counts these as passed.
// `make gpu-check` runs them where a GPU is lent (docs/gpu.md).
// LibTorch first: its logging defines CHECK, which Catch's must replace.
#include <torch/torch.h>

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "../catch_session.h"
#include "client/synthetic.h"
#include "data/partition.h"
#include "server/engine.h"
#include "simulator/collectives.h"
#include "simulator/sim_fleet.h"
#include "simulator/state_store.h"
#include "split/split_model.h"
#include "torch_trainer/blobs.h"
#include "torch_trainer/device.h"
#include "torch_trainer/device_compress_check.h"
#include "torch_trainer/device_round_check.h"
#include "torch_trainer/torch_trainer.h"

using namespace starling;
using namespace starling::torch_trainer;
namespace sim = starling::simulator;

namespace {

const Device kGpu{Device::Kind::kCuda, 0};

// ||a - b|| / ||b||, in double.
double relativeDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    n += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
}

double metric(const client::FitResult& r, const std::string& name) {
  for (const auto& m : r.metrics)
    if (m.name == name) return m.value;
  return NAN;
}

}  // namespace

TEST_CASE(
    "a fit on the GPU equals the fit on the CPU within 1e-3, for every model and gradient term",
    "[gpu][torch_trainer]") {
  const data::Dataset d = testing::blobImages(96, 28, 28, 10, 4);
  const auto idx = testing::allIndices(d);
  for (const char* spec : {"logreg", "mlp:hidden=64", "cnn", "resnet", "cnn:momentum=0.9"}) {
    INFO(spec);
    auto cpu = makeTorchTrainer(spec, d), gpu = makeTorchTrainer(spec, d, kGpu);
    const size_t n = cpu->layout().numel();
    std::vector<float> global(n), anchor(n), corr(n, 1e-3f);
    cpu->initParameters(global, 1);
    for (size_t i = 0; i < n; ++i) anchor[i] = global[i] + 0.01f;
    for (const bool terms : {false, true}) {
      INFO("FedProx and SCAFFOLD: " << terms);
      client::FitConfig cfg{.epochs = 2, .batch_size = 16, .lr = 0.05};
      if (terms) {
        cfg.prox_mu = 0.1;
        cfg.prox_anchor = anchor;
        cfg.correction = corr;
      }
      std::vector<float> pc = global, pg = global;
      RngStream rc(StreamKey{1, 1, 0, StreamPurpose::kTraining, 0}), rg = rc;
      const auto fc = cpu->fit(pc, client::DataView{&d, idx}, cfg, rc);
      const auto fg = gpu->fit(pg, client::DataView{&d, idx}, cfg, rg);
      CHECK(relativeDiff(pg, pc) <= 1e-3);
      CHECK(relativeDiff(pg, global) > 1e-3);  // it trained
      CHECK(metric(fg, "train_loss") == Approx(metric(fc, "train_loss")).epsilon(1e-3));
      const auto ec = cpu->evaluate(pc, client::DataView{&d, idx});
      const auto eg = gpu->evaluate(pc, client::DataView{&d, idx});  // the same model on both
      CHECK(eg.loss == Approx(ec.loss).epsilon(1e-4));
      CHECK(std::fabs(eg.accuracy - ec.accuracy) <= 2.0 / static_cast<double>(d.size()));
    }
  }
}

TEST_CASE("a data set held as bytes gives the floats' results on the GPU, bit for bit",
          "[gpu][torch_trainer]") {
  // starling-sim keeps images as bytes: the GPU must see byte / 255.0f exactly (a CUDA division by
  // a scalar multiplies by the reciprocal, which differs in the last bit for half the bytes).
  const data::Dataset blobs = testing::blobImages(48, 12, 12, 3, 5);
  data::Dataset bytes = blobs, floats = blobs;
  bytes.images.clear();
  bytes.pixels.resize(blobs.images.size());
  for (size_t i = 0; i < bytes.pixels.size(); ++i) {
    bytes.pixels[i] = static_cast<uint8_t>((i * 131 + 17) % 256);
    floats.images[i] = static_cast<float>(bytes.pixels[i]) / 255.0f;
  }
  const auto idx = testing::allIndices(blobs);
  for (const char* spec : {"logreg", "mlp:hidden=32"}) {
    INFO(spec);
    auto tb = makeTorchTrainer(spec, bytes, kGpu), tf = makeTorchTrainer(spec, floats, kGpu);
    std::vector<float> pb(tb->layout().numel());
    tb->initParameters(pb, 2);
    std::vector<float> pf = pb;
    const auto eb = tb->evaluate(pb, client::DataView{&bytes, idx});
    const auto ef = tf->evaluate(pf, client::DataView{&floats, idx});
    CHECK(eb.loss == ef.loss);
    CHECK(eb.accuracy == ef.accuracy);
    const client::FitConfig cfg{.epochs = 1, .batch_size = 8, .lr = 0.05};
    RngStream rb(StreamKey{1, 1, 0, StreamPurpose::kTraining, 0}), rf = rb;
    tb->fit(pb, client::DataView{&bytes, idx}, cfg, rb);
    tf->fit(pf, client::DataView{&floats, idx}, cfg, rf);
    CHECK(pb == pf);
  }
}

TEST_CASE("a diverging fit on the GPU throws and leaves the parameters as they were",
          "[gpu][torch_trainer]") {
  data::Dataset d = testing::separableData(64, 8, 4, 6);
  for (float& x : d.images) x *= 100.0f;
  auto t = makeTorchTrainer("mlp:hidden=16", d, kGpu);
  std::vector<float> p(t->layout().numel());
  t->initParameters(p, 1);
  const auto before = p;
  RngStream rng(StreamKey{1, 1, 0, StreamPurpose::kTraining, 0});
  CHECK_THROWS_AS(t->fit(p, client::DataView{&d, testing::allIndices(d)},
                         client::FitConfig{.epochs = 2, .batch_size = 8, .lr = 1e38}, rng),
                  client::DivergenceError);
  CHECK(p == before);
}

TEST_CASE("one simulated round on cuda equals the round on cpu within 1e-3", "[gpu][simulator]") {
  const data::Dataset train = testing::blobImages(400, 28, 28, 10, 9);
  sim::SimClients clients;
  clients.train = &train;
  clients.shards = data::ClientShards(
      data::makePartitioner("dirichlet:alpha=0.5")->split(train.labels, train.num_classes, 20, 3));
  clients.devices = sim::DevicePopulation::sample(20, sim::DeviceDistributions{}, 3);
  const auto round = [&](const Device& device, const std::string& compressor) {
    auto trainer = makeTorchTrainer("cnn", train, device);
    const auto layout = std::make_shared<const ParamLayout>(trainer->layout());
    sim::ClientStateStore store(sim::StateStoreOptions{}, layout->fingerprint());
    auto coll = sim::makeLocal();
    sim::SimFleet fleet(sim::SimFleetConfig{}, clients, *trainer, store, *coll, nullptr);
    server::EngineConfig ec;
    ec.rounds = 1;
    ec.scheme.compressor = compressor;
    ec.sampling.fraction = 0.5;
    ec.fit = protocol::FitSettings{1, 16, 0.05f};
    std::vector<float> init(layout->numel());
    trainer->initParameters(init, 1);
    server::RoundEngine engine(layout, ec, init);
    REQUIRE(engine.runRound(fleet).applied);
    const std::span<const float> m = engine.model().current();
    return std::make_pair(std::vector<float>(m.begin(), m.end()), init);
  };
  for (const char* compressor : {"none", "topk:density=0.05"}) {
    INFO(compressor);
    const auto [gpu, init] = round(kGpu, compressor);
    const auto [cpu, init_cpu] = round(Device{}, compressor);
    REQUIRE(init == init_cpu);
    std::vector<float> dg(gpu.size()), dc(cpu.size());
    for (size_t i = 0; i < gpu.size(); ++i) {
      dg[i] = gpu[i] - init[i];
      dc[i] = cpu[i] - init_cpu[i];
    }
    // The criterion: the model within 1e-3. Dense, the round's update itself is held to
    // it (stricter: the model hides a small update); top-k may pick other entries where two
    // clients' values tie to rounding at its threshold, which moves the update but not the model.
    CHECK(relativeDiff(gpu, cpu) <= 1e-3);
    if (std::string(compressor) == "none") CHECK(relativeDiff(dg, dc) <= 1e-3);
  }
}

TEST_CASE("the split cloud's step on the GPU equals its step on the CPU", "[gpu][split]") {
  for (const char* model : {"cnn", "resnet", "vit"}) {
    INFO(model);
    split::SplitModel cpu(model, split::SplitModel::cutPoints(model)[1], 28, 28, 10);
    split::SplitModel gpu(model, split::SplitModel::cutPoints(model)[1], 28, 28, 10);
    gpu.setCloudDevice(kGpu);
    REQUIRE(gpu.cloudDevice() == kGpu);
    const auto [bottom, top] = cpu.cutParameters(cpu.initParameters(3));
    const data::Dataset d = testing::blobImages(16, 28, 28, 10, 5);
    const size_t n = 16;
    const auto act = cpu.edgeForward(bottom, d.images, n);
    const auto rc = cpu.cloudStep(top, act, d.labels, n);
    const auto rg = gpu.cloudStep(top, act, d.labels, n);
    CHECK(rg.loss == Approx(rc.loss).epsilon(1e-4));
    CHECK(rg.correct == rc.correct);
    CHECK(relativeDiff(rg.grad_top, rc.grad_top) <= 1e-3);
    CHECK(relativeDiff(rg.grad_activations, rc.grad_activations) <= 1e-3);
    const auto ec = cpu.evaluate(bottom, top, d.images, d.labels, n);
    const auto eg = gpu.evaluate(bottom, top, d.images, d.labels, n);
    CHECK(eg.loss == Approx(ec.loss).epsilon(1e-4));
  }
}

TEST_CASE("top-k and stc on the GPU send the CPU compressor's payloads and keep its residual",
          "[gpu][device_compress]") {
  const torch::Device cuda(torch::kCUDA, 0);
  testing::checkTopKIndicesOrder(cuda);
  testing::checkDeviceTopKMatchesCpu(cuda);
}

TEST_CASE("rand-k, random-block, sign and QSGD on the GPU send the CPU compressor's payloads",
          "[gpu][device_compress]") {
  testing::checkDeviceEncodeMatchesCpu(torch::Device(torch::kCUDA, 0));
}

TEST_CASE("PowerSGD and ACP-SGD on the GPU send the CPU compressor's factors, bit for bit",
          "[gpu][device_compress]") {
  testing::checkDeviceLowRankMatchesCpu(torch::Device(torch::kCUDA, 0));
}

TEST_CASE(
    "the round on the GPU sends the host path's payloads, keeps its residual and forms its "
    "SCAFFOLD "
    "control change, bit for bit",
    "[gpu][device_round]") {
  testing::checkDeviceRoundMatchesHost(kGpu);
  testing::checkDeviceLowRankRoundMatchesHost(kGpu);
  testing::checkDeviceScaffoldRoundMatchesHost(kGpu);
}

TEST_CASE(
    "the GPU divides by a device tensor as the host divides (SCAFFOLD's control change), not by "
    "the reciprocal",
    "[gpu][device_round]") {
  testing::checkDeviceDivisionRoundsAsHost(torch::Device(torch::kCUDA, 0));
}

int main(int argc, char** argv) {
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  starling::testing::failEmptyTests(session);
  const Catch::ConfigData& c = session.configData();
  const bool listing =
      c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters || c.showHelp;
  if (!listing) {
    const DeviceInventory inv = deviceInventory();
    if (inv.gpus == 0) {
      std::printf("no GPU for LibTorch (%s): skipped\n",
                  inv.cuda_built ? "a CUDA LibTorch that sees no GPU" : "a LibTorch without CUDA");
      return 77;
    }
    useReproducibleCuda();  // as starling-sim and starling-split do on a GPU: no TF32
  }
  return session.run();
}
