#include "protocol/control.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "check_throws.h"
#include "compression/bitpack.h"
#include "compression/sparsify.h"
#include "core/half.h"
#include "core/input_error.h"
#include "fuzz/fuzz_layout.h"
#include "protocol/codec.h"
#include "test_util.h"

using namespace starling;
using namespace starling::protocol;
using namespace starling::testing;
using Catch::Matchers::Contains;
namespace cz = starling::compression;

namespace {

TaskMsg sampleTask() {
  TaskMsg t;
  t.kind = TaskKind::kFit;
  t.round = 7;
  t.phase = 1;
  t.nonce = 0xfeedfacecafebeefull;
  t.run_seed = 42;
  t.compressor = "powersgd:rank=2";
  t.model_version = 9;
  t.fit = FitSettings{2, 16, 0.25f, 0.125f};
  t.deadline_ms = 1234;
  t.metrics = {"train_loss", "train_accuracy"};
  t.shared = fuzz::shared();
  return t;
}

std::vector<cz::Payload> denseModel(const ParamLayout& l, uint64_t seed) {
  std::vector<cz::Payload> out;
  for (const auto& t : l.tensors())
    out.push_back(cz::DenseF32{randomVector(t.numel, seed + t.offset)});
  return out;
}

std::vector<cz::PayloadView> views(const std::vector<cz::Payload>& ps) {
  std::vector<cz::PayloadView> v;
  for (const auto& p : ps) v.push_back(cz::view(p));
  return v;
}

}  // namespace

TEST_CASE("control messages round-trip and peekKind names them", "[protocol]") {
  RegisterMsg r{5, Role::kAggregator, 0xabcull, 600, 100, 3, {"fp16", "delta"}};
  const auto rb = encode(r);
  CHECK(peekKind(rb) == MessageKind::kRegister);
  const RegisterMsg r2 = decodeRegister(rb);
  CHECK(r2.client_id == 5);
  CHECK(r2.role == Role::kAggregator);
  CHECK(r2.layout_fingerprint == 0xabcull);
  CHECK(r2.num_examples == 600);
  CHECK(r2.eval_examples == 100);
  CHECK(r2.model_version == 3);
  CHECK(r2.capabilities == std::vector<std::string>{"fp16", "delta"});

  const auto wb = encode(WelcomeMsg{5, 77, 250, 1 << 20, 4096});
  CHECK(peekKind(wb) == MessageKind::kWelcome);
  const WelcomeMsg w = decodeWelcome(wb);
  CHECK((w.client_id == 5 && w.session == 77 && w.heartbeat_ms == 250 &&
         w.max_message_bytes == (1 << 20) && w.chunk_bytes == 4096));

  const auto hb = encode(HeartbeatMsg{5, 77, 12});
  CHECK(peekKind(hb) == MessageKind::kHeartbeat);
  const HeartbeatMsg h = decodeHeartbeat(hb);
  CHECK((h.client_id == 5 && h.session == 77 && h.round == 12));

  const auto eb = encode(EvaluationMsg{5, 12, 99, 100, 0.5, 0.875});
  CHECK(peekKind(eb) == MessageKind::kEvaluation);
  const EvaluationMsg e = decodeEvaluation(eb);
  CHECK((e.client_id == 5 && e.round == 12 && e.nonce == 99 && e.num_examples == 100 &&
         e.loss == 0.5 && e.accuracy == 0.875));

  const auto jb = encode(RejectMsg{RejectKind::kNotRegistered, 51, 3, 4, "who are you"});
  CHECK(peekKind(jb) == MessageKind::kReject);
  const RejectMsg j = decodeReject(jb);
  CHECK((j.kind == RejectKind::kNotRegistered && j.code == 51 && j.round == 3 && j.nonce == 4 &&
         j.message == "who are you"));

  const auto sb = encode(ShutdownMsg{8, "done"});
  CHECK(peekKind(sb) == MessageKind::kShutdown);
  CHECK(decodeShutdown(sb).reason == "done");

  const std::vector<uint8_t> data{1, 2, 3, 4, 5};
  const auto cb = encodeChunk(ChunkMsg{11, 2, 3, 4101, data});
  CHECK(peekKind(cb) == MessageKind::kChunk);
  const ChunkMsg c = decodeChunk(cb, 4096);
  CHECK((c.transfer == 11 && c.index == 2 && c.count == 3 && c.total_bytes == 4101));
  CHECK(std::vector<uint8_t>(c.data.begin(), c.data.end()) == data);
}

