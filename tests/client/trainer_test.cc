#include "client/trainer.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>

#include "check_throws.h"
#include "client/address_check.h"
#include "client/algorithm.h"
#include "client/synthetic.h"
#include "core/error.h"
#include "emulated.h"

using namespace starling;
using namespace starling::client;
using Catch::Matchers::Contains;

namespace {

const Metric* findMetric(const FitResult& r, const std::string& name) {
  for (const auto& m : r.metrics)
    if (m.name == name) return &m;
  return nullptr;
}

RngStream trainingStream(uint64_t client) {
  return RngStream(StreamKey{1, 1, client, StreamPurpose::kTraining, 0});
}

}  // namespace

TEST_CASE("trainers lay out their parameters by name and shape", "[client]") {
  const auto softmax = makeTrainer("softmax", 784, 10);
  REQUIRE(softmax->layout().size() == 2);
  CHECK(softmax->layout()[0].name == "fc.weight");
  CHECK(softmax->layout()[0].shape == std::vector<int64_t>{10, 784});
  CHECK(softmax->layout()[1].name == "fc.bias");
  CHECK(softmax->layout()[1].shape == std::vector<int64_t>{10});
  CHECK(softmax->layout().numel() == 7850);

  const auto mlp = makeTrainer("mlp:hidden=32", 784, 10);
  REQUIRE(mlp->layout().size() == 4);
  CHECK(mlp->layout()[0].name == "fc1.weight");
  CHECK(mlp->layout()[0].shape == std::vector<int64_t>{32, 784});
  CHECK(mlp->layout()[1].name == "fc1.bias");
  CHECK(mlp->layout()[2].name == "fc2.weight");
  CHECK(mlp->layout()[2].shape == std::vector<int64_t>{10, 32});
  CHECK(mlp->layout()[3].name == "fc2.bias");
  CHECK(mlp->spec() == "mlp:hidden=32");
  // The LibTorch trainer's default (torch_trainer/), so "mlp" is one model everywhere.
  CHECK(makeTrainer("mlp", 4, 2)->spec() == "mlp:hidden=200");
  CHECK(makeTrainer("logreg", 784, 10)->layout().fingerprint() == softmax->layout().fingerprint());
  CHECK(trainers().names() == "softmax, logreg, mlp, cnn, resnet");

  // McMahan et al.'s CNN at Fashion-MNIST's shape: 1,663,370 parameters, PyTorch's names.
  const auto cnn = makeTrainer("cnn", 28, 28, 10);
  CHECK(cnn->features() == 784);
  CHECK(cnn->layout().numel() == 1'663'370);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected{
      {"conv1.weight", {32, 1, 5, 5}},  {"conv1.bias", {32}},
      {"conv2.weight", {64, 32, 5, 5}}, {"conv2.bias", {64}},
      {"fc1.weight", {512, 3136}},      {"fc1.bias", {512}},
      {"fc2.weight", {10, 512}},        {"fc2.bias", {10}}};
  REQUIRE(cnn->layout().size() == expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CHECK(cnn->layout()[i].name == expected[i].first);
    CHECK(cnn->layout()[i].shape == expected[i].second);
  }
  // Odd sizes: each pooling floors (30 -> 15 -> 7, 29 -> 14 -> 7).
  CHECK(makeTrainer("cnn", 30, 29, 10)->layout()[4].shape == std::vector<int64_t>{512, 64 * 7 * 7});
  CHECK(makeTrainer("cnn:momentum=0.9", 28, 28, 10)->spec() == "cnn:momentum=0.9");
  CHECK(makeTrainer("mlp:hidden=8,momentum=0.5", 4, 2)->spec() == "mlp:hidden=8,momentum=0.5");
  // The momentum is the trainer's to say, not a spec string's to be searched: SCAFFOLD refuses it.
  CHECK(makeTrainer("cnn:momentum=0.9", 28, 28, 10)->momentum() == 0.9);
  CHECK(makeTrainer("mlp:hidden=8,momentum=0", 4, 2)->momentum() == 0.0);
  CHECK(makeTrainer("softmax", 4, 2)->momentum() == 0.0);
  CHECK_NOTHROW(checkScaffoldTrainer(*makeTrainer("mlp:hidden=8", 4, 2)));
  CHECK_NOTHROW(checkScaffoldTrainer(*makeTrainer("mlp:hidden=8,momentum=0", 4, 2)));
  CHECK_THROWS_MATCHING(checkScaffoldTrainer(*makeTrainer("mlp:hidden=8,momentum=0.5", 4, 2)),
                        ConfigError, Contains("uses momentum 0.5"));
}

