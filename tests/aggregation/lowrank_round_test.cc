#include <catch2/catch.hpp>

#include <Eigen/Dense>

#include "aggregation/lowrank_round.h"
#include "compression/lowrank.h"
#include "test_util.h"

using namespace starling;
using namespace starling::aggregation;
using namespace starling::compression;
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

Update wrap(const ParamLayout& layout, std::vector<Payload> p, uint64_t client, uint64_t examples) {
  Update u;
  u.layout_fingerprint = layout.fingerprint();
  u.client_id = client;
  u.num_examples = examples;
  u.tensors = std::move(p);
  return u;
}

bool orthonormal(const std::vector<float>& f, size_t rows) {
  const size_t r = f.size() / rows;
  Eigen::Map<const RowMatrix> m(f.data(), rows, r);
  return (m.transpose() * m - RowMatrix::Identity(r, r)).cwiseAbs().maxCoeff() < 1e-4f;
}

}  // namespace

TEST_CASE("an ACP-SGD round averages in factor space and flips the shared side", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  LowRankOptions o;
  o.rank = 2;
  AcpSgdCompressor c(o);
  SharedFactors shared = initialSharedFactors(layout, o, 3);
  std::vector<ClientState> states(3, c.initialState(layout));
  for (uint64_t round = 0; round < 4; ++round) {
    const bool fixed_q = shared.fixed == SharedFactors::Side::kQ;
    CHECK(fixed_q == (round % 2 == 0));  // P, Q, P, Q ...
    AcpSgdRound acp(layout, shared);
    std::vector<float> expect(layout.numel(), 0.0f);
    double total = 0;
    for (uint64_t i = 0; i < 3; ++i) {
      auto payloads = c.compress(layout, testing::randomVector(layout.numel(), round * 10 + i), states[i],
                                 RoundContext{3, round, i, &shared});
      const double w = 1.0 + static_cast<double>(i);
      auto dense = testing::densify(layout, payloads, &shared);
      for (size_t j = 0; j < dense.size(); ++j) expect[j] += static_cast<float>(w) * dense[j];
      total += w;
      acp.add(wrap(layout, std::move(payloads), i, 1), w);
    }
    for (float& x : expect) x = static_cast<float>(x / total);
    SharedFactors next;
    const auto mean = acp.finish(&next);
    CHECK(testing::maxAbsDiff(mean, expect) < 1e-5);
    CHECK(next.fixed != shared.fixed);
    for (size_t t = 0; t < layout.size(); ++t) {
      if (shared.factors[t].empty()) {
        CHECK(next.factors[t].empty());
        continue;
      }
      const size_t rows = next.fixed == SharedFactors::Side::kP ? layout[t].rows() : layout[t].cols();
      CHECK(orthonormal(next.factors[t], rows));
    }
    shared = next;
  }
}

TEST_CASE("a PowerSGD round of several clients matches its formula", "[aggregation]") {
  const ParamLayout layout = testing::smallCnnLayout();
  LowRankOptions o;
  o.rank = 2;
  PowerSgdCompressor c(o);
  const SharedFactors q = initialSharedFactors(layout, o, 8);
  PowerSgdRound round(layout, q);
  std::vector<ClientState> states(4, c.initialState(layout));
  std::vector<std::vector<float>> inputs;
  const std::vector<double> w = {1, 2, 3, 4};
  for (uint64_t i = 0; i < 4; ++i) {
    inputs.push_back(testing::randomVector(layout.numel(), 50 + i));
    round.addPhaseP(wrap(layout, c.compressPhaseP(layout, inputs[i], states[i], RoundContext{8, 0, i, &q}), i, 1), w[i]);
  }
  CHECK_THROWS_WITH(round.addPhaseQ(Update{}, 1.0), Catch::Contains("before finishPhaseP"));
  const SharedFactors& phat = round.finishPhaseP();
  // Drop client 3 between the phases: its P shaped P-hat, its Q never arrives.
  for (uint64_t i = 0; i < 3; ++i)
    round.addPhaseQ(wrap(layout, c.compressPhaseQ(layout, states[i], RoundContext{8, 0, i, &phat}), i, 1), w[i]);
  SharedFactors next_q;
  const auto mean = round.finish(&next_q);

  const size_t fc1 = *layout.find("fc1.weight"), bias = *layout.find("fc1.bias");
  // Reference for fc1: P-hat = orth(sum_i w_i M_i Q); mean = P-hat (sum_{i<3} w_i M_i^T P-hat)^T / W_Q.
  Eigen::Map<const RowMatrix> qm(q.factors[fc1].data(), 256, 2);
  RowMatrix psum = RowMatrix::Zero(64, 2);
  for (size_t i = 0; i < 4; ++i) psum += static_cast<float>(w[i]) * (layout.matrix(std::span<const float>(inputs[i]), fc1) * qm);
  std::vector<float> ph(psum.data(), psum.data() + psum.size());
  orthogonalize(ph.data(), 64, 2);
  Eigen::Map<const RowMatrix> phm(ph.data(), 64, 2);
  RowMatrix qsum = RowMatrix::Zero(256, 2);
  for (size_t i = 0; i < 3; ++i)
    qsum += static_cast<float>(w[i]) * (layout.matrix(std::span<const float>(inputs[i]), fc1).transpose() * phm);
  RowMatrix want = phm * qsum.transpose() / 6.0f;
  auto got = layout.matrix(std::span<const float>(mean), fc1);
  CHECK((got - want).cwiseAbs().maxCoeff() < 1e-4f);
  // Dense tensors were complete in phase P, weighted over all four clients.
  for (size_t j = 0; j < 64; ++j) {
    double s = 0;
    for (size_t i = 0; i < 4; ++i) s += w[i] * inputs[i][layout[bias].offset + j];
    REQUIRE(mean[layout[bias].offset + j] == Approx(s / 10.0).margin(1e-5));
  }
  // Warm start: next Q = sum w Q / W.
  Eigen::Map<const RowMatrix> nq(next_q.factors[fc1].data(), 256, 2);
  CHECK((nq - qsum / 6.0f).cwiseAbs().maxCoeff() < 1e-4f);
  CHECK_THROWS_WITH(PowerSgdRound(layout, phat), Catch::Contains("must be Q"));
}
