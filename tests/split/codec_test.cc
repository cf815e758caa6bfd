// split/codec.h: each activation codec within its stated error on known inputs, its byte count,
// its state across calls, and a receiver that refuses every lie a sender can tell.
#include "split/codec.h"

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "check_throws.h"
#include "core/input_error.h"
#include "core/rng.h"
#include "test_util.h"

using namespace starling;
using namespace starling::split;

namespace {

std::vector<float> randomMatrix(size_t rows, size_t cols, uint64_t seed) {
  RngStream rng(StreamKey{seed, 0, 0, StreamPurpose::kTest, 0});
  std::vector<float> m(rows * cols);
  for (float& x : m) x = static_cast<float>(rng.normal());
  return m;
}

// A rows x cols matrix of rank exactly r (sum of r outer products of random vectors).
std::vector<float> rankR(size_t rows, size_t cols, size_t r, uint64_t seed) {
  const auto a = randomMatrix(rows, r, seed), b = randomMatrix(cols, r, seed + 1);
  std::vector<float> m(rows * cols, 0.0f);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j)
      for (size_t k = 0; k < r; ++k) m[i * cols + j] += a[i * r + k] * b[j * r + k];
  return m;
}

double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

double frob(const std::vector<float>& a) {
  double s = 0;
  for (float x : a) s += double(x) * x;
  return std::sqrt(s);
}

std::vector<float> roundTrip(const ActivationCodec& c, const std::vector<float>& m, size_t rows,
                             size_t cols, CodecState& st, size_t* bytes = nullptr) {
  const auto wire = c.encode(m, rows, cols, st);
  if (bytes) *bytes = wire.size();
  std::vector<float> out(rows * cols);
  decodeActivation(wire, rows, cols, out);
  return out;
}

}  // namespace

TEST_CASE("none is exact and int8 errs by at most half a row's scale", "[split]") {
  const size_t rows = 32, cols = 50;
  const auto m = randomMatrix(rows, cols, 1);
  CodecState st;
  size_t bytes = 0;
  CHECK(roundTrip(*makeActivationCodec("none"), m, rows, cols, st, &bytes) == m);
  CHECK(bytes == 10 + 4 * rows * cols);
  const auto q = roundTrip(*makeActivationCodec("int8"), m, rows, cols, st, &bytes);
  CHECK(bytes == 10 + 4 * rows + rows * cols);  // about 4x less than f32
  for (size_t r = 0; r < rows; ++r) {
    float mx = 0;
    for (size_t c = 0; c < cols; ++c) mx = std::max(mx, std::fabs(m[r * cols + c]));
    for (size_t c = 0; c < cols; ++c)
      CHECK(std::fabs(q[r * cols + c] - m[r * cols + c]) <= mx / 127.0f / 2.0f * 1.0001f + 1e-7f);
  }
  // A zero row has scale 0 and decodes to zeros.
  std::vector<float> z(rows * cols, 0.0f);
  CHECK(roundTrip(*makeActivationCodec("int8"), z, rows, cols, st) == z);
}

TEST_CASE("topk keeps exactly the k largest magnitudes and nothing else", "[split]") {
  const size_t rows = 16, cols = 64;
  const auto m = randomMatrix(rows, cols, 2);
  CodecState st;
  size_t bytes = 0;
  const auto got = roundTrip(*makeActivationCodec("topk:density=0.1"), m, rows, cols, st, &bytes);
  const size_t k = 102;  // round(0.1 x 1024)
  CHECK(bytes == 10 + 4 + 8 * k);
  size_t kept = 0;
  float smallest_kept = 1e30f, largest_dropped = 0.0f;
  for (size_t i = 0; i < m.size(); ++i) {
    if (got[i] != 0.0f) {
      ++kept;
      CHECK(got[i] == m[i]);
      smallest_kept = std::min(smallest_kept, std::fabs(m[i]));
    } else {
      largest_dropped = std::max(largest_dropped, std::fabs(m[i]));
    }
  }
  CHECK(kept == k);
  CHECK(smallest_kept >= largest_dropped);
}

