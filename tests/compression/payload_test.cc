// Payloads and their views (compression/payload.h): view/toOwned, what validatePayload measures
// against a dense reference for every encoding, accumulation, sizes and names.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "compression/bitpack.h"
#include "compression/lowrank.h"
#include "compression/registry.h"
#include "compression/rice.h"
#include "core/half.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

namespace {

// A 6 x 10 matrix and a vector of 13.
ParamLayout tiny() {
  ParamLayout l;
  l.add("m", {6, 10});
  l.add("v", {13});
  return l;
}

std::vector<float> randomFactor(size_t n, uint64_t seed) {
  return testing::randomVector(n, seed, 0.7);
}

// One payload of every encoding (and every low-rank form) for tensor 0 of tiny(), with the shared
// factors a one-factor payload needs.
struct Sample {
  std::string what;
  Payload payload;
  const SharedFactors* shared = nullptr;
};

std::vector<Sample> samples(const SharedFactors& shared_q, const SharedFactors& shared_p) {
  RngStream rng(StreamKey{3, 0, 0, StreamPurpose::kTest, 0});
  std::vector<Sample> out;
  const auto dense = testing::randomVector(60, 1, 3.0);
  out.push_back({"dense_f32", DenseF32{dense}});
  DenseF16 h;
  DenseBF16 bf;
  for (float x : dense) {
    h.values.push_back(floatToHalf(x));
    bf.values.push_back(floatToBf16(x));
  }
  out.push_back({"dense_f16", h});
  out.push_back({"dense_bf16", bf});
  out.push_back({"sparse", Sparse{{0, 7, 8, 31, 59}, {-1.5f, 2.0f, 0.0f, 4.25f, -0.125f}}});
  out.push_back({"empty sparse", Sparse{}});
  out.push_back({"randblock wrapping", RandBlock{55, {1, -2, 3, -4, 5, -6, 7, -8.5f, 9}}});
  out.push_back({"randblock", RandBlock{3, {0.5f, -0.25f}}});
  out.push_back({"lowrank rank 2", LowRank{6, 10, 2, randomFactor(12, 2), randomFactor(20, 3)}});
  out.push_back({"lowrank rank 1", LowRank{6, 10, 1, randomFactor(6, 4), randomFactor(10, 5)}});
  out.push_back({"lowrank rank 1, a negative entry largest",
                 LowRank{6, 10, 1, {0.1f, -3, 0.2f, 1, 0, 2}, randomFactor(10, 6)}});
  out.push_back({"lowrank P only", LowRank{6, 10, 2, randomFactor(12, 7), {}}, &shared_q});
  out.push_back({"lowrank Q only", LowRank{6, 10, 2, {}, randomFactor(20, 8)}, &shared_p});
  Sign s{0.75f, std::vector<uint8_t>(8)};
  for (size_t i = 0; i < 60; ++i) s.bits[i / 8] |= static_cast<uint8_t>(rng.below(2) << (i % 8));
  out.push_back({"sign", s});
  // QSGD s=5: 1 sign + 3 level bits per value, 60 values in 30 bytes.
  Qsgd q{2.5f, 5, std::vector<uint8_t>(30)};
  for (size_t i = 0; i < 60; ++i) {
    const auto field = static_cast<uint8_t>((rng.below(6) << 1) | rng.below(2));
    q.packed[i / 2] |= static_cast<uint8_t>(field << (4 * (i % 2)));
  }
  out.push_back({"qsgd", q});
  // Ternary: positions 0, 7, 8, 31, 59 Rice-coded with r = 2 and 3 (both valid), signs - + + - -.
  const std::vector<uint32_t> pos = {0, 7, 8, 31, 59};
  out.push_back({"ternary", Ternary{5, 1.25f, 2, riceEncode(pos, 2), {0x19}}});
  out.push_back({"ternary r=3", Ternary{5, 0.5f, 3, riceEncode(pos, 3), {0x19}}});
  out.push_back({"empty ternary", Ternary{0, 0.0f, 0, {}, {}}});
  // Block levels: 3 bits in blocks of 16 (the last of 12), one block of zeros, the extreme
  // exponents; and 2 bits in one block of 64 covering all 60 values.
  BlockQ b3{3, 16, {-2, kBlockQZero, kBlockQMaxExp, kBlockQMinExp}, {}};
  {
    BitWriter w(b3.packed, 60, 3);
    for (uint32_t i = 0; i < 60; ++i) w.put(i >= 16 && i < 32 ? 0 : (i * 5) % 8, 3);
    w.flush();
  }
  out.push_back({"blockq 3 bits", b3});
  BlockQ b2{2, 64, {1}, {}};
  {
    BitWriter w(b2.packed, 60, 2);
    for (uint32_t i = 0; i < 60; ++i) w.put(static_cast<uint32_t>(rng.below(4)), 2);
    w.flush();
  }
  out.push_back({"blockq 2 bits", b2});
  return out;
}

struct Dense {
  double max_abs = 0, sq = 0;
};
Dense reference(const std::vector<float>& v) {
  Dense d;
  for (float x : v) {
    d.max_abs = std::max(d.max_abs, std::fabs(static_cast<double>(x)));
    d.sq += static_cast<double>(x) * x;
  }
  return d;
}

double maxRowNorm(std::span<const float> f, size_t rows, size_t r) {
  double m = 0;
  for (size_t i = 0; i < rows; ++i) {
    double s = 0;
    for (size_t k = 0; k < r; ++k) s += static_cast<double>(f[i * r + k]) * f[i * r + k];
    m = std::max(m, std::sqrt(s));
  }
  return m;
}

}  // namespace

