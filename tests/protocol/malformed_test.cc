// The attacker's tests of the decoder: one case per check of protocol/codec.cc (and of the payload
// validation decodeUpdate() runs), each rejected with its own starling::Errc, plus shared tables,
// metrics, messages that claim far more than they carry, and partial aggregates. Allocation is
// counted with a replaced global operator new (this binary only holds the protocol tests).
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>

#include "counting_new.h"
#include "fuzz/fuzz_layout.h"
#include "protocol/codec.h"
#include "protocol/control.h"
#include "protocol/starling_generated.h"
#include "test_util.h"

namespace {
auto& g_bytes = starling::testing::alloc::bytes;
}  // namespace

using namespace starling;
using namespace starling::compression;
using namespace starling::protocol;
namespace fb = starling::wire;
using Builder = flatbuffers::FlatBufferBuilder;
using TensorOff = flatbuffers::Offset<fb::Tensor>;
using MetricsOff = flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Metric>>>;

namespace {

Update valid() { return fuzz::seedUpdates()[0]; }

Update withTensor0(Payload p) {
  Update u = valid();
  u.tensors[0] = std::move(p);
  return u;
}

std::vector<uint8_t> finish(Builder& b, flatbuffers::Offset<fb::Message> m) {
  fb::FinishSizePrefixedMessageBuffer(b, m);
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

std::vector<uint8_t> updateMessage(Builder& b, const std::vector<TensorOff>& ts,
                                   MetricsOff metrics = 0, uint16_t version = kSchemaVersion) {
  auto u = fb::CreateUpdate(b, fuzz::layout().fingerprint(), 0, 0, 1, b.CreateVector(ts), metrics);
  return finish(b, fb::CreateMessage(b, version, fb::Body::Update, u.Union()));
}

TensorOff denseTensor(Builder& b, size_t n) {
  return fb::CreateTensor(
      b, fb::Payload::DenseF32,
      fb::CreateDenseF32(b, b.CreateVector(std::vector<float>(n, 1.0f))).Union());
}

// A message whose first tensor is built by `tensor`, the second a valid dense bias.
std::vector<uint8_t> rawMessage(uint16_t version,
                                const std::function<TensorOff(Builder&)>& tensor) {
  Builder b;
  auto t0 = tensor(b);
  auto t1 = denseTensor(b, 8);
  return updateMessage(b, {t0, t1}, 0, version);
}

TensorOff denseW(Builder& b) { return denseTensor(b, 96); }

// A valid update with these metrics (names as raw bytes, so any byte can be tried).
std::vector<uint8_t> withMetrics(const std::vector<std::pair<std::string, double>>& metrics) {
  Builder b;
  auto t0 = denseW(b);
  auto t1 = denseTensor(b, 8);
  std::vector<flatbuffers::Offset<fb::Metric>> ms;
  for (const auto& [name, value] : metrics)
    ms.push_back(fb::CreateMetric(b, b.CreateString(name), value));
  return updateMessage(b, {t0, t1}, b.CreateVector(ms));
}

struct Case {
  const char* name;
  std::function<std::vector<uint8_t>()> bytes;
  Errc expect;
};

void runCases(const std::vector<Case>& cases, const SharedFactors* shared = nullptr) {
  const ParamLayout layout = fuzz::layout();
  for (const Case& c : cases) {
    INFO(c.name);
    const auto bytes = c.bytes();
    try {
      decodeUpdate(bytes, layout, shared);
      FAIL("accepted: " << c.name);
    } catch (const InputError& e) {
      CHECK(errcName(e.code()) == std::string(errcName(c.expect)));
      CHECK(std::string(e.what()).find(errcName(c.expect)) != std::string::npos);
    }
  }
}

}  // namespace

TEST_CASE("each malformed buffer is rejected with its own error", "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  const auto good = encodeUpdate(valid());
  REQUIRE_NOTHROW(decodeUpdate(good, layout));

  runCases({
      // framing
      {"empty", [] { return std::vector<uint8_t>{}; }, Errc::kTruncated},
      {"cut in the size prefix",
       [&] { return std::vector<uint8_t>(good.begin(), good.begin() + 3); }, Errc::kTruncated},
      {"last byte missing", [&] { return std::vector<uint8_t>(good.begin(), good.end() - 1); },
       Errc::kTruncated},
      {"half missing",
       [&] { return std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 2); },
       Errc::kTruncated},
      {"trailing garbage",
       [&] {
         auto b = good;
         b.push_back(0);
         return b;
       },
       Errc::kTrailingBytes},
      {"size prefix only", [] { return std::vector<uint8_t>{4, 0, 0, 0, 1, 2, 3, 4}; },
       Errc::kTruncated},
      {"wrong identifier",
       [&] {
         auto b = good;
         std::memcpy(b.data() + 8, "XXXX", 4);
         return b;
       },
       Errc::kBadIdentifier},
      // structure
      {"root offset past the end",
       [&] {
         auto b = good;
         b[4] = 0xf0;
         b[5] = 0xff;
         return b;
       },
       Errc::kMalformed},
      {"future schema version", [] { return rawMessage(kSchemaVersion + 1, denseW); },
       Errc::kUnsupportedVersion},
      {"no body",
       [] {
         Builder b;
         return finish(b, fb::CreateMessage(b, kSchemaVersion));
       },
       Errc::kUnexpectedMessage},
      {"body type named, table absent",
       [] {
         Builder b;
         return finish(b, fb::CreateMessage(b, kSchemaVersion, fb::Body::Update));
       },
       Errc::kUnexpectedMessage},
      {"a partial aggregate where an update is expected",
       [] {
         PartialMessage m;
         m.header.layout_fingerprint = fuzz::layout().fingerprint();
         m.tensors = valid().tensors;
         return encodePartial(m);
       },
       Errc::kUnexpectedMessage},
      {"other model",
       [] {
         Update u = valid();
         u.header.layout_fingerprint ^= 1;
         return encodeUpdate(u);
       },
       Errc::kFingerprintMismatch},
      {"no tensor list",
       [] {
         Builder b;
         auto u = fb::CreateUpdate(b, fuzz::layout().fingerprint(), 0, 0, 1);
         return finish(b, fb::CreateMessage(b, kSchemaVersion, fb::Body::Update, u.Union()));
       },
       Errc::kMissingField},
      {"a tensor short",
       [] {
         Update u = valid();
         u.tensors.pop_back();
         return encodeUpdate(u);
       },
       Errc::kTensorCountMismatch},
      {"a tensor too many",
       [] {
         Update u = valid();
         u.tensors.push_back(DenseF32{std::vector<float>(8)});
         return encodeUpdate(u);
       },
       Errc::kTensorCountMismatch},
      {"unknown encoding",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           return fb::CreateTensor(b, static_cast<fb::Payload>(77), fb::CreateDenseF32(b).Union());
         });
       },
       Errc::kUnknownEncoding},
      {"encoding absent",
       [] { return rawMessage(kSchemaVersion, [](auto& b) { return fb::CreateTensor(b); }); },
       Errc::kUnknownEncoding},
      {"encoding named, table absent",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           fb::TensorBuilder tb(b);
           tb.add_payload_type(fb::Payload::Sparse);
           return tb.Finish();
         });
       },
       Errc::kMissingField},
      {"dense f32 without values",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           return fb::CreateTensor(b, fb::Payload::DenseF32, fb::CreateDenseF32(b).Union());
         });
       },
       Errc::kMissingField},
      {"dense f16 without values",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           return fb::CreateTensor(b, fb::Payload::DenseF16, fb::CreateDenseF16(b).Union());
         });
       },
       Errc::kMissingField},
      {"dense bf16 without values",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           return fb::CreateTensor(b, fb::Payload::DenseBF16, fb::CreateDenseBF16(b).Union());
         });
       },
       Errc::kMissingField},
      {"sparse without values",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           auto idx = b.CreateVector(std::vector<uint32_t>{1, 2});
           return fb::CreateTensor(b, fb::Payload::Sparse, fb::CreateSparse(b, idx).Union());
         });
       },
       Errc::kMissingField},
      {"sparse without indices",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           auto val = b.CreateVector(std::vector<float>{1, 2});
           return fb::CreateTensor(b, fb::Payload::Sparse, fb::CreateSparse(b, 0, val).Union());
         });
       },
       Errc::kMissingField},
      {"random block without values",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           return fb::CreateTensor(b, fb::Payload::RandBlock, fb::CreateRandBlock(b, 3).Union());
         });
       },
       Errc::kMissingField},
      {"sign without bits",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           return fb::CreateTensor(b, fb::Payload::Sign, fb::CreateSign(b, 1.0f).Union());
         });
       },
       Errc::kMissingField},
      {"QSGD without levels",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           return fb::CreateTensor(b, fb::Payload::Qsgd, fb::CreateQsgd(b, 1.0f, 4).Union());
         });
       },
       Errc::kMissingField},
      {"ternary without bits",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           return fb::CreateTensor(b, fb::Payload::Ternary,
                                   fb::CreateTernary(b, 1, 1.0f, 2).Union());
         });
       },
       Errc::kMissingField},
      {"ternary bits too short for the signs",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           auto bits = b.CreateVector(std::vector<uint8_t>{0, 0});
           return fb::CreateTensor(b, fb::Payload::Ternary,
                                   fb::CreateTernary(b, 40, 1.0f, 2, bits).Union());
         });
       },
       Errc::kSizeMismatch},
      // payloads against the layout (validatePayload)
      {"dense size lies",
       [] { return encodeUpdate(withTensor0(DenseF32{std::vector<float>(95, 1.0f)})); },
       Errc::kSizeMismatch},
      {"fp16 size lies",
       [] { return encodeUpdate(withTensor0(DenseF16{std::vector<uint16_t>(97, 0)})); },
       Errc::kSizeMismatch},
      {"bf16 size lies",
       [] { return encodeUpdate(withTensor0(DenseBF16{std::vector<uint16_t>(1, 0)})); },
       Errc::kSizeMismatch},
      {"sparse values vs indices",
       [] {
         return encodeUpdate(withTensor0(Sparse{{1, 2}, {1.0f}}));
       },
       Errc::kSizeMismatch},
      {"sign bytes lie",
       [] {
         return encodeUpdate(withTensor0(Sign{1.0f, std::vector<uint8_t>(13, 0)}));
       },
       Errc::kSizeMismatch},
      {"QSGD bytes lie",
       [] {
         return encodeUpdate(withTensor0(Qsgd{1.0f, 3, std::vector<uint8_t>(35, 0)}));
       },
       Errc::kSizeMismatch},
      {"empty random block",
       [] {
         return encodeUpdate(withTensor0(RandBlock{3, {}}));
       },
       Errc::kSizeMismatch},
      {"random block longer than the tensor",
       [] {
         return encodeUpdate(withTensor0(RandBlock{3, std::vector<float>(97, 1.0f)}));
       },
       Errc::kSizeMismatch},
      {"low-rank without factors",
       [] {
         return encodeUpdate(withTensor0(LowRank{8, 12, 2, {}, {}}));
       },
       Errc::kSizeMismatch},
      {"low-rank P size lies",
       [] {
         return encodeUpdate(
             withTensor0(LowRank{8, 12, 2, std::vector<float>(15), std::vector<float>(24)}));
       },
       Errc::kSizeMismatch},
      {"sparse index out of range",
       [] {
         return encodeUpdate(withTensor0(Sparse{{1, 96}, {1.0f, 1.0f}}));
       },
       Errc::kIndexOutOfRange},
      {"block offset out of range",
       [] {
         return encodeUpdate(withTensor0(RandBlock{96, {1.0f}}));
       },
       Errc::kIndexOutOfRange},
      {"duplicate index",
       [] {
         return encodeUpdate(withTensor0(Sparse{{3, 3}, {1.0f, 1.0f}}));
       },
       Errc::kIndexOrder},
      {"unsorted indices",
       [] {
         return encodeUpdate(withTensor0(Sparse{{5, 3}, {1.0f, 1.0f}}));
       },
       Errc::kIndexOrder},
      {"low-rank shape",
       [] {
         return encodeUpdate(
             withTensor0(LowRank{12, 8, 2, std::vector<float>(24), std::vector<float>(16)}));
       },
       Errc::kShapeMismatch},
      {"low-rank rank too big",
       [] {
         return encodeUpdate(
             withTensor0(LowRank{8, 12, 9, std::vector<float>(72), std::vector<float>(108)}));
       },
       Errc::kShapeMismatch},
      {"low-rank rank 0",
       [] {
         return encodeUpdate(withTensor0(LowRank{8, 12, 0, {}, {}}));
       },
       Errc::kShapeMismatch},
      {"NaN value",
       [] {
         std::vector<float> w(96, 1.0f);
         w[40] = std::nanf("");
         return encodeUpdate(withTensor0(DenseF32{w}));
       },
       Errc::kNonFinite},
      {"inf half",
       [] {
         std::vector<uint16_t> h(96, 0x3c00);
         h[3] = 0x7c00;
         return encodeUpdate(withTensor0(DenseF16{h}));
       },
       Errc::kNonFinite},
      {"NaN bf16",
       [] {
         std::vector<uint16_t> h(96, 0x3f80);
         h[95] = 0x7fc0;
         return encodeUpdate(withTensor0(DenseBF16{h}));
       },
       Errc::kNonFinite},
      {"inf sparse value",
       [] {
         return encodeUpdate(withTensor0(Sparse{{1, 2}, {1.0f, INFINITY}}));
       },
       Errc::kNonFinite},
      {"NaN block value",
       [] {
         return encodeUpdate(withTensor0(RandBlock{3, {std::nanf("")}}));
       },
       Errc::kNonFinite},
      {"inf in a low-rank factor",
       [] {
         std::vector<float> q(24, 1.0f);
         q[23] = -INFINITY;
         return encodeUpdate(withTensor0(LowRank{8, 12, 2, std::vector<float>(16), q}));
       },
       Errc::kNonFinite},
      {"negative sign scale",
       [] {
         return encodeUpdate(withTensor0(Sign{-1.0f, std::vector<uint8_t>(12, 0)}));
       },
       Errc::kNonFinite},
      {"NaN sign scale",
       [] {
         return encodeUpdate(withTensor0(Sign{std::nanf(""), std::vector<uint8_t>(12, 0)}));
       },
       Errc::kNonFinite},
      {"inf QSGD norm",
       [] {
         return encodeUpdate(withTensor0(Qsgd{INFINITY, 3, std::vector<uint8_t>(36, 0)}));
       },
       Errc::kNonFinite},
      {"QSGD level above s",
       [] {
         return encodeUpdate(withTensor0(Qsgd{1.0f, 2, std::vector<uint8_t>(36, 0xff)}));
       },
       Errc::kLevelOutOfRange},
      {"QSGD s = 0",
       [] {
         return encodeUpdate(withTensor0(Qsgd{1.0f, 0, std::vector<uint8_t>(24, 0)}));
       },
       Errc::kLevelOutOfRange},
      {"QSGD s > 65535",
       [] {
         return encodeUpdate(withTensor0(Qsgd{1.0f, 65536, std::vector<uint8_t>(216, 0)}));
       },
       Errc::kLevelOutOfRange},
      {"ternary count above numel",
       [] {
         return encodeUpdate(withTensor0(
             Ternary{97, 1.0f, 0, std::vector<uint8_t>(13, 0), std::vector<uint8_t>(13, 0)}));
       },
       Errc::kSizeMismatch},
      {"ternary sign bytes lie",
       [] {
         return encodeUpdate(withTensor0(
             Ternary{3, 1.0f, 4, riceEncode(std::vector<uint32_t>{1, 5, 90}, 4), {0, 0}}));
       },
       Errc::kSizeMismatch},
      {"ternary positions cut short",
       [] {
         auto p = riceEncode(std::vector<uint32_t>{1, 5, 90}, 4);
         p.pop_back();
         return encodeUpdate(withTensor0(Ternary{3, 1.0f, 4, p, {0}}));
       },
       Errc::kSizeMismatch},
      {"ternary position beyond the tensor",
       [] {
         return encodeUpdate(
             withTensor0(Ternary{3, 1.0f, 4, riceEncode(std::vector<uint32_t>{1, 5, 96}, 4), {0}}));
       },
       Errc::kIndexOutOfRange},
      {"ternary Rice parameter 32",
       [] {
         return encodeUpdate(withTensor0(Ternary{1, 1.0f, 32, std::vector<uint8_t>(5, 0), {0}}));
       },
       Errc::kLevelOutOfRange},
      {"NaN ternary mu",
       [] {
         return encodeUpdate(withTensor0(
             Ternary{3, std::nanf(""), 4, riceEncode(std::vector<uint32_t>{1, 5, 90}, 4), {0}}));
       },
       Errc::kNonFinite},
      {"negative ternary mu",
       [] {
         return encodeUpdate(withTensor0(
             Ternary{3, -1.0f, 4, riceEncode(std::vector<uint32_t>{1, 5, 90}, 4), {0}}));
       },
       Errc::kNonFinite},
      {"one factor, no shared factor",
       [] {
         return encodeUpdate(withTensor0(LowRank{8, 12, 2, std::vector<float>(16), {}}));
       },
       Errc::kMissingSharedFactor},
  });
}