TEST_CASE("initial parameters are a function of the seed, with PyTorch's Linear and Conv scales",
          "[client]") {
  const size_t features = 400;
  const auto mlp = makeTrainer("mlp:hidden=100", features, 10);
  const ParamLayout& l = mlp->layout();
  std::vector<float> a(l.numel()), b(l.numel()), c(l.numel());
  mlp->initParameters(a, 7);
  mlp->initParameters(b, 7);
  mlp->initParameters(c, 8);
  CHECK(a == b);
  CHECK(a != c);
  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for a layer's weight and bias: variance 1 / (3 fan_in).
  const auto check = [](std::span<const float> v, double fan_in, double tolerance) {
    double s = 0;
    const double bound = 1.0 / std::sqrt(fan_in);
    for (float x : v) {
      REQUIRE(std::abs(x) <= bound);
      s += static_cast<double>(x) * x;
    }
    CHECK(s / static_cast<double>(v.size()) == Approx(1.0 / (3 * fan_in)).epsilon(tolerance));
  };
  const std::span<const float> av(a);
  check(l.slice(av, 0), features, 0.03);                      // 40000 draws
  check(l.slice(av, 1), features, 0.4);                       // 100 draws
  check(l.slice(av, 2), 100, 0.15);                           // 1000 draws
  for (float x : l.slice(av, 3)) CHECK(std::abs(x) <= 0.1f);  // 10 draws: only the bound
  // Each tensor draws from its own stream: the bias is not a scaled copy of the weight's first
  // values (same stream, same bound, would give the same numbers).
  CHECK(l.slice(av, 1)[0] != l.slice(av, 0)[0]);

  const auto cnn = makeTrainer("cnn", 28, 28, 10);
  std::vector<float> p(cnn->layout().numel());
  cnn->initParameters(p, 7);
  const std::span<const float> pv(p);
  check(cnn->layout().slice(pv, 0), 25, 0.2);  // conv: fan_in = in channels x 5 x 5
  check(cnn->layout().slice(pv, 2), 800, 0.03);
  check(cnn->layout().slice(pv, 3), 800, 0.5);
  check(cnn->layout().slice(pv, 4), 3136, 0.03);

  const auto softmax = makeTrainer("softmax", features, 10);
  std::vector<float> s(softmax->layout().numel(), 1.0f);
  softmax->initParameters(s, 7);
  for (float x : s) REQUIRE(x == 0.0f);
  const auto logreg = makeTrainer("logreg", features, 10);
  logreg->initParameters(s, 7);
  check(logreg->layout().slice(std::span<const float>(s), 0), features, 0.1);
}

TEST_CASE("training lowers the loss on separable data", "[client]") {
  const data::Dataset d = testing::separableData(300, 4, 3, 1);
  const auto idx = testing::allIndices(d);
  const DataView view{&d, idx};
  for (const char* spec : {"softmax", "mlp:hidden=16"}) {
    INFO(spec);
    auto t = makeTrainer(spec, 4, 3);
    std::vector<float> params(t->layout().numel());
    t->initParameters(params, 3);
    const EvalResult before = t->evaluate(params, view);
    RngStream rng = trainingStream(0);
    const FitResult fit =
        t->fit(params, view, FitConfig{.epochs = 5, .batch_size = 16, .lr = 0.2}, rng);
    const EvalResult after = t->evaluate(params, view);
    CHECK(fit.num_examples == 300);  // the client's examples, not examples x epochs
    REQUIRE(findMetric(fit, "train_loss") != nullptr);
    CHECK(std::isfinite(findMetric(fit, "train_loss")->value));
    CHECK(after.num_examples == 300);
    CHECK(after.loss < 0.3 * before.loss);
    CHECK(after.accuracy > 0.95);
    // The training loss averages over the run, starting from the initial model: it lies between.
    CHECK(findMetric(fit, "train_loss")->value < before.loss);
    CHECK(findMetric(fit, "train_loss")->value > after.loss);
  }
}

