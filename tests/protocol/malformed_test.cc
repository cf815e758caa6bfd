#include <catch2/catch.hpp>

#include <cstring>
#include <functional>

#include "fuzz/fuzz_layout.h"
#include "protocol/codec.h"
#include "protocol/starling_generated.h"

using namespace starling;
using namespace starling::compression;
using namespace starling::protocol;
namespace fb = starling::wire;

namespace {

Update valid() { return fuzz::seedUpdates()[0]; }

Update withTensor0(Payload p) {
  Update u = valid();
  u.tensors[0] = std::move(p);
  return u;
}

std::vector<uint8_t> finish(flatbuffers::FlatBufferBuilder& b, flatbuffers::Offset<fb::Message> m) {
  fb::FinishSizePrefixedMessageBuffer(b, m);
  return {b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize()};
}

// A message whose first tensor is built by `tensor`, the second a valid dense bias.
std::vector<uint8_t> rawMessage(uint16_t version,
                                const std::function<flatbuffers::Offset<fb::Tensor>(flatbuffers::FlatBufferBuilder&)>& tensor) {
  flatbuffers::FlatBufferBuilder b;
  auto t0 = tensor(b);
  auto t1 = fb::CreateTensor(b, fb::Payload::DenseF32, fb::CreateDenseF32(b, b.CreateVector(std::vector<float>(8, 1.0f))).Union());
  std::vector<flatbuffers::Offset<fb::Tensor>> ts = {t0, t1};
  auto u = fb::CreateUpdate(b, fuzz::layout().fingerprint(), 0, 0, 1, b.CreateVector(ts));
  return finish(b, fb::CreateMessage(b, version, fb::Body::Update, u.Union()));
}

flatbuffers::Offset<fb::Tensor> denseW(flatbuffers::FlatBufferBuilder& b) {
  return fb::CreateTensor(b, fb::Payload::DenseF32, fb::CreateDenseF32(b, b.CreateVector(std::vector<float>(96, 1.0f))).Union());
}

struct Case {
  const char* name;
  std::function<std::vector<uint8_t>()> bytes;
  DecodeErrc expect;
};

}  // namespace

