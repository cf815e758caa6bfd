// starling-split-bench: the cloud's time per split fine-tuning step against one step of the unsplit
// model, measured in the same run (docs/performance.md, "Split fine-tuning").
//
//   split_step/unsplit         one SGD step of the whole CNN (torch_trainer's fit over one batch:
//                              forward, loss, backward, update), the step the cloud would run
//                              alone without a split
//   split_step/cloud/CUT[/svdR] SplitCloud::step on the activations of one batch at cut CUT
//                              (decode, the top part's forward, loss and backward, the update,
//                              the gradient's encoding; codecs "none"), with the weight-side cut of
//                              rank R where named
//   split_step/paired/CUT...   the unsplit step and the cloud's step alternately, timed apart
//                              (counters unsplit_ms, cloud_ms, cloud_over_unsplit): robust to a
//                              shared machine's load drifting between the benchmarks above
//
// One iteration is 10 steps of batch 32 (28x28x1, 10 classes: the first 320 examples of
// Fashion-MNIST's training split when the Debian package is installed, random images otherwise),
// --threads LibTorch threads (default 1).
//
//   starling-split-bench [--threads=N] [--ratios_out=FILE] [Google Benchmark flags]
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "bench/image_data.h"
#include "bench/ratios.h"
#include "core/rng.h"
#include "data/idx.h"
#include "split/roles.h"
#include "split/split_model.h"
#include "split/trainer.h"
#include "torch_trainer/threads.h"
#include "torch_trainer/torch_trainer.h"

namespace {

using namespace starling;

constexpr size_t kBatch = 32;
constexpr size_t kSteps = 10;

const data::Dataset& benchData() {
  static const data::Dataset data_set = bench::fashionOrRandom(kBatch * kSteps);
  return data_set;
}

// kSteps steps of the whole model: one fit over kSteps batches.
struct Unsplit {
  const data::Dataset& d = benchData();
  std::unique_ptr<client::Trainer> trainer = torch_trainer::makeTorchTrainer("cnn", d);
  std::vector<float> params;
  std::vector<size_t> idx;
  uint64_t round = 0;
  Unsplit() {
    params.resize(trainer->layout().numel());
    trainer->initParameters(params, 1);
    for (size_t i = 0; i < d.size(); ++i) idx.push_back(i);
  }
  void run() {
    RngStream rng(StreamKey{1, round++, 0, StreamPurpose::kTraining, 0});
    const client::FitConfig cfg{.epochs = 1, .batch_size = kBatch, .lr = 0.05};
    benchmark::DoNotOptimize(trainer->fit(params, client::DataView{&d, idx}, cfg, rng));
  }
};

// kSteps cloud steps on the activations of kSteps batches, computed once by the edge's part.
struct Cloud {
  split::SplitModel sm;
  std::unique_ptr<split::SplitCloud> cloud;
  std::vector<std::vector<uint8_t>> acts, labels;
  Cloud(const std::string& cut, uint32_t rank) : sm("cnn", cut, 28, 28, 10, rank) {
    const auto [bottom, top] = sm.cutParameters(sm.initParameters(1));
    cloud = std::make_unique<split::SplitCloud>(sm, top, "none", 0.05);
    split::SplitEdge edge(sm, bottom, "none", 0.05);
    const data::Dataset& d = benchData();
    std::vector<float> x;
    std::vector<uint8_t> y;
    for (size_t s = 0; s < kSteps; ++s) {
      std::vector<size_t> which;
      for (size_t i = 0; i < kBatch; ++i) which.push_back(s * kBatch + i);
      split::gatherBatch(d, which, x, y);
      acts.push_back(edge.forward(x, kBatch));
      labels.push_back(y);
    }
  }
  void run() {
    for (size_t s = 0; s < kSteps; ++s)
      benchmark::DoNotOptimize(cloud->step(1, acts[s], labels[s], kBatch));
  }
};

void unsplitBench(benchmark::State& st) {
  Unsplit u;
  for (auto _ : st) u.run();
}

void cloudBench(benchmark::State& st, std::string cut, uint32_t rank) {
  Cloud c(cut, rank);
  for (auto _ : st) c.run();
}

void pairedBench(benchmark::State& st, std::string cut, uint32_t rank) {
  Unsplit u;
  Cloud c(cut, rank);
  const auto [us, cs] = bench::pairedSeconds(
      st, [&] { u.run(); }, [&] { c.run(); });
  const double steps = static_cast<double>(st.iterations()) * kSteps;
  st.counters["unsplit_ms"] = 1e3 * us / steps;
  st.counters["cloud_ms"] = 1e3 * cs / steps;
  st.counters["cloud_over_unsplit"] = cs / us;
}

}  // namespace

int main(int argc, char** argv) {
  starling::bench::CommandLine cl;
  int threads = 1;
  const bool ok =
      starling::bench::initBenchmarks(argc, argv, cl, starling::bench::threadsFlag(threads));
  if (!ok) return 1;
  starling::torch_trainer::setThreads(threads);
  benchData();
  benchmark::RegisterBenchmark("split_step/unsplit", unsplitBench)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  const std::vector<std::pair<std::string, uint32_t>> cuts = {
      {"conv1", 0}, {"conv2", 0}, {"fc1", 0}, {"conv2", 32}};
  std::vector<starling::bench::Ratio> ratios;
  for (const auto& [cut, rank] : cuts) {
    const std::string name = cut + (rank ? "/svd" + std::to_string(rank) : "");
    benchmark::RegisterBenchmark(("split_step/cloud/" + name).c_str(), cloudBench, cut, rank)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("split_step/paired/" + name).c_str(), pairedBench, cut, rank)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    ratios.push_back({"cloud_step_over_unsplit_step/" + name, "split_step/cloud/" + name,
                      "split_step/unsplit", "reported"});
  }
  const auto rec = starling::bench::runBenchmarks(cl.json);
  if (!starling::bench::reportRatios(*rec, ratios, cl.ratios_out)) return 1;
  benchmark::Shutdown();
  return 0;
}