TEST_CASE("a heartbeat carries an edge aggregator's subtree, bounded", "[protocol]") {
  HeartbeatMsg m{7, 77, 3};
  CHECK(!decodeHeartbeat(encode(m)).subtree);  // absent: no news
  m.subtree.emplace();
  REQUIRE(decodeHeartbeat(encode(m)).subtree);  // present and empty: no clients
  CHECK(decodeHeartbeat(encode(m)).subtree->empty());
  m.subtree->push_back(SubtreePeer{1, true, false, 250, 12, 3, 0});
  m.subtree->push_back(SubtreePeer{UINT64_MAX, false, true, UINT32_MAX, UINT64_MAX, 0,
                                   static_cast<uint32_t>(kLastErrc) + 1});
  const HeartbeatMsg h = decodeHeartbeat(encode(m));
  CHECK((h.client_id == 7 && h.session == 77 && h.round == 3));
  REQUIRE(h.subtree);
  CHECK(*h.subtree == *m.subtree);
  // The refusal field: the code plus one, 0 none; a code past the last (a newer aggregator's)
  // travels and reads as none.
  CHECK(refusalOf(h.subtree->back().last_refusal) == kLastErrc);
  CHECK(refusalOf(refusalField(Errc::kTruncated)) == Errc::kTruncated);
  CHECK(refusalField(std::nullopt) == 0);
  CHECK(!refusalOf(0));
  m.subtree->back().last_refusal = static_cast<uint32_t>(kLastErrc) + 2;
  REQUIRE(decodeHeartbeat(encode(m)).subtree);
  CHECK(!refusalOf(decodeHeartbeat(encode(m)).subtree->back().last_refusal));
  // A client's (a decoder told it may have none) is refused; too many clients are refused.
  ControlLimits client_limits;
  client_limits.max_subtree = 0;
  CHECK(errcOf([&] { decodeHeartbeat(encode(m), client_limits); }) ==
        errcName(Errc::kUnexpectedMessage));
  m.subtree->assign(kMaxSubtree + 1, SubtreePeer{});
  CHECK(errcOf([&] { decodeHeartbeat(encode(m)); }) == errcName(Errc::kSizeMismatch));
  m.subtree->resize(kMaxSubtree);
  CHECK(decodeHeartbeat(encode(m)).subtree->size() == kMaxSubtree);
}

TEST_CASE("a decoder refuses another message type, truncation and lies", "[protocol]") {
  const auto hb = encode(HeartbeatMsg{1, 2, 3});
  CHECK(errcOf([&] { decodeRegister(hb); }) == errcName(Errc::kUnexpectedMessage));
  std::vector<uint8_t> cut(hb.begin(), hb.end() - 3);
  CHECK(errcOf([&] { decodeHeartbeat(cut); }) == errcName(Errc::kTruncated));
  CHECK(errcOf([&] { decodeHeartbeat(hb, ControlLimits{16}); }) == errcName(Errc::kTooLarge));
  // A negative or NaN loss, an accuracy above 1.
  CHECK(errcOf([&] {
          decodeEvaluation(encode(EvaluationMsg{1, 1, 1, 1, -1.0, 0.5}));
        }) == errcName(Errc::kNonFinite));
  CHECK(errcOf([&] {
          decodeEvaluation(encode(EvaluationMsg{1, 1, 1, 1, std::nan(""), 0.5}));
        }) == errcName(Errc::kNonFinite));
  CHECK(errcOf([&] {
          decodeEvaluation(encode(EvaluationMsg{1, 1, 1, 1, 0.1, 1.5}));
        }) == errcName(Errc::kNonFinite));
  // A finite loss no model reaches (1.7e308 was once accepted, then overflowed the server's
  // weighted mean): refused above ControlLimits::max_eval_loss (1e9), accepted at it.
  CHECK(errcOf([&] {
          decodeEvaluation(encode(EvaluationMsg{1, 1, 1, 1, 1.7e308, 0.5}));
        }) == errcName(Errc::kValueTooLarge));
  CHECK(errcOf([&] {
          decodeEvaluation(encode(EvaluationMsg{1, 1, 1, 1, 1.000001e9, 0.5}));
        }) == errcName(Errc::kValueTooLarge));
  CHECK(decodeEvaluation(encode(EvaluationMsg{1, 1, 1, 1, 1e9, 0.5})).loss == 1e9);
  // Chunks: index past count, count 0, data over the chunk size.
  const std::vector<uint8_t> data(100, 7);
  CHECK(errcOf([&] {
          decodeChunk(encodeChunk(ChunkMsg{1, 3, 3, 300, data}), 4096);
        }) == errcName(Errc::kBadChunk));
  CHECK(errcOf([&] {
          decodeChunk(encodeChunk(ChunkMsg{1, 0, 0, 300, data}), 4096);
        }) == errcName(Errc::kBadChunk));
  CHECK(errcOf([&] { decodeChunk(encodeChunk(ChunkMsg{1, 0, 2, 300, data}), 64); }) != "no error");
  // Too many capabilities.
  RegisterMsg r;
  r.capabilities.assign(17, "x");
  CHECK(errcOf([&] { decodeRegister(encode(r)); }) == errcName(Errc::kSizeMismatch));
}

