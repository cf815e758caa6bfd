// After its first client, a trainer reuses its scratch: the number of operator-new allocations in
// fit() does not grow with the number of batches. Counted with a replaced global operator new (its
// own binary), at the size of the Fashion-MNIST demo (784 features, 10 classes). Eigen's matrix
// products take their occasional blocking workspace from malloc, which this does not count.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <new>

#include "client/synthetic.h"
#include "client/trainer.h"
#include "counting_new.h"
#include "emulated.h"

namespace alloc = starling::testing::alloc;

using namespace starling;
using namespace starling::client;

TEST_CASE("fit's own scratch allocates nothing per batch once warmed up", "[client]") {
  data::Dataset d = testing::gaussianData(640, 784, 10, 1);
  d.rows = 28;
  d.cols = 28;
  // Under qemu or AddressSanitizer (tests/emulated.h) the convolutional models take 8 x 8 images:
  // the same buffers, smaller.
  data::Dataset small = testing::gaussianData(640, 64, 10, 1);
  small.rows = 8;
  small.cols = 8;
  const auto all = testing::allIndices(d);
  const std::vector<size_t> few(all.begin(), all.begin() + 64);
  for (const char* spec : {"softmax", "mlp:hidden=128", "cnn", "resnet:momentum=0.9"}) {
    INFO(spec);
    const bool conv =
        std::string(spec).rfind("cnn", 0) == 0 || std::string(spec).rfind("resnet", 0) == 0;
    const data::Dataset& data = conv && testing::kReduced ? small : d;
    auto t = makeTrainer(spec, data);
    std::vector<float> global(t->layout().numel());
    t->initParameters(global, 1);
    const FitConfig cfg{.epochs = 1, .batch_size = 32, .lr = 0.01};
    const auto count = [&](const std::vector<size_t>& idx) {
      std::vector<float> p = global;
      RngStream rng(StreamKey{1, 1, 0, StreamPurpose::kTraining, 0});
      const long before = alloc::count.load();
      t->fit(p, DataView{&data, idx}, cfg, rng);
      return alloc::count.load() - before;
    };
    // Warm-up: scratch grows to the largest client. A fresh trainer allocates at least its
    // working copy, the gradient, the batch, the labels, the order and the model's scratch
    // (aligned or not): fewer would mean the counter no longer sees them.
    CHECK(count(all) >= 6);
    const long for_few = count(few), for_all = count(all);  // 2 batches vs 20
    CHECK(for_few == for_all);
    CHECK(for_all <= 4);  // the result's metric list
  }
}
