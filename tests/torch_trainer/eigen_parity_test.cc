// The lightweight client's Eigen models against the LibTorch trainer's: the same spec
// is the same model on a deployed client and in the simulator. Same layout and fingerprint, the
// same initial bits from a seed; then each trainer against a double-precision reference of the
// same computation (double_reference.h): the loss of the same parameters, one step (the gradient,
// with momentum, FedProx and SCAFFOLD) and a local epoch, within what float32 arithmetic of that
// computation can promise. Not against each other: two right float32 results may differ by more
// than either differs from the exact one. Registered again under each oneDNN ISA
// ([isa]). Both trainers through the Trainer interface, so this file needs no LibTorch header.
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>

#include "client/synthetic.h"
#include "client/trainer.h"
#include "torch_trainer/blobs.h"
#include "torch_trainer/double_reference.h"
#include "torch_trainer/torch_trainer.h"

using namespace starling;
using client::DataView;
using client::FitConfig;

namespace {

using testing::fitMetric;

struct Pair {
  std::unique_ptr<client::Trainer> eigen, torch;
};

Pair makePair(const std::string& spec, const data::Dataset& d) {
  return {client::makeTrainer(spec, d), torch_trainer::makeTorchTrainer(spec, d)};
}

}  // namespace

TEST_CASE("Eigen and LibTorch models: the same layout and the same initial bits",
          "[torch_trainer][parity][isa]") {
  const data::Dataset d = testing::blobImages(8, 28, 28, 10, 1);
  for (const char* spec : {"softmax", "logreg", "mlp", "mlp:hidden=64", "cnn", "resnet"}) {
    INFO(spec);
    const Pair p = makePair(spec, d);
    CHECK(p.eigen->spec() == p.torch->spec());
    CHECK(p.eigen->layout().fingerprint() == p.torch->layout().fingerprint());
    std::vector<float> a(p.eigen->layout().numel()), b(p.torch->layout().numel(), 1.0f);
    p.eigen->initParameters(a, 11);
    p.torch->initParameters(b, 11);
    CHECK(a == b);
  }
}