TEST_CASE("peekKind never reads outside the bytes and refuses garbage", "[protocol]") {
  std::mt19937_64 rng(7);
  const auto good = encode(RegisterMsg{1, Role::kClient, 2, 3, 4, 5, {}});
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> b = good;
    if (i % 2) b.resize(rng() % (good.size() + 1));
    for (int k = 0; k < 3; ++k)
      if (!b.empty()) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    const auto k = peekKind(b);  // must not crash or read out of bounds (ASan build checks it)
    if (k) CHECK(static_cast<int>(*k) >= 1);
  }
  std::vector<uint8_t> tiny{1, 2, 3};
  CHECK(!peekKind(tiny).has_value());
}

TEST_CASE("a task round-trips with its model and shared factors, the nonce is patched in place",
          "[protocol]") {
  const ParamLayout l = fuzz::layout();
  TaskMsg t = sampleTask();
  const auto model = denseModel(l, 3);
  std::vector<uint8_t> bytes = encodeTask(t, views(model));
  CHECK(peekKind(bytes) == MessageKind::kTask);
  TaskMsg d = decodeTask(bytes, l);
  CHECK(d.round == 7);
  CHECK(d.phase == 1);
  CHECK(d.nonce == t.nonce);
  CHECK(d.compressor == t.compressor);
  CHECK(d.model_version == 9);
  CHECK(d.fit.epochs == 2);
  CHECK(d.fit.batch_size == 16);
  CHECK(d.fit.lr == 0.25f);
  CHECK(d.fit.prox_mu == 0.125f);
  CHECK(d.deadline_ms == 1234);
  CHECK(d.metrics == t.metrics);
  CHECK(samePayloads(d.model, model));
  REQUIRE(d.shared.factors.size() == t.shared.factors.size());
  for (size_t i = 0; i < t.shared.factors.size(); ++i)
    CHECK(sameBits(d.shared.factors[i], t.shared.factors[i]));
  CHECK(d.shared.fixed == t.shared.fixed);

  const size_t size_before = bytes.size();
  setTaskNonce(bytes, 12345);
  CHECK(bytes.size() == size_before);
  CHECK(decodeTask(bytes, l).nonce == 12345);
  // A task without a nonce cannot be patched (the field is absent) and is refused by clients.
  t.nonce = 0;
  std::vector<uint8_t> no_nonce = encodeTask(t, {});
  CHECK_THROWS_AS(setTaskNonce(no_nonce, 5), InvalidArgument);
  CHECK(errcOf([&] { decodeTask(no_nonce, l); }) == errcName(Errc::kMissingField));
}

