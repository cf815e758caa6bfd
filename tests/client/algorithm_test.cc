// ClientAlgorithm: FedProx's anchor and SCAFFOLD's control variates (Karimireddy et al., ICML
// 2020, option II), against the formulas written out here.
#include "client/algorithm.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "check_throws.h"
#include "client/synthetic.h"
#include "compression/registry.h"
#include "protocol/codec.h"
#include "test_util.h"

using namespace starling;
using namespace starling::client;
using Catch::Matchers::Contains;

namespace {

std::vector<float> dense(const compression::Update& u, const ParamLayout& l) {
  std::vector<float> out;
  out.reserve(l.numel());
  for (const auto& p : u.tensors) {
    const auto& d = std::get<compression::DenseF32>(p);
    out.insert(out.end(), d.values.begin(), d.values.end());
  }
  REQUIRE(out.size() == l.numel());
  return out;
}

}  // namespace

TEST_CASE("SCAFFOLD: corrected steps, the control-variate update and its neutral setting",
          "[client]") {
  const data::Dataset d = testing::gaussianData(50, 5, 3, 2);
  const std::vector<size_t> idx = testing::allIndices(d);
  const DataView view{&d, idx};
  auto t = makeTrainer("softmax", 5, 3);
  const ParamLayout& l = t->layout();
  const size_t n = l.numel();
  const auto none = compression::makeCompressor("none");
  const FitConfig cfg{.epochs = 2, .batch_size = 16, .lr = 0.1};  // K = 2 x ceil(50 / 16) = 8 steps
  REQUIRE(cfg.steps(d.size()) == 8);
  ClientAlgorithm alg(*none, *t, cfg);
  std::vector<float> global(n);
  t->initParameters(global, 5);
  const compression::PhaseBroadcast b{7, 1, 0, nullptr};

  // c = c_i = 0: the same training as FedAvg's; the state gains c_i = control_delta.
  ClientState plain_state(l.fingerprint()), s(l.fingerprint());
  const PhaseResult fedavg = alg.runPhase(b, 3, global, view, plain_state);
  const std::vector<float> zeros(n, 0.0f);
  const PhaseResult first = alg.runPhase(b, 3, global, view, s, zeros);
  const auto u0 = dense(fedavg.update, l), u1 = dense(first.update, l);
  CHECK(u0 == u1);
  CHECK(fedavg.control_delta.empty());
  CHECK_FALSE(plain_state.has(kControlVariate));
  REQUIRE(first.control_delta.size() == n);
  const double K = 8, lr = 0.1;
  for (size_t i = 0; i < n; ++i)
    CHECK(first.control_delta[i] == Approx(-u1[i] / (K * lr)).margin(1e-6));
  const auto* ci = s.find<ControlVariateState>(kControlVariate);
  REQUIRE(ci != nullptr);
  CHECK(ci->values == first.control_delta);

  // With c != 0: the steps are corrected by c - c_i, and c_i+ = c_i - c + (x - y) / (K lr).
  std::vector<float> c(n);
  for (size_t i = 0; i < n; ++i) c[i] = 0.05f * std::sin(static_cast<float>(i));
  const std::vector<float> ci_before = ci->values;
  const PhaseResult second = alg.runPhase(b, 3, global, view, s, c);
  const auto u2 = dense(second.update, l);
  // The same training by hand: the trainer with the correction c - c_i.
  std::vector<float> corr(n), p = global;
  for (size_t i = 0; i < n; ++i) corr[i] = c[i] - ci_before[i];
  FitConfig by_hand = cfg;
  by_hand.correction = corr;
  RngStream rng(StreamKey{7, 1, 3, StreamPurpose::kTraining, 0});
  t->fit(p, view, by_hand, rng);
  for (size_t i = 0; i < n; ++i) {
    CHECK(u2[i] == Approx(p[i] - global[i]).margin(1e-6));
    const double want = -c[i] + (global[i] - p[i]) / (K * lr);
    CHECK(second.control_delta[i] == Approx(want).margin(1e-5));
  }
  const auto* ci2 = s.find<ControlVariateState>(kControlVariate);
  for (size_t i = 0; i < n; ++i)
    CHECK(ci2->values[i] == Approx(ci_before[i] + second.control_delta[i]).margin(1e-6));
  CHECK(u2 != u1);

  // A server control variate of the wrong size, or one so large that training diverges, is
  // refused and the state (residual, control variate) stays as it was.
  std::vector<uint8_t> before, after;
  s.saveTo(before);
  CHECK_THROWS_MATCHING(alg.runPhase(b, 3, global, view, s, std::span<const float>(c).first(n - 1)),
                        InvalidArgument, Contains("server control variate"));
  s.saveTo(after);
  CHECK(before == after);
  const std::vector<float> huge(n, 3e37f);
  CHECK_THROWS_AS(alg.runPhase(b, 3, global, view, s, huge), Error);
  s.saveTo(after);
  CHECK(before == after);
}

