// The LibTorch trainer through its public, LibTorch-free interface.
#include <catch2/catch.hpp>
#include <cmath>

#include "check_throws.h"
#include "client/address_check.h"
#include "client/synthetic.h"
#include "torch_trainer/blobs.h"
#include "torch_trainer/torch_trainer.h"

using namespace starling;
using namespace starling::torch_trainer;
using Catch::Matchers::Contains;
using client::DataView;
using client::FitConfig;

namespace {

double metric(const client::FitResult& r, const std::string& name) {
  for (const auto& m : r.metrics)
    if (m.name == name) return m.value;
  FAIL("no metric " << name);
  return 0;
}

RngStream trainingStream(uint64_t client) {
  return RngStream(StreamKey{1, 1, client, StreamPurpose::kTraining, 0});
}

std::vector<std::pair<std::string, std::vector<int64_t>>> shapes(const ParamLayout& l) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& t : l.tensors()) out.emplace_back(t.name, t.shape);
  return out;
}

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

}  // namespace

TEST_CASE("LibTorch models lay out their parameters in named_parameters order", "[torch_trainer]") {
  CHECK(torchTrainers().names() == "logreg, softmax, mlp, cnn, resnet, torchscript");

  const auto logreg = makeTorchTrainer("logreg", 28, 28, 10);
  CHECK(shapes(logreg->layout()) == Shapes{{"fc.weight", {10, 784}}, {"fc.bias", {10}}});
  CHECK(logreg->features() == 784);
  CHECK(logreg->classes() == 10);

  const auto mlp = makeTorchTrainer("mlp", 28, 28, 10);
  CHECK(mlp->spec() == "mlp:hidden=200");
  CHECK(shapes(mlp->layout()) == Shapes{{"fc1.weight", {200, 784}},
                                        {"fc1.bias", {200}},
                                        {"fc2.weight", {10, 200}},
                                        {"fc2.bias", {10}}});
  // Same names and shapes as the Eigen MLP: the same fingerprint, so either trainer can serve a
  // federation of this model.
  CHECK(mlp->layout().fingerprint() ==
        client::makeTrainer("mlp:hidden=200", 784, 10)->layout().fingerprint());

  const auto cnn = makeTorchTrainer("cnn", 28, 28, 10);
  CHECK(shapes(cnn->layout()) == Shapes{{"conv1.weight", {32, 1, 5, 5}},
                                        {"conv1.bias", {32}},
                                        {"conv2.weight", {64, 32, 5, 5}},
                                        {"conv2.bias", {64}},
                                        {"fc1.weight", {512, 3136}},
                                        {"fc1.bias", {512}},
                                        {"fc2.weight", {10, 512}},
                                        {"fc2.bias", {10}}});
  CHECK(cnn->layout().numel() == 1663370);  // McMahan et al.'s CNN with "same" padding
  CHECK(cnn->layout().fingerprint() == makeTorchTrainer("cnn", 28, 28, 10)->layout().fingerprint());
  CHECK(makeTorchTrainer("cnn", 28, 28, 62)->layout().fingerprint() != cnn->layout().fingerprint());

  // ResNet-8: the parameters (PyTorch's order: each module's own, then its children's), then
  // BatchNorm's running statistics (float buffers, same order); num_batches_tracked left out.
  const auto resnet = makeTorchTrainer("resnet", 28, 28, 10);
  const ParamLayout& rl = resnet->layout();
  REQUIRE(rl.size() == 29 + 18);
  CHECK(rl[0].name == "conv1.weight");
  CHECK(rl[0].shape == std::vector<int64_t>{16, 1, 3, 3});
  CHECK(rl[1].name == "bn1.weight");
  CHECK(rl[3].name == "layer1.0.conv1.weight");
  CHECK(rl[9].name == "layer2.0.conv1.weight");
  CHECK(rl[9].shape == std::vector<int64_t>{32, 16, 3, 3});
  CHECK(rl[15].name == "layer2.0.downsample.0.weight");
  CHECK(rl[15].shape == std::vector<int64_t>{32, 16, 1, 1});
  CHECK(rl[17].name == "layer2.0.downsample.1.bias");
  CHECK(rl[26].name == "layer3.0.downsample.1.bias");
  CHECK(rl[27].name == "fc.weight");
  CHECK(rl[27].shape == std::vector<int64_t>{10, 64});
  CHECK(rl[28].name == "fc.bias");
  CHECK(rl[29].name == "bn1.running_mean");
  CHECK(rl[30].name == "bn1.running_var");
  CHECK(rl[31].name == "layer1.0.bn1.running_mean");
  CHECK(rl[46].name == "layer3.0.downsample.1.running_var");
  size_t params = 0, buffers = 0;
  for (size_t i = 0; i < rl.size(); ++i) (i < 29 ? params : buffers) += rl[i].numel;
  CHECK(params == 77754);
  CHECK(buffers == 2 * (16 + 2 * 16 + 3 * 32 + 3 * 64));
}