TEST_CASE("decodeTask refuses a model that does not fit, is not finite, or is the wrong kind",
          "[protocol]") {
  const ParamLayout l = fuzz::layout();
  TaskMsg t = sampleTask();
  t.shared = {};
  auto model = denseModel(l, 1);
  // One tensor too few.
  std::vector<cz::Payload> short_model(model.begin(), model.end() - 1);
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(short_model)), l); }) ==
        errcName(Errc::kTensorCountMismatch));
  // A NaN in the model.
  auto nan_model = model;
  std::get<cz::DenseF32>(nan_model[1]).values[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(nan_model)), l); }) ==
        errcName(Errc::kNonFinite));
  // A wrong size.
  auto long_model = model;
  std::get<cz::DenseF32>(long_model[1]).values.push_back(1.0f);
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(long_model)), l); }) ==
        errcName(Errc::kSizeMismatch));
  // Sparse values without a base version, and a dense model claiming one.
  std::vector<cz::Payload> sparse{cz::Sparse{{1}, {2.0f}}, cz::Sparse{{0}, {1.0f}}};
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(sparse)), l); }) ==
        errcName(Errc::kUnexpectedEncoding));
  t.base_version = 4;
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(model)), l); }) ==
        errcName(Errc::kUnexpectedEncoding));
  CHECK(decodeTask(encodeTask(t, views(sparse)), l).base_version == 4);
  // Unsorted delta indices.
  std::vector<cz::Payload> unsorted{cz::Sparse{{5, 1}, {2.0f, 1.0f}}, cz::Sparse{{0}, {1.0f}}};
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(unsorted)), l); }) ==
        errcName(Errc::kIndexOrder));
  // A shared factor larger than its tensor, or not finite.
  t.base_version = 0;
  t.shared.factors = {std::vector<float>(97, 1.0f), {}};
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(model)), l); }) ==
        errcName(Errc::kShapeMismatch));
  t.shared.factors = {std::vector<float>(24, std::numeric_limits<float>::infinity()), {}};
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(model)), l); }) == errcName(Errc::kNonFinite));
}

TEST_CASE("applyModel: whole models overwrite, deltas patch exactly, a wrong base is refused",
          "[protocol]") {
  const ParamLayout l = fuzz::layout();
  std::vector<float> model(l.numel(), 0.0f);
  const auto dense = denseModel(l, 9);
  applyModel(l, 0, 0, dense, model);
  CHECK(sameBits(model, densify(l, dense)));
  std::vector<cz::Payload> half;
  for (const auto& p : dense) {
    cz::DenseF16 h;
    for (float x : std::get<cz::DenseF32>(p).values) h.values.push_back(floatToHalf(x));
    half.push_back(h);
  }
  applyModel(l, 3, 0, half, model);
  CHECK(maxAbsDiff(model, densify(l, dense)) < 1e-2);
  std::vector<float> before = model;
  const std::vector<cz::Payload> delta{cz::Sparse{{0, 95}, {1.5f, -2.5f}},
                                       cz::Sparse{{7}, {0.25f}}};
  applyModel(l, 5, 5, delta, model);
  before[0] = 1.5f;
  before[95] = -2.5f;
  before[96 + 7] = 0.25f;
  CHECK(sameBits(model, before));
  CHECK_THROWS_AS(applyModel(l, 4, 5, delta, model), InvalidArgument);
}