TEST_CASE("Eigen and LibTorch models: the same forward pass, step and local epoch",
          "[torch_trainer][parity][isa]") {
  // Blobs on noise, 28 x 28, 10 classes: the CNN learns them within an epoch, so the epoch
  // moves the model far from its start and the comparison means something.
  const data::Dataset d = testing::blobImages(160, 28, 28, 10, 3);
  const auto idx = testing::allIndices(d);
  const DataView view{&d, idx};
  struct Case {
    const char* spec;
    testing::ReferenceConfig ref;
    bool scaffold;
  };
  const auto ref = [](const char* model, double lr, double momentum, double prox_mu) {
    testing::ReferenceConfig r;
    r.model = model;
    r.hidden = 64;
    r.lr = lr;
    r.momentum = momentum;
    r.prox_mu = prox_mu;
    r.batch_size = 16;
    return r;
  };
  for (Case& k : std::vector<Case>{{"logreg", ref("logreg", 0.1, 0, 0), false},
                                   {"mlp:hidden=64", ref("mlp", 0.1, 0, 0), false},
                                   {"cnn", ref("cnn", 0.05, 0, 0), false},
                                   {"cnn:momentum=0.9", ref("cnn", 0.01, 0.9, 0), false},
                                   {"cnn", ref("cnn", 0.05, 0, 0.1), true},
                                   {"resnet", ref("resnet", 0.05, 0, 0), false},
                                   {"resnet:momentum=0.9", ref("resnet", 0.01, 0.9, 0.1), true}}) {
    INFO(k.spec << ", lr " << k.ref.lr << ", prox_mu " << k.ref.prox_mu
                << (k.scaffold ? ", SCAFFOLD" : ""));
    const Pair p = makePair(k.spec, d);
    const ParamLayout& l = p.torch->layout();
    std::vector<float> start(l.numel());
    p.torch->initParameters(start, 5);
    // A SCAFFOLD correction and a FedProx anchor that differ from the start.
    std::vector<float> correction(l.numel()), anchor(start);
    for (size_t i = 0; i < l.numel(); ++i) {
      correction[i] = 0.01f * static_cast<float>((i * 37) % 11) - 0.05f;
      anchor[i] += 0.02f * static_cast<float>((i * 13) % 7) - 0.06f;
    }
    FitConfig cfg{.epochs = 1, .batch_size = 16, .lr = k.ref.lr};
    cfg.prox_mu = k.ref.prox_mu;
    if (k.ref.prox_mu > 0) {
      cfg.prox_anchor = anchor;
      k.ref.anchor = anchor;
    }
    if (k.scaffold) {
      cfg.correction = correction;
      k.ref.correction = correction;
    }

    // The forward pass: loss and accuracy of the same parameters, the loss against double.
    const client::EvalResult ee = p.eigen->evaluate(start, view),
                             et = p.torch->evaluate(start, view);
    const double exact_loss = testing::referenceLoss(k.ref, l, d, idx, start);
    CHECK(ee.loss == Approx(exact_loss).epsilon(1e-5));
    CHECK(et.loss == Approx(exact_loss).epsilon(1e-5));
    CHECK(ee.accuracy == et.accuracy);

    // One step on a batch of 16, then a local epoch of batches of 16 (10 steps) from the same
    // start: each trainer against the double-precision reference of the same steps, tensor by
    // tensor, within what float32 arithmetic of those steps can promise (double_reference.h).
    // Neither trainer is compared with the other: on some CPUs and oneDNN kernels a max-pool
    // near-tie of this data is routed one way by one and the other way by the other, and both
    // are right.
    struct Run {
      const char* what;
      std::span<const size_t> examples;
      uint64_t stream;
    };
    for (const Run& run :
         {Run{"step", std::span<const size_t>(idx).subspan(64, 16), 1}, Run{"epoch", idx, 2}}) {
      const RngStream rng(StreamKey{1, run.stream, 7, StreamPurpose::kTraining, 0});
      const testing::Reference reference(k.ref, l, d, run.examples, start, rng);
      const DataView data{&d, run.examples};
      const bool step = run.examples.size() < idx.size(),
                 resnet = l.find("bn1.running_mean").has_value();
      for (const auto* trainer : {&p.eigen, &p.torch}) {
        INFO(run.what << ", " << (trainer == &p.eigen ? "Eigen" : "LibTorch"));
        std::vector<float> params(start);
        RngStream r = rng;
        const client::FitResult f = (*trainer)->fit(params, data, cfg, r);
        for (const testing::Verdict& v : reference.judge(params)) {
          INFO(v.name << ": " << v.error << " of the step from the double result, float32 "
                      << "promises " << v.tolerance);
          CHECK(v.ok());
          // The comparison means something: float32 promises the step within 0.3%, and the
          // epoch within 3% -- but for ResNet, whose epoch of BatchNorm on batches of 16 is
          // ill-conditioned (the ReLUs after BatchNorm sit at 0): a Monte Carlo sample of it
          // ended 5% of the step away at lr 0.05 (8% at lr 0.02, where Eigen's own result was
          // 0.25% away), while both trainers ended within 1e-4. The step holds ResNet to 0.3%.
          if (step || !resnet) CHECK(v.tolerance < (step ? 3e-3 : 3e-2));
        }
        for (const testing::Verdict& v :
             reference.judgeMetrics(fitMetric(f, "train_loss"), fitMetric(f, "train_accuracy"))) {
          INFO(v.name << ": " << v.error << " from the double result, float32 promises "
                      << v.tolerance);
          CHECK(v.ok());
        }
      }
      if (step) continue;
      // The epoch went somewhere, and it learned (ResNet evaluates with running statistics that
      // 10 steps barely moved: its training loss says it).
      const std::vector<double>& exact = reference.exact().params;
      double moved = 0;
      for (size_t t = 0; t < l.size(); ++t) {
        double diff = 0, norm = 0;
        for (size_t i = l[t].offset; i < l[t].offset + l[t].numel; ++i) {
          diff += (exact[i] - start[i]) * (exact[i] - start[i]);
          norm += static_cast<double>(start[i]) * start[i];
        }
        moved = std::max(moved, std::sqrt(diff / std::max(norm, 1e-300)));
      }
      CHECK(moved > 1e-2);
      if (resnet) {
        CHECK(reference.exact().train_loss < exact_loss);
      } else {
        const std::vector<float> trained(exact.begin(), exact.end());
        CHECK(testing::referenceLoss(k.ref, l, d, idx, trained) < exact_loss);
      }
    }
  }
}

TEST_CASE("the LibTorch trainer stops as the Eigen one does", "[torch_trainer][parity][isa]") {
  const data::Dataset d = testing::blobImages(40, 28, 28, 10, 4);
  const auto idx = testing::allIndices(d);
  auto t = torch_trainer::makeTorchTrainer("cnn", d);
  std::vector<float> params(t->layout().numel());
  t->initParameters(params, 2);
  const std::vector<float> before = params;
  std::atomic<bool> stop{true};
  FitConfig cfg{.epochs = 1, .batch_size = 8, .lr = 0.1};
  cfg.stop = &stop;
  RngStream rng(StreamKey{1, 1, 7, StreamPurpose::kTraining, 0});
  CHECK_THROWS_AS(t->fit(params, DataView{&d, idx}, cfg, rng), client::TrainingStopped);
  CHECK(params == before);
}

