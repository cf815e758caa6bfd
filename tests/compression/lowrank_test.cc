#include "compression/lowrank.h"

#include <Eigen/Dense>
#include <catch2/catch.hpp>
#include <cmath>
#include <tuple>

#include "compression/registry.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace {

ParamLayout matrixLayout(int64_t rows, int64_t cols) {
  ParamLayout l;
  l.add("w", {rows, cols});
  l.add("b", {rows});
  return l;
}

// U diag(s) V^T with random orthonormal U, V and the given singular values.
std::vector<float> matrixWithSpectrum(size_t rows, size_t cols, const std::vector<float>& s,
                                      uint64_t seed) {
  auto a = testing::randomVector(rows * s.size(), seed);
  auto b = testing::randomVector(cols * s.size(), seed + 1);
  orthogonalize(a.data(), rows, s.size());
  orthogonalize(b.data(), cols, s.size());
  Eigen::Map<RowMatrix> u(a.data(), rows, s.size()), v(b.data(), cols, s.size());
  Eigen::VectorXf sv = Eigen::Map<const Eigen::VectorXf>(s.data(), s.size());
  RowMatrix m = u * sv.asDiagonal() * v.transpose();
  return std::vector<float>(m.data(), m.data() + m.size());
}

}  // namespace

TEST_CASE("orthogonalize gives orthonormal columns (Gram-Schmidt and QR)", "[compression]") {
  for (size_t r : {1, 2, 3, 4, 8}) {
    auto m = testing::randomVector(200 * r, r);
    orthogonalize(m.data(), 200, r);
    Eigen::Map<RowMatrix> a(m.data(), 200, r);
    RowMatrix g = a.transpose() * a;
    INFO("rank " << r);
    CHECK((g - RowMatrix::Identity(r, r)).cwiseAbs().maxCoeff() < 1e-5f);
  }
  // A dependent column stays zero instead of becoming noise or NaN.
  for (size_t r : {2, 4}) {
    auto m = testing::randomVector(50 * r, 9);
    for (size_t i = 0; i < 50; ++i) m[i * r + 1] = 2 * m[i * r];
    orthogonalize(m.data(), 50, r);
    Eigen::Map<RowMatrix> a(m.data(), 50, r);
    CHECK(a.col(1).norm() < 1e-3f);
    CHECK(a.col(0).norm() == Approx(1.0f).epsilon(1e-5));
    CHECK(a.allFinite());
  }
}

TEST_CASE("halvingSum adds in its fixed tree, in double", "[compression]") {
  CHECK(halvingSum(nullptr, 0) == 0.0);
  double one[] = {-2.5};
  CHECK(halvingSum(one, 1) == -2.5);
  // 2^53 + 1 rounds back to 2^53 (ties to even), so the order decides: in sequence
  // ((2^53 + 1) - 2^53) + 1 + 1 = 2; the tree pairs x0 with x2 and x1 with x3 first:
  // ((2^53 - 2^53) + (1 + 1)) + 1 = 3.
  const double big = std::ldexp(1.0, 53);
  double x[] = {big, 1, -big, 1, 1};
  CHECK(halvingSum(x, 5) == 3.0);
  // Six: x0 + x3 = 1 - 2^53 (exact), x1 + x4 = 2^53 + 1 -> 2^53, x2 + x5 = 2; then
  // (1 - 2^53) + 2^53 = 1, and 1 + 2 = 3 (in sequence: 1 + 2^53 -> 2^53, then 2^53 + 1 -> 2^53,
  // - 2^53 -> 0, then 2).
  double y[] = {1, big, 1, -big, 1, 1};
  CHECK(halvingSum(y, 6) == 3.0);
}