TEST_CASE("SCAFFOLD deployed: c_i+ waits for the server's acknowledgement of its round",
          "[client][scaffold]") {
  const data::Dataset d = testing::gaussianData(40, 4, 3, 3);
  const std::vector<size_t> idx = testing::allIndices(d);
  const DataView view{&d, idx};
  auto t = makeTrainer("softmax", 4, 3);
  const ParamLayout& l = t->layout();
  const size_t n = l.numel();
  const auto none = compression::makeCompressor("none");
  ClientAlgorithm alg(*none, *t, FitConfig{.epochs = 1, .batch_size = 8, .lr = 0.1});
  std::vector<float> global(n), c(n);
  t->initParameters(global, 3);
  for (size_t i = 0; i < n; ++i) c[i] = 0.02f * std::cos(static_cast<float>(i));
  const auto at = [](uint64_t round) { return compression::PhaseBroadcast{7, round, 0, nullptr}; };

  // The simulator's way (no acknowledgement) commits at once: the reference.
  ClientState sim(l.fingerprint());
  const PhaseResult r1 = alg.runPhase(at(1), 2, global, view, sim, c);
  const std::vector<float> c1 = sim.find<ControlVariateState>(kControlVariate)->values;

  // Round 1 deployed: c_i stays zeros, c_i+ pending under round 1; the update is the simulator's.
  ClientState s(l.fingerprint());
  const PhaseResult d1 = alg.runPhase(at(1), 2, global, view, s, c, 0);
  CHECK(dense(d1.update, l) == dense(r1.update, l));
  CHECK(d1.control_delta == r1.control_delta);
  const auto* ci = s.find<ControlVariateState>(kControlVariate);
  REQUIRE(ci != nullptr);
  CHECK(ci->values.empty());
  CHECK(ci->pending_round == 1);
  CHECK(ci->pending == c1);

  // Round 2 acknowledges round 1: the client trains with c_i = c1, exactly as the simulator's
  // second round, and keeps round 2's c_i+ pending.
  const PhaseResult r2 = alg.runPhase(at(2), 2, global, view, sim, c);
  const std::vector<float> c2 = sim.find<ControlVariateState>(kControlVariate)->values;
  const PhaseResult d2 = alg.runPhase(at(2), 2, global, view, s, c, 1);
  CHECK(dense(d2.update, l) == dense(r2.update, l));
  ci = s.find<ControlVariateState>(kControlVariate);
  CHECK(ci->values == c1);
  CHECK(ci->pending_round == 2);
  CHECK(ci->pending == c2);

  CHECK(d2.control_dropped == 0);

  // Round 5 acknowledges round 1 again (round 2's update was not counted: refused as late): round
  // 2's c_i+ is dropped, c_i stays c1, and round 5 trains from c1, as a simulated client holding
  // c1 does (were c2 kept, the correction c - c_i would differ).
  ClientState from_c1(l.fingerprint());
  from_c1.get<ControlVariateState>(kControlVariate).values = c1;
  const PhaseResult r5 = alg.runPhase(at(5), 2, global, view, from_c1, c);
  const PhaseResult d5 = alg.runPhase(at(5), 2, global, view, s, c, 1);
  CHECK(d5.control_dropped == 2);
  CHECK(dense(d5.update, l) == dense(r5.update, l));
  CHECK(d5.control_delta == r5.control_delta);
  ci = s.find<ControlVariateState>(kControlVariate);
  CHECK(ci->values == c1);
  CHECK(ci->pending_round == 5);
  CHECK(ci->pending == from_c1.find<ControlVariateState>(kControlVariate)->values);

  // The state keeps the pending c_i+ across a save and load (the client's state file).
  std::vector<uint8_t> bytes;
  s.saveTo(bytes);
  ClientState back(l.fingerprint());
  back.loadFrom(bytes);
  const auto* cb = back.find<ControlVariateState>(kControlVariate);
  REQUIRE(cb != nullptr);
  CHECK(cb->values == c1);
  CHECK(cb->pending_round == 5);
  CHECK(cb->pending == ci->pending);

  // acknowledge(): only the pending round commits; anything else drops it.
  ControlVariateState v;
  v.values = {1.0f};
  v.pending_round = 4;
  v.pending = {2.0f};
  ControlVariateState drop = v;
  CHECK_FALSE(drop.acknowledge(3));
  CHECK(drop.values == std::vector<float>{1.0f});
  CHECK(drop.pending_round == 0);
  CHECK(drop.pending.empty());
  CHECK(v.acknowledge(4));
  CHECK(v.values == std::vector<float>{2.0f});
  CHECK_FALSE(v.acknowledge(4));  // nothing pending any more
  CHECK(v.values == std::vector<float>{2.0f});
  // An older client's state (version 1: c_i alone) reads with nothing pending; a pending round
  // without values is refused.
  std::vector<uint8_t> v1;
  ByteWriter wv1(v1);
  wv1.floats(c1);
  ControlVariateState old;
  old.pending_round = 9;
  ByteReader rv1(v1, "v1");
  old.load(rv1, 1);
  CHECK(old.values == c1);
  CHECK(old.pending_round == 0);
  std::vector<uint8_t> bad;
  ByteWriter wb(bad);
  wb.floats(c1);
  wb.u64(3);
  wb.floats(std::vector<float>{});
  ByteReader rb(bad, "bad");
  CHECK_THROWS_AS(old.load(rb, 2), IoError);
}