TEST_CASE("a one-factor payload needs a shared factor of its side and rank", "[protocol]") {
  const SharedFactors q = fuzz::shared();  // side Q, rank 2
  REQUIRE_NOTHROW(
      decodeUpdate(encodeUpdate(withTensor0(LowRank{8, 12, 2, std::vector<float>(16), {}})),
                   fuzz::layout(), &q));
  runCases(
      {
          {"Q only, shared Q",
           [] {
             return encodeUpdate(withTensor0(LowRank{8, 12, 2, {}, std::vector<float>(24)}));
           },
           Errc::kMissingSharedFactor},
          {"P only, another rank",
           [] {
             return encodeUpdate(withTensor0(LowRank{8, 12, 1, std::vector<float>(8), {}}));
           },
           Errc::kMissingSharedFactor},
      },
      &q);
}

TEST_CASE("non-zero padding after packed bits is rejected", "[protocol]") {
  const ParamLayout layout = [] {
    ParamLayout l;
    l.add("w", {10});
    return l;
  }();
  Update u;
  u.header.layout_fingerprint = layout.fingerprint();
  u.tensors = {Sign{1.0f, {0x00, 0x04}}};  // bit 10 lies past the 10 values
  CHECK(testing::errcOf([&] { decodeUpdate(encodeUpdate(u), layout); }) ==
        errcName(Errc::kBadPadding));
  u.tensors = {Sign{1.0f, {0xff, 0x03}}};
  CHECK_NOTHROW(decodeUpdate(encodeUpdate(u), layout));
  // QSGD s=1: 2 bits per value, 20 bits in 3 bytes; bits 20..23 are padding.
  u.tensors = {Qsgd{1.0f, 1, {0x00, 0x00, 0x10}}};
  CHECK(testing::errcOf([&] { decodeUpdate(encodeUpdate(u), layout); }) ==
        errcName(Errc::kBadPadding));
  u.tensors = {Qsgd{1.0f, 1, {0x00, 0x00, 0x08}}};
  CHECK_NOTHROW(decodeUpdate(encodeUpdate(u), layout));
  // Ternary: 3 signs in one byte (bits 3..7 padding); positions 0, 1, 2 with r = 0 are three 0
  // bits.
  u.tensors = {Ternary{3, 1.0f, 0, {0x00}, {0x08}}};
  CHECK(testing::errcOf([&] { decodeUpdate(encodeUpdate(u), layout); }) ==
        errcName(Errc::kBadPadding));
  u.tensors = {Ternary{3, 1.0f, 0, {0x00}, {0x07}}};
  CHECK_NOTHROW(decodeUpdate(encodeUpdate(u), layout));
  u.tensors = {Ternary{2, 1.0f, 0, {0x04}, {0x00}}};  // positions 0, 1, then a set padding bit
  CHECK(testing::errcOf([&] { decodeUpdate(encodeUpdate(u), layout); }) ==
        errcName(Errc::kBadPadding));
}