TEST_CASE("LibTorch initial parameters follow PyTorch's defaults from the seed",
          "[torch_trainer]") {
  for (const char* spec : {"logreg", "mlp:hidden=32", "cnn", "resnet"}) {
    INFO(spec);
    const auto t = makeTorchTrainer(spec, 28, 28, 10);
    const ParamLayout& l = t->layout();
    std::vector<float> a(l.numel()), b(l.numel(), 7.0f), c(l.numel());
    t->initParameters(a, 11);
    t->initParameters(b, 11);
    t->initParameters(c, 12);
    CHECK(a == b);
    CHECK(a != c);
    // A fresh trainer (another process) computes the same model.
    std::vector<float> d(l.numel());
    makeTorchTrainer(spec, 28, 28, 10)->initParameters(d, 11);
    CHECK(a == d);
    for (size_t i = 0; i < l.size(); ++i) {
      const TensorSpec& s = l[i];
      const std::span<const float> v = l.slice(std::span<const float>(a), i);
      const bool bn = s.name.find("bn") != std::string::npos ||
                      s.name.find("downsample.1") != std::string::npos;
      if (s.name.ends_with("running_var") || (bn && s.name.ends_with("weight"))) {
        for (float x : v) REQUIRE(x == 1.0f);
      } else if (s.name.ends_with("running_mean") || (bn && s.name.ends_with("bias"))) {
        for (float x : v) REQUIRE(x == 0.0f);
      } else {
        // Linear/Conv weight and bias: U(+-1/sqrt(fan_in)), fan_in of the weight.
        const std::string w =
            s.name.ends_with("bias") ? s.name.substr(0, s.name.size() - 4) + "weight" : s.name;
        const double bound = 1.0 / std::sqrt(static_cast<double>(l[*l.find(w)].cols()));
        double sq = 0;
        for (float x : v) {
          REQUIRE(std::abs(x) <= bound);
          sq += static_cast<double>(x) * x;
        }
        if (v.size() >= 1000)
          CHECK(sq / static_cast<double>(v.size()) == Approx(bound * bound / 3).epsilon(0.1));
      }
    }
  }
}

