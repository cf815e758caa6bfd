// The in-process federation harness (the way gloo tests many ranks in one process): a root, edge
// aggregators and N clients in one process, every message through the real encoder and decoder,
// driven by the generic round loop for every compressor, flat and two-level.
#include "aggregation/round_scheme.h"

#include <Eigen/QR>
#include <catch2/catch.hpp>
#include <functional>

#include "check_throws.h"
#include "compression/lowrank.h"
#include "compression/registry.h"
#include "protocol/codec.h"
#include "test_util.h"

using namespace starling;
using namespace starling::aggregation;
using namespace starling::compression;

namespace {

// What one client sent in one phase, with the factors that phase shared (for references).
struct Sent {
  uint32_t phase;
  uint64_t client;
  double weight;
  Update update;
  std::shared_ptr<const SharedFactors> shared;
};

// A federation: clients with their own error-feedback state, and either a flat topology (every
// client sends to the root) or `edges` edge aggregators that each send the root one partial.
class Federation {
 public:
  Federation(std::shared_ptr<const ParamLayout> layout, RoundSchemeOptions o, size_t clients,
             size_t edges)
      : layout_(std::move(layout)),
        scheme_(layout_, std::move(o)),
        edges_(edges),
        decoder_(*layout_) {
    for (size_t c = 0; c < clients; ++c) states_.emplace_back(layout_->fingerprint());
    carry_ = scheme_.initialCarry();
  }

  // Client c's update in round r: a fixed pseudo-random displacement.
  static std::vector<float> updateOf(const ParamLayout& l, uint64_t c, uint64_t r) {
    return testing::randomVector(l.numel(), 100 * r + c, 0.05 + 0.01 * static_cast<double>(c));
  }

  RoundResult runRound(uint64_t r) {
    sent_.clear();
    broadcasts_.clear();
    auto round = scheme_.begin(r, carry_);
    for (;;) {
      const PhaseBroadcast& b = round->broadcast();
      broadcasts_.push_back(b);
      std::vector<std::unique_ptr<PhaseAggregator>> edges;
      for (size_t e = 0; e < edges_; ++e) edges.push_back(scheme_.phaseAggregator(b));
      for (uint64_t c = 0; c < states_.size(); ++c) {
        Update u;
        u.header = {layout_->fingerprint(), r, b.phase, c, 10 + 3 * c};
        const auto upd = b.phase == 0 ? updateOf(*layout_, c, r) : std::vector<float>{};
        u.tensors =
            scheme_.compressor().compressWithFeedback(*layout_, upd, states_[c], b.context(c));
        if (b.phase == 0) u.metrics = {{"train_loss", static_cast<double>(c)}};
        const auto bytes = protocol::encodeUpdate(u);
        const UpdateView& v = decoder_.decodeUpdate(bytes);
        if (edges_ == 0)
          round->current().add(v);
        else
          edges[c % edges_]->add(v);
        sent_.push_back(
            {b.phase, c, static_cast<double>(u.header.num_examples), std::move(u), b.shared});
      }
      for (size_t e = 0; e < edges_; ++e) {
        const auto bytes = protocol::encodePartial(edges[e]->partial().exportDense());
        round->current().merge(decoder_.decodePartial(bytes), e);
      }
      if (round->lastPhase()) break;
      round->nextPhase();
    }
    RoundResult res = round->finish();
    carry_ = res.next;
    return res;
  }

  const RoundScheme& scheme() const { return scheme_; }
  const std::vector<Sent>& sent() const { return sent_; }
  const std::vector<PhaseBroadcast>& broadcasts() const { return broadcasts_; }