TEST_CASE("oversized buffers are refused before parsing", "[protocol]") {
  const auto good = encodeUpdate(valid());
  DecodeLimits o;
  o.max_bytes = good.size() - 1;
  CHECK(testing::errcOf([&] { decodeUpdate(good, fuzz::layout(), nullptr, o); }) ==
        errcName(Errc::kTooLarge));
  o.max_bytes = good.size();
  CHECK_NOTHROW(decodeUpdate(good, fuzz::layout(), nullptr, o));
}

TEST_CASE("tables or vectors referenced twice are refused", "[protocol]") {
  runCases({
      {"both tensors are one Tensor table",
       [] {
         Builder b;
         auto t = denseW(b);
         return updateMessage(b, {t, t});
       },
       Errc::kSharedData},
      {"two payload tables share one vector",
       [] {
         Builder b;
         auto v = b.CreateVector(std::vector<float>(96, 1.0f));
         auto t0 = fb::CreateTensor(b, fb::Payload::DenseF32, fb::CreateDenseF32(b, v).Union());
         auto t1 = fb::CreateTensor(b, fb::Payload::DenseF32, fb::CreateDenseF32(b, v).Union());
         return updateMessage(b, {t0, t1});
       },
       Errc::kSharedData},
      {"sparse indices and values are one vector",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           auto idx = b.CreateVector(std::vector<uint32_t>{1, 2, 3});
           const flatbuffers::Offset<flatbuffers::Vector<float>> same(idx.o);
           return fb::CreateTensor(b, fb::Payload::Sparse, fb::CreateSparse(b, idx, same).Union());
         });
       },
       Errc::kSharedData},
      {"low-rank P and Q are one vector",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           auto p = b.CreateVector(std::vector<float>(24, 0.5f));
           return fb::CreateTensor(b, fb::Payload::LowRank,
                                   fb::CreateLowRank(b, 8, 12, 2, p, p).Union());
         });
       },
       Errc::kSharedData},
  });
}