TEST_CASE("train_loss is measured before each step", "[client]") {
  // Zero parameters give uniform predictions, loss log(classes) for every example; one epoch of
  // one batch takes a single step after measuring it.
  const data::Dataset d = testing::gaussianData(20, 3, 4, 2);
  const auto idx = testing::allIndices(d);
  auto t = makeTrainer("softmax", 3, 4);
  std::vector<float> params(t->layout().numel(), 0.0f);
  RngStream rng = trainingStream(0);
  const FitResult r =
      t->fit(params, DataView{&d, idx}, FitConfig{.epochs = 1, .batch_size = 20, .lr = 0.1}, rng);
  CHECK(findMetric(r, "train_loss")->value == Approx(std::log(4.0)));
}

TEST_CASE("evaluate counts accuracy and loss on a hand-made case", "[client]") {
  // Two features; fc.weight rows (1, 0), (0, 1), (0, 0): logits (x0, x1, 0).
  data::Dataset d;
  d.rows = 1;
  d.cols = 2;
  d.num_classes = 3;
  d.images = {5, 0, /**/ 0, 5, /**/ 5, 0, /**/ 0, 0};
  d.labels = {0, 1, 2, 0};  // right, right, wrong, and a three-way tie that goes to class 0: right
  auto t = makeTrainer("softmax", 2, 3);
  const std::vector<float> params{1, 0, 0, 1, 0, 0, /*bias*/ 0, 0, 0};
  const std::vector<size_t> all{0, 1, 2, 3};
  const EvalResult r = t->evaluate(params, DataView{&d, all});
  CHECK(r.num_examples == 4);
  CHECK(r.accuracy == 0.75);
  const double lse = std::log(std::exp(5.0) + 2.0);
  CHECK(r.loss == Approx(((lse - 5) + (lse - 5) + lse + std::log(3.0)) / 4).epsilon(1e-6));

  // A view may repeat and reorder examples: it is the multiset that counts.
  const std::vector<size_t> some{2, 2, 0};
  const EvalResult s = t->evaluate(params, DataView{&d, some});
  CHECK(s.num_examples == 3);
  CHECK(s.accuracy == Approx(1.0 / 3));
}

TEST_CASE("fit with a full batch is one gradient step", "[client]") {
  // The documented update rule: params -= lr * d(mean batch loss)/d(params).
  const data::Dataset d = testing::gaussianData(12, 3, 3, 3);
  const auto idx = testing::allIndices(d);
  auto t = makeTrainer("softmax", 3, 3);
  std::vector<float> params(t->layout().numel(), 0.0f);
  // At zero parameters the gradient is closed-form: dW[c] = mean_i (1/3 - [y_i = c]) x_i.
  std::vector<float> expect(params.size(), 0.0f);
  const double lr = 0.5;
  for (size_t i = 0; i < d.size(); ++i)
    for (size_t c = 0; c < 3; ++c) {
      const double dz = (1.0 / 3 - (d.labels[i] == c ? 1.0 : 0.0)) / 12;
      for (size_t f = 0; f < 3; ++f)
        expect[c * 3 + f] -= static_cast<float>(lr * dz * d.images[i * 3 + f]);
      expect[9 + c] -= static_cast<float>(lr * dz);
    }
  RngStream rng = trainingStream(0);
  t->fit(params, DataView{&d, idx}, FitConfig{.epochs = 1, .batch_size = 100, .lr = lr}, rng);
  for (size_t i = 0; i < params.size(); ++i) CHECK(params[i] == Approx(expect[i]).margin(1e-6));
}

