// The Eigen convolution and pooling layers (client/conv.h) against direct loops written from the
// definitions (PyTorch's conv2d and max_pool2d), and the CNN's gradient against finite
// differences.
#include "client/conv.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "check_throws.h"
#include "client/eigen_model.h"
#include "client/synthetic.h"
#include "core/aligned.h"
#include "core/error.h"
#include "core/rng.h"
#include "emulated.h"

using namespace starling;
using namespace starling::client;
using Catch::Matchers::Contains;

namespace {

using Floats = AlignedVector<float>;

Floats normalVector(size_t n, double scale, uint64_t seed) {
  return testing::normalFloats(n, scale, seed, 9);
}

RowMatrixMap asMatrix(Floats& v, size_t rows, size_t cols) {
  return RowMatrixMap(v.data(), static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
}
ConstRowMatrixMap asConst(const Floats& v, size_t rows, size_t cols) {
  return ConstRowMatrixMap(v.data(), static_cast<Eigen::Index>(rows),
                           static_cast<Eigen::Index>(cols));
}

// The input pixel (b, y, x, c) of an NHWC batch, 0 outside the image (zero padding).
double pixel(const Floats& in, const client::detail::ConvShape& s, size_t b, long y, long x,
             size_t c) {
  if (y < 0 || x < 0 || y >= static_cast<long>(s.h) || x >= static_cast<long>(s.w)) return 0;
  return in[((b * s.h + static_cast<size_t>(y)) * s.w + static_cast<size_t>(x)) * s.in_c + c];
}

// Sums in double from the definitions: out[b, oy, ox, o] = bias[o] + sum over c, kh, kw of
// w[o, c, kh, kw] in[b, oy * stride + kh - pad, ox * stride + kw - pad, c].
struct Direct {
  std::vector<double> out, dw, db, din;
};
Direct direct(const client::detail::ConvShape& s, size_t batch, const Floats& in, const Floats& w,
              const Floats& bias, const Floats& dout) {
  const size_t oh = s.outH(), ow = s.outW();
  Direct r;
  r.out.assign(batch * oh * ow * s.out_c, 0);
  r.dw.assign(w.size(), 0);
  r.db.assign(s.out_c, 0);
  r.din.assign(in.size(), 0);
  for (size_t b = 0; b < batch; ++b)
    for (size_t oy = 0; oy < oh; ++oy)
      for (size_t ox = 0; ox < ow; ++ox)
        for (size_t o = 0; o < s.out_c; ++o) {
          const size_t at = ((b * oh + oy) * ow + ox) * s.out_c + o;
          double acc = bias.empty() ? 0 : bias[o];
          const double g = dout[at];
          r.db[o] += g;
          for (size_t c = 0; c < s.in_c; ++c)
            for (size_t kh = 0; kh < s.k; ++kh)
              for (size_t kw = 0; kw < s.k; ++kw) {
                const long y = static_cast<long>(oy * s.stride + kh) - static_cast<long>(s.pad);
                const long x = static_cast<long>(ox * s.stride + kw) - static_cast<long>(s.pad);
                const size_t wi = ((o * s.in_c + c) * s.k + kh) * s.k + kw;
                const double v = pixel(in, s, b, y, x, c);
                acc += w[wi] * v;
                r.dw[wi] += g * v;
                if (y >= 0 && x >= 0 && y < static_cast<long>(s.h) && x < static_cast<long>(s.w))
                  r.din[((b * s.h + static_cast<size_t>(y)) * s.w + static_cast<size_t>(x)) *
                            s.in_c +
                        c] += g * w[wi];
              }
          r.out[at] = acc;
        }
  return r;
}

void closeTo(std::span<const float> got, const std::vector<double>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  double scale = 1e-30;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(what << "[" << i << "]: " << got[i] << " against " << want[i]);
    REQUIRE(std::abs(got[i] - want[i]) <= 1e-5 * scale);
  }
}

}  // namespace

