#include "protocol/control.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <sstream>

#include "compression/bitpack.h"
#include "core/error.h"
#include "core/half.h"
#include "core/overloaded.h"
#include "protocol/codec.h"
#include "protocol/starling_generated.h"
#include "protocol/verify.h"

namespace starling::protocol {
namespace fb = starling::wire;
namespace cz = starling::compression;

static_assert(static_cast<int>(MessageKind::kUpdate) == static_cast<int>(fb::Body::Update));
static_assert(static_cast<int>(MessageKind::kPartial) ==
              static_cast<int>(fb::Body::PartialAggregate));
static_assert(static_cast<int>(MessageKind::kChunk) == static_cast<int>(fb::Body::Chunk));
static_assert(static_cast<int>(MessageKind::kShutdown) == static_cast<int>(fb::Body::Shutdown));
static_assert(static_cast<int>(MessageKind::kSplitHello) == static_cast<int>(fb::Body::SplitHello));
static_assert(static_cast<int>(MessageKind::kSplitReply) == static_cast<int>(fb::Body::SplitReply));
static_assert(static_cast<int>(MessageKind::kSplitBottom) ==
              static_cast<int>(fb::Body::SplitBottom));
static_assert(static_cast<int>(MessageKind::kSplitAverage) ==
              static_cast<int>(fb::Body::SplitAverage));
static_assert(static_cast<int>(MessageKind::kSecAggSetup) ==
              static_cast<int>(fb::Body::SecAggSetup));
static_assert(static_cast<int>(MessageKind::kSecAggSurvivors) ==
              static_cast<int>(fb::Body::SecAggSurvivors));
static_assert(static_cast<int>(MessageKind::kSecAggSigned) == static_cast<int>(fb::Body::MAX));

namespace {

constexpr size_t kMaxCapabilities = 16;
constexpr size_t kMaxCapability = 32;
constexpr size_t kMaxText = 1024;
constexpr size_t kMaxTaskMetrics = 64;
constexpr size_t kMaxSpec = 512;

[[noreturn]] void fail(Errc code, const std::string& msg) { throw InputError(code, msg); }

using detail::body;
using detail::finish;

std::string text(const flatbuffers::String* s, size_t max_len, const char* what) {
  if (!s) return {};
  if (s->size() > max_len)
    fail(Errc::kSizeMismatch, std::string(what) + " of " + std::to_string(s->size()) +
                                  " bytes (at most " + std::to_string(max_len) + ")");
  std::string out(s->c_str(), s->size());
  for (char c : out)
    if (!std::isprint(static_cast<unsigned char>(c)))
      fail(Errc::kMissingField, std::string(what) + " has a non-printable byte");
  return out;
}

std::vector<std::string> texts(
    const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* v, size_t max_n,
    size_t max_len, const char* what) {
  std::vector<std::string> out;
  if (!v) return out;
  if (v->size() > max_n)
    fail(Errc::kSizeMismatch,
         std::to_string(v->size()) + " " + what + " (at most " + std::to_string(max_n) + ")");
  for (flatbuffers::uoffset_t i = 0; i < v->size(); ++i) {
    std::string s = text(v->Get(i), max_len, what);
    if (s.empty()) fail(Errc::kMissingField, std::string("an empty entry in ") + what);
    out.push_back(std::move(s));
  }
  return out;
}

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> strings(
    flatbuffers::FlatBufferBuilder& b, const std::vector<std::string>& v) {
  std::vector<flatbuffers::Offset<flatbuffers::String>> offs;
  offs.reserve(v.size());
  for (const auto& s : v) offs.push_back(b.CreateString(s));
  return b.CreateVector(offs);
}

uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

}  // namespace

const char* kindName(MessageKind k) { return detail::bodyName(static_cast<fb::Body>(k)); }

std::optional<MessageKind> peekKind(std::span<const uint8_t> bytes) {
  // [size prefix u32][root offset u32][identifier 4 bytes] ... ; the root table starts with an
  // soffset to its vtable: [vtable size u16][object size u16][schema_version][body_type][body].
  const size_t n = bytes.size();
  if (n < 12 || std::memcmp(bytes.data() + 8, fb::MessageIdentifier(), 4) != 0) return std::nullopt;
  const uint8_t* p = bytes.data();
  const uint64_t root = 4 + static_cast<uint64_t>(u32(p + 4));
  if (root + 4 > n) return std::nullopt;
  int32_t soff;
  std::memcpy(&soff, p + root, 4);
  const int64_t vt = static_cast<int64_t>(root) - soff;
  if (vt < 4 || vt + 4 > static_cast<int64_t>(n)) return std::nullopt;
  const uint16_t vt_size = u16(p + vt);
  const uint16_t obj_size = u16(p + vt + 2);
  constexpr uint16_t kBodyTypeSlot = 6;  // fb::Message::VT_BODY_TYPE
  if (vt_size < kBodyTypeSlot + 2 || vt + kBodyTypeSlot + 2 > static_cast<int64_t>(n))
    return std::nullopt;
  const uint16_t field = u16(p + vt + kBodyTypeSlot);
  if (field == 0 || field >= obj_size || root + field >= n) return std::nullopt;
  const uint8_t type = p[root + field];
  if (type < static_cast<uint8_t>(MessageKind::kUpdate) ||
      type > static_cast<uint8_t>(MessageKind::kSecAggSigned))
    return std::nullopt;
  return static_cast<MessageKind>(type);
}

// ---------------------------------------------------------------- encoding

std::vector<uint8_t> encode(const RegisterMsg& m) {
  flatbuffers::FlatBufferBuilder b(256);
  auto caps = strings(b, m.capabilities);
  auto body =
      fb::CreateRegister(b, m.client_id, static_cast<fb::Role>(m.role), m.layout_fingerprint,
                         m.num_examples, m.eval_examples, m.model_version, caps);
  return finish(b, fb::Body::Register, body.Union());
}

std::vector<uint8_t> encode(const WelcomeMsg& m) {
  flatbuffers::FlatBufferBuilder b(128);
  auto body = fb::CreateWelcome(b, m.client_id, m.session, m.heartbeat_ms, m.max_message_bytes,
                                m.chunk_bytes);
  return finish(b, fb::Body::Welcome, body.Union());
}

std::vector<uint8_t> encode(const HeartbeatMsg& m) {
  flatbuffers::FlatBufferBuilder b(96 + (m.subtree ? m.subtree->size() * 64 : 0));
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::SubtreePeer>>> subtree = 0;
  if (m.subtree) {
    std::vector<flatbuffers::Offset<fb::SubtreePeer>> peers;
    peers.reserve(m.subtree->size());
    for (const SubtreePeer& p : *m.subtree)
      peers.push_back(fb::CreateSubtreePeer(b, p.id, p.online, p.in_round, p.seen_ms, p.updates,
                                            p.refused, p.last_refusal));
    subtree = b.CreateVector(peers);
  }
  auto body = fb::CreateHeartbeat(b, m.client_id, m.session, m.round, subtree);
  return finish(b, fb::Body::Heartbeat, body.Union());
}

std::vector<uint8_t> encode(const EvaluationMsg& m) {
  flatbuffers::FlatBufferBuilder b(128);
  auto body =
      fb::CreateEvaluation(b, m.client_id, m.round, m.nonce, m.num_examples, m.loss, m.accuracy);
  return finish(b, fb::Body::Evaluation, body.Union());
}

std::vector<uint8_t> encode(const RejectMsg& m) {
  flatbuffers::FlatBufferBuilder b(256);
  auto msg = b.CreateString(m.message.substr(0, kMaxText));
  auto body =
      fb::CreateReject(b, static_cast<fb::RejectKind>(m.kind), m.code, m.round, m.nonce, msg);
  return finish(b, fb::Body::Reject, body.Union());
}

std::vector<uint8_t> encode(const ShutdownMsg& m) {
  flatbuffers::FlatBufferBuilder b(128);
  auto reason = b.CreateString(m.reason.substr(0, kMaxText));
  auto body = fb::CreateShutdown(b, m.round, reason);
  return finish(b, fb::Body::Shutdown, body.Union());
}

std::vector<uint8_t> encode(const SplitHelloMsg& m) {
  flatbuffers::FlatBufferBuilder b(256);
  auto up = b.CreateString(m.up);
  auto down = b.CreateString(m.down);
  auto body = fb::CreateSplitHello(b, m.edge_id, m.fingerprint, up, down);
  return finish(b, fb::Body::SplitHello, body.Union());
}

std::vector<uint8_t> encode(const SplitStepMsg& m) {
  flatbuffers::FlatBufferBuilder b(m.activations.size() + m.labels.size() + 128);
  auto acts = b.CreateVector(m.activations.data(), m.activations.size());
  auto labels = b.CreateVector(m.labels);
  auto body = fb::CreateSplitStep(b, m.session, m.step, static_cast<fb::SplitStepKind>(m.kind),
                                  m.examples, labels, acts);
  return finish(b, fb::Body::SplitStep, body.Union());
}

std::vector<uint8_t> encode(const SplitReplyMsg& m) {
  flatbuffers::FlatBufferBuilder b(m.gradient.size() + 128);
  auto grad = b.CreateVector(m.gradient.data(), m.gradient.size());
  auto body = fb::CreateSplitReply(b, m.session, m.step, m.loss, m.correct, m.cloud_us, grad);
  return finish(b, fb::Body::SplitReply, body.Union());
}

std::vector<uint8_t> encode(const SplitBottomMsg& m) {
  flatbuffers::FlatBufferBuilder b(m.bottom.size() * sizeof(float) + 128);
  auto v = b.CreateVector(m.bottom);
  auto body = fb::CreateSplitBottom(b, m.session, m.epoch, m.examples, v);
  return finish(b, fb::Body::SplitBottom, body.Union());
}

std::vector<uint8_t> encode(const SplitAverageMsg& m) {
  flatbuffers::FlatBufferBuilder b(m.bottom.size() * sizeof(float) + 128);
  auto v = b.CreateVector(m.bottom);
  auto body = fb::CreateSplitAverage(b, m.session, m.epoch, m.edges, v);
  return finish(b, fb::Body::SplitAverage, body.Union());
}

std::vector<uint8_t> encodeChunk(const ChunkMsg& m) {
  flatbuffers::FlatBufferBuilder b(m.data.size() + 128);
  auto data = b.CreateVector(m.data.data(), m.data.size());
  auto body = fb::CreateChunk(b, m.transfer, m.index, m.count, m.total_bytes, data);
  return finish(b, fb::Body::Chunk, body.Union());
}

std::vector<uint8_t> encodeTask(const TaskMsg& h, std::span<const cz::PayloadView> model) {
  size_t est = 512;
  for (const auto& p : model) est += cz::payloadDataBytes(p) + 32;
  for (const auto& f : h.shared.factors) est += f.size() * sizeof(float) + 16;
  est += h.control.size() * sizeof(float);
  flatbuffers::FlatBufferBuilder b(est);
  auto tensors = detail::encodeTensors(b, model);  // exactly as an update's tensors
  std::vector<flatbuffers::Offset<fb::SharedFactor>> shared;
  for (const auto& f : h.shared.factors)
    shared.push_back(fb::CreateSharedFactor(b, b.CreateVector(f)));
  auto tv = b.CreateVector(tensors);
  auto sv = b.CreateVector(shared);
  auto spec = b.CreateString(h.compressor);
  auto metrics = strings(b, h.metrics);
  auto fit = fb::CreateFitSettings(b, h.fit.epochs, h.fit.batch_size, h.fit.lr, h.fit.prox_mu);
  flatbuffers::Offset<flatbuffers::Vector<float>> control;
  if (!h.control.empty()) control = b.CreateVector(h.control);
  // A task with a control variate always holds control_ack, 0 included, so that setTaskControlAck
  // can patch it per client: ForceDefaults writes every scalar of the Task table (a few bytes).
  b.ForceDefaults(!h.control.empty());
  auto body = fb::CreateTask(b, static_cast<fb::TaskKind>(h.kind), h.round, h.phase, h.nonce,
                             h.run_seed, spec, h.model_version, h.base_version, tv,
                             static_cast<uint8_t>(h.shared.fixed), sv, fit, h.deadline_ms, metrics,
                             control, h.control.empty() ? 0 : h.control_ack.value_or(0), h.secure);
  b.ForceDefaults(false);
  return finish(b, fb::Body::Task, body.Union());
}

void setTaskControlAck(std::span<uint8_t> bytes, uint64_t round) {
  STARLING_CHECK_ARG(peekKind(bytes) == MessageKind::kTask,
                     "setTaskControlAck: not an encoded Task");
  auto* msg = fb::GetMutableSizePrefixedMessage(bytes.data());
  auto* task = static_cast<fb::Task*>(msg->mutable_body());
  STARLING_CHECK_ARG(task && task->control() && task->mutate_control_ack(round),
                     "setTaskControlAck: the task carries no SCAFFOLD control variate");
}

void setTaskNonce(std::span<uint8_t> bytes, uint64_t nonce) {
  STARLING_CHECK_ARG(peekKind(bytes) == MessageKind::kTask, "setTaskNonce: not an encoded Task");
  auto* msg = fb::GetMutableSizePrefixedMessage(bytes.data());
  auto* task = static_cast<fb::Task*>(msg->mutable_body());
  STARLING_CHECK_ARG(task && task->mutate_nonce(nonce),
                     "setTaskNonce: the task was encoded without a nonce");
}

// ---------------------------------------------------------------- decoding

RegisterMsg decodeRegister(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* r = body<fb::Register>(bytes, limits.max_bytes, fb::Body::Register, 8, aligned);
  RegisterMsg m;
  m.client_id = r->client_id();
  if (r->role() != fb::Role::Client && r->role() != fb::Role::Aggregator)
    fail(Errc::kMissingField, "unknown role " + std::to_string(static_cast<int>(r->role())));
  m.role = static_cast<Role>(r->role());
  m.layout_fingerprint = r->layout_fingerprint();
  m.num_examples = r->num_examples();
  m.eval_examples = r->eval_examples();
  m.model_version = r->model_version();
  m.capabilities = texts(r->capabilities(), kMaxCapabilities, kMaxCapability, "capabilities");
  return m;
}

WelcomeMsg decodeWelcome(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* w = body<fb::Welcome>(bytes, limits.max_bytes, fb::Body::Welcome, 8, aligned);
  WelcomeMsg m{w->client_id(), w->session(), w->heartbeat_ms(), w->max_message_bytes(),
               w->chunk_bytes()};
  if (m.heartbeat_ms == 0 || m.chunk_bytes == 0 || m.max_message_bytes == 0)
    fail(Errc::kMissingField, "welcome without heartbeat, chunk size or message bound");
  return m;
}

HeartbeatMsg decodeHeartbeat(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* h =
      body<fb::Heartbeat>(bytes, limits.max_bytes, fb::Body::Heartbeat, 8 + kMaxSubtree, aligned);
  HeartbeatMsg m{h->client_id(), h->session(), h->round()};
  if (const auto* sub = h->subtree()) {
    if (limits.max_subtree == 0)
      fail(Errc::kUnexpectedMessage, "heartbeat with a subtree from a peer that has none");
    if (sub->size() > std::min(limits.max_subtree, kMaxSubtree))
      fail(Errc::kSizeMismatch, "heartbeat with a subtree of " + std::to_string(sub->size()) +
                                    " clients (at most " + std::to_string(kMaxSubtree) + ")");
    m.subtree.emplace();
    m.subtree->reserve(sub->size());
    for (const fb::SubtreePeer* p : *sub)
      m.subtree->push_back(SubtreePeer{p->id(), p->online(), p->in_round(), p->seen_ms(),
                                       p->updates(), p->refused(), p->last_refusal()});
  }
  return m;
}

EvaluationMsg decodeEvaluation(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* e = body<fb::Evaluation>(bytes, limits.max_bytes, fb::Body::Evaluation, 8, aligned);
  EvaluationMsg m{e->client_id(),    e->round(), e->nonce(),
                  e->num_examples(), e->loss(),  e->accuracy()};
  if (!std::isfinite(m.loss) || m.loss < 0 || !(m.accuracy >= 0.0 && m.accuracy <= 1.0))
    fail(Errc::kNonFinite, "evaluation with loss " + std::to_string(m.loss) + " and accuracy " +
                               std::to_string(m.accuracy) +
                               " (loss finite and >= 0, accuracy in [0, 1])");
  if (m.loss > limits.max_eval_loss) {
    std::ostringstream os;
    os << "evaluation with loss " << m.loss << ", above the bound " << limits.max_eval_loss;
    fail(Errc::kValueTooLarge, os.str());
  }
  return m;
}

RejectMsg decodeReject(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* r = body<fb::Reject>(bytes, limits.max_bytes, fb::Body::Reject, 8, aligned);
  RejectMsg m;
  m.kind = static_cast<RejectKind>(r->kind());
  if (m.kind != RejectKind::kRefused && m.kind != RejectKind::kNotRegistered &&
      m.kind != RejectKind::kBusy && m.kind != RejectKind::kRegistrationRefused)
    fail(Errc::kMissingField, "unknown reject kind");
  m.code = r->code();
  m.round = r->round();
  m.nonce = r->nonce();
  m.message = text(r->message(), kMaxText, "reject message");
  return m;
}

ShutdownMsg decodeShutdown(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* f = body<fb::Shutdown>(bytes, limits.max_bytes, fb::Body::Shutdown, 8, aligned);
  return ShutdownMsg{f->round(), text(f->reason(), kMaxText, "shutdown reason")};
}

SplitHelloMsg decodeSplitHello(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* h = body<fb::SplitHello>(bytes, limits.max_bytes, fb::Body::SplitHello, 8, aligned);
  SplitHelloMsg m{h->edge_id(), h->fingerprint(), text(h->up(), kMaxSpec, "up codec"),
                  text(h->down(), kMaxSpec, "down codec")};
  if (m.up.empty() || m.down.empty())
    fail(Errc::kMissingField, "split hello without its codec specs");
  return m;
}

SplitStepMsg decodeSplitStep(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* s = body<fb::SplitStep>(bytes, limits.max_bytes, fb::Body::SplitStep, 8, aligned);
  SplitStepMsg m;
  m.session = s->session();
  m.step = s->step();
  const auto kind = static_cast<uint8_t>(s->kind());
  if (kind > static_cast<uint8_t>(SplitStepKind::kEvaluate))
    fail(Errc::kMissingField, "unknown split step kind " + std::to_string(kind));
  m.kind = static_cast<SplitStepKind>(kind);
  m.examples = s->examples();
  if (m.step == 0) fail(Errc::kMissingField, "split step 0 (steps count from 1)");
  if (m.examples == 0) fail(Errc::kSizeMismatch, "split step of 0 examples");
  if (!s->labels() || s->labels()->size() != m.examples)
    fail(Errc::kSizeMismatch, "split step of " + std::to_string(m.examples) + " examples with " +
                                  std::to_string(s->labels() ? s->labels()->size() : 0) +
                                  " labels");
  m.labels.assign(s->labels()->begin(), s->labels()->end());
  if (!s->activations() || s->activations()->size() == 0)
    fail(Errc::kMissingField, "split step without activations");
  m.activations.assign(s->activations()->begin(), s->activations()->end());
  return m;
}

SplitReplyMsg decodeSplitReply(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* r = body<fb::SplitReply>(bytes, limits.max_bytes, fb::Body::SplitReply, 8, aligned);
  SplitReplyMsg m{r->session(), r->step(), r->loss(), r->correct(), r->cloud_us(), {}};
  if (m.step == 0 && r->gradient() && r->gradient()->size() != 0)
    fail(Errc::kMissingField, "split reply to a hello (step 0) with a gradient");
  if (!std::isfinite(m.loss) || m.loss < 0)
    fail(Errc::kNonFinite,
         "split reply with loss " + std::to_string(m.loss) + " (finite and >= 0)");
  if (r->gradient()) m.gradient.assign(r->gradient()->begin(), r->gradient()->end());
  return m;
}

namespace {
std::vector<float> finiteFloats(const flatbuffers::Vector<float>* v, const char* what) {
  if (!v || v->size() == 0)
    fail(Errc::kMissingField, std::string(what) + " without its parameters");
  std::vector<float> out(v->begin(), v->end());
  for (float x : out)
    if (!std::isfinite(x))
      fail(Errc::kNonFinite, std::string(what) + " with a non-finite parameter");
  return out;
}
}  // namespace

SplitBottomMsg decodeSplitBottom(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* m = body<fb::SplitBottom>(bytes, limits.max_bytes, fb::Body::SplitBottom, 8, aligned);
  SplitBottomMsg out{m->session(), m->epoch(), m->examples(), {}};
  if (out.epoch == 0 || out.examples == 0)
    fail(Errc::kMissingField, "split bottom of epoch 0 or of 0 examples");
  out.bottom = finiteFloats(m->bottom(), "split bottom");
  return out;
}

SplitAverageMsg decodeSplitAverage(std::span<const uint8_t> bytes, const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  const auto* m =
      body<fb::SplitAverage>(bytes, limits.max_bytes, fb::Body::SplitAverage, 8, aligned);
  SplitAverageMsg out{m->session(), m->epoch(), m->edges(), {}};
  if (out.epoch == 0 || out.edges == 0)
    fail(Errc::kMissingField, "split average of epoch 0 or of 0 edges");
  out.bottom = finiteFloats(m->bottom(), "split average");
  return out;
}

ChunkMsg decodeChunk(std::span<const uint8_t> bytes, size_t max_chunk_bytes) {
  std::vector<uint64_t> aligned;
  const auto* c = body<fb::Chunk>(bytes, max_chunk_bytes + 256, fb::Body::Chunk, 8, aligned);
  if (!aligned.empty())
    fail(Errc::kBadChunk, "chunk frame is not 8-byte aligned");  // data would point into scratch
  ChunkMsg m{c->transfer(), c->index(), c->count(), c->total_bytes(), {}};
  if (!c->data() || c->data()->size() == 0) fail(Errc::kBadChunk, "chunk without data");
  if (c->data()->size() > max_chunk_bytes)
    fail(Errc::kBadChunk, "chunk of " + std::to_string(c->data()->size()) + " bytes, at most " +
                              std::to_string(max_chunk_bytes));
  if (m.count == 0 || m.index >= m.count || m.total_bytes == 0)
    fail(Errc::kBadChunk, "chunk " + std::to_string(m.index) + " of " + std::to_string(m.count) +
                              ", " + std::to_string(m.total_bytes) + " bytes in all");
  m.data = std::span<const uint8_t>(c->data()->data(), c->data()->size());
  return m;
}

TaskMsg decodeTask(std::span<const uint8_t> bytes, const ParamLayout& layout,
                   const ControlLimits& limits) {
  std::vector<uint64_t> aligned;
  // A tensor is a few tables; an stc chain holds up to kMaxRefreshChain refreshes of every tensor
  // (one more passes the verifier, so that a chain too long is refused by name below).
  const size_t max_tables = 8 + 3 * layout.size() * (kMaxRefreshChain + 1);
  const auto* t = body<fb::Task>(bytes, limits.max_bytes, fb::Body::Task, max_tables, aligned);
  TaskMsg m;
  if (t->kind() != fb::TaskKind::Fit && t->kind() != fb::TaskKind::Evaluate)
    fail(Errc::kMissingField, "unknown task kind");
  m.kind = static_cast<TaskKind>(t->kind());
  m.round = t->round();
  m.phase = t->phase();
  m.nonce = t->nonce();
  m.run_seed = t->run_seed();
  m.compressor = text(t->compressor(), kMaxSpec, "compressor spec");
  m.model_version = t->model_version();
  m.base_version = t->base_version();
  m.deadline_ms = t->deadline_ms();
  m.metrics = texts(t->metrics(), kMaxTaskMetrics, 64, "metric names");
  if (const auto* f = t->fit())
    m.fit = FitSettings{f->epochs(), f->batch_size(), f->lr(), f->prox_mu()};
  if (m.nonce == 0) fail(Errc::kMissingField, "task without a nonce");
  // Bounded like the server's own configuration, so a hostile server cannot make a client train
  // forever.
  if (m.kind == TaskKind::kFit &&
      (m.fit.epochs == 0 || m.fit.epochs > 1000 || m.fit.batch_size == 0 ||
       m.fit.batch_size > (1u << 20) || !(m.fit.lr > 0) || !(m.fit.lr <= 100) ||
       !(m.fit.prox_mu >= 0) || !(m.fit.prox_mu <= 1e4) ||
       !(static_cast<double>(m.fit.lr) * m.fit.prox_mu < 2.0)))
    fail(Errc::kMissingField, "task with a bad fit config (epochs " + std::to_string(m.fit.epochs) +
                                  ", batch " + std::to_string(m.fit.batch_size) + ", lr " +
                                  std::to_string(m.fit.lr) + ", prox_mu " +
                                  std::to_string(m.fit.prox_mu) + ")");
  m.secure = t->secure();
  // (Any phase: two-phase PowerSGD's phase Q is a secure sum of its own.)
  if (m.secure && m.kind != TaskKind::kFit)
    fail(Errc::kUnexpectedMessage, "a secure-aggregation flag on a task other than a fit");
  // SCAFFOLD's server control variate: a phase-0 Fit task's, numel finite values.
  if (const auto* c = t->control()) {
    if (m.kind != TaskKind::kFit || m.phase != 0)
      fail(Errc::kUnexpectedMessage,
           "a SCAFFOLD control variate in a task other than a phase-0 fit");
    if (c->size() != layout.numel())
      fail(Errc::kSizeMismatch, "the task's SCAFFOLD control variate has " +
                                    std::to_string(c->size()) + " values, the model " +
                                    std::to_string(layout.numel()));
    m.control.assign(c->begin(), c->end());
    // Present or not (a server older than the field): generated tables derive privately from
    // flatbuffers::Table, which a C-style cast reaches (a static_cast that ignores access).
    const auto* table = (const flatbuffers::Table*)t;  // NOLINT(google-readability-casting)
    if (table->CheckField(fb::Task::VT_CONTROL_ACK)) m.control_ack = t->control_ack();
    for (float x : m.control)
      if (!std::isfinite(x))
        fail(Errc::kNonFinite, "the task's SCAFFOLD control variate holds a non-finite value");
  }
  // The model: whole (dense f32 / f16, or QSGD levels) or, against a base version, sparse new
  // values or QSGD levels to add, or a chain of stc refreshes (whole multiples of the model's
  // tensors, every one ternary) to add in turn.
  const auto* tensors = t->model();
  const size_t n = tensors ? tensors->size() : 0;
  const size_t per = layout.size();
  const bool chain = n > per && per != 0 && n % per == 0 && m.base_version != 0;
  if (n != 0 && n != per && !chain)
    fail(Errc::kTensorCountMismatch, "task carries " + std::to_string(n) +
                                         " model tensors, the model has " + std::to_string(per));
  if (chain && n / per > kMaxRefreshChain)
    fail(Errc::kTensorCountMismatch, "task carries a chain of " + std::to_string(n / per) +
                                         " refreshes, at most " + std::to_string(kMaxRefreshChain) +
                                         " are taken");
  if (n != 0) {
    // A client copies its task's model once per round: owned payloads, each validated.
    for (flatbuffers::uoffset_t i = 0; i < n; ++i) {
      const fb::Tensor* ft = tensors->Get(i);
      const TensorSpec& spec = layout.tensors()[i % per];
      cz::Payload p;
      if (!ft) fail(Errc::kMissingField, "model tensor " + std::to_string(i) + " is null");
      if (m.base_version == 0 && ft->payload_type() == fb::Payload::DenseF32 &&
          ft->payload_as_DenseF32() && ft->payload_as_DenseF32()->values()) {
        const auto* v = ft->payload_as_DenseF32()->values();
        p = cz::DenseF32{std::vector<float>(v->begin(), v->end())};
      } else if (m.base_version == 0 && ft->payload_type() == fb::Payload::DenseF16 &&
                 ft->payload_as_DenseF16() && ft->payload_as_DenseF16()->values()) {
        const auto* v = ft->payload_as_DenseF16()->values();
        p = cz::DenseF16{std::vector<uint16_t>(v->begin(), v->end())};
      } else if (chain && ft->payload_type() != fb::Payload::Ternary) {
        fail(Errc::kUnexpectedEncoding,
             "model tensor " + std::to_string(i) + " of a chain of refreshes is not ternary");
      } else if (ft->payload_type() == fb::Payload::Qsgd && ft->payload_as_Qsgd() &&
                 ft->payload_as_Qsgd()->packed()) {
        // A quantised downlink (server/model_store.h): the whole model, or a refresh to add.
        const auto* q = ft->payload_as_Qsgd();
        // Bounded so that no value, nor its sum with a model's, can overflow: a model is far
        // smaller (the server's bounds keep updates within 1e4 a value).
        if (!(q->norm() >= 0.0f && q->norm() <= 1e30f))
          fail(Errc::kValueTooLarge, "model tensor " + std::to_string(i) + "'s QSGD norm " +
                                         std::to_string(q->norm()) + " is outside [0, 1e30]");
        p = cz::Qsgd{q->norm(), q->s(),
                     std::vector<uint8_t>(q->packed()->begin(), q->packed()->end())};
      } else if (ft->payload_type() == fb::Payload::BlockQ && ft->payload_as_BlockQ() &&
                 ft->payload_as_BlockQ()->exps() && ft->payload_as_BlockQ()->packed()) {
        // The block-scaled downlinks (q2, q3: server/model_store.h), the whole model or a refresh
        // to add; validation bounds every exponent, so no value nor its sum with a model's
        // overflows.
        const auto* q = ft->payload_as_BlockQ();
        p = cz::BlockQ{q->bits(), q->block(),
                       std::vector<int8_t>(q->exps()->begin(), q->exps()->end()),
                       std::vector<uint8_t>(q->packed()->begin(), q->packed()->end())};
      } else if (m.base_version != 0 && ft->payload_type() == fb::Payload::Ternary &&
                 ft->payload_as_Ternary() && ft->payload_as_Ternary()->bits()) {
        // The stc downlink's refresh (server/model_store.h), alone or in a chain. Bounded as the
        // QSGD norm is, so that a chain's sum with a model stays finite.
        const auto* x = ft->payload_as_Ternary();
        if (!(x->mu() >= 0.0f && x->mu() <= 1e30f))
          fail(Errc::kValueTooLarge, "model tensor " + std::to_string(i) + "'s ternary mu " +
                                         std::to_string(x->mu()) + " is outside [0, 1e30]");
        const auto* bits = x->bits();
        const size_t sign_bytes = std::min<size_t>(bits->size(), cz::packedBytes(x->count(), 1));
        p = cz::Ternary{x->count(), x->mu(), x->rice(),
                        std::vector<uint8_t>(bits->begin() + sign_bytes, bits->end()),
                        std::vector<uint8_t>(bits->begin(), bits->begin() + sign_bytes)};
      } else if (m.base_version != 0 && ft->payload_type() == fb::Payload::Sparse &&
                 ft->payload_as_Sparse() && ft->payload_as_Sparse()->indices() &&
                 ft->payload_as_Sparse()->values()) {
        const auto* s = ft->payload_as_Sparse();
        p = cz::Sparse{std::vector<uint32_t>(s->indices()->begin(), s->indices()->end()),
                       std::vector<float>(s->values()->begin(), s->values()->end())};
      } else {
        fail(Errc::kUnexpectedEncoding,
             "model tensor " + std::to_string(i) + " is not " +
                 (m.base_version == 0 ? "dense f32 or f16, QSGD or block levels"
                                      : "sparse, QSGD or block levels, or ternary (a delta)"));
      }
      cz::validatePayload(cz::view(p), spec, nullptr, i % per);
      m.model.push_back(std::move(p));
    }
  }
  m.shared.fixed =
      t->shared_side() == 1 ? cz::SharedFactors::Side::kP : cz::SharedFactors::Side::kQ;
  if (t->shared_side() > 1) fail(Errc::kMissingField, "unknown shared side");
  if (const auto* sh = t->shared(); sh && sh->size() != 0) {
    if (sh->size() != layout.size())
      fail(Errc::kTensorCountMismatch, "task shares " + std::to_string(sh->size()) +
                                           " factors, the model has " +
                                           std::to_string(layout.size()) + " tensors");
    for (flatbuffers::uoffset_t i = 0; i < sh->size(); ++i) {
      const fb::SharedFactor* f = sh->Get(i);
      std::vector<float> vals;
      if (f && f->values()) vals.assign(f->values()->begin(), f->values()->end());
      if (vals.size() > layout.tensors()[i].numel)
        fail(Errc::kShapeMismatch,
             "shared factor " + std::to_string(i) + " is larger than its tensor");
      for (float x : vals)
        if (!std::isfinite(x))
          fail(Errc::kNonFinite, "shared factor " + std::to_string(i) + " is not finite");
      m.shared.factors.push_back(std::move(vals));
    }
  }
  return m;
}

void applyModel(const ParamLayout& layout, uint64_t held, uint64_t base_version,
                const std::vector<cz::Payload>& tensors, std::span<float> model) {
  const size_t per = layout.size();
  STARLING_CHECK_ARG(per != 0 && model.size() == layout.numel() &&
                         (tensors.size() == per ||
                          (base_version != 0 && tensors.size() % per == 0 && !tensors.empty())),
                     "task model does not fit the layout");
  STARLING_CHECK_ARG(base_version == 0 || base_version == held,
                     "task model is a delta against version ", base_version, ", this client holds ",
                     held);
  if (tensors.size() != per)
    for (const auto& p : tensors)
      STARLING_CHECK_ARG(std::holds_alternative<cz::Ternary>(p),
                         "a chain of refreshes holds only ternary payloads");
  // In order: a chain's refreshes are added oldest first, as the server made them.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = layout.tensors()[i % per];
    float* dst = model.data() + t.offset;
    std::visit(Overloaded{
                   [&](const cz::DenseF32& d) {
                     std::memcpy(dst, d.values.data(), t.numel * sizeof(float));
                   },
                   [&](const cz::DenseF16& d) {
                     for (size_t j = 0; j < t.numel; ++j) dst[j] = halfToFloat(d.values[j]);
                   },
                   [&](const cz::Sparse& s) {
                     for (size_t j = 0; j < s.indices.size(); ++j) dst[s.indices[j]] = s.values[j];
                   },
                   [&](const cz::Qsgd& q) {
                     // The quantised downlink: the whole model (base 0) or a refresh added to the
                     // copy held. Every decoded value is exact (a power-of-two step), so the
                     // copy is the server's broadcast model bit for bit.
                     const std::span<float> out(dst, t.numel);
                     if (base_version == 0) std::fill(out.begin(), out.end(), 0.0f);
                     cz::accumulatePayload(cz::view(cz::Payload(q)), t, out, 1.0f);
                   },
                   [&](const cz::BlockQ& q) {
                     // The block-scaled downlinks, as the QSGD ones: every decoded value is
                     // exact and its sum with the copy's is the one float addition the server
                     // made, so the copy is the server's bit for bit.
                     const std::span<float> out(dst, t.numel);
                     if (base_version == 0) std::fill(out.begin(), out.end(), 0.0f);
                     cz::accumulatePayload(cz::view(cz::Payload(q)), t, out, 1.0f);
                   },
                   [&](const cz::Ternary& x) {
                     // The stc downlink's refresh, added to the copy held: the same float
                     // additions as the server's, so the copy stays its broadcast model bit for
                     // bit.
                     STARLING_CHECK_ARG(base_version != 0,
                                        "a ternary refresh needs a base version");
                     cz::accumulatePayload(cz::view(cz::Payload(x)), t,
                                           std::span<float>(dst, t.numel), 1.0f);
                   },
                   [&](const auto&) {
                     STARLING_THROW(InvalidArgument, "task model tensor ", i,
                                    " has an unexpected encoding");
                   },
               },
               tensors[i]);
  }
}

}  // namespace starling::protocol