TEST_CASE("LibTorch training raises accuracy on separable data", "[torch_trainer]") {
  SECTION("logreg and mlp on separable vectors") {
    const data::Dataset d = testing::separableData(300, 8, 4, 1);
    const auto idx = testing::allIndices(d);
    const DataView view{&d, idx};
    for (const char* spec : {"logreg", "mlp:hidden=16", "mlp:hidden=16,momentum=0.9"}) {
      INFO(spec);
      auto t = makeTorchTrainer(spec, d);
      CHECK(t->momentum() == (std::string(spec).find("momentum") != std::string::npos ? 0.9 : 0.0));
      std::vector<float> params(t->layout().numel());
      t->initParameters(params, 3);
      const client::EvalResult before = t->evaluate(params, view);
      RngStream rng = trainingStream(0);
      const client::FitResult fit =
          t->fit(params, view, FitConfig{.epochs = 5, .batch_size = 16, .lr = 0.1}, rng);
      const client::EvalResult after = t->evaluate(params, view);
      CHECK(fit.num_examples == 300);
      CHECK(after.num_examples == 300);
      CHECK(after.accuracy > 0.95);
      CHECK(after.loss < 0.3 * before.loss);
      // train_loss averages over the run from the initial model: between before and after.
      CHECK(metric(fit, "train_loss") < before.loss);
      CHECK(metric(fit, "train_loss") > after.loss);
      CHECK(metric(fit, "train_accuracy") > before.accuracy);
      CHECK(metric(fit, "train_accuracy") <= 1.0);
    }
  }
  SECTION("cnn and resnet on 28x28 blobs") {
    const data::Dataset d = testing::blobImages(160, 28, 28, 4, 2);
    const auto idx = testing::allIndices(d);
    const DataView view{&d, idx};
    for (const char* spec : {"cnn", "resnet"}) {
      INFO(spec);
      auto t = makeTorchTrainer(spec, d);
      std::vector<float> params(t->layout().numel());
      t->initParameters(params, 3);
      const client::EvalResult before = t->evaluate(params, view);
      RngStream rng = trainingStream(0);
      const client::FitResult fit =
          t->fit(params, view, FitConfig{.epochs = 4, .batch_size = 16, .lr = 0.05}, rng);
      const client::EvalResult after = t->evaluate(params, view);
      CHECK(before.accuracy < 0.6);
      CHECK(after.accuracy > 0.9);
      CHECK(after.loss < before.loss);
      CHECK(metric(fit, "train_accuracy") > before.accuracy);
    }
  }
}

TEST_CASE("LibTorch fit is reproducible from its stream and keeps no per-client state",
          "[torch_trainer][isa]") {
  const data::Dataset d = testing::blobImages(64, 12, 12, 3, 4);
  std::vector<size_t> a_idx, b_idx;
  for (size_t i = 0; i < d.size(); ++i) (i % 3 ? a_idx : b_idx).push_back(i);
  for (const char* spec : {"cnn", "resnet"}) {
    INFO(spec);
    auto t = makeTorchTrainer(spec, d);
    std::vector<float> global(t->layout().numel());
    t->initParameters(global, 1);
    const FitConfig cfg{.epochs = 2, .batch_size = 8, .lr = 0.05};
    const auto train = [&](client::Trainer& tr, const std::vector<size_t>& idx, uint64_t client) {
      std::vector<float> p = global;
      RngStream rng = trainingStream(client);
      tr.fit(p, DataView{&d, idx}, cfg, rng);
      return p;
    };
    const auto a1 = train(*t, a_idx, 0);
    const auto b = train(*t, b_idx, 1);
    const auto a2 = train(*t, a_idx, 0);  // same trainer, after another client
    CHECK(a1 == a2);
    CHECK(a1 != b);
    CHECK(a1 != global);
    CHECK(train(*t, a_idx, 5) != a1);  // another stream shuffles differently
    auto fresh = makeTorchTrainer(spec, d);
    CHECK(train(*fresh, a_idx, 0) == a1);
    // evaluate changes nothing (eval mode: BatchNorm statistics stay), and is deterministic.
    const auto e1 = t->evaluate(a1, DataView{&d, a_idx});
    const auto e2 = t->evaluate(a1, DataView{&d, a_idx});
    CHECK(e1.loss == e2.loss);
    CHECK(e1.accuracy == e2.accuracy);
  }
}