TEST_CASE("metrics are bounded in number and name, unique and finite", "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  const DecodeLimits limits;
  std::vector<std::pair<std::string, double>> many;
  for (size_t i = 0; i < limits.max_metrics; ++i)
    many.push_back({std::string(1, 'm').append(std::to_string(i)), 1.0});
  REQUIRE_NOTHROW(decodeUpdate(withMetrics(many), layout));
  REQUIRE_NOTHROW(
      decodeUpdate(withMetrics({{std::string(limits.max_metric_name, 'a'), 1.0}}), layout));
  REQUIRE_NOTHROW(decodeUpdate(withMetrics({{"Az09_.-/x", -3.5}}), layout));
  auto too_many = many;
  too_many.push_back({"one_more", 1.0});
  runCases({
      {"one metric too many", [&] { return withMetrics(too_many); }, Errc::kBadMetric},
      {"a name too long",
       [&] {
         return withMetrics({{std::string(limits.max_metric_name + 1, 'a'), 1.0}});
       },
       Errc::kBadMetric},
      {"an empty name",
       [] {
         return withMetrics({{"", 1.0}});
       },
       Errc::kBadMetric},
      {"a space in a name",
       [] {
         return withMetrics({{"train loss", 1.0}});
       },
       Errc::kBadMetric},
      {"a newline in a name",
       [] {
         return withMetrics({{"loss\n", 1.0}});
       },
       Errc::kBadMetric},
      {"a non-ASCII name",
       [] {
         return withMetrics({{"verlust\xc3\xa9", 1.0}});
       },
       Errc::kBadMetric},
      {"a repeated name",
       [] {
         return withMetrics({{"loss", 1.0}, {"acc", 0.5}, {"loss", 2.0}});
       },
       Errc::kBadMetric},
      {"a NaN value",
       [] {
         return withMetrics({{"loss", std::nan("")}});
       },
       Errc::kBadMetric},
      {"an infinite value",
       [] {
         return withMetrics({{"loss", -INFINITY}});
       },
       Errc::kBadMetric},
      {"a metric without a name",
       [] {
         Builder b;
         auto t0 = denseW(b);
         auto t1 = denseTensor(b, 8);
         std::vector<flatbuffers::Offset<fb::Metric>> ms = {fb::CreateMetric(b, 0, 1.0)};
         return updateMessage(b, {t0, t1}, b.CreateVector(ms));
       },
       Errc::kMissingField},
      {"two metrics are one Metric table",
       [] {
         Builder b;
         auto t0 = denseW(b);
         auto t1 = denseTensor(b, 8);
         auto m = fb::CreateMetric(b, b.CreateString("loss"), 1.0);
         return updateMessage(b, {t0, t1},
                              b.CreateVector(std::vector<flatbuffers::Offset<fb::Metric>>{m, m}));
       },
       Errc::kBadMetric},
  });
}