TEST_CASE("view and toOwned round-trip every encoding, and a view aliases its payload",
          "[compression]") {
  const ParamLayout l = tiny();
  const SharedFactors q = initialSharedFactors(l, LowRankOptions{2, 1.0}, 1);
  SharedFactors p;
  for (const auto& s : samples(q, p)) {
    INFO(s.what);
    const PayloadView v = view(s.payload);
    CHECK(v.index() == s.payload.index());
    CHECK(std::string(encodingName(v)) == encodingName(s.payload));
    CHECK(testing::samePayload(toOwned(v), s.payload));
    std::visit(
        [&](const auto& owned) {
          using T = std::decay_t<decltype(owned)>;
          if constexpr (std::is_same_v<T, Sparse>) {
            CHECK(std::get<SparseView>(v).indices.data() == owned.indices.data());
            CHECK(std::get<SparseView>(v).values.data() == owned.values.data());
          } else if constexpr (std::is_same_v<T, LowRank>) {
            CHECK(std::get<LowRankView>(v).p.data() == owned.p.data());
            CHECK(std::get<LowRankView>(v).q.data() == owned.q.data());
            CHECK(std::get<LowRankView>(v).oneFactor() == (owned.p.empty() != owned.q.empty()));
          } else if constexpr (std::is_same_v<T, Sign>) {
            CHECK(std::get<SignView>(v).bits.data() == owned.bits.data());
          } else if constexpr (std::is_same_v<T, Ternary>) {
            CHECK(std::get<TernaryView>(v).positions.data() == owned.positions.data());
            CHECK(std::get<TernaryView>(v).signs.data() == owned.signs.data());
            CHECK(std::get<TernaryView>(v).count == owned.count);
          } else if constexpr (std::is_same_v<T, BlockQ>) {
            CHECK(std::get<BlockQView>(v).packed.data() == owned.packed.data());
            CHECK(std::get<BlockQView>(v).exps.data() == owned.exps.data());
            CHECK(std::get<BlockQView>(v).bits == owned.bits);
            CHECK(std::get<BlockQView>(v).block == owned.block);
          } else if constexpr (std::is_same_v<T, Qsgd>) {
            CHECK(std::get<QsgdView>(v).packed.data() == owned.packed.data());
            CHECK(std::get<QsgdView>(v).s == owned.s);
          } else if constexpr (std::is_same_v<T, RandBlock>) {
            CHECK(std::get<RandBlockView>(v).values.data() == owned.values.data());
            CHECK(std::get<RandBlockView>(v).offset == owned.offset);
          } else if constexpr (std::is_same_v<T, DenseF32>) {
            CHECK(std::get<DenseF32View>(v).values.data() == owned.values.data());
          } else if constexpr (std::is_same_v<T, DenseF16>) {
            CHECK(std::get<DenseF16View>(v).values.data() == owned.values.data());
          } else {
            CHECK(std::get<DenseBF16View>(v).values.data() == owned.values.data());
          }
        },
        s.payload);
  }
  CHECK(std::string(encodingName(size_t{0})) == "dense_f32");
  CHECK(std::string(encodingName(size_t{7})) == "qsgd");
  CHECK(std::string(encodingName(size_t{8})) == "ternary");
  CHECK(std::string(encodingName(size_t{9})) == "blockq");
  CHECK(std::string(encodingName(size_t{10})) == "unknown");
}

