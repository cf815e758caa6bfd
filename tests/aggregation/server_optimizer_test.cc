#include "aggregation/server_optimizer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

using namespace starling;
using namespace starling::aggregation;

namespace {
std::vector<uint8_t> save(const ServerOptimizer& o) {
  std::vector<uint8_t> b;
  ByteWriter w(b);
  o.saveState(w);
  return b;
}
void load(ServerOptimizer& o, std::span<const uint8_t> b) {
  ByteReader r(b, "server optimizer state");
  o.loadState(r);
  r.finish();
}
std::vector<float> run(const std::string& spec, std::vector<float> x,
                       const std::vector<std::vector<float>>& deltas) {
  auto opt = makeServerOptimizer(spec, x.size());
  for (const auto& d : deltas) opt->step(x, d);
  return x;
}
}  // namespace

// Expected values are worked by hand (and with a calculator) from the formulas in Reddi et al.
TEST_CASE("fedavg and fedavgm follow their formulas", "[aggregation]") {
  CHECK(run("fedavg", {1, 1}, {{2, -4}}) == std::vector<float>{3, -3});
  CHECK(run("fedavg:eta=0.5", {1, 1}, {{2, -4}}) == std::vector<float>{2, -1});
  // m = [1,2] -> x = [1,2]; m = 0.5*[1,2] + [1,0] = [1.5,1] -> x = [2.5,3]
  CHECK(run("fedavgm:beta1=0.5", {0, 0}, {{1, 2}, {1, 0}}) == std::vector<float>{2.5f, 3.0f});
}

TEST_CASE("adaptive server optimizers follow their formulas step by step", "[aggregation]") {
  // eta = 1, beta1 = beta2 = 0.5, tau = 0.5, v starts at tau^2 = 0.25
  const std::string opts = ":eta=1,beta1=0.5,beta2=0.5,tau=0.5";
  // adagrad: d=1: m=.5, v=1.25, x=.5/(sqrt(1.25)+.5); d=1: m=.75, v=2.25, x+=.75/2
  auto a = run("fedadagrad" + opts, {0}, {{1}});
  CHECK(a[0] == Approx(0.3090169944));
  a = run("fedadagrad" + opts, {0}, {{1}, {1}});
  CHECK(a[0] == Approx(0.6840169944));
  // adam: d=2: m=1, v=2.125; d=0: m=.5, v=1.0625
  a = run("fedadam" + opts, {0}, {{2}});
  CHECK(a[0] == Approx(0.5107935860));
  a = run("fedadam" + opts, {0}, {{2}, {0}});
  CHECK(a[0] == Approx(0.8374252207));
  // yogi: d=2: v - d^2 < 0 so v = .25 + .5*4 = 2.25, x = 1/2; d=1: v - 1 > 0 so v = 1.75
  a = run("fedyogi" + opts, {0}, {{2}});
  CHECK(a[0] == Approx(0.5));
  a = run("fedyogi" + opts, {0}, {{2}, {1}});
  CHECK(a[0] == Approx(1.0485837704));
}

TEST_CASE("optimizer state survives a checkpoint", "[aggregation]") {
  for (const char* spec : {"fedavgm", "fedadam:eta=0.1", "fedyogi", "fedadagrad", "fedavg"}) {
    auto a = makeServerOptimizer(spec, 3);
    std::vector<float> xa = {1, 2, 3};
    a->step(xa, std::vector<float>{0.1f, -0.2f, 0.3f});
    auto b = makeServerOptimizer(spec, 3);
    load(*b, save(*a));
    CHECK(b->steps() == 1);
    std::vector<float> xb = xa;
    a->step(xa, std::vector<float>{0.5f, 0.5f, -0.5f});
    b->step(xb, std::vector<float>{0.5f, 0.5f, -0.5f});
    INFO(spec);
    CHECK(xa == xb);
  }
  auto adam = makeServerOptimizer("fedadam", 3);
  CHECK_THROWS_WITH(load(*makeServerOptimizer("fedyogi", 3), save(*adam)),
                    Catch::Contains("is for 'fedadam'"));
  CHECK_THROWS_WITH(load(*makeServerOptimizer("fedadam", 4), save(*adam)),
                    Catch::Contains("3 parameters"));
  auto blob = save(*adam);
  blob.pop_back();
  CHECK_THROWS_AS(load(*makeServerOptimizer("fedadam", 3), blob), IoError);
  // A refused load leaves the optimizer as it was.
  auto c = makeServerOptimizer("fedadam", 3);
  std::vector<float> xc = {1, 2, 3};
  c->step(xc, std::vector<float>{0.1f, 0.1f, 0.1f});
  auto wrong = save(*adam);
  wrong[wrong.size() - 4] ^=
      0xff;  // the last float's low mantissa byte: a valid state of another run
  CHECK_NOTHROW(load(*c, wrong));
  CHECK_THROWS_AS(load(*c, std::span(blob)), IoError);
  CHECK(save(*c) == wrong);
}