TEST_CASE("a message claiming far more than it carries is refused before per-tensor work",
          "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  Decoder d(layout);
  // One 4 MB table referenced by every tensor: copying per reference would cost 4 MB each.
  auto build = [](size_t tensors) {
    Builder b(size_t{5} << 20);
    auto t = denseTensor(b, size_t{1} << 20);
    return updateMessage(b, std::vector<TensorOff>(tensors, t));
  };
  for (size_t tensors : {size_t{3}, size_t{30}, size_t{10000}}) {
    INFO(tensors << " tensors");
    const auto bytes = build(tensors);
    REQUIRE(reinterpret_cast<uintptr_t>(bytes.data()) % 8 == 0);
    const long before = g_bytes.load();
    const std::string got = testing::errcOf([&] { d.decodeUpdate(bytes); });
    const long allocated = g_bytes.load() - before;
    CHECK((got == errcName(Errc::kTensorCountMismatch) || got == errcName(Errc::kMalformed)));
    // Nothing proportional to the message, let alone to what it claims (the error text is all).
    CHECK(allocated < 64 * 1024);
  }
  // Many metrics pointing at one long name: refused by count or by the verifier's table budget.
  for (size_t metrics : {size_t{33}, size_t{12000}}) {
    INFO(metrics << " metrics");
    Builder b(size_t{1} << 20);
    auto t0 = denseW(b);
    auto t1 = denseTensor(b, 8);
    auto name = b.CreateString(std::string(200000, 'a'));
    std::vector<flatbuffers::Offset<fb::Metric>> ms;
    for (size_t i = 0; i < metrics; ++i) ms.push_back(fb::CreateMetric(b, name, 1.0));
    const auto bytes = updateMessage(b, {t0, t1}, b.CreateVector(ms));
    const long before = g_bytes.load();
    const std::string got = testing::errcOf([&] { d.decodeUpdate(bytes); });
    const long allocated = g_bytes.load() - before;
    CHECK((got == errcName(Errc::kBadMetric) || got == errcName(Errc::kMalformed)));
    CHECK(allocated < 64 * 1024);
  }
}

