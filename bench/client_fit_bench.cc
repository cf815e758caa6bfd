// The Eigen trainers' fit (the deployed client's local training) against the bare compute it is
// made of, same run: `client_fit/<spec>` is EigenTrainer::fit on a copy of the global model, one
// epoch over 640 Fashion-MNIST-sized examples (784 features, 10 classes, batch 32);
// `client_fit_bare/<spec>` runs the same 20 batches, already gathered, through the model's
// forwardBackward and the SGD step on aligned buffers, with no shuffle, copy or check. Their ratio
// is what the trainer adds to the model's own work (fit trains on an aligned copy of
// the parameters; docs/performance.md, "Eigen trainers").
#include <vector>

#include "bench/bench_common.h"
#include "client/eigen_model.h"
#include "client/trainer.h"
#include "core/aligned.h"
#include "core/rng.h"

namespace starling::bench {
namespace {

constexpr size_t kExamples = 640, kFeatures = 784, kBatch = 32;
constexpr uint32_t kClasses = 10;
// The bare loop maps batches in place: each must start on a 64-byte boundary (forwardBackward
// refuses others), which a row of kFeatures floats keeps.
static_assert(kFeatures * sizeof(float) % kSimdAlign == 0);

const data::Dataset& fitData() {
  static const data::Dataset d = [] {
    data::Dataset r;
    r.rows = 28;
    r.cols = 28;
    r.num_classes = kClasses;
    RngStream g(StreamKey{2026, 0, 0, StreamPurpose::kTest, 18});
    r.images.resize(kExamples * kFeatures);
    for (float& x : r.images) x = static_cast<float>(g.uniform());
    for (size_t i = 0; i < kExamples; ++i)
      r.labels.push_back(static_cast<uint8_t>(g.below(kClasses)));
    return r;
  }();
  return d;
}

std::unique_ptr<client::EigenModel> makeModel(const std::string& spec) {
  if (spec == "softmax") return client::makeSoftmaxModel(kFeatures, kClasses);
  return client::makeMlpModel(kFeatures, kClasses, 128);
}

void registerFit(const std::string& spec) {
  benchmark::RegisterBenchmark(("client_fit/" + spec).c_str(), [spec](benchmark::State& st) {
    const data::Dataset& d = fitData();
    auto t = client::makeTrainer(spec, kFeatures, kClasses);
    std::vector<float> global(t->layout().numel()), p;
    t->initParameters(global, 1);
    std::vector<size_t> idx(kExamples);
    for (size_t i = 0; i < kExamples; ++i) idx[i] = i;
    const client::FitConfig cfg{.epochs = 1, .batch_size = kBatch, .lr = 0.05};
    uint64_t round = 0;
    for (auto _ : st) {
      p = global;
      RngStream rng(StreamKey{1, round++, 0, StreamPurpose::kTraining, 0});
      benchmark::DoNotOptimize(t->fit(p, client::DataView{&d, idx}, cfg, rng));
    }
    st.counters["examples_per_s"] = benchmark::Counter(
        static_cast<double>(kExamples), benchmark::Counter::kIsIterationInvariantRate);
  });
  benchmark::RegisterBenchmark(("client_fit_bare/" + spec).c_str(), [spec](benchmark::State& st) {
    const data::Dataset& d = fitData();
    auto m = makeModel(spec);
    const size_t n = m->layout().numel();
    AlignedVector<float> global(n), p(n), grad(n);
    m->initParameters(global, 1);
    const AlignedVector<float> x(d.images.begin(), d.images.end());
    for (auto _ : st) {
      p = global;
      for (size_t start = 0; start < kExamples; start += kBatch) {
        const ConstRowMatrixMap xb(x.data() + start * kFeatures, kBatch, kFeatures);
        m->forwardBackward(p, xb, std::span<const uint8_t>(d.labels).subspan(start, kBatch), grad);
        VectorMap(p.data(), static_cast<Eigen::Index>(n)) -=
            0.05f * ConstVectorMap(grad.data(), static_cast<Eigen::Index>(n));
      }
      benchmark::DoNotOptimize(p.data());
    }
    st.counters["examples_per_s"] = benchmark::Counter(
        static_cast<double>(kExamples), benchmark::Counter::kIsIterationInvariantRate);
  });
}

}  // namespace

void registerClientFitBenchmarks() {
  for (const char* spec : {"softmax", "mlp:hidden=128"}) registerFit(spec);
}

}  // namespace starling::bench
