// starling-torch-loop-bench: the LibTorch trainer's cost over a bare LibTorch training loop of the
// same model on the same data, measured in the same run (the goal: at most ~10% over the bare
// loop). docs/performance.md, section "LibTorch trainer", records the figures with the command.
//
//   cnn_fit/bare_loop   a plain single-threaded LibTorch loop as a C++ user writes it: torch::nn
//                       modules (McMahan et al.'s CNN), torch::optim::SGD, a randperm per epoch,
//                       index_select batches, zero_grad / forward / cross_entropy / backward /
//                       step. No metrics.
//   cnn_fit/trainer     Trainer::fit of torch_trainer's "cnn" on the same examples (flat buffer
//                       in and out, Starling's shuffle, train_loss and train_accuracy per batch).
//   cnn_fit/paired      both, alternating epoch by epoch and timed separately (counters bare_ms,
//                       trainer_ms, trainer_over_bare): robust to the load of a shared machine
//                       drifting between the two benchmarks above.
//   cnn_fit/eigen       Trainer::fit of the lightweight client's Eigen "cnn" (client/cnn_model.cc,
//                       no LibTorch), the same model, examples, batches and shuffle (the goal:
//                       at least 0.7x the LibTorch trainer's speed on one core).
//   cnn_fit/eigen_paired  the Eigen and the LibTorch trainer alternating epoch by epoch (counters
//                       eigen_ms, torch_ms, eigen_speed_vs_torch).
//   topk_encode/host    top-k 1% (layer scope) of a CNN-sized update (1,663,370 values, normal)
//                       by TopKCompressor on the host, as a worker does today.
//   topk_encode/device  the same payloads by torch_trainer::encodeTopK where --device puts the
//                       update (is the round on the device worth its wiring?), the copy
//                       of the k indices and values to the host included.
//
// One iteration is one epoch over 600 Fashion-MNIST-sized examples (28x28x1, 10 classes), batch
// 32, lr 0.05: the first 600 of Fashion-MNIST's training split when the Debian package is
// installed, random images otherwise. Both run with --threads (default 1) LibTorch threads; the
// counter samples_per_s is examples per second of wall time.
//
// --device=cuda (or cuda:N, auto; default cpu) puts the bare loop and the LibTorch trainer on a
// GPU: the bare loop moves its model and data there once and draws its permutation there, as a C++
// user writes it, and reads one value back at the end of each epoch so that the time counts the
// GPU's work; both run under useReproducibleCuda() (deterministic cuDNN, no TF32), as starling-sim
// does, so the bare loop is the compute limit of the same arithmetic (scripts/gpu-check.sh runs
// several side by side). The Eigen benchmarks stay on the CPU.
//
//   starling-torch-loop-bench [--threads=N] [--device=D] [--ratios_out=FILE] [Google Benchmark
//   flags]
#include <torch/torch.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "bench/image_data.h"
#include "bench/ratios.h"
#include "client/trainer.h"
#include "compression/sparsify.h"
#include "core/rng.h"
#include "data/idx.h"
#include "torch_trainer/device.h"
#include "torch_trainer/device_compress.h"
#include "torch_trainer/threads.h"
#include "torch_trainer/torch_trainer.h"

namespace {

using namespace starling;

constexpr size_t kSamples = 600;
constexpr int64_t kBatch = 32;
constexpr double kLr = 0.05;

data::Dataset benchData() { return bench::fashionOrRandom(kSamples); }

const data::Dataset& benchDataOnce() {
  static const data::Dataset d = benchData();
  return d;
}

torch_trainer::Device g_device;  // --device

torch::Device torchDevice() {
  return g_device.cuda()
             ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(g_device.index))
             : torch::Device(torch::kCPU);
}

struct BareCnn : torch::nn::Module {
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 32, 5).padding(2)};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(32, 64, 5).padding(2)};
  torch::nn::Linear fc1{64 * 7 * 7, 512}, fc2{512, 10};
  BareCnn() {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return fc2(torch::relu(fc1(x.flatten(1))));
  }
};