 private:
  std::shared_ptr<const ParamLayout> layout_;
  RoundScheme scheme_;
  size_t edges_;
  protocol::Decoder decoder_;
  std::vector<ClientState> states_;
  RoundCarry carry_;
  std::vector<Sent> sent_;
  std::vector<PhaseBroadcast> broadcasts_;
};

RoundSchemeOptions options(const std::string& compressor, const std::string& rule = "fedavg") {
  RoundSchemeOptions o;
  o.compressor = compressor;
  o.rule = rule;
  o.run_seed = 17;
  return o;
}

std::vector<std::string> everyCompressor() {
  std::vector<std::string> specs;
  for (const auto& e : compressors().entries()) specs.push_back(e.name);
  specs.push_back("powersgd:mode=local");
  specs.push_back("acpsgd:rank=2");
  return specs;
}

// Reference: the weighted mean over clients of what each sent that belongs to the update,
// densified with the factors its phase shared (in double).
std::vector<double> referenceDelta(const ParamLayout& l, const Compressor& comp,
                                   const std::vector<Sent>& sent) {
  std::vector<double> delta(l.numel(), 0.0);
  std::map<uint32_t, double> phase_weight;
  for (const auto& s : sent) phase_weight[s.phase] += s.weight;
  std::vector<float> dense(l.numel());
  for (const auto& s : sent) {
    std::vector<Payload> parts = s.update.tensors;
    if (!comp.factorsAreUpdate(s.phase))
      for (auto& p : parts)
        if (auto* lr = std::get_if<LowRank>(&p); lr && (lr->p.empty() != lr->q.empty()))
          p = Sparse{};
    densifyUpdate(l, parts, dense, s.shared.get());
    for (size_t i = 0; i < dense.size(); ++i)
      delta[i] += s.weight * dense[i] / phase_weight[s.phase];
  }
  return delta;
}

double maxDiff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

double maxFactorDiff(const SharedFactors& a, const SharedFactors& b) {
  REQUIRE(a.factors.size() == b.factors.size());
  double m = 0;
  for (size_t t = 0; t < a.factors.size(); ++t) {
    REQUIRE(a.factors[t].size() == b.factors[t].size());
    for (size_t i = 0; i < a.factors[t].size(); ++i)
      m = std::max(m, std::fabs(double(a.factors[t][i]) - b.factors[t][i]));
  }
  return m;
}

// sum_i w_i F_i over the one-factor payloads of `phase`, per tensor.
std::vector<std::vector<double>> factorSums(const ParamLayout& l, const std::vector<Sent>& sent,
                                            uint32_t phase, double* total) {
  std::vector<std::vector<double>> sums(l.size());
  *total = 0;
  for (const auto& s : sent) {
    if (s.phase != phase) continue;
    *total += s.weight;
    for (size_t t = 0; t < l.size(); ++t) {
      const auto* lr = std::get_if<LowRank>(&s.update.tensors[t]);
      if (!lr || lr->p.empty() == lr->q.empty()) continue;
      const auto& f = lr->p.empty() ? lr->q : lr->p;
      sums[t].resize(f.size());
      for (size_t i = 0; i < f.size(); ++i) sums[t][i] += s.weight * f[i];
    }
  }
  return sums;
}

}  // namespace

TEST_CASE("every compressor runs through the generic loop, two-level equals flat",
          "[aggregation][integration]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  for (const auto& spec : everyCompressor()) {
    INFO(spec);
    Federation flat(layout, options(spec), 7, 0), tree(layout, options(spec), 7, 3);
    for (uint64_t r = 1; r <= 3; ++r) {
      INFO("round " << r);
      const RoundResult rf = flat.runRound(r), rt = tree.runRound(r);
      // The aggregate is the weighted mean of what the clients sent (the independent reference).
      CHECK(maxDiff(rf.delta, referenceDelta(*layout, flat.scheme().compressor(), flat.sent())) <
            1e-5);
      // Hierarchy == flat, round after round (client states and carries evolve identically).
      CHECK(testing::maxAbsDiff(rf.delta, rt.delta) < 1e-5);
      CHECK(rf.count == rt.count);
      CHECK(rf.total_weight == rt.total_weight);
      CHECK(rf.metrics.at("train_loss") == Approx(rt.metrics.at("train_loss")));
      CHECK(maxFactorDiff(rf.next.shared, rt.next.shared) < 1e-4);
      CHECK(rf.rejected == 0);
      CHECK(rt.rejected == 0);
    }
  }
}