TEST_CASE("Conv2d equals the convolution's definition, forward and backward", "[client][conv]") {
  // Odd sizes, strides, paddings and chunkings that do not divide the batch; with and without bias.
  const client::detail::ConvShape shapes[] = {
      {.in_c = 1, .h = 9, .w = 7, .out_c = 4, .k = 5, .stride = 1, .pad = 2},
      {.in_c = 3, .h = 8, .w = 9, .out_c = 5, .k = 3, .stride = 2, .pad = 1},
      {.in_c = 4, .h = 7, .w = 7, .out_c = 6, .k = 1, .stride = 2, .pad = 0},
      {.in_c = 2, .h = 6, .w = 5, .out_c = 3, .k = 3, .stride = 1, .pad = 0},
  };
  uint64_t seed = 1;
  for (const auto& s : shapes)
    for (size_t chunk : {size_t{1}, size_t{2}, size_t{8}})
      for (bool with_bias : {true, false}) {
        INFO("in " << s.in_c << "x" << s.h << "x" << s.w << ", out " << s.out_c << ", k " << s.k
                   << ", stride " << s.stride << ", pad " << s.pad << ", chunk " << chunk
                   << (with_bias ? ", bias" : ", no bias"));
        const size_t batch = 3, pin = s.h * s.w, pout = s.outH() * s.outW();
        const Floats in = normalVector(batch * pin * s.in_c, 1.0, ++seed);
        const Floats w = normalVector(s.weightNumel(), 0.5, ++seed);
        const Floats bias = with_bias ? normalVector(s.out_c, 0.5, ++seed) : Floats{};
        const Floats dout = normalVector(batch * pout * s.out_c, 1.0, ++seed);
        const Direct want = direct(s, batch, in, w, bias, dout);

        client::detail::Conv2d conv(s, chunk);
        Floats out(batch * pout * s.out_c, 99.0f), dw(w.size(), 99.0f), db(s.out_c, 99.0f),
            din(in.size(), 99.0f);
        conv.forward(asConst(in, batch * pin, s.in_c), w, bias,
                     asMatrix(out, batch * pout, s.out_c));
        closeTo(out, want.out, "out");
        RowMatrixMap din_map = asMatrix(din, batch * pin, s.in_c);
        conv.backward(asConst(in, batch * pin, s.in_c), w, asConst(dout, batch * pout, s.out_c), dw,
                      with_bias ? std::span<float>(db) : std::span<float>{}, &din_map);
        closeTo(dw, want.dw, "dweight");
        closeTo(din, want.din, "din");
        if (with_bias) closeTo(db, want.db, "dbias");
      }
}

TEST_CASE("MaxPool2 takes each window's first maximum and routes the gradient to it",
          "[client][conv]") {
  // One image 4x5 (the last column dropped), two channels; channel 1 has ties.
  const size_t h = 4, w = 5, c = 2;
  Floats in(h * w * c);
  for (size_t p = 0; p < h * w; ++p) {
    in[p * c] = static_cast<float>((p * 7) % 11);  // distinct enough
    in[p * c + 1] = 1.0f;                          // every window tied
  }
  Floats out(2 * 2 * c), din(in.size(), 5.0f);
  client::detail::MaxPool2 pool;
  pool.forward(asConst(in, h * w, c), 1, h, w, asMatrix(out, 4, c));
  Floats dout{1, 10, 2, 20, 3, 30, 4, 40};
  pool.backward(asConst(dout, 4, c), asMatrix(din, h * w, c));
  for (size_t oy = 0; oy < 2; ++oy)
    for (size_t ox = 0; ox < 2; ++ox) {
      const size_t o = oy * 2 + ox;
      const size_t window[4] = {(2 * oy) * w + 2 * ox, (2 * oy) * w + 2 * ox + 1,
                                (2 * oy + 1) * w + 2 * ox, (2 * oy + 1) * w + 2 * ox + 1};
      size_t best = window[0];
      for (size_t r : window)
        if (in[r * c] > in[best * c]) best = r;
      CHECK(out[o * c] == in[best * c]);
      CHECK(out[o * c + 1] == 1.0f);
      for (size_t r : window) {
        CHECK(din[r * c] == (r == best ? dout[o * c] : 0.0f));
        // Ties: the first of the window in scan order (PyTorch's choice).
        CHECK(din[r * c + 1] == (r == window[0] ? dout[o * c + 1] : 0.0f));
      }
    }
  for (size_t y = 0; y < h; ++y) CHECK(din[(y * w + 4) * c] == 0.0f);  // the dropped column
}

