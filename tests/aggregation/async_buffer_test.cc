// FedBuff's buffer (aggregation/async_buffer.h): the staleness weights and the K-buffer against
// sequences computed by hand, and its degenerate case against a synchronous round, bit for bit.
#include "aggregation/async_buffer.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "check_throws.h"
#include "compression/registry.h"
#include "test_util.h"

using namespace starling;
using namespace starling::aggregation;
using namespace starling::compression;
using Catch::Matchers::Contains;

namespace {

std::shared_ptr<const ParamLayout> threeValues() {
  auto l = std::make_shared<ParamLayout>();
  l->add("w", {3});
  return l;
}

// A dense update of client `id`, trained from model version `from`, on `n` examples.
Update dense(const ParamLayout& l, uint64_t id, uint64_t from, uint64_t n,
             std::vector<float> values, double loss) {
  Update u;
  u.header = {l.fingerprint(), from, 0, id, n};
  u.tensors = {DenseF32{std::move(values)}};
  u.metrics = {{"train_loss", loss}};
  return u;
}

Errc codeOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.code();
  }
  FAIL("no InputError");
  return Errc::kMalformed;
}

}  // namespace

TEST_CASE("staleness weights: constant, polynomial and hinge by hand, and bad specs",
          "[aggregation][async]") {
  const Staleness c = Staleness::parse("constant");
  CHECK(c.weight(0) == 1.0);
  CHECK(c.weight(1000) == 1.0);
  const Staleness fedbuff = Staleness::parse("polynomial");  // a = 0.5, FedBuff's
  CHECK(fedbuff.weight(0) == 1.0);
  CHECK(fedbuff.weight(3) == 0.5);  // 4^-0.5
  CHECK(fedbuff.weight(8) == Approx(1.0 / 3.0).epsilon(1e-15));
  const Staleness p1 = Staleness::parse("polynomial:a=1");
  CHECK(p1.weight(1) == 0.5);
  CHECK(p1.weight(4) == Approx(0.2).epsilon(1e-15));
  const Staleness h = Staleness::parse("hinge:a=10,b=4");
  CHECK(h.weight(0) == 1.0);
  CHECK(h.weight(4) == 1.0);
  CHECK(h.weight(5) == Approx(1.0 / 11.0).epsilon(1e-15));
  CHECK(h.weight(6) == Approx(1.0 / 21.0).epsilon(1e-15));
  for (const char* bad :
       {"linear", "polynomial:a=0", "polynomial:a=x", "polynomial:a=0.5,a=1", "hinge:a=10",
        "hinge:a=10,b=1.5", "hinge:a=-1,b=2", "constant:a=1", "polynomial:b=2", "polynomial:a"}) {
    INFO(bad);
    CHECK_THROWS_MATCHING(Staleness::parse(bad), ConfigError, Contains(bad));
  }
}