TEST_CASE("Eigen and LibTorch models: odd image sizes, where pooling and strides drop an edge",
          "[torch_trainer][parity][isa]") {
  // 30 x 29: the CNN's poolings give 15 x 14 then 7 x 7 (a row dropped at the second, a column at
  // the first); ResNet's strides give 15 x 15 and 8 x 8.
  const data::Dataset d = testing::blobImages(48, 30, 29, 10, 6);
  const auto idx = testing::allIndices(d);
  for (const char* spec : {"cnn", "resnet"}) {
    INFO(spec);
    const Pair p = makePair(spec, d);
    const ParamLayout& l = p.torch->layout();
    REQUIRE(p.eigen->layout().fingerprint() == l.fingerprint());
    std::vector<float> start(l.numel());
    p.torch->initParameters(start, 8);
    testing::ReferenceConfig ref;
    ref.model = spec;
    ref.lr = 0.05;
    ref.batch_size = 16;
    const double exact_loss = testing::referenceLoss(ref, l, d, idx, start);
    CHECK(p.eigen->evaluate(start, DataView{&d, idx}).loss == Approx(exact_loss).epsilon(1e-5));
    CHECK(p.torch->evaluate(start, DataView{&d, idx}).loss == Approx(exact_loss).epsilon(1e-5));
    const FitConfig cfg{.epochs = 1, .batch_size = 16, .lr = ref.lr};
    const auto first = std::span<const size_t>(idx).first(16);
    const RngStream rng(StreamKey{1, 3, 7, StreamPurpose::kTraining, 0});
    const testing::Reference reference(ref, l, d, first, start, rng);
    for (const auto* trainer : {&p.eigen, &p.torch}) {
      INFO((trainer == &p.eigen ? "Eigen" : "LibTorch"));
      std::vector<float> params(start);
      RngStream r = rng;
      (*trainer)->fit(params, DataView{&d, first}, cfg, r);
      for (const testing::Verdict& v : reference.judge(params)) {
        INFO(v.name << ": " << v.error << " of the step from the double result, float32 promises "
                    << v.tolerance);
        CHECK(v.ok());
        CHECK(v.tolerance < 3e-3);
      }
    }
  }
}

TEST_CASE(
    "a CNN step through a max-pool near-tie: float32 promises less, and both trainers keep "
    "to it",
    "[torch_trainer][parity][isa]") {
  // On this batch the second max-pool has a window whose two largest inputs differ by
  // 6.2e-8 of their value (0.1075268751 and 0.1075268685 in double), within float32's rounding.
  // Some of oneDNN's kernels pick the other input than the double computation and the Eigen
  // client do (here, an AVX-512 Xeon: under DNNL_MAX_CPU_ISA=AVX2, not under ALL; on the
  // reporter's AVX-512 EPYC the reverse), the gradient goes down another path, and conv1's step
  // differs by 0.24% (0.5% on its bias). Both are right: the Monte Carlo samples of the same step
  // route it either way, so the reference promises no better there, and each trainer keeps to it.
  const data::Dataset d = testing::blobImages(160, 28, 28, 10, 3);
  const auto idx = testing::allIndices(d);
  const auto batch = std::span<const size_t>(idx).first(16);
  const Pair p = makePair("cnn", d);
  const ParamLayout& l = p.torch->layout();
  std::vector<float> start(l.numel());
  p.torch->initParameters(start, 5);
  testing::ReferenceConfig ref;
  ref.model = "cnn";
  ref.lr = 0.05;
  ref.batch_size = 16;
  const RngStream rng(StreamKey{1, 1, 7, StreamPurpose::kTraining, 0});
  const testing::Reference reference(ref, l, d, batch, start, rng);
  const FitConfig cfg{.epochs = 1, .batch_size = 16, .lr = ref.lr};
  for (const auto* trainer : {&p.eigen, &p.torch}) {
    INFO((trainer == &p.eigen ? "Eigen" : "LibTorch"));
    std::vector<float> params(start);
    RngStream r = rng;
    (*trainer)->fit(params, DataView{&d, batch}, cfg, r);
    for (const testing::Verdict& v : reference.judge(params)) {
      INFO(v.name << ": " << v.error << " of the step from the double result, float32 promises "
                  << v.tolerance);
      CHECK(v.ok());
      // The tie is seen: what float32 promises for the convolutions is a tie's routing, over
      // ten times the 1e-4 of a batch without one (the step of the test above).
      if (v.name == "conv1.bias") CHECK(v.tolerance > 1e-3);
    }
  }
}
