#include "protocol/codec.h"

#include <cstring>
#include <memory>

#include "core/overloaded.h"
#include "protocol/starling_generated.h"

namespace starling::protocol {
namespace fb = starling::wire;
namespace cz = starling::compression;

const char* decodeErrcName(DecodeErrc c) {
  switch (c) {
    case DecodeErrc::kTruncated: return "truncated";
    case DecodeErrc::kTrailingBytes: return "trailing bytes";
    case DecodeErrc::kTooLarge: return "too large";
    case DecodeErrc::kBadIdentifier: return "bad identifier";
    case DecodeErrc::kMalformed: return "malformed";
    case DecodeErrc::kUnsupportedVersion: return "unsupported version";
    case DecodeErrc::kUnexpectedMessage: return "unexpected message";
    case DecodeErrc::kUnknownEncoding: return "unknown encoding";
    case DecodeErrc::kMissingField: return "missing field";
    case DecodeErrc::kFingerprintMismatch: return "fingerprint mismatch";
    case DecodeErrc::kTensorCountMismatch: return "tensor count mismatch";
    case DecodeErrc::kSizeMismatch: return "size mismatch";
    case DecodeErrc::kIndexOutOfRange: return "index out of range";
    case DecodeErrc::kDuplicateIndex: return "duplicate or unsorted index";
    case DecodeErrc::kShapeMismatch: return "shape mismatch";
    case DecodeErrc::kNonFinite: return "non-finite value";
    case DecodeErrc::kLevelOutOfRange: return "level out of range";
    case DecodeErrc::kMissingSharedFactor: return "missing shared factor";
    case DecodeErrc::kBadPadding: return "bad padding";
  }
  return "unknown";
}

namespace {

[[noreturn]] void fail(DecodeErrc code, const std::string& msg) { throw DecodeError(code, msg); }

DecodeErrc fromPayloadErrc(cz::PayloadErrc c) {
  switch (c) {
    case cz::PayloadErrc::kSizeMismatch: return DecodeErrc::kSizeMismatch;
    case cz::PayloadErrc::kIndexOutOfRange: return DecodeErrc::kIndexOutOfRange;
    case cz::PayloadErrc::kIndexOrder: return DecodeErrc::kDuplicateIndex;
    case cz::PayloadErrc::kShapeMismatch: return DecodeErrc::kShapeMismatch;
    case cz::PayloadErrc::kNonFinite: return DecodeErrc::kNonFinite;
    case cz::PayloadErrc::kLevelOutOfRange: return DecodeErrc::kLevelOutOfRange;
    case cz::PayloadErrc::kMissingSharedFactor: return DecodeErrc::kMissingSharedFactor;
    case cz::PayloadErrc::kBadPadding: return DecodeErrc::kBadPadding;
  }
  return DecodeErrc::kMalformed;
}

flatbuffers::Offset<fb::Tensor> encodeTensor(flatbuffers::FlatBufferBuilder& b, const cz::Payload& p) {
  return std::visit(
      Overloaded{
          [&](const cz::DenseF32& d) {
            return fb::CreateTensor(b, fb::Payload::DenseF32, fb::CreateDenseF32(b, b.CreateVector(d.values)).Union());
          },
          [&](const cz::DenseF16& d) {
            return fb::CreateTensor(b, fb::Payload::DenseF16, fb::CreateDenseF16(b, b.CreateVector(d.values)).Union());
          },
          [&](const cz::DenseBF16& d) {
            return fb::CreateTensor(b, fb::Payload::DenseBF16,
                                    fb::CreateDenseBF16(b, b.CreateVector(d.values)).Union());
          },
          [&](const cz::Sparse& s) {
            auto idx = b.CreateVector(s.indices);
            auto val = b.CreateVector(s.values);
            return fb::CreateTensor(b, fb::Payload::Sparse, fb::CreateSparse(b, idx, val).Union());
          },
          [&](const cz::RandBlock& r) {
            auto val = b.CreateVector(r.values);
            return fb::CreateTensor(b, fb::Payload::RandBlock, fb::CreateRandBlock(b, r.offset, val).Union());
          },
          [&](const cz::LowRank& l) {
            flatbuffers::Offset<flatbuffers::Vector<float>> p_off, q_off;
            if (!l.p.empty()) p_off = b.CreateVector(l.p);
            if (!l.q.empty()) q_off = b.CreateVector(l.q);
            return fb::CreateTensor(b, fb::Payload::LowRank,
                                    fb::CreateLowRank(b, l.rows, l.cols, l.rank, p_off, q_off).Union());
          },
          [&](const cz::Sign& s) {
            auto bits = b.CreateVector(s.bits);
            return fb::CreateTensor(b, fb::Payload::Sign, fb::CreateSign(b, s.scale, bits).Union());
          },
          [&](const cz::Qsgd& q) {
            auto packed = b.CreateVector(q.packed);
            return fb::CreateTensor(b, fb::Payload::Qsgd, fb::CreateQsgd(b, q.norm, q.s, packed).Union());
          },
      },
      p);
}

template <class T>
std::vector<T> copyOut(const flatbuffers::Vector<T>* v, const char* what, size_t tensor) {
  if (!v) fail(DecodeErrc::kMissingField, "tensor " + std::to_string(tensor) + ": " + what + " is absent");
  return std::vector<T>(v->begin(), v->end());
}

cz::Payload decodeTensor(const fb::Tensor* t, size_t i) {
  if (!t) fail(DecodeErrc::kMissingField, "tensor " + std::to_string(i) + " is null");
  // The verifier accepts a union whose type is set but whose table is absent.
  if (t->payload_type() != fb::Payload::NONE && !t->payload())
    fail(DecodeErrc::kMissingField, "tensor " + std::to_string(i) + " names an encoding but carries no payload");
  switch (t->payload_type()) {
    case fb::Payload::DenseF32: {
      auto* d = t->payload_as_DenseF32();
      return cz::DenseF32{copyOut(d->values(), "dense values", i)};
    }
    case fb::Payload::DenseF16:
      return cz::DenseF16{copyOut(t->payload_as_DenseF16()->values(), "fp16 values", i)};
    case fb::Payload::DenseBF16:
      return cz::DenseBF16{copyOut(t->payload_as_DenseBF16()->values(), "bf16 values", i)};
    case fb::Payload::Sparse: {
      auto* s = t->payload_as_Sparse();
      return cz::Sparse{copyOut(s->indices(), "sparse indices", i), copyOut(s->values(), "sparse values", i)};
    }
    case fb::Payload::RandBlock: {
      auto* r = t->payload_as_RandBlock();
      return cz::RandBlock{r->offset(), copyOut(r->values(), "block values", i)};
    }
    case fb::Payload::LowRank: {
      auto* l = t->payload_as_LowRank();
      cz::LowRank out{l->rows(), l->cols(), l->rank(), {}, {}};
      if (l->p()) out.p.assign(l->p()->begin(), l->p()->end());
      if (l->q()) out.q.assign(l->q()->begin(), l->q()->end());
      return out;
    }
    case fb::Payload::Sign: {
      auto* s = t->payload_as_Sign();
      return cz::Sign{s->scale(), copyOut(s->bits(), "sign bits", i)};
    }
    case fb::Payload::Qsgd: {
      auto* q = t->payload_as_Qsgd();
      return cz::Qsgd{q->norm(), q->s(), copyOut(q->packed(), "QSGD levels", i)};
    }
    default:
      fail(DecodeErrc::kUnknownEncoding, "tensor " + std::to_string(i) + " has payload type " +
                                             std::to_string(static_cast<int>(t->payload_type())) +
                                             ", unknown to this build");
  }
}

// Checks framing, identifier, structure and version; returns the verified message.
const fb::Message* verifyMessage(std::span<const uint8_t> bytes, const DecodeOptions& o,
                                 std::unique_ptr<uint64_t[]>& aligned) {
  if (bytes.size() > o.max_bytes)
    fail(DecodeErrc::kTooLarge, std::to_string(bytes.size()) + " bytes exceed the limit of " + std::to_string(o.max_bytes));
  if (bytes.size() < 4) fail(DecodeErrc::kTruncated, "only " + std::to_string(bytes.size()) + " bytes, no size prefix");
  uint32_t declared = 0;
  for (int i = 0; i < 4; ++i) declared |= static_cast<uint32_t>(bytes[i]) << (8 * i);
  const size_t body = bytes.size() - 4;
  if (declared > body)
    fail(DecodeErrc::kTruncated, "size prefix announces " + std::to_string(declared) + " bytes, " +
                                     std::to_string(body) + " arrived");
  if (declared < body)
    fail(DecodeErrc::kTrailingBytes, std::to_string(body - declared) + " bytes after the announced " +
                                         std::to_string(declared));
  if (body < 8) fail(DecodeErrc::kTruncated, "message body of " + std::to_string(body) + " bytes is too short");
  if (std::memcmp(bytes.data() + 8, fb::MessageIdentifier(), 4) != 0)
    fail(DecodeErrc::kBadIdentifier, "file identifier is not \"STRL\": not a Starling message");
  const uint8_t* data = bytes.data();
  if (reinterpret_cast<uintptr_t>(data) % 8 != 0) {  // FlatBuffers reads scalars in place: realign
    aligned.reset(new uint64_t[(bytes.size() + 7) / 8]);
    std::memcpy(aligned.get(), data, bytes.size());
    data = reinterpret_cast<const uint8_t*>(aligned.get());
  }
  flatbuffers::Verifier verifier(data, bytes.size(), /*max_depth=*/16, /*max_tables=*/4'000'000);
  if (!fb::VerifySizePrefixedMessageBuffer(verifier))
    fail(DecodeErrc::kMalformed, "the FlatBuffers verifier rejected the buffer (corrupt offsets or lengths)");
  const fb::Message* msg = fb::GetSizePrefixedMessage(data);
  if (msg->schema_version() != kSchemaVersion)
    fail(DecodeErrc::kUnsupportedVersion, "schema version " + std::to_string(msg->schema_version()) +
                                              ", this build speaks " + std::to_string(kSchemaVersion));
  return msg;
}

cz::Update decodeStructure(const fb::Message* msg) {
  if (msg->body_type() != fb::Body::Update || !msg->body_as_Update())
    fail(DecodeErrc::kUnexpectedMessage, "expected an Update, got body type " +
                                             std::to_string(static_cast<int>(msg->body_type())));
  const fb::Update* u = msg->body_as_Update();
  cz::Update out;
  out.layout_fingerprint = u->layout_fingerprint();
  out.round = u->round();
  out.client_id = u->client_id();
  out.num_examples = u->num_examples();
  if (!u->tensors()) fail(DecodeErrc::kMissingField, "update has no tensor list");
  out.tensors.reserve(u->tensors()->size());
  for (flatbuffers::uoffset_t i = 0; i < u->tensors()->size(); ++i)
    out.tensors.push_back(decodeTensor(u->tensors()->Get(i), i));
  if (u->metrics()) {
    for (flatbuffers::uoffset_t i = 0; i < u->metrics()->size(); ++i) {
      const fb::Metric* m = u->metrics()->Get(i);
      if (!m || !m->name()) fail(DecodeErrc::kMissingField, "metric " + std::to_string(i) + " has no name");
      out.metrics.push_back({m->name()->str(), m->value()});
    }
  }
  return out;
}

}  // namespace

std::vector<uint8_t> encodeUpdate(const cz::Update& update) {
  size_t estimate = 256;
  for (const auto& p : update.tensors) estimate += cz::payloadDataBytes(p) + 32;
  flatbuffers::FlatBufferBuilder b(estimate);
  std::vector<flatbuffers::Offset<fb::Tensor>> tensors;
  tensors.reserve(update.tensors.size());
  for (const auto& p : update.tensors) tensors.push_back(encodeTensor(b, p));
  std::vector<flatbuffers::Offset<fb::Metric>> metrics;
  for (const auto& m : update.metrics) metrics.push_back(fb::CreateMetric(b, b.CreateString(m.name), m.value));
  auto tv = b.CreateVector(tensors);
  auto mv = b.CreateVector(metrics);
  auto u = fb::CreateUpdate(b, update.layout_fingerprint, update.round, update.client_id, update.num_examples, tv, mv);
  auto msg = fb::CreateMessage(b, kSchemaVersion, fb::Body::Update, u.Union());
  fb::FinishSizePrefixedMessageBuffer(b, msg);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

size_t encodedSize(const cz::Update& update) { return encodeUpdate(update).size(); }

cz::Update decodeUpdateUnchecked(std::span<const uint8_t> bytes, const DecodeOptions& options) {
  std::unique_ptr<uint64_t[]> aligned;
  return decodeStructure(verifyMessage(bytes, options, aligned));
}

cz::Update decodeUpdate(std::span<const uint8_t> bytes, const ParamLayout& layout, const cz::SharedFactors* shared,
                        const DecodeOptions& options) {
  cz::Update u = decodeUpdateUnchecked(bytes, options);
  if (u.layout_fingerprint != layout.fingerprint())
    fail(DecodeErrc::kFingerprintMismatch, "update is for model fingerprint " + std::to_string(u.layout_fingerprint) +
                                               ", expected " + std::to_string(layout.fingerprint()));
  if (u.tensors.size() != layout.size())
    fail(DecodeErrc::kTensorCountMismatch, "update carries " + std::to_string(u.tensors.size()) +
                                               " tensors, the model has " + std::to_string(layout.size()));
  for (size_t i = 0; i < u.tensors.size(); ++i) {
    try {
      cz::validatePayload(u.tensors[i], layout[i], shared, i);
    } catch (const cz::PayloadError& e) {
      fail(fromPayloadErrc(e.code()), e.what());
    }
  }
  return u;
}

}  // namespace starling::protocol
