// FedBuff's buffer (aggregation/async_buffer.h): the staleness weights and the K-buffer against
// sequences computed by hand, and its degenerate case against a synchronous round, bit for bit.
#include "aggregation/async_buffer.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "check_throws.h"
#include "compression/registry.h"
#include "test_util.h"

using namespace starling;
using namespace starling::aggregation;
using namespace starling::compression;
using Catch::Matchers::Contains;

namespace {
using starling::testing::codeOf;

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

PhaseBroadcast buf_broadcast(const RoundScheme& scheme, uint64_t v) {
  return PhaseBroadcast{scheme.options().run_seed, v, 0, nullptr};
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

TEST_CASE(
    "an edge aggregator's partial enters as its updates would, by hand: scaled by s(tau), counted "
    "toward K, one per aggregator and version",
    "[aggregation][async]") {
  const auto l = threeValues();
  RoundSchemeOptions o;
  o.compressor = "none";
  const RoundScheme scheme(l, o);
  const AsyncOptions opt{.buffer_size = 3, .max_staleness = 2, .staleness = "polynomial:a=1"};
  AsyncBuffer buf(scheme, opt);
  buf.add(view(dense(*l, 1, 1, 1, {1, 1, 1}, 0.0)));
  (void)buf.take();
  buf.advance();  // version 2
  // An aggregator's partial of two updates its clients trained from version 1 (tau 1, s 1/2).
  const auto partialOf = [&](uint64_t from, std::vector<Update> updates) {
    auto agg = scheme.phaseAggregator(buf_broadcast(scheme, from));
    for (const Update& u : updates) agg->add(view(u));
    return agg->partial().exportDense();
  };
  const PartialMessage p = partialOf(1, {dense(*l, 11, 1, 2, {2, 0, 4}, 1.0),  //
                                         dense(*l, 12, 1, 2, {0, 2, 0}, 3.0)});
  buf.addPartial(view(p), 100);
  CHECK(buf.size() == 2);
  CHECK_FALSE(buf.ready());
  CHECK(buf.hasUpdate(100, 1));
  // The same aggregator again from version 1, or its partial refused as a client's would be.
  CHECK(codeOf([&] { buf.addPartial(view(p), 100); }) == Errc::kDuplicate);
  CHECK(codeOf([&] {
          buf.addPartial(view(partialOf(3, {dense(*l, 11, 3, 2, {1, 1, 1}, 0.0)})), 101);
        }) == Errc::kWrongRound);
  // A second aggregator's partial from version 2 (tau 0) takes the buffer past K = 3: 4 updates.
  buf.addPartial(view(partialOf(2, {dense(*l, 13, 2, 1, {3, 3, 3}, 2.0),  //
                                    dense(*l, 14, 2, 3, {-1, 0, 1}, 2.0)})),
                 101);
  CHECK(buf.size() == 4);
  REQUIRE(buf.ready());
  const RoundResult r = buf.take();
  buf.advance();
  CHECK(r.count == 4);
  CHECK(r.total_weight == 8.0);
  // (0.5 (2 x 2 + 2 x 0) + 1 x 3 - 3 x 1) / 8, (0.5 (2 x 0 + 2 x 2) + 3 + 0) / 8,
  // (0.5 (2 x 4 + 0) + 3 + 3) / 8
  CHECK(r.delta[0] == Approx(2.0 / 8));
  CHECK(r.delta[1] == Approx(5.0 / 8));
  CHECK(r.delta[2] == Approx(10.0 / 8));
  CHECK(r.metrics.at("train_loss") == Approx((2 * 1.0 + 2 * 3.0 + 2.0 + 3 * 2.0) / 8));
  // A step that was not applied lets the aggregators send again from their versions.
  buf.discardTaken();
  CHECK_FALSE(buf.hasUpdate(100, 1));
  CHECK_FALSE(buf.hasUpdate(101, 2));
  // Version 3: version 1 is two versions old, within the bound; the state with a partial in it
  // saved and loaded steps bit for bit as the saved one.
  buf.addPartial(view(p), 100);
  std::vector<uint8_t> saved;
  ByteWriter w(saved);
  buf.save(w);
  AsyncBuffer again(scheme, opt);
  ByteReader rd(saved, "saved buffer");
  again.load(rd);
  rd.finish();
  CHECK(again.size() == 2);
  CHECK(again.hasUpdate(100, 1));
  for (AsyncBuffer* b : {&buf, &again}) b->add(view(dense(*l, 5, 3, 1, {1, 0, 0}, 0.0)));
  const RoundResult a = buf.take(), c = again.take();
  CHECK(c.count == 3);
  CHECK(c.total_weight == a.total_weight);
  CHECK(std::memcmp(c.delta.data(), a.delta.data(), a.delta.size() * sizeof(float)) == 0);
  CHECK(a.delta[0] == Approx((4.0 / 3 + 1) / 5));  // s(2) = 1/3 on the partial's 2 x 2
  // Past the bound (version 4: three versions old), the partial is stale.
  buf.advance();
  CHECK(codeOf([&] { buf.addPartial(view(p), 102); }) == Errc::kStale);
}

TEST_CASE(
    "what the buffer takes from edge aggregators it gives back from its state: a sparse partial "
    "within its slack, counts up to 2^24, senders that brought fewer updates are refused",
    "[aggregation][async]") {
  const auto l = threeValues();
  RoundSchemeOptions o;
  o.compressor = "none";
  o.bounds.max_abs_value = 10;
  const RoundScheme scheme(l, o);
  const AsyncOptions opt{.buffer_size = 100, .max_staleness = 2, .staleness = "constant"};
  AsyncBuffer buf(scheme, opt);
  // A re-sparsified partial of one update may carry the mass its aggregator kept back: 50 for a
  // weight of 1 and max_abs 10 is within max_partial_slack (8).
  const uint64_t tag =
      scheme.phaseAggregator(buf_broadcast(scheme, 1))->partial().layout().sharedTag();
  PartialMessage sparse;
  sparse.header = {l->fingerprint(), 1, 0, tag, 1, 1.0, 0};
  sparse.tensors = {Sparse{{1}, {50.0f}}};
  buf.addPartial(view(sparse), 100);
  // A partial of 2^24 - 2 updates, then one client: 2^24, the most a version's sum counts.
  PartialMessage big;
  big.header = {
      l->fingerprint(), 1, 0, tag, (1u << 24) - 2, static_cast<double>((1u << 24) - 2), 0};
  big.tensors = {DenseF32{{0, 0, 0}}};
  buf.addPartial(view(big), 101);
  buf.add(view(dense(*l, 7, 1, 1, {1, 1, 1}, 0.0)));
  CHECK(buf.size() == uint64_t{1} << 24);
  CHECK(codeOf([&] { buf.add(view(dense(*l, 8, 1, 1, {1, 1, 1}, 0.0))); }) == Errc::kBadWeight);
  std::vector<uint8_t> saved;
  ByteWriter w(saved);
  buf.save(w);
  AsyncBuffer again(scheme, opt);
  ByteReader r(saved, "saved buffer");
  again.load(r);
  r.finish();
  CHECK(again.size() == buf.size());
  const RoundResult a = buf.take(), b = again.take();
  CHECK(std::memcmp(a.delta.data(), b.delta.data(), a.delta.size() * sizeof(float)) == 0);
  // The same state with aggregator 100 said to have brought no update: refused.
  std::vector<uint8_t> lying = saved;
  const auto le = [](uint64_t v) {
    std::vector<uint8_t> out(8);
    for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
    return out;
  };
  std::vector<uint8_t> pair = le(101), count = le((1u << 24) - 2);
  pair.insert(pair.end(), count.begin(), count.end());
  const auto at = std::search(lying.begin(), lying.end(), pair.begin(), pair.end());
  REQUIRE(at != lying.end());
  const std::vector<uint8_t> one = le(1);
  std::copy(one.begin(), one.end(), at + 8);  // 101 brought one update
  AsyncBuffer liar(scheme, opt);
  const auto load = [&] {  // a reader per call: the macro may evaluate its expression twice
    ByteReader lr(lying, "damaged buffer");
    liar.load(lr);
  };
  CHECK_THROWS_MATCHING(load(), IoError, Contains("not all among its senders"));
  CHECK(liar.size() == 0);
}

TEST_CASE("asynchronous aggregation refuses what it cannot do, naming it", "[aggregation][async]") {
  auto l = threeValues();
  RoundSchemeOptions two;
  two.compressor = "powersgd:rank=1";
  CHECK_THROWS_MATCHING(AsyncBuffer(RoundScheme(l, two), AsyncOptions{}), ConfigError,
                        Contains("one-phase"));
  RoundSchemeOptions acp;
  acp.compressor = "acpsgd:rank=1";  // one phase, its factors shared across rounds
  CHECK_THROWS_MATCHING(AsyncBuffer(RoundScheme(l, acp), AsyncOptions{}), ConfigError,
                        Contains("shares factors across rounds"));
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

TEST_CASE("a saved buffer, loaded, steps as the saved one would, and a damaged state is refused",
          "[aggregation][async]") {
  const auto l = threeValues();
  RoundSchemeOptions o;
  o.compressor = "none";
  const RoundScheme scheme(l, o);
  const AsyncOptions opt{.buffer_size = 4, .max_staleness = 2, .staleness = "polynomial:a=0.5"};
  AsyncBuffer a(scheme, opt);
  a.add(view(dense(*l, 1, 1, 3, {1, 2, 3}, 1.0)));
  a.add(view(dense(*l, 2, 1, 2, {0.1f, -2, 7}, 2.0)));
  (void)a.take();
  a.advance();
  a.advance();  // version 3: updates from 1 are two versions old
  a.add(view(dense(*l, 3, 1, 5, {0.3f, 0.7f, -1.1f}, 3.0)));
  a.add(view(dense(*l, 4, 2, 1, {2.5f, 0, 1}, 4.0)));
  a.add(view(dense(*l, 5, 3, 7, {-0.2f, 0.9f, 0.4f}, 5.0)));
  CHECK_THROWS_AS(a.add(view(dense(*l, 6, 9, 1, {1, 1, 1}, 0.0))), InputError);  // a refusal
  std::vector<uint8_t> saved;
  ByteWriter w(saved);
  a.save(w);

  AsyncBuffer b(scheme, opt);
  ByteReader r(saved, "saved buffer");
  b.load(r);
  r.finish();
  CHECK(b.version() == 3);
  CHECK(b.size() == 3);
  CHECK(b.rejected() == 1);
  CHECK(b.hasUpdate(1, 1));  // taken in the first step, still a duplicate if sent again
  CHECK(b.hasUpdate(5, 3));
  CHECK_FALSE(b.hasUpdate(5, 2));
  CHECK(codeOf([&] { b.add(view(dense(*l, 1, 1, 3, {1, 2, 3}, 1.0))); }) == Errc::kDuplicate);
  CHECK(codeOf([&] { a.add(view(dense(*l, 1, 1, 3, {1, 2, 3}, 1.0))); }) == Errc::kDuplicate);
  // The same fourth update to both: the same step, bit for bit.
  a.add(view(dense(*l, 7, 2, 4, {0.6f, -0.3f, 0.05f}, 6.0)));
  b.add(view(dense(*l, 7, 2, 4, {0.6f, -0.3f, 0.05f}, 6.0)));
  REQUIRE(a.ready());
  REQUIRE(b.ready());
  const RoundResult ra = a.take(), rb = b.take();
  CHECK(rb.count == ra.count);
  CHECK(rb.total_weight == ra.total_weight);
  CHECK(rb.rejected == ra.rejected);
  CHECK(rb.metrics == ra.metrics);
  REQUIRE(rb.delta.size() == ra.delta.size());
  CHECK(std::memcmp(rb.delta.data(), ra.delta.data(), ra.delta.size() * sizeof(float)) == 0);

  // Damaged states: each refused naming what is wrong, the buffer it was loaded into unchanged.
  const auto refused = [&](std::vector<uint8_t> bytes, const AsyncOptions& into,
                           const std::string& says) {
    INFO(says);
    AsyncBuffer c(scheme, into);
    const auto load = [&] {  // a reader per call: the macro may evaluate its expression twice
      ByteReader rr(bytes, "damaged buffer");
      c.load(rr);
    };
    CHECK_THROWS_MATCHING(load(), IoError, Contains(says));
    CHECK(c.version() == 1);
    CHECK(c.size() == 0);
  };
  refused({saved.begin(), saved.end() - 3}, opt, "only 13 bytes left");  // a sender is 16 bytes
  refused({saved.begin(), saved.begin() + 52}, opt, "truncated");
  AsyncOptions tighter = opt;
  tighter.max_staleness = 1;  // version 1's sum is two versions old
  refused(saved, tighter, "more than async.max_staleness + 1 = 2");
  std::vector<uint8_t> count = saved;
  count[8] = 9;  // the update count (after the version)
  refused(count, opt, "the buffer counts 9 updates, its sums hold 3");
  // The first buffered sum's first value (after 5 u64, the version and the float count).
  std::vector<uint8_t> nan = saved;
  const float q = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan.data() + 7 * 8, &q, sizeof q);
  refused(nan, opt, "non-finite");
  // Values no update within the bounds could sum to: a count that is not whole, a sum beyond its
  // weight times bounds.max_abs (such a file would make the step's mean non-finite).
  const size_t dense_at =
      scheme.phaseAggregator(buf_broadcast(scheme, 1))->partial().layout().denseOffset();
  std::vector<uint8_t> half = saved;
  const float two_and_half = 2.5f;
  std::memcpy(half.data() + 7 * 8 + 4, &two_and_half, sizeof(float));  // the count slot
  refused(half, opt, "counts 2.5 updates");
  std::vector<uint8_t> huge = saved;
  const float big = 1e30f;
  std::memcpy(huge.data() + 7 * 8 + 4 * dense_at, &big, sizeof(float));
  refused(huge, opt, "beyond its weight");
}