// The bare loop's state: the data as tensors, the model, the optimizer.
struct Bare {
  const data::Dataset& d = benchDataOnce();
  const int64_t n = static_cast<int64_t>(d.size());
  const torch::Device dev = torchDevice();
  torch::Tensor x =
      torch::from_blob(const_cast<float*>(d.images.data()), {n, 1, 28, 28}, torch::kFloat32)
          .clone()
          .to(dev);
  torch::Tensor y = torch::from_blob(const_cast<uint8_t*>(d.labels.data()), {n}, torch::kUInt8)
                        .to(dev, torch::kInt64);
  std::shared_ptr<BareCnn> model = seeded(dev);
  torch::optim::SGD opt{model->parameters(), torch::optim::SGDOptions(kLr)};

  static std::shared_ptr<BareCnn> seeded(torch::Device dev) {
    torch::manual_seed(
        1);  // the bare loop initialises with LibTorch's global generator, as users do
    auto m = std::make_shared<BareCnn>();
    m->to(dev);
    return m;
  }
  void epoch() {
    const torch::Tensor perm = torch::randperm(n, torch::TensorOptions(torch::kInt64).device(dev));
    for (int64_t start = 0; start < n; start += kBatch) {
      const torch::Tensor idx = perm.narrow(0, start, std::min(kBatch, n - start));
      opt.zero_grad();
      const torch::Tensor loss = torch::nn::functional::cross_entropy(
          model->forward(x.index_select(0, idx)), y.index_select(0, idx));
      loss.backward();
      opt.step();
    }
    // One value read back: the epoch's time includes the device's work (a GPU runs asynchronously).
    benchmark::DoNotOptimize(model->fc2->bias.sum().item<float>());
  }
};

// The trainer's state: one model replica serving "clients" that all start from the global model.
struct Fit {
  explicit Fit(bool eigen = false)
      : trainer(eigen ? client::makeTrainer("cnn", benchDataOnce())
                      : torch_trainer::makeTorchTrainer("cnn", benchDataOnce(), g_device)) {}
  const data::Dataset& d = benchDataOnce();
  std::vector<size_t> idx = allIndices();
  std::unique_ptr<client::Trainer> trainer;
  std::vector<float> global = initial(*trainer), params;
  const client::FitConfig cfg{.epochs = 1, .batch_size = static_cast<uint32_t>(kBatch), .lr = kLr};
  uint64_t round = 0;

  std::vector<size_t> allIndices() const {
    std::vector<size_t> v(d.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = i;
    return v;
  }
  static std::vector<float> initial(const client::Trainer& t) {
    std::vector<float> g(t.layout().numel());
    t.initParameters(g, 1);
    return g;
  }
  void epoch() {
    params = global;  // a client starts from the global model (the copy is part of a client's cost)
    RngStream rng(StreamKey{1, round++, 0, StreamPurpose::kTraining, 0});
    benchmark::DoNotOptimize(trainer->fit(params, client::DataView{&d, idx}, cfg, rng));
  }
};

void setRate(benchmark::State& st) {
  st.counters["samples_per_s"] = benchmark::Counter(static_cast<double>(st.iterations()) * kSamples,
                                                    benchmark::Counter::kIsRate);
}

void bareLoop(benchmark::State& st) {
  Bare b;
  for (auto _ : st) b.epoch();
  setRate(st);
}

void trainerFit(benchmark::State& st) {
  Fit f;
  for (auto _ : st) f.epoch();
  setRate(st);
}

void eigenFit(benchmark::State& st) {
  Fit f(true);
  for (auto _ : st) f.epoch();
  setRate(st);
}

void eigenPaired(benchmark::State& st) {
  Fit e(true), t;
  const auto [eigen_s, torch_s] = bench::pairedSeconds(
      st, [&] { e.epoch(); }, [&] { t.epoch(); });
  const auto iters = static_cast<double>(st.iterations());
  st.counters["eigen_ms"] = 1e3 * eigen_s / iters;
  st.counters["torch_ms"] = 1e3 * torch_s / iters;
  st.counters["eigen_speed_vs_torch"] = torch_s / eigen_s;
}

// Both, alternating epoch by epoch, each timed on its own: slow changes of the machine's load
// (other jobs on a shared machine) hit both alike. Counters: milliseconds per epoch of each (wall
// time) and their ratio.
void paired(benchmark::State& st) {
  Bare b;
  Fit f;
  const auto [bare_s, fit_s] = bench::pairedSeconds(
      st, [&] { b.epoch(); }, [&] { f.epoch(); });
  const auto iters = static_cast<double>(st.iterations());
  st.counters["bare_ms"] = 1e3 * bare_s / iters;
  st.counters["trainer_ms"] = 1e3 * fit_s / iters;
  st.counters["trainer_over_bare"] = fit_s / bare_s;
}

// A CNN-sized update, its layout, and top-k 1% at layer scope.
struct TopKInput {
  std::unique_ptr<client::Trainer> cnn = torch_trainer::makeTorchTrainer("cnn", benchDataOnce());
  const ParamLayout& layout = cnn->layout();
  std::vector<float> update = normal(layout.numel());
  compression::TopKOptions opt{.density = 0.01};
  compression::TopKCompressor comp{opt};