TEST_CASE("the low-rank products round each entry of the tree's exact terms once",
          "[compression]") {
  const double big = std::ldexp(1.0, 53);
  const auto b = static_cast<float>(big);
  {
    // P = M Q's 34 terms along a row interleave over 32 lanes: lane 0 = (1 + 2^53) -> 2^53 (ties
    // to even), lane 1 = -2^53, lane 2 = 1; halvingSum pairs lanes 0 and 2 (2^53 + 1 -> 2^53), then
    // 2^53 - 2^53 = 0. In index order the sum would be 2 (1 - 2^53 + 1 + 2^53).
    std::vector<float> row(34, 0.0f), ones(34, 1.0f), p(1);
    row[0] = 1;
    row[32] = b;
    row[1] = -b;
    row[2] = 1;
    factorProduct(row, 1, 34, ones, 1, p);
    CHECK(p[0] == 0.0f);
    // Q = M^T P's 34 terms down a column run in lanes of ceil(34 / 32) = 2: lane 0 = (1 + 2^53)
    // -> 2^53, lane 1 = -2^53 + 0, lane 2 = 1 + 0; the same lanes, 0. In index order: 1.
    std::vector<float> col(34, 0.0f);
    col[0] = 1;
    col[1] = b;
    col[2] = -b;
    col[4] = 1;
    transposedFactorProduct(col, 34, 1, ones, 1, p);
    CHECK(p[0] == 0.0f);
    // The residual's r terms by halvingSum: 0 - (2^53 + 1 - 2^53 + 1 + 1) = -3 (see above).
    const std::vector<float> m = {b, 1, -b, 1, 1};
    std::vector<float> zero = {0.0f};
    subtractFactorProduct(zero, 1, 1, m, std::span<const float>(ones).first(5), 5);
    CHECK(zero[0] == -3.0f);
    // The residual's subtraction is in double, rounded once: 1 - (1 - 2^-23)(1 + 2^-23) is 2^-46;
    // in float the product would round to 1 and leave 0.
    std::vector<float> one = {1.0f};
    const std::vector<float> lo = {1.0f - std::ldexp(1.0f, -23)},
                             hi = {1.0f + std::ldexp(1.0f, -23)};
    subtractFactorProduct(one, 1, 1, lo, hi, 1);
    CHECK(one[0] == std::ldexp(1.0f, -46));  // 1 - (1 - 2^-23)(1 + 2^-23) = 2^-46
  }
  // Random matrices: within float rounding of a long double reference, and sizes checked.
  for (const auto& [rows, cols, r] : {std::tuple<size_t, size_t, size_t>{3, 7, 2},
                                      {64, 33, 4},
                                      {5, 300, 3},
                                      {700, 9, 1},
                                      {40, 50, 8},
                                      {20, 70, 5}}) {
    INFO(rows << " x " << cols << ", rank " << r);
    const auto m = testing::randomVector(rows * cols, rows),
               qf = testing::randomVector(cols * r, cols), pf = testing::randomVector(rows * r, r);
    std::vector<float> p(rows * r), q(cols * r), res = m;
    factorProduct(m, rows, cols, qf, r, p);
    transposedFactorProduct(m, rows, cols, pf, r, q);
    subtractFactorProduct(res, rows, cols, pf, qf, r);
    // |got - (start + sum of n terms)| within float rounding of start's and the terms' magnitudes.
    const auto near = [](float got, long double start, size_t n, const auto& term) {
      long double want = start, scale = std::fabs(start);
      for (size_t k = 0; k < n; ++k) {
        want += term(k);
        scale += std::fabs(term(k));
      }
      return std::fabs(got - want) <= 1e-7L * scale + 1e-30L;
    };
    const auto mul = [](float x, float y) { return static_cast<long double>(x) * y; };
    for (size_t i = 0; i < rows; ++i)
      for (size_t c = 0; c < r; ++c)
        CHECK(near(p[i * r + c], 0, cols,
                   [&](size_t k) { return mul(m[i * cols + k], qf[k * r + c]); }));
    for (size_t j = 0; j < cols; ++j)
      for (size_t c = 0; c < r; ++c)
        CHECK(near(q[j * r + c], 0, rows,
                   [&](size_t i) { return mul(m[i * cols + j], pf[i * r + c]); }));
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j)
        CHECK(near(res[i * cols + j], m[i * cols + j], r,
                   [&](size_t c) { return -mul(pf[i * r + c], qf[j * r + c]); }));
    std::vector<float> short_p(rows * r - 1);
    CHECK_THROWS_AS(factorProduct(m, rows, cols, qf, r, short_p), InvalidArgument);
    CHECK_THROWS_AS(transposedFactorProduct(m, rows, cols, pf, r, short_p), InvalidArgument);
    CHECK_THROWS_AS(subtractFactorProduct(res, rows, cols, short_p, qf, r), InvalidArgument);
  }
}