TEST_CASE("ACP-SGD alternates its shared side and carries the orthogonalized factor sum",
          "[aggregation]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  Federation f(layout, options("acpsgd:rank=2"), 5, 0);
  SharedFactors::Side expect = SharedFactors::Side::kQ;
  REQUIRE(f.scheme().phases() == 1);
  for (uint64_t r = 1; r <= 4; ++r) {
    const RoundResult res = f.runRound(r);
    REQUIRE(f.broadcasts().size() == 1);
    REQUIRE(f.broadcasts()[0].shared != nullptr);
    CHECK(f.broadcasts()[0].shared->fixed == expect);  // round r shares what round r-1 produced
    expect = expect == SharedFactors::Side::kQ ? SharedFactors::Side::kP : SharedFactors::Side::kQ;
    CHECK(res.next.shared.fixed == expect);
    // next = orth(sum_i w_i F_i), recomputed here from the payloads in double.
    double total = 0;
    const auto sums = factorSums(*layout, f.sent(), 0, &total);
    for (size_t t = 0; t < layout->size(); ++t) {
      if (sums[t].empty()) {
        CHECK(res.next.shared.factors[t].empty());
        continue;
      }
      std::vector<float> ref(sums[t].begin(), sums[t].end());
      const size_t dim = res.next.shared.fixed == SharedFactors::Side::kP ? (*layout)[t].rows()
                                                                          : (*layout)[t].cols();
      orthogonalize(ref.data(), dim, ref.size() / dim);
      CHECK(testing::maxAbsDiff(ref, res.next.shared.factors[t]) < 1e-4);
    }
  }
}

TEST_CASE(
    "two-phase PowerSGD: P-hat from phase P, the orthonormalized mean Q carried to the next round",
    "[aggregation]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  Federation f(layout, options("powersgd:rank=2"), 5, 0);
  REQUIRE(f.scheme().phases() == 2);
  std::shared_ptr<const SharedFactors> previous_next;
  for (uint64_t r = 1; r <= 3; ++r) {
    const RoundResult res = f.runRound(r);
    REQUIRE(f.broadcasts().size() == 2);
    const auto& q = *f.broadcasts()[0].shared;
    const auto& p_hat = *f.broadcasts()[1].shared;
    CHECK(q.fixed == SharedFactors::Side::kQ);
    CHECK(p_hat.fixed == SharedFactors::Side::kP);
    if (previous_next)
      CHECK(maxFactorDiff(q, *previous_next) == 0.0);  // the carry is what phase 0 shares
    double w0 = 0, w1 = 0;
    const auto p_sums = factorSums(*layout, f.sent(), 0, &w0);
    const auto q_sums = factorSums(*layout, f.sent(), 1, &w1);
    for (size_t t = 0; t < layout->size(); ++t) {
      if (p_sums[t].empty()) continue;
      std::vector<float> ref(p_sums[t].begin(), p_sums[t].end());
      orthogonalize(ref.data(), (*layout)[t].rows(), ref.size() / (*layout)[t].rows());
      CHECK(testing::maxAbsDiff(ref, p_hat.factors[t]) < 1e-4);
      std::vector<float> mean_q(q_sums[t].size());
      for (size_t i = 0; i < mean_q.size(); ++i) mean_q[i] = static_cast<float>(q_sums[t][i] / w1);
      orthogonalize(mean_q.data(), (*layout)[t].cols(), mean_q.size() / (*layout)[t].cols());
      CHECK(testing::maxAbsDiff(mean_q, res.next.shared.factors[t]) < 1e-4);
    }
    previous_next = std::make_shared<const SharedFactors>(res.next.shared);
  }
}