TEST_CASE("updates and partial aggregates view and copy back whole", "[compression]") {
  Update u;
  u.header = {0xabcdef, 9, 1, 77, 123};
  u.tensors = {DenseF32{{1, 2, 3}}, Sparse{{4}, {5.0f}}};
  u.metrics = {{"loss", 0.5}, {"acc", 0.75}};
  const UpdateView v = view(u);
  CHECK(v.header.layout_fingerprint == 0xabcdefu);
  CHECK(v.header.round == 9u);
  CHECK(v.header.phase == 1u);
  CHECK(v.header.client_id == 77u);
  CHECK(v.header.num_examples == 123u);
  REQUIRE(v.tensors.size() == 2);
  CHECK(std::get<DenseF32View>(v.tensors[0]).values.data() ==
        std::get<DenseF32>(u.tensors[0]).values.data());
  REQUIRE(v.metrics.size() == 2);
  CHECK(v.metrics[1].name == "acc");
  CHECK(v.metrics[1].name.data() == u.metrics[1].name.data());
  CHECK(v.metrics[1].value == 0.75);
  const Update back = toOwned(v);
  CHECK(back.header.round == 9u);
  CHECK(back.header.phase == 1u);
  CHECK(testing::samePayloads(back.tensors, u.tensors));
  REQUIRE(back.metrics.size() == 2);
  CHECK(back.metrics[0].name == "loss");
  CHECK(back.metrics[0].value == 0.5);

  PartialMessage m;
  m.header = {0xabcdef, 9, 1, 0x55, 4, 7.5};
  m.tensors = {DenseF32{{1, 2, 3}}};
  m.metrics = {{"loss", 3.0, 7.5}};
  const PartialView pv = view(m);
  CHECK(pv.header.shared_tag == 0x55u);
  CHECK(pv.header.count == 4u);
  CHECK(pv.header.total_weight == 7.5);
  CHECK(std::get<DenseF32View>(pv.tensors[0]).values.data() ==
        std::get<DenseF32>(m.tensors[0]).values.data());
  REQUIRE(pv.metrics.size() == 1);
  CHECK(pv.metrics[0].name == "loss");
  CHECK(pv.metrics[0].weighted_sum == 3.0);
  CHECK(pv.metrics[0].weight == 7.5);
}