TEST_CASE("a data set held as bytes trains and evaluates to the same bits as its floats",
          "[torch_trainer][isa]") {
  // The simulator keeps unsigned-byte images as bytes (data::IdxOptions::keep_bytes): the trainer
  // gathers bytes and divides by 255, which must be the float loader's values exactly.
  const data::Dataset blobs = testing::blobImages(40, 10, 10, 3, 6);
  data::Dataset bytes = blobs, floats = blobs;
  bytes.images.clear();
  bytes.pixels.resize(blobs.images.size());
  for (size_t i = 0; i < bytes.pixels.size(); ++i) {
    // Every byte value, in an order that has nothing to do with the blobs' classes.
    bytes.pixels[i] = static_cast<uint8_t>(i % 7 == 0 ? 255 : (i * 131 + 17) % 256);
    floats.images[i] = static_cast<float>(bytes.pixels[i]) / 255.0f;
  }
  REQUIRE(bytes.holdsBytes());
  std::vector<size_t> idx(blobs.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  for (const char* spec : {"logreg", "cnn", "resnet"}) {
    INFO(spec);
    auto tb = makeTorchTrainer(spec, bytes), tf = makeTorchTrainer(spec, floats);
    std::vector<float> pb(tb->layout().numel());
    tb->initParameters(pb, 3);
    std::vector<float> pf = pb;
    const FitConfig cfg{.epochs = 2, .batch_size = 8, .lr = 0.05};
    RngStream rb = trainingStream(4), rf = trainingStream(4);
    const auto fb = tb->fit(pb, DataView{&bytes, idx}, cfg, rb);
    const auto ff = tf->fit(pf, DataView{&floats, idx}, cfg, rf);
    CHECK(pb == pf);
    CHECK(metric(fb, "train_loss") == metric(ff, "train_loss"));
    const auto eb = tb->evaluate(pb, DataView{&bytes, idx}),
               ef = tf->evaluate(pf, DataView{&floats, idx});
    CHECK(eb.loss == ef.loss);
    CHECK(eb.accuracy == ef.accuracy);
  }
  // The Eigen trainers read floats only, and say so rather than read nothing.
  auto eigen = client::makeTrainer("softmax", bytes.features(), bytes.num_classes);
  std::vector<float> p(eigen->layout().numel());
  RngStream r = trainingStream(1);
  CHECK_THROWS_MATCHING(
      eigen->fit(p, DataView{&bytes, idx}, FitConfig{.epochs = 1, .batch_size = 8, .lr = 0.1}, r),
      InvalidArgument, Contains("only the LibTorch trainer reads"));
}

TEST_CASE("every LibTorch trainer's results are functions of the values, not of where buffers lie",
          "[torch_trainer]") {
  // What the Eigen trainers once got wrong (results that followed buffer alignment), checked for
  // LibTorch's: caller buffers at every 4-byte offset from a 64-byte boundary, images at every
  // 16-byte residue, fresh and warmed trainers.
  const data::Dataset d = testing::blobImages(48, 12, 12, 3, 4);
  for (const char* spec :
       {"logreg", "mlp:hidden=37", "mlp:hidden=37,momentum=0.9", "cnn", "resnet"}) {
    INFO(spec);
    testing::checkAddressIndependence([&] { return makeTorchTrainer(spec, d); }, d,
                                      {.fit = FitConfig{.epochs = 1, .batch_size = 8, .lr = 0.05}});
  }
}

TEST_CASE("ResNet's BatchNorm statistics travel in the layout", "[torch_trainer]") {
  const data::Dataset d = testing::blobImages(32, 12, 12, 3, 5);
  const auto idx = testing::allIndices(d);
  auto t = makeTorchTrainer("resnet", d);
  const ParamLayout& l = t->layout();
  std::vector<float> p(l.numel());
  t->initParameters(p, 1);
  const size_t mean = *l.find("bn1.running_mean"), var = *l.find("bn1.running_var");
  RngStream rng = trainingStream(0);
  t->fit(p, DataView{&d, idx}, FitConfig{.epochs = 1, .batch_size = 8, .lr = 0.01}, rng);
  // Training-mode forward passes moved the running statistics away from (0, 1).
  bool moved = false;
  for (float x : l.slice(std::span<const float>(p), mean)) moved |= x != 0.0f;
  CHECK(moved);
  for (float x : l.slice(std::span<const float>(p), var)) CHECK(x > 0.0f);
  // Evaluation uses them: other statistics, another loss.
  std::vector<float> q = p;
  for (float& x : l.slice(std::span<float>(q), mean)) x += 1.0f;
  CHECK(t->evaluate(q, DataView{&d, idx}).loss != t->evaluate(p, DataView{&d, idx}).loss);
}

TEST_CASE("a diverging LibTorch fit throws and leaves the parameters as they were",
          "[torch_trainer]") {
  // A learning rate of 1e38 with inputs of ~300: the first step pushes the weights past the float
  // range, the next loss is not finite.
  data::Dataset d = testing::separableData(64, 8, 4, 6);
  for (float& x : d.images) x *= 100.0f;
  const auto idx = testing::allIndices(d);
  for (const char* spec : {"logreg", "mlp:hidden=16"}) {
    INFO(spec);
    auto t = makeTorchTrainer(spec, d);
    std::vector<float> params(t->layout().numel());
    t->initParameters(params, 1);
    const std::vector<float> before = params;
    RngStream rng = trainingStream(0);
    CHECK_THROWS_MATCHING(
        t->fit(params, DataView{&d, idx}, FitConfig{.epochs = 2, .batch_size = 8, .lr = 1e38}, rng),
        client::DivergenceError, Contains("diverged") && Contains("learning rate 1e+38"));
    CHECK(params == before);
    // The trainer is still usable.
    RngStream rng2 = trainingStream(0);
    t->fit(params, DataView{&d, idx}, FitConfig{.epochs = 1, .batch_size = 8, .lr = 1e-4}, rng2);
    CHECK(params != before);
  }
}

TEST_CASE("LibTorch trainer specs, shapes and views are checked", "[torch_trainer]") {
  CHECK_THROWS_MATCHING(makeTorchTrainer("mlp:hidden=0", 4, 4, 3), ConfigError,
                        Contains("hidden=0"));
  CHECK_THROWS_MATCHING(makeTorchTrainer("cnn:depth=2", 28, 28, 3), ConfigError,
                        Contains("unknown option 'depth'"));
  CHECK_THROWS_MATCHING(makeTorchTrainer("vgg", 28, 28, 3), ConfigError,
                        Contains("logreg, softmax, mlp, cnn, resnet"));
  CHECK_THROWS_MATCHING(makeTorchTrainer("cnn:momentum=1", 28, 28, 3), ConfigError,
                        Contains("momentum=1"));
  CHECK_THROWS_MATCHING(makeTorchTrainer("logreg", 28, 28, 1), InvalidArgument,
                        Contains("at least 2 classes"));
  CHECK_THROWS_MATCHING(makeTorchTrainer("logreg", 0, 28, 3), InvalidArgument,
                        Contains("0 pixels"));
  CHECK_THROWS_MATCHING(makeTorchTrainer("cnn", 3, 28, 3), InvalidArgument, Contains("too small"));
  CHECK_THROWS_AS(makeTorchTrainer("mlp:hidden=100000", 1, 100000, 10), InvalidArgument);
  CHECK(makeTorchTrainer("cnn:momentum=0.9", 28, 28, 10)->spec() == "cnn:momentum=0.9");
  CHECK(makeTorchTrainer("mlp:hidden=8,momentum=0.5", 2, 2, 2)->spec() ==
        "mlp:hidden=8,momentum=0.5");

  const data::Dataset d = testing::blobImages(10, 12, 12, 3, 7);
  const auto idx = testing::allIndices(d);
  auto cnn = makeTorchTrainer("cnn", d);
  std::vector<float> p(cnn->layout().numel(), 0.0f);
  RngStream rng = trainingStream(0);
  CHECK_THROWS_MATCHING(cnn->fit(p, DataView{&d, {}}, FitConfig{}, rng), InvalidArgument,
                        Contains("no examples"));
  CHECK_THROWS_MATCHING(cnn->fit(p, DataView{&d, idx}, FitConfig{.epochs = 0}, rng), ConfigError,
                        Contains("epochs=0"));
  std::vector<float> small(5);
  CHECK_THROWS_MATCHING(cnn->fit(small, DataView{&d, idx}, FitConfig{}, rng), InvalidArgument,
                        Contains("params has 5"));
  CHECK_THROWS_MATCHING(cnn->initParameters(small, 1), InvalidArgument, Contains("params has 5"));
  // Same number of pixels, another image shape: the CNN refuses it, logreg does not care.
  data::Dataset wide = d;
  wide.rows = 6;
  wide.cols = 24;
  CHECK_THROWS_MATCHING(cnn->evaluate(p, DataView{&wide, idx}), InvalidArgument, Contains("6x24"));
  auto logreg = makeTorchTrainer("logreg", d);
  std::vector<float> lp(logreg->layout().numel(), 0.0f);
  CHECK(logreg->evaluate(lp, DataView{&wide, idx}).num_examples == 10);
}

// One step over the whole batch: FedProx adds -lr mu (p0 - anchor), SCAFFOLD -lr correction, to
// every trained parameter; BatchNorm's running statistics (after the parameters in the layout) are
// not trained and move as in plain SGD.
TEST_CASE("LibTorch fit adds FedProx's and SCAFFOLD's gradient terms to the trained parameters",
          "[torch_trainer]") {
  const data::Dataset d = testing::blobImages(24, 12, 12, 3, 6);
  std::vector<size_t> idx(d.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  for (const char* spec : {"logreg", "resnet"}) {
    INFO(spec);
    auto t = makeTorchTrainer(spec, d);
    const ParamLayout& l = t->layout();
    const size_t n = l.numel();
    std::vector<bool> trained(n, true);
    for (size_t k = 0; k < l.size(); ++k)
      if (l[k].name.find("running_") != std::string::npos)
        for (size_t i = 0; i < l[k].numel; ++i) trained[l[k].offset + i] = false;
    std::vector<float> p0(n), anchor(n), corr(n);
    t->initParameters(p0, 3);
    for (size_t i = 0; i < n; ++i) {
      anchor[i] = p0[i] + 0.5f * std::sin(0.3f * static_cast<float>(i));
      corr[i] = 0.25f * std::cos(0.7f * static_cast<float>(i));
    }
    const double lr = 0.05, mu = 0.8;
    const auto fit = [&](FitConfig cfg) {
      std::vector<float> p = p0;
      RngStream rng = trainingStream(0);
      t->fit(p, DataView{&d, idx}, cfg, rng);
      return p;
    };
    const FitConfig one{.epochs = 1, .batch_size = 24, .lr = lr};
    const auto plain = fit(one);
    FitConfig prox = one;
    prox.prox_mu = mu;
    prox.prox_anchor = anchor;
    FitConfig scaffold = one;
    scaffold.correction = corr;
    const auto with_prox = fit(prox), with_corr = fit(scaffold);
    size_t checked = 0;
    for (size_t i = 0; i < n; ++i) {
      const double want_prox = trained[i] ? -lr * mu * (p0[i] - anchor[i]) : 0.0;
      const double want_corr = trained[i] ? -lr * corr[i] : 0.0;
      CHECK(with_prox[i] - plain[i] == Approx(want_prox).margin(2e-6));
      CHECK(with_corr[i] - plain[i] == Approx(want_corr).margin(2e-6));
      checked += trained[i] ? 0 : 1;
    }
    CHECK((std::string(spec) == "resnet") == (checked > 0));  // the ResNet has running statistics
    FitConfig bad = one;
    bad.correction = std::span<const float>(corr).first(n - 1);
    std::vector<float> p = p0;
    RngStream rng = trainingStream(0);
    CHECK_THROWS_MATCHING(t->fit(p, DataView{&d, idx}, bad, rng), InvalidArgument,
                          Contains("SCAFFOLD correction"));
  }
}