TEST_CASE("FedProx: the algorithm anchors the proximal term at the round's global model",
          "[client]") {
  const data::Dataset d = testing::gaussianData(60, 5, 3, 4);
  const std::vector<size_t> idx = testing::allIndices(d);
  auto t = makeTrainer("mlp:hidden=8", 5, 3);
  const ParamLayout& l = t->layout();
  const auto none = compression::makeCompressor("none");
  std::vector<float> global(l.numel());
  t->initParameters(global, 9);
  const compression::PhaseBroadcast b{7, 1, 0, nullptr};
  const auto norm = [&](double mu) {
    FitConfig cfg{.epochs = 5, .batch_size = 6, .lr = 0.1};
    cfg.prox_mu = mu;
    ClientAlgorithm alg(*none, *t, cfg);
    ClientState s(l.fingerprint());
    const auto u = dense(alg.runPhase(b, 1, global, DataView{&d, idx}, s).update, l);
    double sum = 0;
    for (float v : u) sum += static_cast<double>(v) * v;
    return std::sqrt(sum);
  };
  const double n0 = norm(0.0), n1 = norm(1.0), n5 = norm(5.0);
  CHECK(n0 > 0);
  CHECK(n1 < n0);  // the further from the global model, the stronger the pull back
  CHECK(n5 < n1);
}

