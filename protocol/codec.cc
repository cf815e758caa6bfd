#include "protocol/codec.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>

#include "compression/bitpack.h"
#include "core/overloaded.h"
#include "protocol/starling_generated.h"
#include "protocol/verify.h"

// Views read FlatBuffers' little-endian scalars in place.
static_assert(std::endian::native == std::endian::little,
              "the zero-copy decoder needs a little-endian host");

namespace starling::protocol {
namespace fb = starling::wire;
namespace cz = starling::compression;

namespace {

template <class T>
std::span<const T> spanOf(const flatbuffers::Vector<T>* v) {
  return v ? std::span<const T>(v->data(), v->size()) : std::span<const T>();
}

// ---------------------------------------------------------------- encoding

template <class T>
flatbuffers::Offset<flatbuffers::Vector<T>> vec(flatbuffers::FlatBufferBuilder& b,
                                                std::span<const T> s) {
  return b.CreateVector(s.data(), s.size());
}

flatbuffers::Offset<fb::Tensor> encodeTensor(flatbuffers::FlatBufferBuilder& b,
                                             const cz::PayloadView& p) {
  return std::visit(
      Overloaded{
          [&](const cz::DenseF32View& d) {
            return fb::CreateTensor(b, fb::Payload::DenseF32,
                                    fb::CreateDenseF32(b, vec(b, d.values)).Union());
          },
          [&](const cz::DenseF16View& d) {
            return fb::CreateTensor(b, fb::Payload::DenseF16,
                                    fb::CreateDenseF16(b, vec(b, d.values)).Union());
          },
          [&](const cz::DenseBF16View& d) {
            return fb::CreateTensor(b, fb::Payload::DenseBF16,
                                    fb::CreateDenseBF16(b, vec(b, d.values)).Union());
          },
          [&](const cz::SparseView& s) {
            auto idx = vec(b, s.indices);
            auto val = vec(b, s.values);
            return fb::CreateTensor(b, fb::Payload::Sparse, fb::CreateSparse(b, idx, val).Union());
          },
          [&](const cz::RandBlockView& r) {
            auto val = vec(b, r.values);
            return fb::CreateTensor(b, fb::Payload::RandBlock,
                                    fb::CreateRandBlock(b, r.offset, val).Union());
          },
          [&](const cz::LowRankView& l) {
            flatbuffers::Offset<flatbuffers::Vector<float>> p_off, q_off;
            if (!l.p.empty()) p_off = vec(b, l.p);
            if (!l.q.empty()) q_off = vec(b, l.q);
            return fb::CreateTensor(
                b, fb::Payload::LowRank,
                fb::CreateLowRank(b, l.rows, l.cols, l.rank, p_off, q_off).Union());
          },
          [&](const cz::SignView& s) {
            auto bits = vec(b, s.bits);
            return fb::CreateTensor(b, fb::Payload::Sign, fb::CreateSign(b, s.scale, bits).Union());
          },
          [&](const cz::QsgdView& q) {
            auto packed = vec(b, q.packed);
            return fb::CreateTensor(b, fb::Payload::Qsgd,
                                    fb::CreateQsgd(b, q.norm, q.s, packed).Union());
          },
          [&](const cz::TernaryView& x) {
            uint8_t* dst = nullptr;
            auto bits = b.CreateUninitializedVector(x.signs.size() + x.positions.size(), &dst);
            if (!x.signs.empty()) std::memcpy(dst, x.signs.data(), x.signs.size());
            if (!x.positions.empty())
              std::memcpy(dst + x.signs.size(), x.positions.data(), x.positions.size());
            return fb::CreateTensor(b, fb::Payload::Ternary,
                                    fb::CreateTernary(b, x.count, x.mu, x.rice, bits).Union());
          },
          [&](const cz::BlockQView& q) {
            auto exps = vec(b, q.exps);
            auto packed = vec(b, q.packed);
            return fb::CreateTensor(b, fb::Payload::BlockQ,
                                    fb::CreateBlockQ(b, q.bits, q.block, exps, packed).Union());
          },
      },
      p);
}

size_t estimate(std::span<const cz::PayloadView> tensors) {
  size_t e = 256;
  for (const auto& p : tensors) e += cz::payloadDataBytes(p) + 32;
  return e;
}

using detail::finish;

// ---------------------------------------------------------------- decoding

[[noreturn]] void fail(Errc code, const std::string& msg) { throw InputError(code, msg); }

}  // namespace

void DecodeLimits::validate() const {
  if (max_bytes < 64 || max_bytes > (size_t{2} << 30) - 1)
    STARLING_THROW(ConfigError, "decode limits: max_bytes must be in [64, 2^31), got ", max_bytes);
  // The uniqueness check compares names pairwise: these caps keep it to ~8M byte compares.
  if (max_metrics > 256)
    STARLING_THROW(ConfigError, "decode limits: max_metrics must be <= 256, got ", max_metrics);
  if (max_metric_name == 0 || max_metric_name > 256)
    STARLING_THROW(ConfigError, "decode limits: max_metric_name must be in [1, 256], got ",
                   max_metric_name);
}

std::vector<uint8_t> encodeUpdate(const cz::UpdateView& u) {
  flatbuffers::FlatBufferBuilder b(estimate(u.tensors) + u.control.size_bytes());
  auto tensors = detail::encodeTensors(b, u.tensors);
  std::vector<flatbuffers::Offset<fb::Metric>> metrics;
  for (const auto& m : u.metrics)
    metrics.push_back(fb::CreateMetric(b, b.CreateString(m.name.data(), m.name.size()), m.value));
  auto tv = b.CreateVector(tensors);
  auto mv = b.CreateVector(metrics);
  flatbuffers::Offset<flatbuffers::Vector<float>> cv;
  if (!u.control.empty()) cv = b.CreateVector(u.control.data(), u.control.size());
  const auto& h = u.header;
  auto body = fb::CreateUpdate(b, h.layout_fingerprint, h.round, h.client_id, h.num_examples, tv,
                               mv, h.phase, h.nonce, cv);
  return finish(b, fb::Body::Update, body.Union());
}

size_t encodedSize(const cz::UpdateView& u) { return encodeUpdate(u).size(); }

std::vector<uint8_t> encodePartial(const cz::PartialView& m) {
  flatbuffers::FlatBufferBuilder b(estimate(m.tensors) + m.control.size_bytes());
  auto tensors = detail::encodeTensors(b, m.tensors);
  std::vector<flatbuffers::Offset<fb::MetricSum>> metrics;
  for (const auto& x : m.metrics)
    metrics.push_back(fb::CreateMetricSum(b, b.CreateString(x.name.data(), x.name.size()),
                                          x.weighted_sum, x.weight));
  auto tv = b.CreateVector(tensors);
  auto mv = b.CreateVector(metrics);
  flatbuffers::Offset<flatbuffers::Vector<float>> cv;
  if (!m.control.empty()) cv = b.CreateVector(m.control.data(), m.control.size());
  const auto& h = m.header;
  auto body = fb::CreatePartialAggregate(b, h.layout_fingerprint, h.round, h.phase, h.shared_tag,
                                         h.count, h.total_weight, tv, mv, h.nonce, cv);
  return finish(b, fb::Body::PartialAggregate, body.Union());
}

Decoder::Decoder(const ParamLayout& layout, DecodeLimits limits)
    : layout_(layout), limits_(limits) {
  limits_.validate();
}

namespace detail {

std::vector<flatbuffers::Offset<fb::Tensor>> encodeTensors(
    flatbuffers::FlatBufferBuilder& b, std::span<const cz::PayloadView> tensors) {
  std::vector<flatbuffers::Offset<fb::Tensor>> out;
  out.reserve(tensors.size());
  for (const auto& p : tensors) out.push_back(encodeTensor(b, p));
  return out;
}

const wire::Message* verifyMessage(std::span<const uint8_t> bytes, size_t max_bytes,
                                   size_t max_tables, std::vector<uint64_t>& aligned,
                                   uint64_t* realigned) {
  if (bytes.size() > max_bytes)
    fail(Errc::kTooLarge,
         std::to_string(bytes.size()) + " bytes exceed the limit of " + std::to_string(max_bytes));
  if (bytes.size() < 4)
    fail(Errc::kTruncated, "only " + std::to_string(bytes.size()) + " bytes, no size prefix");
  uint32_t declared = 0;
  for (int i = 0; i < 4; ++i) declared |= static_cast<uint32_t>(bytes[i]) << (8 * i);
  const size_t body = bytes.size() - 4;
  if (declared > body)
    fail(Errc::kTruncated, "size prefix announces " + std::to_string(declared) + " bytes, " +
                               std::to_string(body) + " arrived");
  if (declared < body)
    fail(Errc::kTrailingBytes, std::to_string(body - declared) + " bytes after the announced " +
                                   std::to_string(declared));
  if (body < 8)
    fail(Errc::kTruncated, "message body of " + std::to_string(body) + " bytes is too short");
  if (std::memcmp(bytes.data() + 8, fb::MessageIdentifier(), 4) != 0)
    fail(Errc::kBadIdentifier, "file identifier is not \"STRL\": not a Starling message");
  const uint8_t* data = bytes.data();
  if (reinterpret_cast<uintptr_t>(data) % 8 != 0) {
    // FlatBuffers reads scalars in place and our views are typed spans: realign (a ZeroMQ frame
    // need not be 8-byte aligned). The only copy the decoder ever makes.
    aligned.resize((bytes.size() + 7) / 8);
    std::memcpy(aligned.data(), data, bytes.size());
    data = reinterpret_cast<const uint8_t*>(aligned.data());
    if (realigned) *realigned += bytes.size();
  }
  flatbuffers::Verifier verifier(data, bytes.size(), /*max_depth=*/16,
                                 static_cast<flatbuffers::uoffset_t>(max_tables));
  if (!fb::VerifySizePrefixedMessageBuffer(verifier))
    fail(Errc::kMalformed,
         "the FlatBuffers verifier rejected the buffer (corrupt offsets or lengths, or over " +
             std::to_string(max_tables) + " tables)");
  const fb::Message* msg = fb::GetSizePrefixedMessage(data);
  if (msg->schema_version() != kSchemaVersion)
    fail(Errc::kUnsupportedVersion, "schema version " + std::to_string(msg->schema_version()) +
                                        ", this build speaks " + std::to_string(kSchemaVersion));
  return msg;
}

std::vector<uint8_t> finish(flatbuffers::FlatBufferBuilder& b, fb::Body type,
                            flatbuffers::Offset<void> body) {
  auto msg = fb::CreateMessage(b, kSchemaVersion, type, body);
  fb::FinishSizePrefixedMessageBuffer(b, msg);
  return std::vector<uint8_t>(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

const char* bodyName(fb::Body b) {
  const char* n = fb::EnumNameBody(b);
  return n && *n ? n : "unknown";
}

}  // namespace detail

const void* Decoder::verify(std::span<const uint8_t> bytes) {
  // Table budget: an honest message has a root, a body, two tables per tensor and one per metric.
  // Twice that leaves room for a message with a few tensors too many to reach the count check.
  const size_t max_tables = 2 * (4 + 2 * layout_.size() + limits_.max_metrics);
  const fb::Message* msg =
      detail::verifyMessage(bytes, limits_.max_bytes, max_tables, aligned_, &realigned_bytes_);
  regions_.clear();
  return msg;
}

namespace {

using detail::bodyName;

// The tensors of an Update or PartialAggregate as views, with every field present. Collects the
// byte regions the views cover for the sharing check.
template <class Region>
void decodeTensors(const flatbuffers::Vector<flatbuffers::Offset<fb::Tensor>>* tensors,
                   size_t expected, std::vector<cz::PayloadView>& out,
                   std::vector<Region>& regions) {
  if (!tensors) fail(Errc::kMissingField, "the message has no tensor list");
  // The count is checked before any per-tensor work.
  if (tensors->size() != expected)
    fail(Errc::kTensorCountMismatch, "the message carries " + std::to_string(tensors->size()) +
                                         " tensors, the model has " + std::to_string(expected));
  out.clear();
  auto note = [&](auto s) {
    if (!s.empty()) {
      const auto* b = reinterpret_cast<const uint8_t*>(s.data());
      regions.push_back(Region{b, b + s.size_bytes()});
    }
  };
  for (flatbuffers::uoffset_t i = 0; i < tensors->size(); ++i) {
    const fb::Tensor* t = tensors->Get(i);
    auto where = [&] { return "tensor " + std::to_string(i); };
    if (!t) fail(Errc::kMissingField, where() + " is null");
    // The verifier accepts a union whose type is set but whose table is absent.
    if (t->payload_type() != fb::Payload::NONE && !t->payload())
      fail(Errc::kMissingField, where() + " names an encoding but carries no payload");
    auto need = [&](const auto* v, const char* what) {
      if (!v) fail(Errc::kMissingField, where() + ": " + what + " is absent");
      note(spanOf(v));
      return spanOf(v);
    };
    switch (t->payload_type()) {
      case fb::Payload::DenseF32:
        out.push_back(cz::DenseF32View{need(t->payload_as_DenseF32()->values(), "dense values")});
        break;
      case fb::Payload::DenseF16:
        out.push_back(cz::DenseF16View{need(t->payload_as_DenseF16()->values(), "fp16 values")});
        break;
      case fb::Payload::DenseBF16:
        out.push_back(cz::DenseBF16View{need(t->payload_as_DenseBF16()->values(), "bf16 values")});
        break;
      case fb::Payload::Sparse: {
        const auto* s = t->payload_as_Sparse();
        auto idx = need(s->indices(), "sparse indices");
        out.push_back(cz::SparseView{idx, need(s->values(), "sparse values")});
        break;
      }
      case fb::Payload::RandBlock: {
        const auto* r = t->payload_as_RandBlock();
        out.push_back(cz::RandBlockView{r->offset(), need(r->values(), "block values")});
        break;
      }
      case fb::Payload::LowRank: {
        const auto* l = t->payload_as_LowRank();
        note(spanOf(l->p()));
        note(spanOf(l->q()));
        out.push_back(
            cz::LowRankView{l->rows(), l->cols(), l->rank(), spanOf(l->p()), spanOf(l->q())});
        break;
      }
      case fb::Payload::Sign: {
        const auto* s = t->payload_as_Sign();
        out.push_back(cz::SignView{s->scale(), need(s->bits(), "sign bits")});
        break;
      }
      case fb::Payload::Qsgd: {
        const auto* q = t->payload_as_Qsgd();
        out.push_back(cz::QsgdView{q->norm(), q->s(), need(q->packed(), "QSGD levels")});
        break;
      }
      case fb::Payload::Ternary: {
        // The sign bytes first, then the positions; a vector too short for the signs leaves them
        // short, which validation refuses.
        const auto* x = t->payload_as_Ternary();
        const auto bits = need(x->bits(), "ternary bits");
        const size_t sign_bytes = std::min(bits.size(), cz::packedBytes(x->count(), 1));
        out.push_back(cz::TernaryView{x->count(), x->mu(), x->rice(), bits.subspan(sign_bytes),
                                      bits.first(sign_bytes)});
        break;
      }
      case fb::Payload::BlockQ: {
        const auto* q = t->payload_as_BlockQ();
        out.push_back(cz::BlockQView{q->bits(), q->block(), need(q->exps(), "block exponents"),
                                     need(q->packed(), "block levels")});
        break;
      }
      default:
        fail(Errc::kUnknownEncoding, where() + " has payload type " +
                                         std::to_string(static_cast<int>(t->payload_type())) +
                                         ", unknown to this build");
    }
  }
}

// SCAFFOLD's control vector of an Update or PartialAggregate: absent (empty), or exactly numel
// finite floats. Whether the round expects one is the round's to check (aggregation/).
template <class Region>
std::span<const float> decodeControl(const flatbuffers::Vector<float>* v, size_t numel,
                                     std::vector<Region>& regions) {
  if (!v) return {};
  const std::span<const float> c = spanOf(v);
  if (c.size() != numel)
    fail(Errc::kSizeMismatch, "the SCAFFOLD control vector has " + std::to_string(c.size()) +
                                  " values, the model " + std::to_string(numel));
  for (float x : c)
    if (!std::isfinite(x))
      fail(Errc::kNonFinite, "the SCAFFOLD control vector holds a non-finite value");
  if (!c.empty()) {
    const auto* b = reinterpret_cast<const uint8_t*>(c.data());
    regions.push_back(Region{b, b + c.size_bytes()});
  }
  return c;
}

// A metric name: 1..max bytes of letters, digits and "_.-/".
std::string_view metricName(const flatbuffers::String* s, size_t i, size_t max_len) {
  if (!s) fail(Errc::kMissingField, "metric " + std::to_string(i) + " has no name");
  const std::string_view n(s->c_str(), s->size());
  if (n.empty() || n.size() > max_len)
    fail(Errc::kBadMetric, "metric " + std::to_string(i) + " has a name of " +
                               std::to_string(n.size()) + " bytes (1 to " +
                               std::to_string(max_len) + " allowed)");
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ||
          c == '/'))
      fail(Errc::kBadMetric,
           "metric " + std::to_string(i) + " has a name with a character outside [A-Za-z0-9_.-/]");
  return n;
}

template <class Views>
void checkUniqueNames(const Views& metrics) {
  for (size_t i = 0; i < metrics.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (metrics[i].name == metrics[j].name)
        fail(Errc::kBadMetric, "metric '" + std::string(metrics[i].name) + "' appears twice");
}

void requireFiniteMetric(double v, std::string_view name) {
  if (!std::isfinite(v)) fail(Errc::kBadMetric, "metric '" + std::string(name) + "' is not finite");
}

// The metrics of an Update (Metric tables) or a PartialAggregate (MetricSum tables) as views:
// bounded in number, checked names, unique, finite values (`make` builds a view and checks its
// values). Their bytes join the regions of the sharing check.
template <class Table, class View, class Region, class Make>
void decodeMetrics(const flatbuffers::Vector<flatbuffers::Offset<Table>>* ms,
                   const DecodeLimits& limits, std::vector<View>& out, std::vector<Region>& regions,
                   Make make) {
  out.clear();
  if (!ms) return;
  if (ms->size() > limits.max_metrics)
    fail(Errc::kBadMetric,
         std::to_string(ms->size()) + " metrics, at most " + std::to_string(limits.max_metrics));
  for (flatbuffers::uoffset_t i = 0; i < ms->size(); ++i) {
    const Table* m = ms->Get(i);
    if (!m) fail(Errc::kMissingField, "metric " + std::to_string(i) + " is null");
    const std::string_view name = metricName(m->name(), i, limits.max_metric_name);
    out.push_back(make(*m, name));
    const auto* b = reinterpret_cast<const uint8_t*>(name.data());
    regions.push_back(Region{b, b + name.size()});
  }
  checkUniqueNames(out);
}

}  // namespace

void Decoder::checkRegions() {
  // Linear cost whatever the message claims: no two views may share or overlap bytes. (Honest
  // encoders never share; a hostile one could point every tensor at one big vector.)
  std::sort(regions_.begin(), regions_.end(),
            [](const Region& a, const Region& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < regions_.size(); ++i)
    if (regions_[i].begin < regions_[i - 1].end)
      fail(Errc::kSharedData, "two fields of the message share or overlap bytes");
}

const cz::UpdateView& Decoder::decodeUpdate(std::span<const uint8_t> bytes) {
  const auto* msg = static_cast<const fb::Message*>(verify(bytes));
  if (msg->body_type() != fb::Body::Update || !msg->body_as_Update())
    fail(Errc::kUnexpectedMessage,
         std::string("expected an Update, got ") + bodyName(msg->body_type()));
  const fb::Update* u = msg->body_as_Update();
  cz::UpdateView& out = update_;
  out.header = {u->layout_fingerprint(), u->round(),        u->phase(),
                u->client_id(),          u->num_examples(), u->nonce()};
  if (out.header.layout_fingerprint != layout_.fingerprint())
    fail(Errc::kFingerprintMismatch, "update from client " + std::to_string(out.header.client_id) +
                                         " is for model fingerprint " +
                                         std::to_string(out.header.layout_fingerprint) +
                                         ", expected " + std::to_string(layout_.fingerprint()));
  decodeTensors(u->tensors(), layout_.size(), out.tensors, regions_);
  decodeMetrics(u->metrics(), limits_, out.metrics, regions_,
                [](const fb::Metric& m, std::string_view name) {
                  requireFiniteMetric(m.value(), name);
                  return cz::MetricView{name, m.value()};
                });
  out.control = decodeControl(u->control(), layout_.numel(), regions_);
  checkRegions();
  return out;
}

const cz::PartialView& Decoder::decodePartial(std::span<const uint8_t> bytes) {
  const auto* msg = static_cast<const fb::Message*>(verify(bytes));
  if (msg->body_type() != fb::Body::PartialAggregate || !msg->body_as_PartialAggregate())
    fail(Errc::kUnexpectedMessage,
         std::string("expected a PartialAggregate, got ") + bodyName(msg->body_type()));
  const fb::PartialAggregate* p = msg->body_as_PartialAggregate();
  cz::PartialView& out = partial_;
  out.header = {p->layout_fingerprint(), p->round(), p->phase(), p->shared_tag(), p->count(),
                p->total_weight(),       p->nonce()};
  if (out.header.layout_fingerprint != layout_.fingerprint())
    fail(Errc::kFingerprintMismatch, "partial aggregate is for model fingerprint " +
                                         std::to_string(out.header.layout_fingerprint) +
                                         ", expected " + std::to_string(layout_.fingerprint()));
  decodeTensors(p->tensors(), layout_.size(), out.tensors, regions_);
  decodeMetrics(p->metrics(), limits_, out.metrics, regions_,
                [](const fb::MetricSum& m, std::string_view name) {
                  requireFiniteMetric(m.weighted_sum(), name);
                  requireFiniteMetric(m.weight(), name);
                  return cz::MetricSumView{name, m.weighted_sum(), m.weight()};
                });
  out.control = decodeControl(p->control(), layout_.numel(), regions_);
  checkRegions();
  return out;
}

cz::Update decodeUpdate(std::span<const uint8_t> bytes, const ParamLayout& layout,
                        const cz::SharedFactors* shared, const DecodeLimits& limits) {
  Decoder d(layout, limits);
  const cz::UpdateView& v = d.decodeUpdate(bytes);
  cz::validateUpdate(layout, v, shared);
  return cz::toOwned(v);
}

}  // namespace starling::protocol