TEST_CASE("powersgd recovers an exactly rank-r matrix", "[compression]") {
  for (uint32_t r : {1u, 2u, 4u}) {
    const ParamLayout layout = matrixLayout(96, 80);
    std::vector<float> update(layout.numel(), 0.0f);
    auto m = matrixWithSpectrum(96, 80, std::vector<float>(r, 3.0f), 100 + r);
    std::copy(m.begin(), m.end(), update.begin());
    auto c = makeCompressor("powersgd:mode=local,rank=" + std::to_string(r));
    ClientState st = ClientState(layout.fingerprint());
    auto p = c->compressWithFeedback(layout, update, st, RoundContext{5, 0, 0, 1});
    REQUIRE(std::holds_alternative<LowRank>(p[0]));
    REQUIRE(std::holds_alternative<DenseF32>(p[1]));  // 1-D tensors go dense
    auto back = testing::densify(layout, p);
    INFO("rank " << r);
    CHECK(testing::maxAbsDiff(back, update) < 1e-4);
    CHECK(testing::norm2(testing::residualOf(st, layout.numel())) < 1e-3);
    const auto& lr = std::get<LowRank>(p[0]);
    Eigen::Map<const RowMatrix> pm(lr.p.data(), 96, r);
    CHECK((pm.transpose() * pm - RowMatrix::Identity(r, r)).cwiseAbs().maxCoeff() < 1e-5f);
  }
}

TEST_CASE("powersgd power iteration converges under warm start", "[compression]") {
  const ParamLayout layout = matrixLayout(120, 100);
  const std::vector<float> spectrum = {10, 6, 3, 1, 0.5f, 0.25f};
  std::vector<float> update(layout.numel(), 0.0f);
  auto m = matrixWithSpectrum(120, 100, spectrum, 7);
  std::copy(m.begin(), m.end(), update.begin());
  const double optimal = std::sqrt(1.0 + 0.25 + 0.0625);  // best rank-3 error: tail of the spectrum
  auto c = makeCompressor("powersgd:rank=3,ef=false,mode=local");
  ClientState st = ClientState(layout.fingerprint());
  double first = 0, last = 0;
  for (int it = 0; it < 40; ++it) {
    auto back = testing::densify(
        layout, c->compressWithFeedback(layout, update, st,
                                        RoundContext{1, static_cast<uint64_t>(it), 0, 1}));
    for (size_t i = 0; i < back.size(); ++i) back[i] -= update[i];
    const double err = testing::norm2(back);
    if (it == 0) first = err;
    last = err;
  }
  CHECK(last <= optimal * 1.001);
  CHECK(first > last);
  // Without warm start every round restarts from the same seeded Q: no progress.
  auto cold = makeCompressor("powersgd:rank=3,ef=false,mode=local,warm_start=false");
  ClientState cs = ClientState(layout.fingerprint());
  std::vector<float> b1, b2;
  b1 = testing::densify(layout,
                        cold->compressWithFeedback(layout, update, cs, RoundContext{1, 0, 0, 1}));
  b2 = testing::densify(layout,
                        cold->compressWithFeedback(layout, update, cs, RoundContext{1, 1, 0, 1}));
  CHECK(b1 == b2);
}