namespace {

// Central differences of the mean batch loss in training mode (a forwardBackward with a gradient:
// BatchNorm normalises with the batch's statistics) against the analytic gradient: every value of
// the first tensor and an even spread of the others' (1.6M differences at the CNN's full size
// would take minutes). A difference may straddle a ReLU's kink or change a pooling's maximum, and
// BatchNorm over a few images is strongly curved: `allowed` of the checked values may miss (the
// exact check of these gradients is against LibTorch's autograd, test_torch_trainer's [parity]).
void checkTrainingGradient(EigenModel& m, Floats params, size_t batch, uint64_t seed,
                           double allowed, bool has_buffers) {
  const ParamLayout& l = m.layout();
  const Floats xs = normalVector(batch * m.features(), 1.0, seed);
  std::vector<uint8_t> y(batch);
  for (size_t i = 0; i < batch; ++i) y[i] = static_cast<uint8_t>((i * 2 + 1) % m.classes());
  const ConstRowMatrixMap x(xs.data(), static_cast<Eigen::Index>(batch),
                            static_cast<Eigen::Index>(m.features()));
  Floats grad(params.size(), 123.0f), scratch(params.size());
  m.forwardBackward(params, x, y, grad);
  // A model with buffers (BatchNorm) computes another function in evaluation: its training
  // loss comes with a (discarded) backward pass.
  const auto loss = [&](const Floats& p) {
    const std::span<float> g = has_buffers ? std::span<float>(scratch) : std::span<float>();
    return m.forwardBackward(p, x, y, g).loss_sum / static_cast<double>(batch);
  };
  // Under qemu or AddressSanitizer (tests/emulated.h) an eighth of the first tensor and 4 values of
  // each other.
  const size_t first_step = testing::kReduced ? 8 : 1, per_tensor = testing::kReduced ? 4 : 60;
  std::vector<size_t> picks;
  for (size_t t = 0; t < m.trainableTensors(); ++t) {
    const size_t step = t == 0 ? first_step : std::max<size_t>(1, l[t].numel / per_tensor);
    for (size_t i = 0; i < l[t].numel; i += step) picks.push_back(l[t].offset + i);
  }
  const double eps = 3e-4;  // misses fall with it (26 at 1e-3, 12 at 3e-4 of ResNet's 1375)
  size_t off = 0;
  double largest = 0;
  for (size_t i : picks) {
    const float keep = params[i];
    params[i] = static_cast<float>(keep + eps);
    const double up = loss(params);
    const double hi = params[i];
    params[i] = static_cast<float>(keep - eps);
    const double down = loss(params);
    const double lo = params[i];
    params[i] = keep;
    const double fd = (up - down) / (hi - lo);
    largest = std::max(largest, std::abs(fd));
    if (std::abs(fd - grad[i]) > 1e-3 + 2e-2 * std::abs(fd)) {
      ++off;
      UNSCOPED_INFO("value " << i << ": analytic " << grad[i] << ", finite difference " << fd);
    }
  }
  INFO(picks.size() << " parameters checked");
  CHECK(largest > 1e-2);  // the check saw real gradients
  CHECK(static_cast<double>(off) <= allowed * static_cast<double>(picks.size()));
  // Buffers (running statistics) get no gradient.
  for (size_t t = m.trainableTensors(); t < l.size(); ++t)
    for (float g : l.slice(std::span<const float>(grad), t)) REQUIRE(g == 0.0f);
}

}  // namespace

TEST_CASE("the CNN's gradient matches finite differences", "[client][conv]") {
  // 8x8 images, 3 classes: fc1 reads 64 x 2 x 2.
  auto m = makeCnnModel(8, 8, 3);
  Floats params(m->layout().numel());
  m->initParameters(params, 5);
  // Biases away from zero keep most units clear of the ReLU's kink.
  for (size_t t : {size_t{1}, size_t{3}, size_t{5}})
    for (float& v : m->layout().slice(std::span<float>(params), t)) v += 0.05f;
  checkTrainingGradient(*m, params, 3, 21, 0.01, false);
}

TEST_CASE("ResNet-8's gradient matches finite differences, through BatchNorm and shortcuts",
          "[client][conv]") {
  // 9x7 images: stages of 9x7, 5x4 and 3x2 pixels, the second and third with a 1x1 shortcut.
  auto m = makeResnetModel(9, 7, 4);
  Floats params(m->layout().numel());
  m->initParameters(params, 6);
  // BatchNorm's shift away from zero keeps units clear of the ReLU's kink; its scale away from 1
  // makes its gradient matter.
  const ParamLayout& l = m->layout();
  for (size_t t = 0; t < m->trainableTensors(); ++t)
    if (l[t].shape.size() == 1 && l[t].name.find("bn") != std::string::npos) {
      RngStream r(StreamKey{7, 0, 0, StreamPurpose::kTest, t});
      for (float& v : l.slice(std::span<float>(params), t))
        v += static_cast<float>(0.3 * r.normal());
    }
  checkTrainingGradient(*m, params, 4, 22, 0.02, true);
}