TEST_CASE("fit is reproducible from its stream and keeps no per-client state", "[client]") {
  const data::Dataset d = testing::gaussianData(200, 6, 4, 4);
  std::vector<size_t> a_idx, b_idx;
  for (size_t i = 0; i < d.size(); ++i) (i % 3 ? a_idx : b_idx).push_back(i);
  auto t = makeTrainer("mlp:hidden=8", 6, 4);
  std::vector<float> global(t->layout().numel());
  t->initParameters(global, 1);
  const FitConfig cfg{.epochs = 2, .batch_size = 8, .lr = 0.05};
  const auto train = [&](const std::vector<size_t>& idx, uint64_t client) {
    std::vector<float> p = global;
    RngStream rng = trainingStream(client);
    t->fit(p, DataView{&d, idx}, cfg, rng);
    return p;
  };
  const auto a1 = train(a_idx, 0);
  const auto b = train(b_idx, 1);
  const auto a2 = train(a_idx, 0);  // same trainer object, after another client
  CHECK(a1 == a2);
  CHECK(a1 != b);
  // Another stream shuffles differently.
  CHECK(train(a_idx, 5) != a1);
  // A fresh trainer gives the same bits.
  auto fresh = makeTrainer("mlp:hidden=8", 6, 4);
  std::vector<float> p = global;
  RngStream rng = trainingStream(0);
  fresh->fit(p, DataView{&d, a_idx}, cfg, rng);
  CHECK(p == a1);
}

TEST_CASE("the deployed models' layouts have the fingerprints docs/protocol.md gives", "[client]") {
  // A client written in another language checks its fingerprint against these (values computed
  // by the Python function docs/protocol.md prints, not by this code).
  CHECK(makeTrainer("softmax", 784, 10)->layout().fingerprint() == 0x041c75f26c40b566ull);
  CHECK(makeTrainer("mlp:hidden=128", 784, 10)->layout().fingerprint() == 0x5340aa0c80dc3ae4ull);
}

TEST_CASE("every Eigen trainer's results are functions of the values, not of where buffers lie",
          "[client]") {
  // Sizes that are no multiple of any vector width (4, 8, 16 floats), so a vectorised loop has a
  // scalar head or tail wherever a buffer starts; and the Fashion-MNIST shape, where Eigen's
  // blocked matrix products take over from its coefficient-based ones.
  // The CNN on odd images (9 x 11, pooled to 2 x 2) and at 28 x 28 (its convolutions' products
  // are blocked at either size: a patch has 800 values); ResNet-8 on the odd images.
  struct Case {
    const char* spec;
    size_t examples, rows, cols;
    uint32_t classes;
  };
  std::vector<Case> cases{Case{"softmax", 120, 1, 45, 19}, Case{"mlp:hidden=37", 120, 1, 45, 19},
                          Case{"softmax", 64, 1, 784, 10}, Case{"mlp:hidden=128", 64, 1, 784, 10},
                          Case{"logreg:momentum=0.9", 64, 1, 45, 19}};
  if (testing::kReduced) {
    // Under qemu or AddressSanitizer (tests/emulated.h): the convolutional models on fewer, smaller
    // images.
    cases.push_back(Case{"cnn", 12, 9, 11, 5});
    cases.push_back(Case{"resnet:momentum=0.9", 12, 7, 5, 5});
  } else {
    cases.push_back(Case{"cnn", 24, 9, 11, 5});
    cases.push_back(Case{"resnet:momentum=0.9", 24, 9, 11, 5});
    cases.push_back(Case{"cnn:momentum=0.5", 16, 28, 28, 10});
  }
  for (const Case& k : cases) {
    INFO(k.spec << ", " << k.rows << "x" << k.cols << " features, " << k.classes << " classes");
    data::Dataset d = testing::gaussianData(k.examples, k.rows * k.cols, k.classes, 4);
    d.rows = k.rows;
    d.cols = k.cols;
    testing::checkAddressIndependence(
        [&] { return makeTrainer(k.spec, k.rows, k.cols, k.classes); }, d,
        {.fit = FitConfig{.epochs = 2, .batch_size = 8, .lr = 0.05}});
  }
}