TEST_CASE("local powersgd error feedback invariant", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  auto c = makeCompressor("powersgd:rank=2,mode=local");
  ClientState st = ClientState(layout.fingerprint());
  for (uint64_t round = 0; round < 3; ++round) {
    auto u = testing::randomVector(layout.numel(), round);
    const auto old = testing::residualOf(st, layout.numel());
    std::vector<float> expect(u.size());
    for (size_t i = 0; i < u.size(); ++i) expect[i] = u[i] + old[i];
    auto sent = testing::densify(
        layout, c->compressWithFeedback(layout, u, st, RoundContext{1, round, 0, 1}));
    const auto res = testing::residualOf(st, layout.numel());
    for (size_t i = 0; i < sent.size(); ++i) sent[i] += res[i];
    CHECK(testing::maxAbsDiff(sent, expect) < 1e-4);
  }
}

TEST_CASE("only matrices that compress enough are low-rank", "[compression]") {
  ParamLayout l;
  l.add("big", {64, 64});  // (64+64)*4*2 = 1024 < 4096
  l.add("thin", {4, 64});  // r=4: (68)*4*2 = 544 > 256
  l.add("vec", {1000});
  l.add("conv", {16, 3, 3, 3});  // 16 x 27: (43)*4*2 = 344 < 432
  CHECK(lowRankCompressible(l[0], 4, 2.0));
  CHECK_FALSE(lowRankCompressible(l[1], 4, 2.0));
  CHECK_FALSE(lowRankCompressible(l[2], 4, 2.0));
  CHECK(lowRankCompressible(l[3], 4, 2.0));
  CHECK_FALSE(lowRankCompressible(l[3], 4, 4.0));
  auto shared = initialSharedFactors(l, LowRankOptions{}, 1);
  CHECK(shared.factors[0].size() == 64 * 4);
  CHECK(shared.factors[1].empty());
  CHECK(shared.factors[2].empty());
  CHECK(shared.factors[3].size() == 27 * 4);
}

TEST_CASE("acpsgd sends one factor against the shared one and with error feedback",
          "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  LowRankOptions o;
  o.rank = 2;
  auto c = makeCompressor("acpsgd:rank=2");
  const SharedFactors q0 = initialSharedFactors(layout, o, 77);
  // Identical seeded factors wherever they are made.
  CHECK(initialSharedFactors(layout, o, 77).factors == q0.factors);
  CHECK(initialSharedFactors(layout, o, 78).factors != q0.factors);

  ClientState st = ClientState(layout.fingerprint());
  auto u = testing::randomVector(layout.numel(), 5);
  auto p = c->compressWithFeedback(layout, u, st, RoundContext{77, 0, 0, 1, &q0});
  const size_t fc1 = *layout.find("fc1.weight");
  const auto& lr = std::get<LowRank>(p[fc1]);
  CHECK(lr.q.empty());
  CHECK(lr.p.size() == 64 * 2);
  // P = M Q-hat, exactly
  auto m = layout.matrix(std::span<const float>(u), fc1);
  Eigen::Map<const RowMatrix> q(q0.factors[fc1].data(), 256, 2);
  RowMatrix want = m * q;
  CHECK((Eigen::Map<const RowMatrix>(lr.p.data(), 64, 2) - want).cwiseAbs().maxCoeff() < 1e-4f);
  // EF invariant with the shared factor expanding the one-factor payload.
  auto sent = testing::densify(layout, p, &q0);
  const auto res = testing::residualOf(st, layout.numel());
  for (size_t i = 0; i < sent.size(); ++i) sent[i] += res[i];
  CHECK(testing::maxAbsDiff(sent, u) < 1e-4);

  // The other side: fixed P.
  SharedFactors p0;
  p0.fixed = SharedFactors::Side::kP;
  p0.factors.resize(layout.size());
  for (size_t t = 0; t < layout.size(); ++t)
    if (!q0.factors[t].empty()) {
      p0.factors[t] = testing::randomVector(layout[t].rows() * 2, t);
      orthogonalize(p0.factors[t].data(), layout[t].rows(), 2);
    }
  const auto before = res;
  auto p2 = c->compressWithFeedback(layout, u, st, RoundContext{77, 1, 0, 1, &p0});
  CHECK(std::get<LowRank>(p2[fc1]).p.empty());
  CHECK(std::get<LowRank>(p2[fc1]).q.size() == 256 * 2);
  auto sent2 = testing::densify(layout, p2, &p0);
  const auto res2 = testing::residualOf(st, layout.numel());
  for (size_t i = 0; i < sent2.size(); ++i) sent2[i] += res2[i] - before[i];
  CHECK(testing::maxAbsDiff(sent2, u) < 1e-4);
}