// Step-ahead error feedback (ef_preview = a, compression/compressor.h): the client trains from
// global + a residual, and what it compresses is its displacement from that start plus the
// residual, so with a = 1 it sends its local model's distance from the global one.
TEST_CASE("ef_preview: local training starts from the global model plus the residual", "[client]") {
  const data::Dataset d = testing::gaussianData(40, 5, 3, 6);
  const std::vector<size_t> idx = testing::allIndices(d);
  const DataView view{&d, idx};
  auto t = makeTrainer("softmax", 5, 3);
  const ParamLayout& l = t->layout();
  const size_t n = l.numel();
  std::vector<float> global(n);
  t->initParameters(global, 3);
  const FitConfig cfg{.epochs = 2, .batch_size = 8, .lr = 0.2};
  for (const double alpha : {0.0, 0.5, 1.0}) {
    INFO("ef_preview " << alpha);
    const auto comp =
        compression::makeCompressor("randblock:density=0.25,ef_preview=" + std::to_string(alpha));
    REQUIRE(comp->feedback().preview == alpha);
    ClientAlgorithm alg(*comp, *t, cfg);
    ClientState s(l.fingerprint());
    alg.runPhase(compression::PhaseBroadcast{7, 1, 0, nullptr}, 2, global, view,
                 s);  // leaves a residual
    const std::vector<float> r = testing::residualOf(s, n);
    REQUIRE(testing::maxAbs(r) > 0);
    const PhaseResult res =
        alg.runPhase(compression::PhaseBroadcast{7, 2, 0, nullptr}, 2, global, view, s);
    const std::vector<float> sent = testing::densify(l, res.update.tensors);
    const std::vector<float> kept = testing::residualOf(s, n);
    // By hand: the same stream, from global + alpha r.
    std::vector<float> p(n), start(n);
    for (size_t i = 0; i < n; ++i) start[i] = p[i] = global[i] + static_cast<float>(alpha) * r[i];
    RngStream rng(StreamKey{7, 2, 2, StreamPurpose::kTraining, 0});
    t->fit(p, view, cfg, rng);
    std::vector<float> got(n), want(n);
    for (size_t i = 0; i < n; ++i) {
      got[i] = sent[i] + kept[i];
      want[i] = (p[i] - start[i]) + r[i];
    }
    CHECK(testing::maxAbsDiff(got, want) <= 1e-6);
  }
  // A residual older than ef_max_age is neither previewed nor added.
  const auto comp = compression::makeCompressor("randblock:density=0.25,ef_preview=1,ef_max_age=2");
  ClientAlgorithm alg(*comp, *t, cfg);
  ClientState s(l.fingerprint());
  alg.runPhase(compression::PhaseBroadcast{7, 1, 0, nullptr}, 2, global, view, s);
  const PhaseResult res =
      alg.runPhase(compression::PhaseBroadcast{7, 9, 0, nullptr}, 2, global, view, s);
  ClientState fresh(l.fingerprint());
  const PhaseResult clean =
      alg.runPhase(compression::PhaseBroadcast{7, 9, 0, nullptr}, 2, global, view, fresh);
  CHECK(testing::densify(l, res.update.tensors) == testing::densify(l, clean.update.tensors));
  CHECK(testing::residualOf(s, n) == testing::residualOf(fresh, n));
}

TEST_CASE("the algorithm reports error feedback's diagnostics with the update", "[client]") {
  const data::Dataset d = testing::gaussianData(40, 5, 3, 6);
  const std::vector<size_t> idx = testing::allIndices(d);
  auto t = makeTrainer("softmax", 5, 3);
  const ParamLayout& l = t->layout();
  std::vector<float> global(l.numel());
  t->initParameters(global, 3);
  const auto metric = [](const PhaseResult& r, const char* name) {
    for (const auto& m : r.update.metrics)
      if (m.name == name) return m.value;
    return -1.0;
  };
  const auto plain = compression::makeCompressor("randblock:density=0.25,ef_preview=0");
  ClientAlgorithm alg(*plain, *t, FitConfig{.epochs = 1, .batch_size = 8, .lr = 0.2});
  ClientState s(l.fingerprint());
  const PhaseResult r1 =
      alg.runPhase(compression::PhaseBroadcast{7, 1, 0, nullptr}, 2, global, DataView{&d, idx}, s);
  CHECK(metric(r1, "ef_gain") == Approx(1.0));  // nothing waited: what is sent is the fresh update
  CHECK(metric(r1, "ef_residual_ratio") > 0.0);
  CHECK(metric(r1, "ef_residual_ratio") < 1.0);
  CHECK(metric(r1, "ef_residual_age") == 0.0);
  const PhaseResult r3 =
      alg.runPhase(compression::PhaseBroadcast{7, 3, 0, nullptr}, 2, global, DataView{&d, idx}, s);
  CHECK(metric(r3, "ef_residual_age") == 2.0);
  CHECK(metric(r1, "train_loss") >= 0.0);
  // Without error feedback, none.
  const auto off = compression::makeCompressor("randblock:density=0.25,ef=false");
  ClientAlgorithm alg_off(*off, *t, FitConfig{.epochs = 1, .batch_size = 8, .lr = 0.2});
  ClientState s2(l.fingerprint());
  const PhaseResult r0 = alg_off.runPhase(compression::PhaseBroadcast{7, 1, 0, nullptr}, 2, global,
                                          DataView{&d, idx}, s2);
  CHECK(metric(r0, "ef_gain") == -1.0);
}