TEST_CASE("lowrank recovers a matrix of rank <= r and warm-starts across calls", "[split]") {
  const size_t rows = 40, cols = 30;
  for (size_t true_rank : {1u, 2u, 4u}) {
    INFO("rank " << true_rank);
    const auto m = rankR(rows, cols, true_rank, 10 + true_rank);
    CodecState st;
    size_t bytes = 0;
    const auto got = roundTrip(*makeActivationCodec("lowrank:rank=4"), m, rows, cols, st, &bytes);
    CHECK(bytes == 10 + 4 + 4 * 4 * (rows + cols));
    CHECK(maxAbsDiff(got, m) <= 1e-4 * (1 + frob(m)));
    CHECK(st.q.size() == cols * 4);
  }
  // A full-rank matrix: the rank-2 error shrinks as power iterations repeat on the same matrix
  // (warm start), toward the best rank-2 approximation.
  const auto m = randomMatrix(rows, cols, 5);
  const auto codec = makeActivationCodec("lowrank:rank=2");
  CodecState st;
  const double e1 = frob([&] {
    auto g = roundTrip(*codec, m, rows, cols, st);
    for (size_t i = 0; i < g.size(); ++i) g[i] -= m[i];
    return g;
  }());
  double e = e1;
  for (int i = 0; i < 10; ++i) {
    auto g = roundTrip(*codec, m, rows, cols, st);
    for (size_t j = 0; j < g.size(); ++j) g[j] -= m[j];
    e = frob(g);
  }
  CHECK(e <= e1);
  CHECK(e < frob(m));
  // A new shape starts over from the seeded factor.
  const auto small = rankR(8, 6, 1, 3);
  CHECK(maxAbsDiff(roundTrip(*codec, small, 8, 6, st), small) <= 1e-4 * (1 + frob(small)));
  CHECK(st.rows == 8);
  CHECK(st.cols == 6);
}

TEST_CASE("lowrank with error feedback loses nothing across calls of one shape", "[split]") {
  const size_t rows = 20, cols = 12;
  const auto codec = makeActivationCodec("lowrank:rank=1,ef=true");
  CodecState st;
  std::vector<float> sum_sent(rows * cols, 0.0f), sum_in(rows * cols, 0.0f);
  for (int call = 0; call < 5; ++call) {
    const auto m = randomMatrix(rows, cols, 40 + call);
    const auto got = roundTrip(*codec, m, rows, cols, st);
    for (size_t i = 0; i < m.size(); ++i) {
      sum_sent[i] += got[i];
      sum_in[i] += m[i];
    }
  }
  // Everything that went in was sent or is still in the residual.
  std::vector<float> total(rows * cols);
  for (size_t i = 0; i < total.size(); ++i) total[i] = sum_sent[i] + st.residual[i];
  CHECK(maxAbsDiff(total, sum_in) <= 1e-4);
}

TEST_CASE("codec specs and encoder inputs are checked", "[split]") {
  CHECK(makeActivationCodec("lowrank:rank=3,iters=2,ef=true")->spec() ==
        "lowrank:rank=3,iters=2,ef=true");
  CHECK(makeActivationCodec("topk:density=0.25")->spec() == "topk:density=0.25");
  for (const char* bad : {"zip", "topk:density=0", "topk:density=2", "lowrank:rank=0",
                          "lowrank:iters=0", "lowrank:iters=99", "int8:bits=4"}) {
    INFO(bad);
    CHECK_THROWS_AS(makeActivationCodec(bad), ConfigError);
  }
  const auto c = makeActivationCodec("lowrank:rank=2,ef=true");
  CodecState st;
  std::vector<float> m = randomMatrix(4, 5, 1);
  c->encode(m, 4, 5, st);
  const CodecState before = st;
  CHECK_THROWS_AS(c->encode(m, 5, 5, st), InvalidArgument);
  m[7] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(c->encode(m, 4, 5, st), InvalidArgument);
  CHECK(st.q == before.q);
  CHECK(st.residual == before.residual);
  CHECK(st.calls == before.calls);
}