TEST_CASE("acpsgd refuses a round without matching shared factors", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  auto c = makeCompressor("acpsgd:rank=2");
  ClientState st = ClientState(layout.fingerprint());
  auto u = testing::randomVector(layout.numel(), 5);
  CHECK_THROWS_WITH(c->compressWithFeedback(layout, u, st, RoundContext{}),
                    Catch::Contains("no shared factors"));
  LowRankOptions o;
  o.rank = 3;
  auto wrong = initialSharedFactors(layout, o, 1);
  CHECK_THROWS_WITH(c->compressWithFeedback(layout, u, st, RoundContext{1, 0, 0, 0, &wrong}),
                    Catch::Contains("expected"));
  CHECK(st.size() == 0);  // untouched: no component was created
}

TEST_CASE("two-phase powersgd with one client equals the local form", "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  LowRankOptions o;
  o.rank = 2;
  o.two_phase = false;
  PowerSgdCompressor local_c(o);
  o.two_phase = true;
  PowerSgdCompressor c(o);
  REQUIRE(c.phases() == 2);
  REQUIRE(local_c.phases() == 1);
  const auto u = testing::randomVector(layout.numel(), 3);
  ClientState local = ClientState(layout.fingerprint());
  const auto ref = testing::densify(
      layout, local_c.compressWithFeedback(layout, u, local, RoundContext{9, 0, 0, 1}));

  ClientState st = ClientState(layout.fingerprint());
  const SharedFactors q = c.initialShared(layout, 9);
  // The local form's seeded Q is the two-phase form's initial shared Q.
  CHECK(q.factors == initialSharedFactors(layout, o, 9).factors);
  auto phase_p = c.compressWithFeedback(layout, u, st, RoundContext{9, 0, 0, 1, &q});
  CHECK_FALSE(c.factorsAreUpdate(0));
  CHECK(c.factorsAreUpdate(1));
  // P-hat by hand: the orthogonalized P of the only client.
  SharedFactors phat;
  phat.fixed = SharedFactors::Side::kP;
  phat.factors.resize(layout.size());
  std::vector<std::vector<float>> sums(layout.size());
  std::vector<float> total(layout.numel(), 0.0f);
  for (size_t t = 0; t < layout.size(); ++t) {
    if (auto* lr = std::get_if<LowRank>(&phase_p[t])) {
      CHECK(lr->q.empty());
      sums[t] = lr->p;
      phat.factors[t] = lr->p;
      orthogonalize(phat.factors[t].data(), lr->rows, lr->rank);
    } else {
      accumulatePayload(view(phase_p[t]), layout[t], layout.slice(std::span<float>(total), t),
                        1.0f);
    }
  }
  std::vector<std::span<const float>> sum_views(sums.begin(), sums.end());
  const SharedFactors next = c.nextShared(layout, RoundContext{9, 0, 0, 0, &q}, q, sum_views, 1.0);
  CHECK(next.fixed == SharedFactors::Side::kP);
  REQUIRE(next.factors.size() == layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    REQUIRE(next.factors[t].size() == phat.factors[t].size());
    CHECK(testing::maxAbsDiff(next.factors[t], phat.factors[t]) < 1e-6);
  }
  auto phase_q = c.compressWithFeedback(layout, {}, st, RoundContext{9, 0, 1, 1, &next});
  for (size_t t = 0; t < layout.size(); ++t)
    accumulatePayload(view(phase_q[t]), layout[t], layout.slice(std::span<float>(total), t), 1.0f,
                      &next, t);
  CHECK(testing::maxAbsDiff(total, ref) < 1e-4);
  CHECK(testing::maxAbsDiff(testing::residualOf(st, layout.numel()),
                            testing::residualOf(local, layout.numel())) < 1e-4);
  CHECK_THROWS_WITH(c.compressWithFeedback(layout, {}, st, RoundContext{9, 0, 1, 1, &next}),
                    Catch::Contains("without phase P"));
}