TEST_CASE("decoding an honest message allocates nothing per message once the decoder is warm",
          "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  Decoder d(layout);
  std::vector<std::vector<uint8_t>> msgs;
  for (const auto& u : fuzz::seedUpdates()) msgs.push_back(encodeUpdate(u));
  for (const auto& m : msgs) d.decodeUpdate(m);  // warm
  const long before = g_bytes.load();
  size_t tensors = 0;
  for (int rep = 0; rep < 10; ++rep)
    for (const auto& m : msgs) tensors += d.decodeUpdate(m).tensors.size();
  CHECK(g_bytes.load() == before);
  CHECK(tensors == 10 * msgs.size() * 2);
}

TEST_CASE("malformed partial aggregates are refused", "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  PartialMessage good;
  good.header.layout_fingerprint = layout.fingerprint();
  good.header.count = 2;
  good.header.total_weight = 3.0;
  good.tensors = valid().tensors;
  good.metrics = {{"loss", 1.0, 3.0}};
  Decoder d(layout);
  REQUIRE(d.decodePartial(encodePartial(good)).header.count == 2u);
  auto with = [&](auto change) {
    PartialMessage m = good;
    change(m);
    return encodePartial(m);
  };
  const std::vector<std::pair<std::vector<uint8_t>, Errc>> cases = {
      {with([](PartialMessage& m) { m.header.layout_fingerprint ^= 1; }),
       Errc::kFingerprintMismatch},
      {with([](PartialMessage& m) { m.tensors.pop_back(); }), Errc::kTensorCountMismatch},
      {with([](PartialMessage& m) { m.metrics[0].weighted_sum = std::nan(""); }), Errc::kBadMetric},
      {with([](PartialMessage& m) { m.metrics[0].weight = INFINITY; }), Errc::kBadMetric},
      {with([](PartialMessage& m) { m.metrics.push_back(m.metrics[0]); }), Errc::kBadMetric},
      {with([](PartialMessage& m) { m.metrics[0].name = "bad name"; }), Errc::kBadMetric},
      {with([](PartialMessage& m) {
         m.metrics.clear();
         for (int i = 0; i < 33; ++i)
           m.metrics.push_back({std::string(1, 'm').append(std::to_string(i)), 1.0, 1.0});
       }),
       Errc::kBadMetric},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i);
    CHECK(testing::errcOf([&] { d.decodePartial(cases[i].first); }) == errcName(cases[i].second));
  }
  // A partial aggregate whose two tensors are one table.
  Builder b;
  auto t = denseW(b);
  auto tv = b.CreateVector(std::vector<TensorOff>{t, t});
  auto body = fb::CreatePartialAggregate(b, layout.fingerprint(), 0, 0, 0, 2, 3.0, tv);
  const auto shared =
      finish(b, fb::CreateMessage(b, kSchemaVersion, fb::Body::PartialAggregate, body.Union()));
  CHECK(testing::errcOf([&] { d.decodePartial(shared); }) == errcName(Errc::kSharedData));
}