TEST_CASE(
    "a chain of stc refreshes is added refresh by refresh, at base 0, mixed, uneven, too long or "
    "with mu past 1e30 it is refused",
    "[protocol]") {
  const ParamLayout l = fuzz::layout();
  TaskMsg t = sampleTask();
  t.shared = {};
  t.phase = 0;
  t.base_version = 4;
  // Two refreshes of both tensors, as the server's stc downlink makes them.
  std::vector<cz::Payload> chain;
  for (uint64_t r = 0; r < 2; ++r)
    for (const auto& spec : l.tensors())
      chain.push_back(
          cz::ternaryTopK(randomVector(spec.numel, 31 + r + spec.offset), (spec.numel + 3) / 4, r));
  const TaskMsg d = decodeTask(encodeTask(t, views(chain)), l);
  REQUIRE(d.model.size() == 2 * l.size());
  for (size_t i = 0; i < chain.size(); ++i) CHECK(samePayload(d.model[i], chain[i]));
  // Added in turn: the model plus the first refresh, then plus the second (float by float).
  std::vector<float> model = randomVector(l.numel(), 5);
  const std::vector<cz::Payload> first(chain.begin(), chain.begin() + 2);
  const std::vector<cz::Payload> second(chain.begin() + 2, chain.end());
  const std::vector<float> r1 = densify(l, first), r2 = densify(l, second);
  std::vector<float> want = model;
  for (size_t i = 0; i < want.size(); ++i) want[i] = (want[i] + r1[i]) + r2[i];
  applyModel(l, 4, 4, d.model, model);
  CHECK(sameBits(model, want));
  size_t moved = 0;
  for (size_t i = 0; i < r1.size(); ++i) moved += r1[i] != 0.0f;
  CHECK(moved == 24 + 2);  // a quarter of each tensor
  // At base 0 a chain is no model, nor is one refresh.
  t.base_version = 0;
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(chain)), l); }) ==
        errcName(Errc::kTensorCountMismatch));
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(first)), l); }) ==
        errcName(Errc::kUnexpectedEncoding));
  t.base_version = 4;
  // A chain with a sparse delta in it, and one and a half refreshes.
  auto mixed = chain;
  mixed[3] = cz::Sparse{{1}, {2.0f}};
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(mixed)), l); }) ==
        errcName(Errc::kUnexpectedEncoding));
  auto with_levels = chain;  // QSGD levels are a delta alone, never in a chain
  with_levels[1] = cz::Qsgd{0.5f, 7, std::vector<uint8_t>(cz::packedBytes(8, 4), 0)};
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(with_levels)), l); }) ==
        errcName(Errc::kUnexpectedEncoding));
  const std::vector<cz::Payload> uneven(chain.begin(), chain.begin() + 3);
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(uneven)), l); }) ==
        errcName(Errc::kTensorCountMismatch));
  // mu past 1e30, or not a number: a chain's sum with the model could overflow.
  for (float mu : {1e31f, -1e31f, std::numeric_limits<float>::quiet_NaN()}) {
    auto big = chain;
    std::get<cz::Ternary>(big[2]).mu = mu;
    CHECK(errcOf([&] { decodeTask(encodeTask(t, views(big)), l); }) ==
          errcName(Errc::kValueTooLarge));
  }
  // More refreshes than a client takes.
  std::vector<cz::Payload> endless;
  for (size_t r = 0; r <= kMaxRefreshChain; ++r)
    for (size_t i = 0; i < l.size(); ++i) endless.push_back(cz::Ternary{});
  CHECK(errcOf([&] { decodeTask(encodeTask(t, views(endless)), l); }) ==
        errcName(Errc::kTensorCountMismatch));
  endless.resize(kMaxRefreshChain * l.size());
  CHECK(decodeTask(encodeTask(t, views(endless)), l).model.size() == endless.size());
  // applyModel itself: a chain only of ternary payloads, against the version held.
  CHECK_THROWS_AS(applyModel(l, 4, 4, mixed, model), InvalidArgument);
  CHECK_THROWS_AS(applyModel(l, 3, 4, chain, model), InvalidArgument);
  CHECK_THROWS_AS(applyModel(l, 4, 0, chain, model), InvalidArgument);
}