TEST_CASE(
    "with step-ahead EF, FedProx anchors at the start point and the residual is not worn away",
    "[client]") {
  // Zero-gradient data for the weights: every example is all-zero features, labels balanced, so
  // only the bias moves; the residual on the weights must come back whole in sent + kept.
  data::Dataset d = testing::gaussianData(30, 5, 3, 6);
  std::fill(d.images.begin(), d.images.end(), 0.0f);
  const std::vector<size_t> idx = testing::allIndices(d);
  auto t = makeTrainer("softmax", 5, 3);
  const ParamLayout& l = t->layout();
  const size_t n = l.numel();
  std::vector<float> global(n);
  t->initParameters(global, 3);
  FitConfig cfg{.epochs = 2, .batch_size = 10, .lr = 0.1};
  cfg.prox_mu = 1.0f;
  const auto comp = compression::makeCompressor("randblock:density=0.25,ef_preview=1");
  ClientAlgorithm alg(*comp, *t, cfg);
  ClientState s(l.fingerprint());
  // A residual on the weights, as if left by an earlier round.
  auto res = std::make_unique<compression::ResidualState>();
  res->values.assign(n, 0.0f);
  const size_t weights = l[0].numel;
  for (size_t i = 0; i < weights; ++i) res->values[i] = 0.01f * static_cast<float>(i % 7);
  res->round = 1;
  const std::vector<float> r = res->values;
  std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>> items;
  items.emplace_back(std::string(compression::kResidualComponent), std::move(res));
  s.commit(items);
  const PhaseResult out =
      alg.runPhase(compression::PhaseBroadcast{7, 2, 0, nullptr}, 2, global, DataView{&d, idx}, s);
  const auto sent = testing::densify(l, out.update.tensors);
  const auto kept = testing::residualOf(s, n);
  double worst = 0;
  for (size_t i = 0; i < weights; ++i)
    worst = std::max(worst, std::fabs(double(sent[i]) + kept[i] - r[i]));
  CHECK(worst <= 1e-6);  // anchored at global, the pull would have removed part of r
}

TEST_CASE("the diagnostics are capped so that they can never get an update refused", "[client]") {
  const data::Dataset d = testing::gaussianData(20, 5, 3, 6);
  const std::vector<size_t> idx = testing::allIndices(d);
  auto t = makeTrainer("softmax", 5, 3);
  const ParamLayout& l = t->layout();
  std::vector<float> global(l.numel());
  t->initParameters(global, 3);
  const auto comp = compression::makeCompressor("randblock:density=0.25,ef_preview=0");
  ClientAlgorithm alg(*comp, *t, FitConfig{.epochs = 1, .batch_size = 20, .lr = 1e-6});
  ClientState s(l.fingerprint());
  auto res = std::make_unique<compression::ResidualState>();
  res->values.assign(l.numel(), 1e20f);  // a large residual, a displacement of about 1e-7
  res->round = 1;
  std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>> items;
  items.emplace_back(std::string(compression::kResidualComponent), std::move(res));
  s.commit(items);
  const PhaseResult out =
      alg.runPhase(compression::PhaseBroadcast{7, 2, 0, nullptr}, 2, global, DataView{&d, idx}, s);
  size_t seen = 0;
  for (const auto& m : out.update.metrics)
    if (m.name.rfind("ef_", 0) == 0) {
      ++seen;
      CHECK(m.value <= 1e6);  // the server refuses a metric above bounds.max_metric_abs (1e9)
    }
  CHECK(seen == 3);
}