TEST_CASE("between the two PowerSGD phases a wrong call is refused and leaves the state intact",
          "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  PowerSgdCompressor c(LowRankOptions{.rank = 2,
                                      .min_compression_rate = 2.0,
                                      .ef = {.on = true},
                                      .warm_start = true,
                                      .two_phase = true});
  const SharedFactors q = c.initialShared(layout, 9);
  ClientState st = ClientState(layout.fingerprint());
  const auto u = testing::randomVector(layout.numel(), 3);
  c.compressWithFeedback(layout, u, st, RoundContext{9, 0, 0, 1, &q});
  REQUIRE(st.find<PowerSgdState>(kPowerSgdComponent)->pending_phase == 1);
  const auto between = testing::stateBytes(st);
  // Phase Q continues from the state: it takes no update.
  CHECK_THROWS_WITH(c.compressWithFeedback(layout, u, st, RoundContext{9, 0, 1, 1, &q}),
                    Catch::Contains("takes no update"));
  // Phase Q needs P-hat, not the round's Q.
  CHECK_THROWS_WITH(c.compressWithFeedback(layout, {}, st, RoundContext{9, 0, 1, 1, &q}),
                    Catch::Contains("wrong side"));
  CHECK_THROWS_WITH(c.compressWithFeedback(layout, {}, st, RoundContext{9, 0, 1, 1}),
                    Catch::Contains("needs the shared P"));
  CHECK_THROWS_WITH(c.compressWithFeedback(layout, {}, st, RoundContext{9, 0, 2, 1}),
                    Catch::Contains("does not exist"));
  CHECK(testing::stateBytes(st) == between);
  CHECK(st.find<PowerSgdState>(kPowerSgdComponent)->pending_phase == 1);
}

TEST_CASE("a two-phase client that missed phase Q carries its whole matrix into the next round",
          "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  for (bool ef : {true, false}) {
    PowerSgdCompressor c(LowRankOptions{.rank = 2,
                                        .min_compression_rate = 2.0,
                                        .ef = {.on = ef},
                                        .warm_start = true,
                                        .two_phase = true});
    const SharedFactors q = c.initialShared(layout, 4);
    ClientState st = ClientState(layout.fingerprint());
    const auto u1 = testing::randomVector(layout.numel(), 1),
               u2 = testing::randomVector(layout.numel(), 2);
    c.compressWithFeedback(layout, u1, st, RoundContext{4, 0, 0, 1, &q});
    // Phase P of the next round (the client never ran phase Q): M = u1 + u2 with EF, u2 without.
    auto p = c.compressWithFeedback(layout, u2, st, RoundContext{4, 1, 0, 1, &q});
    std::vector<float> m(layout.numel());
    for (size_t i = 0; i < m.size(); ++i) m[i] = ef ? u1[i] + u2[i] : u2[i];
    const size_t fc1 = *layout.find("fc1.weight");
    Eigen::Map<const RowMatrix> qm(q.factors[fc1].data(), 256, 2);
    const RowMatrix want = layout.matrix(std::span<const float>(m), fc1) * qm;
    INFO("ef " << ef);
    CHECK((Eigen::Map<const RowMatrix>(std::get<LowRank>(p[fc1]).p.data(), 64, 2) - want)
              .cwiseAbs()
              .maxCoeff() < 1e-4f);
    // The kept buffer holds M on low-rank tensors and nothing on the dense ones (sent whole).
    const auto kept = testing::residualOf(st, layout.numel());
    for (size_t t = 0; t < layout.size(); ++t) {
      const auto k = layout.slice(std::span<const float>(kept), t);
      const auto mt = layout.slice(std::span<const float>(m), t);
      if (std::holds_alternative<LowRank>(p[t]))
        CHECK(std::equal(k.begin(), k.end(), mt.begin()));
      else
        CHECK(std::all_of(k.begin(), k.end(), [](float x) { return x == 0.0f; }));
    }
  }
}