TEST_CASE(
    "a block-scaled downlink decodes to its levels exactly, whole or added, and each malformed "
    "one is refused with its code",
    "[protocol]") {
  const ParamLayout l = fuzz::layout();  // w: 96 values (blocks of 64 and 32), b: 8
  TaskMsg t = sampleTask();
  t.shared = {};
  t.phase = 0;
  t.base_version = 0;
  // w: block 0 on step 2^-3 with codes 0, 1, 2, 3, ...; block 1 zeros. b: step 2^4, codes 3, 2, ...
  const auto pack = [](const std::vector<uint32_t>& codes, uint32_t bits) {
    std::vector<uint8_t> out;
    cz::BitWriter w(out, codes.size(), bits);
    for (uint32_t c : codes) w.put(c, bits);
    w.flush();
    return out;
  };
  std::vector<uint32_t> wc(96, 0), bc(8);
  for (uint32_t i = 0; i < 64; ++i) wc[i] = i % 4;
  for (uint32_t i = 0; i < 8; ++i) bc[i] = 3 - i % 4;
  const std::vector<cz::Payload> honest{cz::BlockQ{2, 64, {-3, cz::kBlockQZero}, pack(wc, 2)},
                                        cz::BlockQ{2, 64, {4}, pack(bc, 2)}};
  std::vector<float> want(l.numel(), 0.0f);
  for (size_t i = 0; i < 64; ++i) want[i] = static_cast<float>(2.0 * wc[i] - 3) / 16;
  for (size_t i = 0; i < 8; ++i) want[96 + i] = static_cast<float>(2.0 * bc[i] - 3) * 8;
  const TaskMsg d = decodeTask(encodeTask(t, views(honest)), l);
  REQUIRE(d.model.size() == 2);
  CHECK(samePayload(d.model[0], honest[0]));
  CHECK(samePayload(d.model[1], honest[1]));
  std::vector<float> model(l.numel(), 7.0f);  // a whole model overwrites what was held
  applyModel(l, 3, 0, d.model, model);
  CHECK(sameBits(model, want));
  // As a refresh against the version held: added, value by value.
  t.base_version = 4;
  const TaskMsg r = decodeTask(encodeTask(t, views(honest)), l);
  std::vector<float> held = randomVector(l.numel(), 3), sum = held;
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += want[i];
  applyModel(l, 4, 4, r.model, held);
  CHECK(sameBits(held, sum));

  const auto refused = [&](std::vector<cz::Payload> tensors, Errc code) {
    return errcOf([&] { decodeTask(encodeTask(t, views(tensors)), l); }) == errcName(code);
  };
  const auto with = [&](auto change) {
    auto tensors = honest;
    change(std::get<cz::BlockQ>(tensors[0]));
    return tensors;
  };
  for (uint64_t base : {uint64_t{0}, uint64_t{4}}) {
    t.base_version = base;
    CAPTURE(base);
    CHECK(refused(with([](cz::BlockQ& q) { q.bits = 0; }), Errc::kLevelOutOfRange));
    CHECK(refused(with([&](cz::BlockQ& q) { q.bits = 9, q.packed.resize(108); }),
                  Errc::kLevelOutOfRange));
    CHECK(refused(with([](cz::BlockQ& q) { q.block = 0; }), Errc::kSizeMismatch));
    CHECK(refused(with([](cz::BlockQ& q) { q.block = 32; }), Errc::kSizeMismatch));  // 3 blocks
    CHECK(refused(with([](cz::BlockQ& q) { q.exps.pop_back(); }), Errc::kSizeMismatch));
    CHECK(refused(with([](cz::BlockQ& q) { q.packed.pop_back(); }), Errc::kSizeMismatch));
    CHECK(refused(with([](cz::BlockQ& q) { q.exps[0] = cz::kBlockQMaxExp + 1; }),
                  Errc::kValueTooLarge));
    CHECK(refused(with([](cz::BlockQ& q) { q.exps[0] = cz::kBlockQMinExp - 1; }),
                  Errc::kValueTooLarge));
    // A block of zeros that carries a level.
    CHECK(refused(with([](cz::BlockQ& q) { q.packed[20] = 1; }), Errc::kLevelOutOfRange));
  }
  // The largest exponent is taken: every level stays below 1e30.
  t.base_version = 0;
  CHECK_NOTHROW(decodeTask(
      encodeTask(t, views(with([](cz::BlockQ& q) { q.exps[0] = cz::kBlockQMaxExp; }))), l));
  // Never in a chain of stc refreshes.
  t.base_version = 4;
  std::vector<cz::Payload> chain;
  for (int rep = 0; rep < 2; ++rep) chain.insert(chain.end(), honest.begin(), honest.end());
  CHECK(refused(chain, Errc::kUnexpectedEncoding));
}