TEST_CASE("every single-byte corruption is either rejected or decodes to a checked update",
          "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  const SharedFactors shared = fuzz::shared();
  for (const Update& u : fuzz::seedUpdates()) {
    const auto good = encodeUpdate(u);
    for (size_t i = 0; i < good.size(); ++i) {
      for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
        auto b = good;
        b[i] ^= flip;
        try {
          Update d = decodeUpdate(b, layout, &shared);
          std::vector<float> out(layout.numel());
          densifyUpdate(layout, d.tensors, out, &shared);
          for (float x : out) REQUIRE(std::isfinite(x));
        } catch (const InputError&) {
        }
      }
    }
  }
}

// A SCAFFOLD task from a server older than the acknowledgement field: the field is absent, and
// decodes as absent (not as "round 0 acknowledged", which would make a newer client drop every
// change that such a server, counting all it got, had added to c).
TEST_CASE("a SCAFFOLD task without control_ack decodes as having none", "[protocol][scaffold]") {
  const ParamLayout l = fuzz::layout();
  Builder b;
  std::vector<TensorOff> model;
  for (const auto& t : l.tensors()) model.push_back(denseTensor(b, t.numel));
  auto tv = b.CreateVector(model);
  auto spec = b.CreateString("none");
  auto fit = fb::CreateFitSettings(b, 1, 8, 0.1f, 0.0f);
  auto control = b.CreateVector(std::vector<float>(l.numel(), 0.5f));
  auto task = fb::CreateTask(
      b, fb::TaskKind::Fit, /*round=*/2, /*phase=*/0, /*nonce=*/9, /*run_seed=*/1, spec,
      /*model_version=*/1, /*base_version=*/0, tv, 0, 0, fit, 1000, 0, control);
  const std::vector<uint8_t> old =
      finish(b, fb::CreateMessage(b, kSchemaVersion, fb::Body::Task, task.Union()));
  const TaskMsg m = decodeTask(old, l);
  CHECK(m.control.size() == l.numel());
  CHECK_FALSE(m.control_ack.has_value());
  // encodeTask always writes it for a SCAFFOLD task, 0 included.
  TaskMsg t = m;
  t.control_ack = std::nullopt;
  std::vector<Payload> dense;
  for (const auto& ts : l.tensors()) dense.push_back(DenseF32{std::vector<float>(ts.numel, 1.0f)});
  std::vector<PayloadView> views;
  for (const auto& p : dense) views.push_back(view(p));
  const TaskMsg back = decodeTask(encodeTask(t, views), l);
  REQUIRE(back.control_ack.has_value());
  CHECK(*back.control_ack == 0);
}