TEST_CASE("two-phase PowerSGD equals the dense PowerSGD step computed directly", "[aggregation]") {
  // One round, residuals zero: M_i = update_i; P-hat = orth(sum_i w_i M_i Q); the factored
  // tensors' delta = P-hat (sum_i w_i M_i^T P-hat)^T / W; dense tensors average exactly.
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  Federation f(layout, options("powersgd:rank=2"), 4, 0);
  const RoundResult res = f.runRound(1);
  const SharedFactors q0 = f.scheme().compressor().initialShared(*layout, 17);
  using Mat = Eigen::MatrixXd;
  double W = 0;
  for (uint64_t c = 0; c < 4; ++c) W += 10 + 3 * c;
  for (size_t t = 0; t < layout->size(); ++t) {
    const TensorSpec& spec = (*layout)[t];
    const auto R = static_cast<Eigen::Index>(spec.rows()),
               C = static_cast<Eigen::Index>(spec.cols());
    std::vector<Mat> m;
    for (uint64_t c = 0; c < 4; ++c) {
      const auto u = Federation::updateOf(*layout, c, 1);
      m.push_back(layout->matrix(std::span<const float>(u), t).cast<double>());
    }
    Mat expect = Mat::Zero(R, C);
    if (q0.factors[t].empty()) {
      for (uint64_t c = 0; c < 4; ++c) expect += (10.0 + 3 * c) / W * m[c];
    } else {
      const auto r = static_cast<Eigen::Index>(q0.factors[t].size()) / C;
      const Mat q = Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>>(
                        q0.factors[t].data(), C, r)
                        .cast<double>();
      Mat p = Mat::Zero(R, r);
      for (uint64_t c = 0; c < 4; ++c) p += (10.0 + 3 * c) * m[c] * q;
      const Mat p_hat = Eigen::HouseholderQR<Mat>(p).householderQ() * Mat::Identity(R, r);
      Mat qsum = Mat::Zero(C, r);
      for (uint64_t c = 0; c < 4; ++c) qsum += (10.0 + 3 * c) * m[c].transpose() * p_hat;
      expect = p_hat * qsum.transpose() / W;  // invariant to the columns' signs
    }
    const Mat got = layout->matrix(std::span<const float>(res.delta), t).cast<double>();
    INFO(spec.name);
    CHECK((got - expect).cwiseAbs().maxCoeff() < 1e-5);
  }
}

TEST_CASE("robust rules and clipping work on sparse and low-rank updates", "[aggregation]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  for (const char* spec : {"topk:density=0.1", "acpsgd:rank=2", "powersgd:rank=2", "qsgd"}) {
    for (const char* rule : {"median", "trimmed_mean:beta=0.2", "krum:f=1", "multikrum:f=1,m=3",
                             "bulyan:f=1", "fedavg:clip=0.5", "median:clip=0.5"}) {
      INFO(spec << " with " << rule);
      Federation f(layout, options(spec, rule), 7, 0);
      const RoundResult res = f.runRound(1);
      // Reference: each client's whole update densified (clipped), then the rule, in the test.
      std::map<uint64_t, std::vector<float>> dense;
      std::map<uint64_t, double> weight;
      for (const auto& s : f.sent()) {
        std::vector<Payload> parts = s.update.tensors;
        if (!f.scheme().compressor().factorsAreUpdate(s.phase))
          for (auto& p : parts)
            if (auto* lr = std::get_if<LowRank>(&p); lr && (lr->p.empty() != lr->q.empty()))
              p = Sparse{};
        auto d = testing::densify(*layout, parts, s.shared.get());
        // Clipping is per phase, on everything the phase sent (the norm the round bounds).
        const auto all = testing::densify(*layout, s.update.tensors, s.shared.get());
        const double norm = testing::norm2(all), c = f.scheme().rule().clipNorm();
        if (c > 0 && norm > c)
          for (auto& x : d) x = static_cast<float>(x * (c / norm));
        auto& acc = dense[s.client];
        if (acc.empty()) acc.assign(d.size(), 0.0f);
        for (size_t i = 0; i < d.size(); ++i) acc[i] += d[i];
        weight[s.client] = s.weight;
      }
      DenseUpdates u;
      std::vector<double> w;
      for (auto& [id, d] : dense) {
        u.push_back(d);
        w.push_back(weight[id]);
      }
      std::vector<float> expect;
      if (f.scheme().rule().streaming()) {
        expect.assign(layout->numel(), 0.0f);
        double total = 0;
        for (double x : w) total += x;
        for (size_t i = 0; i < u.size(); ++i)
          for (size_t j = 0; j < expect.size(); ++j)
            expect[j] += static_cast<float>(w[i] / total) * u[i][j];
      } else {
        expect = f.scheme().rule().combine(u, w);
      }
      CHECK(testing::maxAbsDiff(res.delta, expect) < 1e-5);
      CHECK(testing::norm2(res.delta) > 0);
    }
  }
}