TEST_CASE("a task's FedProx mu is bounded: a server cannot make a client's steps blow up",
          "[protocol]") {
  const ParamLayout l = fuzz::layout();
  const auto model = denseModel(l, 3);
  // lr 0.25 (sampleTask): the proximal term diverges once lr x mu reaches 2, i.e. mu = 8.
  for (float mu :
       {-1.0f, 8.0f, 100.0f, 1e4f * 1.5f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    TaskMsg t = sampleTask();
    t.phase = 0;
    t.fit.prox_mu = mu;
    CAPTURE(mu);
    CHECK_THROWS_MATCHING(decodeTask(encodeTask(t, views(model)), l), InputError,
                          Contains("prox_mu"));
  }
  TaskMsg t = sampleTask();
  t.fit.prox_mu = 7.5f;
  CHECK(decodeTask(encodeTask(t, views(model)), l).fit.prox_mu == 7.5f);
  t.fit.lr = 1e-4f;
  t.fit.prox_mu = 1e4f;
  CHECK(decodeTask(encodeTask(t, views(model)), l).fit.prox_mu == 1e4f);
}

TEST_CASE("decodeTask: SCAFFOLD's control variate only in a phase-0 fit, model-sized and finite",
          "[protocol][scaffold]") {
  const ParamLayout l = fuzz::layout();
  TaskMsg t = sampleTask();
  t.shared = {};
  t.phase = 0;
  const auto model = denseModel(l, 1);
  t.control.assign(l.numel(), 0.25f);
  const TaskMsg back = decodeTask(encodeTask(t, views(model)), l);
  CHECK(back.control == t.control);
  TaskMsg wrong = t;
  wrong.control.pop_back();
  CHECK(errcOf([&] { decodeTask(encodeTask(wrong, views(model)), l); }) ==
        errcName(Errc::kSizeMismatch));
  TaskMsg nan = t;
  nan.control[2] = std::numeric_limits<float>::quiet_NaN();
  CHECK(errcOf([&] { decodeTask(encodeTask(nan, views(model)), l); }) ==
        errcName(Errc::kNonFinite));
  TaskMsg eval = t;
  eval.kind = TaskKind::kEvaluate;
  CHECK(errcOf([&] { decodeTask(encodeTask(eval, views(model)), l); }) ==
        errcName(Errc::kUnexpectedMessage));
  TaskMsg later = t;
  later.phase = 1;
  CHECK(errcOf([&] { decodeTask(encodeTask(later, {}), l); }) ==
        errcName(Errc::kUnexpectedMessage));
  // Without SCAFFOLD a task carries none.
  t.control.clear();
  CHECK(decodeTask(encodeTask(t, views(model)), l).control.empty());
}

TEST_CASE("decodeTask: the secure-aggregation flag on fit tasks of any phase only", "[protocol]") {
  const ParamLayout l = fuzz::layout();
  TaskMsg t = sampleTask();  // phase 1 (two-phase PowerSGD's Q): a secure sum of its own
  t.secure = true;
  CHECK(decodeTask(encodeTask(t, {}), l).secure);
  TaskMsg first = t;
  first.phase = 0;
  first.shared = {};
  const auto model = denseModel(l, 1);
  CHECK(decodeTask(encodeTask(first, views(model)), l).secure);
  TaskMsg eval = first;
  eval.kind = TaskKind::kEvaluate;
  CHECK(errcOf([&] { decodeTask(encodeTask(eval, views(model)), l); }) ==
        errcName(Errc::kUnexpectedMessage));
  t.secure = false;
  CHECK(!decodeTask(encodeTask(t, {}), l).secure);
}

TEST_CASE("a SCAFFOLD task's acknowledgement is present from encoding, patched per client in place",
          "[protocol][scaffold]") {
  const ParamLayout l = fuzz::layout();
  TaskMsg t = sampleTask();
  t.shared = {};
  t.phase = 0;
  const auto model = denseModel(l, 1);
  t.control.assign(l.numel(), 0.5f);
  t.control_ack = 0;  // no round acknowledged: still written, so it can be patched
  std::vector<uint8_t> bytes = encodeTask(t, views(model));
  REQUIRE(decodeTask(bytes, l).control_ack.has_value());
  CHECK(decodeTask(bytes, l).control_ack == 0u);
  const size_t size = bytes.size();
  for (uint64_t round : {7ull, 0ull, ~0ull}) {
    setTaskControlAck(bytes, round);
    CHECK(bytes.size() == size);
    const TaskMsg back = decodeTask(bytes, l);
    CHECK(back.control_ack == round);
    CHECK(back.control == t.control);  // nothing else moved
    CHECK(back.round == t.round);
  }
  t.control_ack = 41;
  CHECK(decodeTask(encodeTask(t, views(model)), l).control_ack == 41);
  // A task without a control variate has no acknowledgement to patch, and reads none.
  t.control.clear();
  std::vector<uint8_t> plain = encodeTask(t, views(model));
  CHECK_THROWS_AS(setTaskControlAck(plain, 3), InvalidArgument);
  CHECK_FALSE(decodeTask(plain, l).control_ack.has_value());
}