TEST_CASE("a client's turn: the update as it is sent, whichever driver asked", "[client]") {
  const data::Dataset d = testing::gaussianData(40, 5, 3, 6);
  const std::vector<size_t> idx = testing::allIndices(d);
  auto t = makeTrainer("softmax", 5, 3);
  const ParamLayout& l = t->layout();
  std::vector<float> global(l.numel());
  t->initParameters(global, 3);
  const auto comp = compression::makeCompressor("randblock:density=0.25,ef_preview=0");
  const protocol::FitSettings settings{1, 8, 0.2f, 0.5f};
  const FitConfig fit = fitConfig(settings);
  CHECK(fit.epochs == 1);
  CHECK(fit.batch_size == 8);
  CHECK(fit.lr == Approx(0.2));
  CHECK(fit.prox_mu == Approx(0.5));
  CHECK(fit.stop == nullptr);
  const std::atomic<bool> stop{false};
  CHECK(fitConfig(settings, &stop).stop == &stop);

  ClientAlgorithm alg(*comp, *t, fit);
  const compression::PhaseBroadcast b{7, 1, 0, nullptr};
  ClientState plain(l.fingerprint()), turned(l.fingerprint());
  const PhaseResult direct = alg.runPhase(b, 2, global, DataView{&d, idx}, plain);
  REQUIRE(direct.update.metrics.size() > 1);  // train_loss and error feedback's diagnostics
  const std::vector<std::string> declared{"ef_gain"};
  const PhaseResult r =
      alg.takeTurn(TurnRequest{b, global, declared, 42}, 2, DataView{&d, idx}, turned);
  // The same training and encoding; only the declared metric, the task's nonce.
  compression::Update want = direct.update;
  std::erase_if(want.metrics, [](const Metric& m) { return m.name != "ef_gain"; });
  want.header.nonce = 42;
  CHECK(protocol::encodeUpdate(r.update) == protocol::encodeUpdate(want));
  REQUIRE(r.update.metrics.size() == 1);
  CHECK(r.update.metrics[0].name == "ef_gain");
  CHECK(r.update.header.nonce == 42);
  CHECK(r.update.header.round == 1);
  CHECK(r.update.control.empty());
  std::vector<uint8_t> a, c;
  plain.saveTo(a);
  turned.saveTo(c);
  CHECK(a == c);

  // SCAFFOLD: the control change travels in the update.
  const auto none = compression::makeCompressor("none");
  ClientAlgorithm plain_sgd(*none, *t, FitConfig{.epochs = 1, .batch_size = 8, .lr = 0.2});
  ClientState s(l.fingerprint());
  const std::vector<float> c0(l.numel(), 0.0f);
  const PhaseResult sc =
      plain_sgd.takeTurn(TurnRequest{b, global, declared, 1, c0}, 2, DataView{&d, idx}, s);
  CHECK(sc.update.control.size() == l.numel());
  CHECK(sc.control_delta.empty());
  CHECK(sc.update.metrics.empty());  // no error feedback: nothing declared was made
  const auto* committed = s.find<ControlVariateState>(kControlVariate);
  REQUIRE(committed != nullptr);
  CHECK(committed->pending_round == 0);
  // A deployed task's acknowledgement reaches the algorithm: this round's c_i+ waits for it.
  ClientState deployed(l.fingerprint());
  const PhaseResult acked = plain_sgd.takeTurn(TurnRequest{b, global, declared, 1, c0, uint64_t{0}},
                                               2, DataView{&d, idx}, deployed);
  CHECK(acked.update.control == sc.update.control);
  const auto* pending = deployed.find<ControlVariateState>(kControlVariate);
  REQUIRE(pending != nullptr);
  CHECK(pending->pending_round == 1);
}