TEST_CASE("robust rules refuse to run below the root", "[aggregation]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  const RoundScheme scheme(layout, options("topk", "median"));
  auto round = scheme.begin(1, scheme.initialCarry());
  CHECK_THROWS_WITH(scheme.phaseAggregator(round->broadcast()),
                    Catch::Contains("needs every update at the root"));
  PartialMessage m;
  CHECK_THROWS_WITH(round->current().merge(view(m), 1),
                    Catch::Contains("cannot merge partial aggregates"));
}

TEST_CASE("Flower differences: zero-example updates where weights are ignored", "[aggregation]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  auto zero = [&](const RoundScheme& s, uint64_t client) {
    Update u;
    u.header = {layout->fingerprint(), 1, 0, client, 0};
    for (const auto& t : layout->tensors())
      u.tensors.push_back(DenseF32{std::vector<float>(t.numel, 0.01f)});
    (void)s;
    return u;
  };
  for (const char* rule : {"median", "trimmed_mean", "krum", "bulyan", "fedavg:weight=uniform",
                           "multikrum:weight=uniform"}) {
    const RoundScheme s(layout, options("none", rule));
    auto round = s.begin(1, s.initialCarry());
    INFO(rule);
    CHECK_NOTHROW(round->current().add(view(zero(s, 1))));
  }
  for (const char* rule : {"fedavg", "multikrum"}) {
    const RoundScheme s(layout, options("none", rule));
    auto round = s.begin(1, s.initialCarry());
    INFO(rule);
    CHECK(testing::codeOf([&] { round->current().add(view(zero(s, 1))); }) == Errc::kBadWeight);
    CHECK(round->current().rejected(Errc::kBadWeight) == 1);
  }
}

TEST_CASE("the round carry survives a checkpoint", "[aggregation]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  Federation f(layout, options("acpsgd:rank=2"), 3, 0);
  const RoundCarry c = f.runRound(1).next;
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  c.save(w);
  ByteReader r(bytes, "carry");
  const RoundCarry back = RoundCarry::load(r, *layout);
  CHECK(r.done());
  CHECK(back.shared.fixed == c.shared.fixed);
  CHECK(back.shared.factors == c.shared.factors);
  ParamLayout other;
  other.add("x", {3});
  ByteReader r2(bytes, "carry");
  CHECK_THROWS_AS(RoundCarry::load(r2, other), IoError);
  bytes.resize(bytes.size() - 1);
  ByteReader r3(bytes, "carry");
  CHECK_THROWS_AS(RoundCarry::load(r3, *layout), IoError);
}

TEST_CASE("round scheme configuration is checked", "[aggregation]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  CHECK_THROWS_WITH(RoundScheme(layout, options("zip")),
                    Catch::Contains("unknown compressor 'zip'"));
  CHECK_THROWS_WITH(RoundScheme(layout, options("none", "mean")),
                    Catch::Contains("unknown aggregation rule 'mean'"));
  CHECK_THROWS_WITH(RoundScheme(layout, options("none", "fedavg:clip=-1")),
                    Catch::Contains("clip must be >= 0"));
  RoundSchemeOptions o = options("none");
  o.bounds.max_abs_value = 1e30;
  CHECK_THROWS_WITH(RoundScheme(layout, o), Catch::Contains("exceeds 1e30"));
  o = options("none");
  o.bounds.max_update_norm = std::nan("");
  CHECK_THROWS_WITH(RoundScheme(layout, o), Catch::Contains("max_update_norm must be finite"));
  o = options("none");
  o.metrics = {"loss", "loss"};
  CHECK_THROWS_WITH(RoundScheme(layout, o), Catch::Contains("declared twice"));
  const RoundScheme s(layout, options("powersgd"));
  auto round = s.begin(1, s.initialCarry());
  CHECK_THROWS_WITH(round->finish(), Catch::Contains("finish() in phase 0 of 2"));
  CHECK_THROWS_WITH(round->nextPhase(), Catch::Contains("no update arrived"));
}