TEST_CASE("the buffer steps every K updates with sum n s(tau) update / sum n, by hand",
          "[aggregation][async]") {
  const auto l = threeValues();
  RoundSchemeOptions o;
  o.compressor = "none";
  const RoundScheme scheme(l, o);
  AsyncBuffer buf(
      scheme, AsyncOptions{.buffer_size = 2, .max_staleness = 1, .staleness = "polynomial:a=1"});
  REQUIRE(buf.version() == 1);

  // Version 1: two fresh updates (tau 0, s 1): FedAvg's mean.
  buf.add(view(dense(*l, 1, 1, 2, {1, 2, 3}, 1.0)));
  CHECK_FALSE(buf.ready());
  buf.add(view(dense(*l, 2, 1, 1, {4, 0, -2}, 4.0)));
  REQUIRE(buf.ready());
  RoundResult r = buf.take();
  CHECK(buf.version() == 1);  // until the caller applied the step
  buf.advance();
  CHECK(buf.version() == 2);
  CHECK(buf.size() == 0);
  CHECK(r.count == 2);
  CHECK(r.total_weight == 3.0);
  CHECK(r.delta[0] == Approx(2.0));  // (2 x 1 + 1 x 4) / 3
  CHECK(r.delta[1] == Approx(4.0 / 3.0));
  CHECK(r.delta[2] == Approx(4.0 / 3.0));
  CHECK(r.metrics.at("train_loss") == Approx(2.0));  // weighted by examples, not by staleness

  // Version 2: one update from version 1 (tau 1, s 1/2), one fresh.
  buf.add(view(dense(*l, 3, 1, 2, {2, 2, 2}, 0.0)));
  CHECK(buf.weightFor(1) == 0.5);
  buf.add(view(dense(*l, 1, 2, 2, {0, 3, 0}, 0.0)));
  r = buf.take();
  buf.advance();
  CHECK(r.delta[0] == Approx(0.5));  // (2 x 0.5 x 2 + 0) / 4
  CHECK(r.delta[1] == Approx(2.0));  // (2 x 0.5 x 2 + 2 x 3) / 4
  CHECK(r.delta[2] == Approx(0.5));

  // Version 3: from version 1 is 2 versions old, past the bound of 1; from version 4 not made yet;
  // a client's second update from one version is a duplicate. Each refused, the buffer unchanged.
  CHECK(codeOf([&] { buf.add(view(dense(*l, 5, 1, 1, {1, 1, 1}, 0.0))); }) == Errc::kStale);
  CHECK(codeOf([&] { buf.add(view(dense(*l, 5, 4, 1, {1, 1, 1}, 0.0))); }) == Errc::kWrongRound);
  CHECK(codeOf([&] { buf.add(view(dense(*l, 5, 0, 1, {1, 1, 1}, 0.0))); }) == Errc::kWrongRound);
  buf.add(view(dense(*l, 2, 2, 4, {1, 1, 1}, 0.0)));
  CHECK(codeOf([&] { buf.add(view(dense(*l, 2, 2, 4, {1, 1, 1}, 0.0))); }) == Errc::kDuplicate);
  // Client 1's update from version 2 was in the last step: sent again, it is a replay.
  CHECK(codeOf([&] { buf.add(view(dense(*l, 1, 2, 2, {0, 3, 0}, 0.0))); }) == Errc::kDuplicate);
  CHECK(buf.size() == 1);
  CHECK(buf.rejected() == 5);
  buf.add(view(dense(*l, 3, 3, 4, {-1, 0, 1}, 0.0)));
  r = buf.take();
  CHECK(r.rejected == 5);              // this step's refusals
  CHECK(r.delta[0] == Approx(-0.25));  // (4 x 0.5 x 1 - 4) / 8
  CHECK(r.delta[1] == Approx(0.25));
  CHECK(r.delta[2] == Approx(0.75));
  CHECK(r.total_weight == 8.0);
  CHECK_THROWS_AS(buf.take(), InvalidArgument);  // empty
  buf.advance();
  buf.add(view(dense(*l, 2, 3, 1, {1, 1, 1}, 0.0)));
  CHECK(buf.take().rejected == 0);
}