TEST_CASE("bad configurations, views and buffers are rejected before training", "[client]") {
  const data::Dataset d = testing::gaussianData(10, 3, 3, 5);
  const auto idx = testing::allIndices(d);
  const DataView view{&d, idx};
  auto t = makeTrainer("softmax", 3, 3);
  std::vector<float> params(t->layout().numel(), 0.25f);
  const std::vector<float> before = params;
  RngStream rng = trainingStream(0);
  const auto fit = [&](const FitConfig& c, const DataView& v) { return t->fit(params, v, c, rng); };

  CHECK_THROWS_MATCHING(fit(FitConfig{.epochs = 0}, view), ConfigError, Contains("epochs=0"));
  CHECK_THROWS_MATCHING(fit(FitConfig{.batch_size = 0}, view), ConfigError,
                        Contains("batch_size=0"));
  for (double lr : {0.0, -0.1, std::nan(""), double{INFINITY}, 1e300}) {
    INFO("lr " << lr);
    CHECK_THROWS_MATCHING(fit(FitConfig{.lr = lr}, view), ConfigError, Contains("learning rate"));
  }

  CHECK_THROWS_MATCHING(fit(FitConfig{}, DataView{&d, {}}), InvalidArgument,
                        Contains("no examples"));
  CHECK_THROWS_MATCHING(fit(FitConfig{}, DataView{nullptr, idx}), InvalidArgument,
                        Contains("no dataset"));
  const std::vector<size_t> out_of_range{0, 10};
  CHECK_THROWS_MATCHING(fit(FitConfig{}, DataView{&d, out_of_range}), InvalidArgument,
                        Contains("index 10 is out of range for a dataset of 10"));
  CHECK_THROWS_MATCHING(t->evaluate(params, DataView{&d, out_of_range}), InvalidArgument,
                        Contains("index 10"));
  CHECK_THROWS_MATCHING(t->evaluate(params, DataView{&d, {}}), InvalidArgument,
                        Contains("no examples"));
  const data::Dataset wide = testing::gaussianData(10, 4, 3, 5);
  CHECK_THROWS_MATCHING(fit(FitConfig{}, DataView{&wide, idx}), InvalidArgument,
                        Contains("4 features"));
  const data::Dataset many =
      testing::gaussianData(10, 3, 5, 5);  // labels up to 4, model has 3 classes
  CHECK_THROWS_MATCHING(fit(FitConfig{}, DataView{&many, idx}), InvalidArgument,
                        Contains("the model has 3 classes"));
  data::Dataset broken = d;
  broken.images.pop_back();
  CHECK_THROWS_MATCHING(fit(FitConfig{}, DataView{&broken, idx}), InvalidArgument,
                        Contains("pixel values"));

  std::vector<float> short_params(5);
  CHECK_THROWS_MATCHING(t->fit(short_params, view, FitConfig{}, rng), InvalidArgument,
                        Contains("params has 5"));
  CHECK_THROWS_MATCHING(t->evaluate(short_params, view), InvalidArgument, Contains("params has 5"));
  CHECK_THROWS_MATCHING(t->initParameters(short_params, 1), InvalidArgument,
                        Contains("params has 5"));
  CHECK(params == before);  // nothing was touched
}

TEST_CASE("a diverging fit throws and restores the parameters", "[client]") {
  // Inputs of 1e30: the first step moves the weights by ~1e29 and the next logits overflow.
  data::Dataset d = testing::gaussianData(8, 3, 3, 6);
  for (float& x : d.images) x *= 1e30f;
  const auto idx = testing::allIndices(d);
  auto t = makeTrainer("softmax", 3, 3);
  std::vector<float> params(t->layout().numel(), 0.0f);
  const std::vector<float> before = params;
  RngStream rng = trainingStream(0);
  CHECK_THROWS_MATCHING(
      t->fit(params, DataView{&d, idx}, FitConfig{.epochs = 1, .batch_size = 2, .lr = 0.1}, rng),
      DivergenceError, Contains("diverged") && Contains("learning rate 0.1"));
  CHECK(params == before);
}