TEST_CASE("server optimizer configuration and input are checked", "[aggregation]") {
  CHECK_THROWS_WITH(makeServerOptimizer("fedsgd", 3),
                    Catch::Contains("unknown server optimizer 'fedsgd'"));
  CHECK_THROWS_WITH(makeServerOptimizer("fedadam:eta=0", 3),
                    Catch::Contains("eta must be finite and > 0"));
  CHECK_THROWS_WITH(makeServerOptimizer("fedadam:beta1=1", 3),
                    Catch::Contains("beta1 must be in [0, 1)"));
  CHECK_THROWS_WITH(makeServerOptimizer("fedadam:tau=-1", 3), Catch::Contains("tau"));
  CHECK_THROWS_WITH(makeServerOptimizer("fedadam:lr=1", 3), Catch::Contains("unknown option 'lr'"));
  CHECK(makeServerOptimizer("fedyogi:eta=0.01", 1)->options().spec() ==
        "fedyogi:eta=0.01,eta_l=0.1,beta1=0.9,beta2=0.99,tau=0.001");
  // fedavg has no moments: its options do not accept them.
  CHECK_THROWS_WITH(makeServerOptimizer("fedavg:beta1=0.5", 3),
                    Catch::Contains("unknown option 'beta1'"));
  auto opt = makeServerOptimizer("fedadam", 2);
  std::vector<float> x = {1, 1};
  CHECK_THROWS_WITH(opt->step(x, std::vector<float>{1, std::nanf("")}),
                    Catch::Contains("not finite"));
  CHECK(x == std::vector<float>{1, 1});
  CHECK(opt->steps() == 0);
  CHECK_THROWS_AS(opt->step(x, std::vector<float>{1}), InvalidArgument);
}

// A state no step could produce (an edited or corrupt checkpoint) is refused at load, before it
// can make the model non-finite at the next step; the optimizer keeps its own state.
TEST_CASE("a server optimizer state with non-finite or negative moments is refused",
          "[aggregation]") {
  auto opt = makeServerOptimizer("fedadam:eta=0.1", 3);
  std::vector<float> x{1, 2, 3};
  opt->step(x, std::vector<float>{0.5f, -0.5f, 0.25f});
  const std::vector<uint8_t> good = save(*opt);
  // The tail is: m (u64 count, 3 floats), then v (u64 count, 3 floats).
  const size_t v_last = good.size() - 4, m_last = good.size() - 12 - 8 - 4;
  const auto patched = [&](size_t at, float value) {
    std::vector<uint8_t> b = good;
    std::memcpy(b.data() + at, &value, 4);
    return b;
  };
  auto fresh = makeServerOptimizer("fedadam:eta=0.1", 3);
  const std::vector<uint8_t> before = save(*fresh);
  CHECK_THROWS_AS(load(*fresh, patched(m_last, std::nanf(""))), IoError);
  CHECK_THROWS_AS(load(*fresh, patched(v_last, std::numeric_limits<float>::infinity())), IoError);
  CHECK_THROWS_AS(load(*fresh, patched(v_last, -1.0f)), IoError);
  CHECK(save(*fresh) == before);
  load(*fresh, good);  // the untouched state loads
  CHECK(save(*fresh) == good);
}