  static std::vector<float> normal(size_t n) {
    RngStream r(StreamKey{1, 0, 0, StreamPurpose::kTest, 7});
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(r.normal());
    return v;
  }
};

void topkHost(benchmark::State& st) {
  TopKInput in;
  const compression::RoundContext ctx{1, 1, 0, 0, nullptr};
  for (auto _ : st) benchmark::DoNotOptimize(in.comp.compress(in.layout, in.update, ctx));
}

void topkDevice(benchmark::State& st) {
  TopKInput in;
  torch::Tensor acc = torch::from_blob(in.update.data(), {static_cast<int64_t>(in.update.size())})
                          .clone()
                          .to(torchDevice());
  for (auto _ : st)
    benchmark::DoNotOptimize(torch_trainer::encodeTopK(in.opt, in.layout, acc, false));
}

}  // namespace

int main(int argc, char** argv) {
  starling::bench::CommandLine cl;
  int threads = 1;
  std::string device = "cpu";
  const auto threads_flag = starling::bench::threadsFlag(threads);
  const bool ok = starling::bench::initBenchmarks(argc, argv, cl, [&](const std::string& a) {
    if (a.rfind("--device=", 0) != 0) return threads_flag(a);
    device = a.substr(9);
    return true;
  });
  if (!ok) return 1;
  starling::torch_trainer::setThreads(threads);
  try {
    g_device = starling::torch_trainer::chooseDevice(device);
  } catch (const std::exception& e) {
    std::cerr << "starling-torch-loop-bench: --device=" << device << ": " << e.what() << "\n";
    return 1;
  }
  if (g_device.cuda()) starling::torch_trainer::useReproducibleCuda();
  std::cerr << "device: " << g_device.str() << "\n";
  benchDataOnce();
  benchmark::RegisterBenchmark("cnn_fit/bare_loop", bareLoop)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("cnn_fit/trainer", trainerFit)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("cnn_fit/paired", paired)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();

  benchmark::RegisterBenchmark("cnn_fit/eigen", eigenFit)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("cnn_fit/eigen_paired", eigenPaired)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();

  benchmark::RegisterBenchmark("topk_encode/host", topkHost)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("topk_encode/device", topkDevice)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();

  const auto rec = starling::bench::runBenchmarks(cl.json);
  const std::vector<starling::bench::Ratio> ratios = {
      {"trainer_time_over_bare_loop/cnn", "cnn_fit/trainer", "cnn_fit/bare_loop", "<= 1.10"},
      {"eigen_cnn_speed_vs_libtorch", "cnn_fit/trainer", "cnn_fit/eigen",
       ">= 0.7 (the lightweight client's CNN step against LibTorch's, one core)"},
      {"topk_encode_device_speedup", "topk_encode/host", "topk_encode/device",
       "none: the host's time over the device's, for the round on the device"}};
  if (!starling::bench::reportRatios(*rec, ratios, cl.ratios_out)) return 1;
  benchmark::Shutdown();
  return 0;
}