TEST_CASE("trainer specs and model sizes are checked", "[client]") {
  CHECK_THROWS_MATCHING(makeTrainer("mlp:hidden=0", 4, 3), ConfigError, Contains("hidden=0"));
  CHECK_THROWS_MATCHING(makeTrainer("mlp:depth=2", 4, 3), ConfigError,
                        Contains("unknown option 'depth'"));
  CHECK_THROWS_MATCHING(makeTrainer("vgg", 4, 3), ConfigError,
                        Contains("softmax, logreg, mlp, cnn, resnet"));
  // A flat input (rows 1) or a small image cannot go through two poolings.
  CHECK_THROWS_MATCHING(makeTrainer("cnn", 784, 10), ConfigError, Contains("1x784 are too small"));
  CHECK_THROWS_MATCHING(makeTrainer("cnn", 3, 28, 10), ConfigError, Contains("3x28"));
  CHECK_THROWS_MATCHING(makeTrainer("cnn:momentum=1", 28, 28, 10), ConfigError,
                        Contains("momentum=1"));
  CHECK_THROWS_MATCHING(makeTrainer("softmax", 4, 1), InvalidArgument,
                        Contains("at least 2 classes"));
  CHECK_THROWS_MATCHING(makeTrainer("softmax", 0, 3), InvalidArgument, Contains("0 features"));
  // A weight matrix past what a ParamLayout holds (u32 indices on the wire).
  CHECK_THROWS_AS(makeTrainer("mlp:hidden=100000", 100000, 10), InvalidArgument);
}