TEST_CASE("completion policy counts results against failures", "[aggregation]") {
  CompletionPolicy p;
  CHECK(decideRound(p, 1, 100).apply);
  CHECK_FALSE(decideRound(p, 0, 0).apply);
  p.min_results = 3;
  p.min_completion_rate = 0.75;
  CHECK(decideRound(p, 3, 1).apply);
  const auto d = decideRound(p, 3, 2);
  CHECK_FALSE(d.apply);
  CHECK_THAT(d.reason, Catch::Contains("completion rate 0.6"));
  CHECK_THAT(decideRound(p, 2, 0).reason, Catch::Contains("at least 3 required"));
  p.min_completion_rate = 1.5;
  CHECK_THROWS_AS(decideRound(p, 1, 0), ConfigError);
}

TEST_CASE("PowerSGD's carried Q cannot grow until honest phase-P factors exceed the bounds",
          "[aggregation]") {
  // Correlated updates of about 1 per entry: an unnormalized mean Q grew round after round until
  // honest phase-P factors (P_i = M_i Q) broke the value bound and every later round stalled.
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  RoundSchemeOptions o = options("powersgd:rank=2");
  const RoundScheme scheme(layout, o);
  std::vector<ClientState> states;
  for (int c = 0; c < 5; ++c) states.emplace_back(layout->fingerprint());
  RoundCarry carry = scheme.initialCarry();
  for (uint64_t r = 1; r <= 12; ++r) {
    auto round = scheme.begin(r, carry);
    for (;;) {
      const PhaseBroadcast& b = round->broadcast();
      for (uint64_t c = 0; c < 5; ++c) {
        std::vector<float> u;
        if (b.phase == 0) u.assign(layout->numel(), 1.0f + 0.01f * static_cast<float>(c));
        Update up;
        up.header = {layout->fingerprint(), r, b.phase, c, 20};
        up.tensors = scheme.compressor().compressWithFeedback(*layout, u, states[c], b.context(c));
        INFO("round " << r << " phase " << b.phase << " client " << c);
        CHECK_NOTHROW(round->current().add(view(up)));
      }
      if (round->lastPhase()) break;
      round->nextPhase();
    }
    carry = round->finish().next;
    for (const auto& f : carry.shared.factors)
      for (float x : f) CHECK(std::fabs(x) <= 1.0f + 1e-5f);  // orthonormal columns
  }
}

TEST_CASE("a round checks the carry it starts from", "[aggregation]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  Federation acp(layout, options("acpsgd:rank=2"), 3, 0);
  const RoundCarry c = acp.runRound(1).next;
  const RoundScheme none(layout, options("none"));
  CHECK_THROWS_WITH(none.begin(2, c), Catch::Contains("shares none"));
  const RoundScheme other_rank(layout, options("acpsgd:rank=4"));
  CHECK_THROWS_WITH(other_rank.begin(2, c), Catch::Contains("floats"));
  RoundCarry bad = c;
  for (auto& f : bad.shared.factors)
    if (!f.empty()) f[0] = NAN;
  const RoundScheme same(layout, options("acpsgd:rank=2"));
  CHECK_THROWS_WITH(same.begin(2, bad), Catch::Contains("not finite"));
  CHECK_NOTHROW(same.begin(2, c));
  CHECK_THROWS_WITH(same.begin(2, RoundCarry{}), Catch::Contains("no shared factors"));
}

TEST_CASE("an edge aggregator admits to phase Q only the clients it took in phase P",
          "[aggregation]") {
  const auto layout = std::make_shared<const ParamLayout>(testing::smallCnnLayout());
  const RoundScheme scheme(layout, options("powersgd:rank=2"));
  auto round = scheme.begin(1, scheme.initialCarry());
  auto p_edge = scheme.phaseAggregator(round->broadcast());
  std::vector<ClientState> states;
  for (uint64_t c = 0; c < 3; ++c) {
    states.emplace_back(layout->fingerprint());
    Update u;
    u.header = {layout->fingerprint(), 1, 0, c, 10};
    u.tensors = scheme.compressor().compressWithFeedback(
        *layout, testing::randomVector(layout->numel(), c, 0.1), states[c],
        round->broadcast().context(c));
    if (c < 2) p_edge->add(view(u));  // client 2 trains phase P but its update never arrives
  }
  round->current().merge(view(p_edge->partial().exportDense()), 1);
  round->nextPhase();
  auto q_edge = scheme.phaseAggregator(round->broadcast(), p_edge.get());
  for (uint64_t c = 0; c < 3; ++c) {
    Update u;
    u.header = {layout->fingerprint(), 1, 1, c, 10};
    u.tensors = scheme.compressor().compressWithFeedback(*layout, {}, states[c],
                                                         round->broadcast().context(c));
    if (c < 2) {
      CHECK_NOTHROW(q_edge->add(view(u)));
    } else {
      CHECK_THROWS_AS(q_edge->add(view(u)), InputError);
      CHECK(q_edge->rejected(Errc::kWrongRound) == 1);
    }
  }
  CHECK_THROWS_WITH(scheme.phaseAggregator(round->broadcast(), q_edge.get()),
                    Catch::Contains("not of the phase before"));
}