TEST_CASE("validatePayload measures what the decoded tensor holds, for every encoding",
          "[compression]") {
  const ParamLayout l = tiny();
  const SharedFactors q = initialSharedFactors(l, LowRankOptions{2, 1.0}, 1);
  SharedFactors p;
  p.fixed = SharedFactors::Side::kP;
  p.factors = {randomFactor(12, 9), {}};
  std::vector<Sample> all = samples(q, p);
  // And what every compressor sends for the CNN, one tensor at a time.
  const ParamLayout cnn = testing::smallCnnLayout();
  std::vector<std::pair<std::string, std::vector<Payload>>> sent;
  std::vector<SharedFactors> cnn_shared;
  for (const auto& spec : testing::allCompressorSpecs()) {
    auto c = makeCompressor(spec);
    cnn_shared.push_back(c->initialShared(cnn, 1));
    ClientState st(cnn.fingerprint());
    sent.push_back({spec, c->compressWithFeedback(cnn, testing::randomVector(cnn.numel(), 2), st,
                                                  RoundContext{1, 0, 0, 1, &cnn_shared.back()})});
    if (c->phases() == 2) {  // and phase Q, against P-hat
      std::vector<std::span<const float>> sums(cnn.size());
      for (size_t t = 0; t < cnn.size(); ++t)
        if (const auto* lr = std::get_if<LowRank>(&sent.back().second[t])) sums[t] = lr->p;
      const RoundContext ctx0{1, 0, 0, 1, &cnn_shared.back()};
      SharedFactors phat = c->nextShared(cnn, ctx0, cnn_shared.back(), sums, 1.0);
      cnn_shared.push_back(std::move(phat));
      sent.push_back(
          {spec + " phase 1",
           c->compressWithFeedback(cnn, {}, st, RoundContext{1, 0, 1, 1, &cnn_shared.back()})});
    }
  }

  auto check = [](const std::string& what, const PayloadView& pv, const TensorSpec& t,
                  const SharedFactors* shared, size_t ti) {
    INFO(what << " (" << encodingName(pv) << ")");
    const PayloadStats stats = validatePayload(pv, t, shared, ti);
    std::vector<float> dense(t.numel, 0.0f);
    accumulatePayload(pv, t, dense, 1.0f, shared, ti);
    const Dense ref = reference(dense);
    CHECK(stats.sq_norm == Approx(ref.sq).epsilon(1e-5).margin(1e-30));
    if (const auto* lr = std::get_if<LowRankView>(&pv)) {
      // An upper bound: the largest row norm of P times the largest of Q (Cauchy-Schwarz), which
      // is exact for rank 1.
      const auto pf = lr->p.empty() ? std::span<const float>(shared->factors[ti]) : lr->p;
      const auto qf = lr->q.empty() ? std::span<const float>(shared->factors[ti]) : lr->q;
      const double bound = maxRowNorm(pf, lr->rows, lr->rank) * maxRowNorm(qf, lr->cols, lr->rank);
      CHECK(stats.max_abs == Approx(bound).epsilon(1e-6));
      CHECK(stats.max_abs >= ref.max_abs * (1 - 1e-6));
      if (lr->rank == 1) CHECK(stats.max_abs == Approx(ref.max_abs).epsilon(1e-6));
    } else if (std::holds_alternative<QsgdView>(pv)) {
      // norm / s in double here, in float when decoded.
      CHECK(stats.max_abs == Approx(ref.max_abs).epsilon(1e-6));
    } else {
      CHECK(stats.max_abs == ref.max_abs);  // exact
    }
    return stats;
  };

  for (const auto& s : all) check(s.what, view(s.payload), l[0], s.shared, 0);
  for (size_t k = 0; k < sent.size(); ++k) {
    const auto& [spec, payloads] = sent[k];
    Update u;
    u.header.layout_fingerprint = cnn.fingerprint();
    u.tensors = payloads;
    double max_abs = 0, sq = 0;
    for (size_t t = 0; t < cnn.size(); ++t) {
      const PayloadStats s = check(spec + " tensor " + std::to_string(t), view(payloads[t]), cnn[t],
                                   &cnn_shared[k], t);
      max_abs = std::max(max_abs, s.max_abs);
      sq += s.sq_norm;
    }
    // The whole update's stats are the tensors' combined.
    const PayloadStats whole = validateUpdate(cnn, view(u), &cnn_shared[k]);
    CHECK(whole.max_abs == max_abs);
    CHECK(whole.sq_norm == Approx(sq).epsilon(1e-12));
  }
}

TEST_CASE("accumulatePayload adds weight times the decoded tensor", "[compression]") {
  const ParamLayout l = tiny();
  const SharedFactors q = initialSharedFactors(l, LowRankOptions{2, 1.0}, 1);
  SharedFactors p;
  p.fixed = SharedFactors::Side::kP;
  p.factors = {randomFactor(12, 9), {}};
  for (const auto& s : samples(q, p)) {
    INFO(s.what);
    std::vector<float> once(60, 0.0f);
    accumulatePayload(view(s.payload), l[0], once, 1.0f, s.shared, 0);
    std::vector<float> acc = testing::randomVector(60, 5);
    const auto start = acc;
    accumulatePayload(view(s.payload), l[0], acc, -0.375f, s.shared, 0);
    for (size_t i = 0; i < 60; ++i)
      REQUIRE(acc[i] == Approx(start[i] - 0.375 * once[i]).epsilon(1e-6).margin(1e-6));
    std::vector<float> wrong(59);
    CHECK_THROWS_AS(accumulatePayload(view(s.payload), l[0], wrong, 1.0f, s.shared, 0),
                    InternalError);
  }
}

TEST_CASE("block levels: padding bits after the last level are refused", "[compression]") {
  // 60 values of 3 bits: 180 bits in 23 bytes, the last byte's top 4 bits padding.
  const ParamLayout l = tiny();
  BlockQ q{3, 16, {-2, -2, -2, -2}, std::vector<uint8_t>(23, 0)};
  CHECK_NOTHROW(validatePayload(view(Payload(q)), l[0]));
  q.packed[22] = 0x0f;  // the last level bits, set
  CHECK_NOTHROW(validatePayload(view(Payload(q)), l[0]));
  q.packed[22] = 0x10;  // the first padding bit
  CHECK(testing::errcOf([&] { validatePayload(view(Payload(q)), l[0]); }) ==
        errcName(Errc::kBadPadding));
}