// One step over the whole batch makes the extra gradient terms exact to check: with the data's
// gradient g at the start p0, plain SGD gives p0 - lr g, FedProx p0 - lr (g + mu (p0 - anchor)),
// SCAFFOLD p0 - lr (g + correction).
TEST_CASE("FedProx's proximal term and SCAFFOLD's correction enter every step's gradient",
          "[client]") {
  const data::Dataset d = testing::gaussianData(40, 5, 3, 11);
  std::vector<size_t> idx(d.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  for (const char* spec : {"softmax", "mlp:hidden=6"}) {
    INFO(spec);
    auto t = makeTrainer(spec, 5, 3);
    const size_t n = t->layout().numel();
    std::vector<float> p0(n), anchor(n), corr(n);
    t->initParameters(p0, 3);
    for (size_t i = 0; i < n; ++i) {
      anchor[i] = p0[i] + 0.5f * std::sin(0.3f * static_cast<float>(i));
      corr[i] = 0.25f * std::cos(0.7f * static_cast<float>(i));
    }
    const double lr = 0.1, mu = 0.8;
    const auto fit = [&](FitConfig cfg) {
      std::vector<float> p = p0;
      RngStream rng = trainingStream(0);
      t->fit(p, DataView{&d, idx}, cfg, rng);
      return p;
    };
    const FitConfig one{.epochs = 1, .batch_size = 40, .lr = lr};
    const auto plain = fit(one);
    FitConfig prox = one;
    prox.prox_mu = mu;
    prox.prox_anchor = anchor;
    FitConfig scaffold = one;
    scaffold.correction = corr;
    const auto with_prox = fit(prox), with_corr = fit(scaffold);
    for (size_t i = 0; i < n; ++i) {
      CHECK(with_prox[i] - plain[i] == Approx(-lr * mu * (p0[i] - anchor[i])).margin(1e-6));
      CHECK(with_corr[i] - plain[i] == Approx(-lr * corr[i]).margin(1e-6));
    }
    // Over many steps the proximal term keeps the model nearer its anchor.
    const auto dist = [&](const std::vector<float>& p) {
      double s = 0;
      for (size_t i = 0; i < n; ++i) s += (p[i] - p0[i]) * (p[i] - p0[i]);
      return std::sqrt(s);
    };
    const FitConfig many{.epochs = 5, .batch_size = 4, .lr = lr};
    FitConfig many_prox = many;
    many_prox.prox_mu = 2.0;
    many_prox.prox_anchor = p0;
    CHECK(dist(fit(many_prox)) < 0.8 * dist(fit(many)));
    // mu = 0 is plain SGD whatever the anchor.
    FitConfig zero = one;
    zero.prox_anchor = anchor;
    CHECK(fit(zero) == plain);

    // Bad terms are refused before anything is touched.
    FitConfig bad = one;
    bad.prox_mu = 1.0;  // no anchor
    std::vector<float> p = p0;
    RngStream rng = trainingStream(0);
    CHECK_THROWS_MATCHING(t->fit(p, DataView{&d, idx}, bad, rng), InvalidArgument,
                          Contains("proximal anchor"));
    bad = one;
    bad.correction = std::span<const float>(corr).first(n - 1);
    CHECK_THROWS_MATCHING(t->fit(p, DataView{&d, idx}, bad, rng), InvalidArgument,
                          Contains("SCAFFOLD correction"));
    bad = one;
    bad.prox_mu = -1;
    CHECK_THROWS_MATCHING(t->fit(p, DataView{&d, idx}, bad, rng), ConfigError, Contains("prox_mu"));
    CHECK(p == p0);
  }
}

TEST_CASE("a fit asked to stop throws TrainingStopped and leaves the parameters as they were",
          "[client]") {
  data::Dataset d = testing::gaussianData(40, 36, 3, 9);
  d.rows = 6;
  d.cols = 6;
  const auto idx = testing::allIndices(d);
  for (const char* spec : {"softmax", "mlp:hidden=8", "cnn", "resnet:momentum=0.9"}) {
    INFO(spec);
    auto t = makeTrainer(spec, d);
    std::vector<float> params(t->layout().numel());
    t->initParameters(params, 2);
    const std::vector<float> before = params;
    std::atomic<bool> stop{true};
    FitConfig cfg{.epochs = 2, .batch_size = 8, .lr = 0.1};
    cfg.stop = &stop;
    RngStream rng = trainingStream(0);
    CHECK_THROWS_MATCHING(t->fit(params, DataView{&d, idx}, cfg, rng), TrainingStopped,
                          Contains("stopped at epoch 1, example 0 of 40"));
    CHECK(params == before);
    // Not set: the same config trains.
    stop = false;
    RngStream rng2 = trainingStream(0);
    t->fit(params, DataView{&d, idx}, cfg, rng2);
    CHECK(params != before);
  }
}

TEST_CASE("a batch whose activations would pass the trainer's limit is refused before training",
          "[client]") {
  // A Task may ask for batches of 2^20: the CNN would need about 400 GB. 3,000 examples of 28 x 28
  // in one batch need about 1.1 GB, above EigenTrainer::kMaxActivationBytes (1 GiB).
  data::Dataset d = testing::gaussianData(3000, 784, 10, 3);
  d.rows = 28;
  d.cols = 28;
  const auto idx = testing::allIndices(d);
  auto t = makeTrainer("cnn", d);
  std::vector<float> params(t->layout().numel(), 0.01f);
  const std::vector<float> before = params;
  RngStream rng = trainingStream(0);
  CHECK_THROWS_MATCHING(t->fit(params, DataView{&d, idx},
                               FitConfig{.epochs = 1, .batch_size = 1u << 20, .lr = 0.1}, rng),
                        InvalidArgument, Contains("MB of activations, above the 1024 MB"));
  CHECK(params == before);
  // The same examples in batches of 32 are fine (one step is enough to see it).
  const std::vector<size_t> some(idx.begin(), idx.begin() + 32);
  t->fit(params, DataView{&d, some}, FitConfig{.epochs = 1, .batch_size = 32, .lr = 0.1}, rng);
  CHECK(params != before);
}
