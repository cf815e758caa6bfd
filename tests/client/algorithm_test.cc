// ClientAlgorithm: FedProx's anchor and SCAFFOLD's control variates (Karimireddy et al., ICML
// 2020, option II), against the formulas written out here.
#include "client/algorithm.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "check_throws.h"
#include "client/synthetic.h"
#include "compression/registry.h"

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

TEST_CASE("SCAFFOLD: corrected steps, the control-variate update and its neutral setting", "[client]") {
  const data::Dataset d = testing::gaussianData(50, 5, 3, 2);
  std::vector<size_t> idx(d.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
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
  for (size_t i = 0; i < n; ++i) CHECK(first.control_delta[i] == Approx(-u1[i] / (K * lr)).margin(1e-6));
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
  for (size_t i = 0; i < n; ++i) CHECK(ci2->values[i] == Approx(ci_before[i] + second.control_delta[i]).margin(1e-6));
  CHECK(u2 != u1);

  // A server control variate of the wrong size, or one so large that training diverges, is
  // refused and the state (residual, control variate) stays as it was.
  std::vector<uint8_t> before, after;
  s.saveTo(before);
  CHECK_THROWS_MATCHING(alg.runPhase(b, 3, global, view, s, std::span<const float>(c).first(n - 1)), InvalidArgument,
                        Contains("server control variate"));
  s.saveTo(after);
  CHECK(before == after);
  const std::vector<float> huge(n, 3e37f);
  CHECK_THROWS_AS(alg.runPhase(b, 3, global, view, s, huge), Error);
  s.saveTo(after);
  CHECK(before == after);
}

TEST_CASE("FedProx: the algorithm anchors the proximal term at the round's global model", "[client]") {
  const data::Dataset d = testing::gaussianData(60, 5, 3, 4);
  std::vector<size_t> idx(d.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
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