constexpr size_t kRows = 6, kCols = 8;

TEST_CASE("a receiver refuses every lie about the matrix, its sizes and its values", "[split]") {
  const auto m = rankR(kRows, kCols, 2, 9);
  const size_t rows = kRows, cols = kCols;
  std::vector<float> out(rows * cols);
  const auto code = [&](const std::vector<uint8_t>& wire, size_t r = kRows, size_t c = kCols) {
    std::vector<float> o(r * c);
    return testing::errcOf([&] { decodeActivation(wire, r, c, o); });
  };
  const std::string ok = "no error";
  const auto putU32 = [](std::vector<uint8_t>& w, size_t at, uint32_t v) {
    for (size_t i = 0; i < 4; ++i) w.at(at + i) = static_cast<uint8_t>(v >> (8 * i));
  };
  for (const char* spec : {"none", "int8", "topk:density=0.3", "lowrank:rank=2"}) {
    INFO(spec);
    CodecState st;
    const auto wire = makeActivationCodec(spec)->encode(m, rows, cols, st);
    CHECK(code(wire) == ok);
    // Another shape than the receiver expects.
    CHECK(code(wire, rows + 1, cols) == errcName(Errc::kShapeMismatch));
    // Every truncation and one trailing byte.
    for (size_t cut = 0; cut < wire.size(); ++cut) {
      const std::vector<uint8_t> shorter(wire.begin(),
                                         wire.begin() + static_cast<std::ptrdiff_t>(cut));
      CHECK(code(shorter) != ok);
    }
    auto longer = wire;
    longer.push_back(0);
    CHECK(code(longer) == errcName(Errc::kSizeMismatch));
    // Not an activation, an unknown kind.
    auto magic = wire;
    magic[0] = 'X';
    CHECK(code(magic) == errcName(Errc::kBadIdentifier));
    auto kind = wire;
    kind[1] = 9;
    CHECK(code(kind) == errcName(Errc::kUnknownEncoding));
    // A NaN where a float is (the last four bytes are always a float).
    auto nan = wire;
    putU32(nan, nan.size() - 4, std::bit_cast<uint32_t>(std::numeric_limits<float>::quiet_NaN()));
    if (std::string(spec) != "int8") CHECK(code(nan) == errcName(Errc::kNonFinite));
  }
  CodecState st;
  // topk: a count that lies, an index out of range, indices out of order.
  auto wire = makeActivationCodec("topk:density=0.3")->encode(m, rows, cols, st);
  auto lie = wire;
  putU32(lie, 10, 1000);
  CHECK(code(lie) == errcName(Errc::kSizeMismatch));
  auto range = wire;
  putU32(range, 14, static_cast<uint32_t>(rows * cols));
  CHECK(code(range) == errcName(Errc::kIndexOutOfRange));
  auto order = wire;
  putU32(order, 18, 0);
  CHECK(code(order) == errcName(Errc::kIndexOrder));
  // lowrank: a rank above the matrix's, or zero.
  auto lr = makeActivationCodec("lowrank:rank=2")->encode(m, rows, cols, st);
  auto big = lr;
  putU32(big, 10, 7);
  CHECK(code(big) == errcName(Errc::kShapeMismatch));
  auto zero = lr;
  putU32(zero, 10, 0);
  CHECK(code(zero) == errcName(Errc::kShapeMismatch));
  // int8: -128 is outside the code range, a negative scale is refused.
  auto i8 = makeActivationCodec("int8")->encode(m, rows, cols, st);
  auto low = i8;
  low.back() = 0x80;
  CHECK(code(low) == errcName(Errc::kSizeMismatch));
  auto neg = i8;
  putU32(neg, 10, std::bit_cast<uint32_t>(-1.0f));
  CHECK(code(neg) == errcName(Errc::kNonFinite));
  // A value over the receiver's bound.
  std::vector<float> huge = m;
  huge[3] = 1e20f;
  auto wide = makeActivationCodec("none")->encode(huge, rows, cols, st);
  CHECK_THROWS_AS(decodeActivation(wide, rows, cols, out, 1e10), InputError);
}
