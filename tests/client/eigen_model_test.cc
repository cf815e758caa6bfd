#include "client/eigen_model.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "check_throws.h"
#include "client/synthetic.h"
#include "core/aligned.h"
#include "core/error.h"
#include "core/rng.h"

using namespace starling;
using namespace starling::client;
using Catch::Matchers::Contains;

namespace {

// The models take buffers that start on 64-byte boundaries (eigen_model.h).
using Floats = AlignedVector<float>;

Floats normalVector(size_t n, double scale, uint64_t seed) {
  return testing::normalFloats(n, scale, seed, 7);
}

double meanLoss(EigenModel& m, std::span<const float> params, ConstRowMatrixMap x,
                std::span<const uint8_t> y) {
  return m.forwardBackward(params, x, y, {}).loss_sum / static_cast<double>(y.size());
}

// Central differences of the mean batch loss against the model's analytic gradient, for every
// parameter. eps = 3e-3 keeps the truncation error (~eps^2) and float rounding (~1e-7 / eps) both
// far below the tolerance.
void checkGradient(EigenModel& m, Floats params, const Floats& xs, const std::vector<uint8_t>& y) {
  const ConstRowMatrixMap x(xs.data(), static_cast<Eigen::Index>(y.size()),
                            static_cast<Eigen::Index>(m.features()));
  Floats grad(params.size(), 123.0f);  // overwritten, not accumulated
  m.forwardBackward(params, x, y, grad);
  const float eps = 3e-3f;
  for (size_t i = 0; i < params.size(); ++i) {
    const float keep = params[i];
    params[i] = keep + eps;
    const float hi = params[i];
    const double up = meanLoss(m, params, x, y);
    params[i] = keep - eps;
    const float lo = params[i];
    const double down = meanLoss(m, params, x, y);
    params[i] = keep;
    const double fd = (up - down) / (static_cast<double>(hi) - lo);
    INFO(m.spec() << " parameter " << i << ": analytic " << grad[i] << ", finite difference "
                  << fd);
    REQUIRE(std::fabs(fd - grad[i]) <= 5e-4 + 1e-2 * std::fabs(fd));
  }
}

}  // namespace

TEST_CASE("softmax regression's gradient matches finite differences", "[client]") {
  const size_t features = 5, batch = 4;
  const uint32_t classes = 3;
  auto m = makeSoftmaxModel(features, classes);
  checkGradient(*m, normalVector(m->layout().numel(), 0.5, 1),
                normalVector(batch * features, 1.0, 2), {0, 2, 1, 2});
}

TEST_CASE("the MLP's gradient matches finite differences, through live and dead ReLUs",
          "[client]") {
  const size_t features = 5, batch = 4;
  const uint32_t classes = 3, hidden = 6;
  auto m = makeMlpModel(features, classes, hidden);
  Floats params = normalVector(m->layout().numel(), 0.2, 3);
  // Hidden biases of +2 / -2 keep every pre-activation far from the ReLU's kink (|x w| ~ 0.45):
  // units 0, 2, 4 are on for every example, units 1, 3, 5 off.
  const auto& b1 = m->layout()[1];
  for (size_t j = 0; j < hidden; ++j) params[b1.offset + j] = j % 2 ? -2.0f : 2.0f;
  const Floats xs = normalVector(batch * features, 1.0, 4);
  const std::vector<uint8_t> y{1, 0, 2, 1};
  checkGradient(*m, params, xs, y);

  // A dead unit passes no gradient to its incoming weights.
  Floats grad(params.size());
  m->forwardBackward(params, ConstRowMatrixMap(xs.data(), batch, features), y, grad);
  const auto& w1 = m->layout()[0];
  for (size_t j = 1; j < hidden; j += 2)
    for (size_t f = 0; f < features; ++f) CHECK(grad[w1.offset + j * features + f] == 0.0f);
}

TEST_CASE("the softmax loss is stable for extreme logits", "[client]") {
  // fc.weight = [[1], [0], [0]]: logits (x, 0, 0) for a one-feature input x.
  auto m = makeSoftmaxModel(1, 3);
  const Floats params{1, 0, 0, 0, 0, 0};
  const Floats xs{1000.0f, -1000.0f};
  const ConstRowMatrixMap x(xs.data(), 2, 1);
  Floats grad(params.size());
  // Label 1 of logits (1000, 0, 0): -log(e^0 / (e^1000 + 2)) = 1000 + log(1 + 2e^-1000) = 1000.
  // Label 0 of logits (-1000, 0, 0): its probability underflows a float, the loss must not.
  const std::vector<uint8_t> y{1, 0};
  const BatchStats st = m->forwardBackward(params, x, y, grad);
  CHECK(st.loss_sum == Approx(1000.0 + (1000.0 + std::log(2.0))).epsilon(1e-6));
  CHECK(st.correct == 0);
  for (float g : grad) CHECK(std::isfinite(g));
}

TEST_CASE("models reject batches of the wrong shape", "[client]") {
  auto m = makeSoftmaxModel(4, 3);
  const Floats params(m->layout().numel()), xs(8);
  const std::vector<uint8_t> y{0, 1};
  Floats grad(m->layout().numel());
  const ConstRowMatrixMap x(xs.data(), 2, 4);
  CHECK_NOTHROW(m->forwardBackward(params, x, y, grad));
  CHECK_THROWS_MATCHING(m->forwardBackward(std::span(params).first(5), x, y, grad), InvalidArgument,
                        Contains("params has 5 floats"));
  CHECK_THROWS_MATCHING(m->forwardBackward(params, x, y, std::span(grad).first(3)), InvalidArgument,
                        Contains("grad has 3 floats"));
  CHECK_THROWS_MATCHING(
      m->forwardBackward(params, ConstRowMatrixMap(xs.data(), 4, 2), std::vector<uint8_t>(4), grad),
      InvalidArgument, Contains("batch has 2 features"));
  CHECK_THROWS_MATCHING(m->forwardBackward(params, x, std::span(y).first(1), grad), InvalidArgument,
                        Contains("2 rows with 1 labels"));
}

TEST_CASE("models refuse buffers that do not start on a 64-byte boundary", "[client]") {
  // Where a buffer lies would otherwise change the bits of the result.
  auto m = makeMlpModel(4, 3, 5);
  const size_t n = m->layout().numel();
  Floats params(n + 16), xs(8 + 16), grad(n + 16);
  const std::vector<uint8_t> y{0, 1};
  const auto x_at = [&](size_t off) { return ConstRowMatrixMap(xs.data() + off, 2, 4); };
  CHECK_NOTHROW(
      m->forwardBackward(std::span(params).first(n), x_at(0), y, std::span(grad).first(n)));
  for (size_t off = 1; off < 16; ++off) {
    INFO("offset " << off * 4 << " bytes");
    CHECK_THROWS_MATCHING(m->forwardBackward(std::span(params).subspan(off, n), x_at(0), y, {}),
                          InvalidArgument, Contains("64-byte boundaries"));
    CHECK_THROWS_MATCHING(m->forwardBackward(std::span(params).first(n), x_at(off), y, {}),
                          InvalidArgument, Contains("64-byte boundaries"));
    CHECK_THROWS_MATCHING(
        m->forwardBackward(std::span(params).first(n), x_at(0), y, std::span(grad).subspan(off, n)),
        InvalidArgument, Contains("64-byte boundaries"));
  }
}