TEST_CASE("ResNet-8's BatchNorm: running statistics move towards the batch's, evaluation uses them",
          "[client][conv]") {
  auto m = makeResnetModel(6, 6, 3);
  const ParamLayout& l = m->layout();
  Floats params(l.numel());
  m->initParameters(params, 2);
  const auto mean = l.find("bn1.running_mean"), var = l.find("bn1.running_var");
  REQUIRE(mean);
  REQUIRE(var);
  REQUIRE(*mean >= m->trainableTensors());
  for (float v : l.slice(std::span<const float>(params), *mean)) CHECK(v == 0.0f);
  for (float v : l.slice(std::span<const float>(params), *var)) CHECK(v == 1.0f);
  const size_t batch = 5;
  const Floats xs = normalVector(batch * 36, 2.0, 3);
  const std::vector<uint8_t> y{0, 1, 2, 0, 1};
  const ConstRowMatrixMap x(xs.data(), batch, 36);
  const double eval_before = m->forwardBackward(params, x, y, {}).loss_sum;
  Floats grad(params.size());
  const Floats before = params;
  m->forwardBackward(params, x, y, grad);
  CHECK(params == before);  // forwardBackward writes nothing into params
  m->commitBuffers(params);
  // Only buffers changed, each by momentum 0.1 towards the batch's statistics: the stem's
  // running mean is 0.1 x the batch mean of its conv's output, not 0.
  for (size_t t = 0; t < l.size(); ++t) {
    const auto a = l.slice(std::span<const float>(params), t);
    const auto b = l.slice(std::span<const float>(before), t);
    INFO(l[t].name);
    if (t < m->trainableTensors())
      CHECK(std::equal(a.begin(), a.end(), b.begin()));
    else
      CHECK_FALSE(std::equal(a.begin(), a.end(), b.begin()));
  }
  for (float v : l.slice(std::span<const float>(params), *var)) CHECK(v != 1.0f);
  // Evaluation reads the running statistics: moved ones give another loss.
  CHECK(m->forwardBackward(params, x, y, {}).loss_sum != eval_before);
  // A batch of one 1x1 image has one value per channel: no variance to train with.
  auto tiny = makeResnetModel(1, 1, 2);
  Floats tp(tiny->layout().numel()), tg(tp.size());
  tiny->initParameters(tp, 1);
  const Floats one(1, 0.5f);
  CHECK_THROWS_MATCHING(
      tiny->forwardBackward(tp, ConstRowMatrixMap(one.data(), 1, 1), std::vector<uint8_t>{1}, tg),
      InvalidArgument, Contains("more than one value per channel"));
}

TEST_CASE("convolution layers refuse shapes that do not fit", "[client][conv]") {
  CHECK_THROWS_MATCHING(client::detail::Conv2d(
                            {.in_c = 1, .h = 2, .w = 2, .out_c = 1, .k = 5, .stride = 1, .pad = 1}),
                        InvalidArgument, Contains("smaller than the 5x5 kernel"));
  client::detail::Conv2d conv(
      {.in_c = 2, .h = 4, .w = 4, .out_c = 3, .k = 3, .stride = 1, .pad = 1});
  Floats in(2 * 16 * 2), w(3 * 2 * 9), out(2 * 16 * 3);
  CHECK_THROWS_MATCHING(conv.forward(asConst(in, 32, 2), std::span<const float>(w).first(10), {},
                                     asMatrix(out, 32, 3)),
                        InvalidArgument, Contains("weight has 10 floats"));
  CHECK_THROWS_MATCHING(conv.forward(asConst(in, 31, 2), w, {}, asMatrix(out, 32, 3)),
                        InvalidArgument, Contains("is not images of 4x4x2"));
  CHECK_THROWS_MATCHING(conv.forward(asConst(in, 32, 2), w, {}, asMatrix(out, 16, 3)),
                        InvalidArgument, Contains("expected [32, 3]"));
}