TEST_CASE("payload data sizes are exact", "[compression]") {
  CHECK(payloadDataBytes(DenseF32{std::vector<float>(60)}) == 240u);
  // bits and block (1 + 4 bytes), a byte a block, the packed levels.
  CHECK(payloadDataBytes(BlockQ{2, 16, std::vector<int8_t>(4), std::vector<uint8_t>(15)}) ==
        5u + 4u + 15u);
  CHECK(payloadDataBytes(DenseF16{std::vector<uint16_t>(60)}) == 120u);
  CHECK(payloadDataBytes(DenseBF16{std::vector<uint16_t>(60)}) == 120u);
  CHECK(payloadDataBytes(Sparse{{1, 2, 3}, {1, 2, 3}}) == 24u);
  CHECK(payloadDataBytes(RandBlock{5, std::vector<float>(9)}) == 4u + 36u);
  CHECK(payloadDataBytes(LowRank{6, 10, 2, std::vector<float>(12), std::vector<float>(20)}) ==
        12u + 128u);
  CHECK(payloadDataBytes(LowRank{6, 10, 2, std::vector<float>(12), {}}) == 12u + 48u);
  CHECK(payloadDataBytes(Sign{1.0f, std::vector<uint8_t>(8)}) == 12u);
  CHECK(payloadDataBytes(Qsgd{1.0f, 5, std::vector<uint8_t>(30)}) == 38u);
}

TEST_CASE("checkUpdateHeader and validateUpdate refuse another model or tensor count",
          "[compression]") {
  const ParamLayout l = tiny();
  Update u;
  u.header.layout_fingerprint = l.fingerprint();
  u.tensors = {DenseF32{std::vector<float>(60)}, DenseF32{std::vector<float>(13)}};
  CHECK_NOTHROW(validateUpdate(l, view(u)));
  u.header.layout_fingerprint ^= 1;
  CHECK(testing::errcOf([&] { validateUpdate(l, view(u)); }) ==
        errcName(Errc::kFingerprintMismatch));
  u.header.layout_fingerprint ^= 1;
  u.tensors.pop_back();
  CHECK(testing::errcOf([&] { validateUpdate(l, view(u)); }) ==
        errcName(Errc::kTensorCountMismatch));
  CHECK(testing::errcOf([&] { checkUpdateHeader(l, u.header, 3); }) ==
        errcName(Errc::kTensorCountMismatch));
  CHECK(testing::errcOf([&] { checkUpdateHeader(l, u.header, 2); }) == "no error");
}

TEST_CASE("the shared-factor tag tells factors and sides apart", "[compression]") {
  const ParamLayout l = tiny();
  const SharedFactors a = initialSharedFactors(l, LowRankOptions{2, 1.0}, 1);
  SharedFactors b = a;
  CHECK(sharedFactorsTag(a) == sharedFactorsTag(b));
  b.factors[0][3] = std::nextafter(b.factors[0][3], 2.0f);
  CHECK(sharedFactorsTag(a) != sharedFactorsTag(b));
  b = a;
  b.fixed = SharedFactors::Side::kP;
  CHECK(sharedFactorsTag(a) != sharedFactorsTag(b));
  CHECK(sharedFactorsTag(a) !=
        sharedFactorsTag(initialSharedFactors(l, LowRankOptions{2, 1.0}, 2)));
  CHECK(a.any());
  CHECK_FALSE(SharedFactors{SharedFactors::Side::kQ, {{}, {}}}.any());
}

// The low-rank max_abs is max_i ||P_i|| * max_j ||Q_j|| (payload.h): an upper bound that no
// multiple of the true maximum bounds in turn. Rows of P orthogonal to rows of Q decode to zero.
TEST_CASE("the low-rank magnitude bound is the product of the largest factor rows",
          "[compression]") {
  ParamLayout l;
  l.add("m", {2, 2});
  const LowRank lr{2, 2, 2, {1, 0, 1, 0}, {0, 1, 0, 1}};
  const PayloadStats s = validatePayload(view(lr), l[0]);
  std::vector<float> dense(4, 0.0f);
  accumulatePayload(view(lr), l[0], dense, 1.0f);
  CHECK(dense == std::vector<float>(4, 0.0f));
  CHECK(s.sq_norm == 0.0);
  CHECK(s.max_abs == 1.0);
}