TEST_CASE("stale compressed updates: each decoded, scaled by s(tau) and weighted by examples",
          "[aggregation][async]") {
  // Against the dense decoding of every update, summed in double: an independent reference.
  auto l = std::make_shared<ParamLayout>();
  l->add("conv", {4, 3, 3});
  l->add("bias", {4});
  for (const char* spec : {"qsgd:levels=4", "sign", "randk:density=0.3", "randblock:density=0.3",
                           "stc:density=0.3", "topk:density=0.3", "fp16"}) {
    INFO(spec);
    RoundSchemeOptions o;
    o.compressor = spec;
    o.run_seed = 3;
    const RoundScheme scheme(l, o);
    AsyncBuffer buf(
        scheme, AsyncOptions{.buffer_size = 6, .max_staleness = 3, .staleness = "polynomial:a=0.5"},
        /*version=*/5);
    std::vector<double> want(l->numel(), 0.0);
    double weight = 0.0;
    std::vector<float> dense_u(l->numel());
    for (uint64_t c = 0; c < 6; ++c) {
      const uint64_t from = 5 - c % 4;  // staleness 0, 1, 2, 3, 0, 1
      ClientState state(l->fingerprint());
      Update u;
      u.header = {l->fingerprint(), from, 0, c, 5 + 2 * c};
      u.tensors = scheme.compressor().compressWithFeedback(
          *l, testing::randomVector(l->numel(), 70 + c, 0.2), state,
          buf.broadcast(from).context(c));
      buf.add(view(u));
      densifyUpdate(*l, u.tensors, dense_u);
      const double s = std::pow(1.0 + static_cast<double>(5 - from), -0.5);
      for (size_t i = 0; i < want.size(); ++i)
        want[i] += static_cast<double>(u.header.num_examples) * s * dense_u[i];
      weight += static_cast<double>(u.header.num_examples);
    }
    const RoundResult r = buf.take();
    CHECK(r.total_weight == weight);
    double top = 0.0, diff = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      top = std::max(top, std::fabs(want[i] / weight));
      diff = std::max(diff, std::fabs(want[i] / weight - r.delta[i]));
    }
    CHECK(top > 0.0);
    CHECK(diff <= 1e-5 * top);
  }
  // A random-block update that claims version 4 but took version 5's block is refused.
  RoundSchemeOptions o;
  o.compressor = "randblock:density=0.3";
  o.run_seed = 3;
  const RoundScheme scheme(l, o);
  AsyncBuffer buf(scheme, AsyncOptions{}, 5);
  ClientState state(l->fingerprint());
  Update u;
  u.header = {l->fingerprint(), 4, 0, 1, 5};
  u.tensors = scheme.compressor().compressWithFeedback(
      *l, testing::randomVector(l->numel(), 9, 0.2), state, buf.broadcast(5).context(1));
  CHECK(codeOf([&] { buf.add(view(u)); }) == Errc::kRoundMismatch);
}

TEST_CASE("K = the cohort, no staleness: the buffered step is the synchronous round's, bit for bit",
          "[aggregation][async]") {
  auto l = std::make_shared<ParamLayout>();
  l->add("conv", {4, 3, 3});
  l->add("bias", {4});
  for (const char* spec : {"none", "topk:density=0.3", "qsgd:levels=4"}) {
    INFO(spec);
    RoundSchemeOptions o;
    o.compressor = spec;
    o.run_seed = 9;
    const RoundScheme scheme(l, o);
    auto sync = scheme.begin(1, scheme.initialCarry());
    AsyncBuffer buf(scheme, AsyncOptions{.buffer_size = 5});  // FedBuff's polynomial; s(0) = 1
    for (uint64_t c = 0; c < 5; ++c) {
      ClientState state(l->fingerprint());
      Update u;
      u.header = {l->fingerprint(), 1, 0, c, 10 + 7 * c};
      u.tensors = scheme.compressor().compressWithFeedback(
          *l, testing::randomVector(l->numel(), 31 + c, 0.1), state, sync->broadcast().context(c));
      u.metrics = {{"train_loss", 0.5 + static_cast<double>(c)}};
      sync->current().add(view(u));
      buf.add(view(u));
    }
    const RoundResult a = buf.take(), s = sync->finish();
    CHECK(a.delta == s.delta);
    CHECK(a.metrics == s.metrics);
    CHECK(a.count == s.count);
    CHECK(a.total_weight == s.total_weight);
  }
}

TEST_CASE("asynchronous aggregation refuses what it cannot do, naming it", "[aggregation][async]") {
  auto l = threeValues();
  RoundSchemeOptions two;
  two.compressor = "powersgd:rank=1";
  CHECK_THROWS_MATCHING(AsyncBuffer(RoundScheme(l, two), AsyncOptions{}), ConfigError,
                        Contains("one-phase"));
  RoundSchemeOptions robust;
  robust.rule = "median";
  CHECK_THROWS_MATCHING(AsyncBuffer(RoundScheme(l, robust), AsyncOptions{}), ConfigError,
                        Contains("streaming"));
  RoundSchemeOptions plain;
  const RoundScheme scheme(l, plain);
  CHECK_THROWS_MATCHING(AsyncBuffer(scheme, AsyncOptions{.buffer_size = 0}), ConfigError,
                        Contains("buffer_size"));
  CHECK_THROWS_MATCHING(AsyncBuffer(scheme, AsyncOptions{.staleness = "hinge:a=1"}), ConfigError,
                        Contains("b="));
}