TEST_CASE("each malformed buffer is rejected with its own error", "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  const auto good = encodeUpdate(valid());
  REQUIRE_NOTHROW(decodeUpdate(good, layout));
  std::vector<float> nan_w(96, 1.0f);
  nan_w[40] = std::nanf("");
  std::vector<uint16_t> inf_half(96, 0x3c00);
  inf_half[3] = 0x7c00;

  const std::vector<Case> cases = {
      {"empty", [] { return std::vector<uint8_t>{}; }, DecodeErrc::kTruncated},
      {"cut in the size prefix", [&] { return std::vector<uint8_t>(good.begin(), good.begin() + 3); }, DecodeErrc::kTruncated},
      {"last byte missing", [&] { return std::vector<uint8_t>(good.begin(), good.end() - 1); }, DecodeErrc::kTruncated},
      {"half missing", [&] { return std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 2); }, DecodeErrc::kTruncated},
      {"trailing garbage", [&] { auto b = good; b.push_back(0); return b; }, DecodeErrc::kTrailingBytes},
      {"size prefix only", [] { return std::vector<uint8_t>{4, 0, 0, 0, 1, 2, 3, 4}; }, DecodeErrc::kTruncated},
      {"wrong identifier", [&] { auto b = good; std::memcpy(b.data() + 8, "XXXX", 4); return b; }, DecodeErrc::kBadIdentifier},
      {"root offset past the end", [&] { auto b = good; b[4] = 0xf0; b[5] = 0xff; return b; }, DecodeErrc::kMalformed},
      {"future schema version", [] { return rawMessage(kSchemaVersion + 1, denseW); }, DecodeErrc::kUnsupportedVersion},
      {"no body",
       [] {
         flatbuffers::FlatBufferBuilder b;
         return finish(b, fb::CreateMessage(b, kSchemaVersion));
       },
       DecodeErrc::kUnexpectedMessage},
      {"unknown encoding",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           return fb::CreateTensor(b, static_cast<fb::Payload>(77), fb::CreateDenseF32(b).Union());
         });
       },
       DecodeErrc::kUnknownEncoding},
      {"encoding named, table absent",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           fb::TensorBuilder tb(b);
           tb.add_payload_type(fb::Payload::Sparse);
           return tb.Finish();
         });
       },
       DecodeErrc::kMissingField},
      {"encoding absent", [] { return rawMessage(kSchemaVersion, [](auto& b) { return fb::CreateTensor(b); }); },
       DecodeErrc::kUnknownEncoding},
      {"sparse without values",
       [] {
         return rawMessage(kSchemaVersion, [](auto& b) {
           auto idx = b.CreateVector(std::vector<uint32_t>{1, 2});
           return fb::CreateTensor(b, fb::Payload::Sparse, fb::CreateSparse(b, idx).Union());
         });
       },
       DecodeErrc::kMissingField},
      {"other model", [] { Update u = valid(); u.layout_fingerprint ^= 1; return encodeUpdate(u); }, DecodeErrc::kFingerprintMismatch},
      {"a tensor short", [] { Update u = valid(); u.tensors.pop_back(); return encodeUpdate(u); }, DecodeErrc::kTensorCountMismatch},
      {"dense size lies", [] { return encodeUpdate(withTensor0(DenseF32{std::vector<float>(95, 1.0f)})); }, DecodeErrc::kSizeMismatch},
      {"sparse values vs indices", [] { return encodeUpdate(withTensor0(Sparse{{1, 2}, {1.0f}})); }, DecodeErrc::kSizeMismatch},
      {"sign bytes lie", [] { return encodeUpdate(withTensor0(Sign{1.0f, std::vector<uint8_t>(13, 0)})); }, DecodeErrc::kSizeMismatch},
      {"sparse index out of range", [] { return encodeUpdate(withTensor0(Sparse{{1, 96}, {1.0f, 1.0f}})); }, DecodeErrc::kIndexOutOfRange},
      {"block offset out of range", [] { return encodeUpdate(withTensor0(RandBlock{96, {1.0f}})); }, DecodeErrc::kIndexOutOfRange},
      {"duplicate index", [] { return encodeUpdate(withTensor0(Sparse{{3, 3}, {1.0f, 1.0f}})); }, DecodeErrc::kDuplicateIndex},
      {"unsorted indices", [] { return encodeUpdate(withTensor0(Sparse{{5, 3}, {1.0f, 1.0f}})); }, DecodeErrc::kDuplicateIndex},
      {"low-rank shape", [] { return encodeUpdate(withTensor0(LowRank{12, 8, 2, std::vector<float>(24), std::vector<float>(16)})); }, DecodeErrc::kShapeMismatch},
      {"low-rank rank too big", [] { return encodeUpdate(withTensor0(LowRank{8, 12, 9, std::vector<float>(72), std::vector<float>(108)})); }, DecodeErrc::kShapeMismatch},
      {"NaN value", [&] { return encodeUpdate(withTensor0(DenseF32{nan_w})); }, DecodeErrc::kNonFinite},
      {"inf half", [&] { return encodeUpdate(withTensor0(DenseF16{inf_half})); }, DecodeErrc::kNonFinite},
      {"negative sign scale", [] { return encodeUpdate(withTensor0(Sign{-1.0f, std::vector<uint8_t>(12, 0)})); }, DecodeErrc::kNonFinite},
      {"QSGD level above s", [] { return encodeUpdate(withTensor0(Qsgd{1.0f, 2, std::vector<uint8_t>(36, 0xff)})); }, DecodeErrc::kLevelOutOfRange},
      {"QSGD s = 0", [] { return encodeUpdate(withTensor0(Qsgd{1.0f, 0, std::vector<uint8_t>(24, 0)})); }, DecodeErrc::kLevelOutOfRange},
      {"one factor, no shared factor", [] { return encodeUpdate(withTensor0(LowRank{8, 12, 2, std::vector<float>(16), {}})); }, DecodeErrc::kMissingSharedFactor},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const auto bytes = c.bytes();
    try {
      decodeUpdate(bytes, layout);
      FAIL("accepted: " << c.name);
    } catch (const DecodeError& e) {
      CHECK(e.code() == c.expect);
      CHECK(std::string(e.what()).find(decodeErrcName(c.expect)) != std::string::npos);
    }
  }
}

TEST_CASE("non-zero padding after packed bits is rejected", "[protocol]") {
  const ParamLayout layout = [] {
    ParamLayout l;
    l.add("w", {10});
    return l;
  }();
  Update u;
  u.layout_fingerprint = layout.fingerprint();
  u.tensors = {Sign{1.0f, {0x00, 0x04}}};  // bit 10 lies past the 10 values
  try {
    decodeUpdate(encodeUpdate(u), layout);
    FAIL("accepted");
  } catch (const DecodeError& e) {
    CHECK(e.code() == DecodeErrc::kBadPadding);
  }
  u.tensors = {Sign{1.0f, {0xff, 0x03}}};
  CHECK_NOTHROW(decodeUpdate(encodeUpdate(u), layout));
}

TEST_CASE("oversized buffers are refused before parsing", "[protocol]") {
  const auto good = encodeUpdate(valid());
  DecodeOptions o;
  o.max_bytes = good.size() - 1;
  try {
    decodeUpdate(good, fuzz::layout(), nullptr, o);
    FAIL("accepted");
  } catch (const DecodeError& e) {
    CHECK(e.code() == DecodeErrc::kTooLarge);
  }
}

TEST_CASE("every single-byte corruption is either rejected or decodes to a checked update", "[protocol]") {
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
        } catch (const DecodeError&) {
        }
      }
    }
  }
}