namespace {

// A dense update of `values` from `client` for round `round`, with `metrics`.
compression::Update denseUpdate(const ParamLayout& l, uint64_t client, uint64_t round,
                                const std::vector<float>& values, std::vector<Metric> metrics) {
  compression::Update u;
  u.header = {l.fingerprint(), round, 0, client, 10};
  for (size_t t = 0; t < l.size(); ++t) {
    const auto s = l.slice(std::span<const float>(values), t);
    u.tensors.push_back(compression::DenseF32{{s.begin(), s.end()}});
  }
  u.metrics = std::move(metrics);
  return u;
}

}  // namespace

TEST_CASE(
    "adaptive clipping's indicator: the aggregator counts the updates within the round's clip "
    "itself, and refuses a client that sends the count",
    "[aggregation][dp]") {
  auto l = std::make_shared<ParamLayout>();
  l->add("w", {4});
  RoundSchemeOptions o;
  o.rule = "fedavg:weight=uniform,clip=1";
  o.clip_indicator = "within";
  const RoundScheme scheme(l, o);
  // Norms 0.5, 1.5 and 3: with the rule's clip 1, one within; with a round clip of 2, two.
  const std::vector<std::vector<float>> x{{0.5f, 0, 0, 0}, {0, 1.5f, 0, 0}, {0, 0, 3.0f, 0}};
  for (const auto& [clip, within] : std::vector<std::pair<double, double>>{{0, 1}, {2.0, 2}}) {
    CAPTURE(clip);
    auto round = scheme.begin(1, scheme.initialCarry());
    if (clip > 0) round->setClip(clip);
    for (uint64_t c = 0; c < 3; ++c) {
      const auto u = denseUpdate(*l, c, 1, x[c], {{"train_loss", 1.0}});
      round->current().add(compression::view(u));
    }
    // A client claiming to be within the clip through the server's own slot: refused.
    const auto liar = denseUpdate(*l, 7, 1, {0, 0, 0, 9.0f}, {{"within", 1.0}});
    try {
      round->current().add(compression::view(liar));
      FAIL("the server's own metric was taken from a client");
    } catch (const InputError& e) {
      CHECK(e.code() == Errc::kBadMetric);
    }
    const RoundResult r = round->finish();
    REQUIRE(r.count == 3);
    CHECK(r.metrics.at("within") * 3 == Approx(within));
    // The clip the round used: the third update enters scaled to it.
    const double c = clip > 0 ? clip : 1.0;
    CHECK(r.delta[2] == Approx(c / 3).epsilon(1e-6));
    CHECK(r.delta[1] == Approx(std::min(1.5, c) / 3).epsilon(1e-6));
  }
  // Not a metric clients may be asked for, and the clip set once, before any update.
  RoundSchemeOptions twice = o;
  twice.metrics = {"within"};
  CHECK_THROWS_AS(RoundScheme(l, twice), ConfigError);
  auto round = scheme.begin(2, scheme.initialCarry());
  const auto u = denseUpdate(*l, 1, 2, x[0], {});
  round->current().add(compression::view(u));
  CHECK_THROWS_AS(round->setClip(2.0), InvalidArgument);
  CHECK_THROWS_AS(scheme.begin(3, scheme.initialCarry())->setClip(0.0), InvalidArgument);
}
