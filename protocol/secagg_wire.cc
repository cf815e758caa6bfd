#include "protocol/secagg_wire.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "compression/bitpack.h"
#include "protocol/codec.h"
#include "protocol/starling_generated.h"
#include "protocol/verify.h"

namespace starling::protocol {
namespace fb = starling::wire;
namespace pv = starling::privacy;

namespace {

[[noreturn]] void fail(Errc code, const std::string& msg) { throw InputError(code, msg); }

using detail::body;
using detail::finish;

template <size_t N>
std::array<uint8_t, N> fixed(const flatbuffers::Vector<uint8_t>* v, const char* what) {
  if (!v) fail(Errc::kMissingField, std::string("secagg: no ") + what);
  if (v->size() != N)
    fail(Errc::kSizeMismatch, std::string("secagg: ") + what + " of " + std::to_string(v->size()) +
                                  " bytes, not " + std::to_string(N));
  std::array<uint8_t, N> out{};
  std::memcpy(out.data(), v->data(), N);
  return out;
}

// Client ids: present, within `max`, strictly ascending.
std::vector<uint64_t> ids(const flatbuffers::Vector<uint64_t>* v, uint64_t max, const char* what,
                          bool may_be_empty = false) {
  if (!v || (v->size() == 0 && !may_be_empty))
    fail(Errc::kMissingField, std::string("secagg: no ") + what);
  if (v->size() > max)
    fail(Errc::kSizeMismatch, std::string("secagg: ") + std::to_string(v->size()) + " " + what +
                                  " (at most " + std::to_string(max) + ")");
  std::vector<uint64_t> out(v->begin(), v->end());
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i] <= out[i - 1])
      fail(Errc::kDuplicate, std::string("secagg: ") + what + " not strictly ascending (" +
                                 std::to_string(out[i - 1]) + ", then " + std::to_string(out[i]) +
                                 ")");
  return out;
}

template <class V>
void countWithin(const V* v, size_t max, const char* what) {
  if (!v) fail(Errc::kMissingField, std::string("secagg: no ") + what);
  if (v->size() > max)
    fail(Errc::kSizeMismatch, std::string("secagg: ") + std::to_string(v->size()) + " " + what +
                                  " (at most " + std::to_string(max) + ")");
}

flatbuffers::Offset<fb::SecAggKeys> keys(flatbuffers::FlatBufferBuilder& b, const pv::KeyAdvert& a,
                                         uint64_t nonce) {
  const bool is_signed =
      std::any_of(a.signature.begin(), a.signature.end(), [](uint8_t x) { return x != 0; });
  auto c = b.CreateVector(a.cipher_pk.data(), a.cipher_pk.size());
  auto m = b.CreateVector(a.mask_pk.data(), a.mask_pk.size());
  auto h = b.CreateVector(a.self_mask_hash.data(), a.self_mask_hash.size());
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> s, sk, cert;
  if (is_signed) {
    s = b.CreateVector(a.signature.data(), a.signature.size());
    sk = b.CreateVector(a.credential.signing_key.data(), a.credential.signing_key.size());
    cert = b.CreateVector(a.credential.certificate.data(), a.credential.certificate.size());
  }
  return fb::CreateSecAggKeys(b, a.client, a.round, nonce, c, m, h, s, sk, cert);
}

pv::KeyAdvert advertOf(const fb::SecAggKeys* k) {
  if (!k) fail(Errc::kMissingField, "secagg: an empty advert");
  pv::KeyAdvert a;
  a.client = k->client_id();
  a.round = k->round();
  a.cipher_pk = fixed<32>(k->cipher_pk(), "cipher public key");
  a.mask_pk = fixed<32>(k->mask_pk(), "mask public key");
  a.self_mask_hash = fixed<32>(k->self_mask_hash(), "self-mask hash");
  // A signed advert carries its credential whole; an unsigned one none of it.
  if (k->signature() || k->signing_key() || k->certificate()) {
    a.signature = fixed<64>(k->signature(), "signature");
    a.credential.signing_key = fixed<32>(k->signing_key(), "signing key");
    a.credential.certificate = fixed<64>(k->certificate(), "certificate");
  }
  return a;
}

// Bytes of a sealed share pair: what privacy::SecAggClient seals (two shares), its MAC and nonce.
// A ciphertext is bounded loosely here; privacy/secagg.h opens and checks it.
constexpr size_t kMaxCiphertext = 1024;

void packWords(std::span<const uint64_t> words, uint32_t bits, std::vector<uint8_t>& out) {
  compression::BitWriter w(out, words.size(), bits);
  for (uint64_t x : words) {
    if (bits <= 32) {
      w.put(static_cast<uint32_t>(x), bits);
    } else {
      w.put(static_cast<uint32_t>(x), 32);
      w.put(static_cast<uint32_t>(x >> 32), bits - 32);
    }
  }
  w.flush();
}

void unpackWords(const uint8_t* data, size_t count, uint32_t bits, std::vector<uint64_t>& out) {
  compression::BitReader r(data);
  out.resize(count);
  for (size_t i = 0; i < count; ++i) {
    if (bits <= 32) {
      out[i] = r.get(bits);
    } else {
      const uint64_t lo = r.get(32);
      out[i] = lo | (static_cast<uint64_t>(r.get(bits - 32)) << 32);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------- encoding

std::vector<uint8_t> encode(const SecAggSetupMsg& m) {
  flatbuffers::FlatBufferBuilder b(256 + 8 * m.clients.size());
  const auto& p = m.params;
  auto clients = b.CreateVector(m.clients);
  auto body = fb::CreateSecAggSetup(b, p.round, m.nonce, p.run_seed, p.neighbours, p.threshold,
                                    p.ring.bits, p.ring.scale, p.ring.clip, p.ring.max_clients,
                                    p.ring.dim, p.signed_keys, clients, pv::kSecAggDerivation,
                                    p.ring.noise, p.phase, p.clip_count);
  return finish(b, fb::Body::SecAggSetup, body.Union());
}

std::vector<uint8_t> encode(const SecAggKeysMsg& m) {
  flatbuffers::FlatBufferBuilder b(256);
  auto k = keys(b, m.advert, m.nonce);
  return finish(b, fb::Body::SecAggKeys, k.Union());
}

std::vector<uint8_t> encode(const SecAggAdvertsMsg& m) {
  flatbuffers::FlatBufferBuilder b(256 + 200 * m.adverts.size());
  std::vector<flatbuffers::Offset<fb::SecAggKeys>> v;
  v.reserve(m.adverts.size());
  for (const auto& a : m.adverts) v.push_back(keys(b, a, 0));
  auto adverts = b.CreateVector(v);
  auto body = fb::CreateSecAggAdverts(b, m.round, m.nonce, adverts);
  return finish(b, fb::Body::SecAggAdverts, body.Union());
}

std::vector<uint8_t> encode(const SecAggSharesMsg& m) {
  flatbuffers::FlatBufferBuilder b(256 + 256 * m.shares.size());
  std::vector<flatbuffers::Offset<fb::SecAggShare>> v;
  v.reserve(m.shares.size());
  for (const auto& s : m.shares)
    v.push_back(fb::CreateSecAggShare(b, s.from, s.to, b.CreateVector(s.ciphertext)));
  auto shares = b.CreateVector(v);
  auto body = fb::CreateSecAggShares(b, m.client, m.round, m.nonce, shares);
  return finish(b, fb::Body::SecAggShares, body.Union());
}

std::vector<uint8_t> encode(const SecAggMaskedMsg& m) {
  if (m.bits < pv::RingSpec::kMinBits || m.bits > pv::RingSpec::kMaxBits)
    STARLING_THROW(InvalidArgument, "secagg: a ring of ", m.bits, " bits");
  std::vector<uint8_t> packed;
  packWords(m.input.words, m.bits, packed);
  flatbuffers::FlatBufferBuilder b(packed.size() + 256 + 8 * m.input.clients.size());
  auto clients = b.CreateVector(m.input.clients);
  auto words = b.CreateVector(packed);
  std::vector<flatbuffers::Offset<fb::Metric>> ms;
  for (const auto& x : m.metrics)
    ms.push_back(fb::CreateMetric(b, b.CreateString(x.name), x.value));
  auto metrics = b.CreateVector(ms);
  auto body = fb::CreateSecAggMasked(b, m.client, m.input.round, m.nonce, m.bits,
                                     m.input.words.size(), clients, words, metrics);
  return finish(b, fb::Body::SecAggMasked, body.Union());
}

std::vector<uint8_t> encode(const SecAggUnmaskMsg& m) {
  flatbuffers::FlatBufferBuilder b(256 + 112 * m.request.signatures.size());
  auto dropped = b.CreateVector(m.request.dropped);
  auto survived = b.CreateVector(m.request.survived);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::SecAggSigned>>> sigs;
  if (!m.request.signatures.empty()) {
    std::vector<flatbuffers::Offset<fb::SecAggSigned>> v;
    for (const auto& s : m.request.signatures)
      v.push_back(fb::CreateSecAggSigned(b, s.client, s.round, m.nonce,
                                         b.CreateVector(s.signature.data(), s.signature.size())));
    sigs = b.CreateVector(v);
  }
  auto body = fb::CreateSecAggUnmask(b, m.request.round, m.nonce, dropped, survived, sigs);
  return finish(b, fb::Body::SecAggUnmask, body.Union());
}

std::vector<uint8_t> encode(const SecAggSurvivorsMsg& m) {
  flatbuffers::FlatBufferBuilder b(256 + 8 * m.request.absent.size());
  auto absent = b.CreateVector(m.request.absent);
  auto body = fb::CreateSecAggSurvivors(b, m.request.round, m.nonce, absent);
  return finish(b, fb::Body::SecAggSurvivors, body.Union());
}

std::vector<uint8_t> encode(const SecAggSignedMsg& m) {
  flatbuffers::FlatBufferBuilder b(256);
  const auto& s = m.signed_survivors;
  auto body = fb::CreateSecAggSigned(b, s.client, s.round, m.nonce,
                                     b.CreateVector(s.signature.data(), s.signature.size()));
  return finish(b, fb::Body::SecAggSigned, body.Union());
}

std::vector<uint8_t> encode(const SecAggRevealMsg& m) {
  flatbuffers::FlatBufferBuilder b(256 + 96 * m.response.shares.size());
  std::vector<flatbuffers::Offset<fb::SecAggRevealed>> v;
  for (const auto& s : m.response.shares) {
    if (s.pairwise) {  // a signed round's dropped neighbour: the key, no share
      v.push_back(fb::CreateSecAggRevealed(b, s.of, s.mask_key, 0,
                                           b.CreateVector(s.pairwise->data(), s.pairwise->size())));
      continue;
    }
    const auto bytes = s.share.bytes();
    v.push_back(
        fb::CreateSecAggRevealed(b, s.of, s.mask_key, b.CreateVector(bytes.data(), bytes.size())));
  }
  auto shares = b.CreateVector(v);
  auto body = fb::CreateSecAggReveal(b, m.response.client, m.response.round, m.nonce, shares);
  return finish(b, fb::Body::SecAggReveal, body.Union());
}

std::vector<uint8_t> encode(const SecAggRelayMsg& m) {
  size_t bytes = 256 + m.common.size();
  for (const auto& it : m.items) bytes += it.message.size() + 32;
  flatbuffers::FlatBufferBuilder b(bytes);
  std::vector<flatbuffers::Offset<fb::SecAggRelayed>> v;
  v.reserve(m.items.size());
  for (const auto& it : m.items)
    v.push_back(
        fb::CreateSecAggRelayed(b, it.client, it.message.empty() ? 0 : b.CreateVector(it.message)));
  auto items = b.CreateVector(v);
  auto common = m.common.empty() ? 0 : b.CreateVector(m.common);
  auto body = fb::CreateSecAggRelay(b, m.from, m.round, m.nonce, static_cast<uint8_t>(m.stage),
                                    m.deadline_ms, items, common);
  return finish(b, fb::Body::SecAggRelay, body.Union());
}

size_t secAggMaskedBytes(uint64_t dim, uint32_t bits, uint64_t client,
                         std::span<const Metric> metrics) {
  SecAggMaskedMsg m;
  m.client = client;
  m.nonce = 1;
  m.bits = bits;
  m.input.round = 1;
  m.input.clients = {client};
  m.input.words.assign(dim, 0);
  m.metrics.assign(metrics.begin(), metrics.end());
  return encode(m).size();
}

// ---------------------------------------------------------------- decoding

SecAggSetupMsg decodeSecAggSetup(std::span<const uint8_t> bytes, const SecAggLimits& l) {
  std::vector<uint64_t> aligned;
  const auto* m = body<fb::SecAggSetup>(bytes, l.max_bytes, fb::Body::SecAggSetup, 8, aligned);
  if (m->derivation() != pv::kSecAggDerivation)
    fail(Errc::kUnsupportedVersion,
         "secagg setup: keys and masks derived by version " + std::to_string(m->derivation()) +
             ", this build derives them by version " + std::to_string(pv::kSecAggDerivation) +
             " (run one Starling release at the root and its clients)");
  SecAggSetupMsg out;
  out.nonce = m->nonce();
  out.params.session = m->nonce();  // what a signed advert binds
  auto& p = out.params;
  p.run_seed = m->run_seed();
  p.round = m->round();
  p.phase = m->phase();
  p.neighbours = m->neighbours();
  p.threshold = m->threshold();
  p.ring.bits = m->bits();
  p.ring.scale = m->scale();
  p.ring.clip = m->clip();
  p.ring.max_clients = m->max_clients();
  p.ring.dim = m->dim();
  p.ring.noise = m->noise();
  p.dim = m->dim();
  p.signed_keys = m->signed_keys();
  p.clip_count = m->clip_count();
  if (p.neighbours > l.max_neighbours)
    fail(Errc::kSizeMismatch, "secagg setup: " + std::to_string(p.neighbours) +
                                  " neighbours (at most " + std::to_string(l.max_neighbours) + ")");
  out.clients = ids(m->clients(), l.max_clients, "clients");
  if (out.clients.size() > p.ring.max_clients)
    fail(Errc::kSizeMismatch, "secagg setup: " + std::to_string(out.clients.size()) +
                                  " clients for a ring sized for " +
                                  std::to_string(p.ring.max_clients));
  try {
    p.validate();
  } catch (const Error& e) {
    fail(Errc::kMissingField, std::string("secagg setup: ") + e.what());
  }
  return out;
}

SecAggKeysMsg decodeSecAggKeys(std::span<const uint8_t> bytes, const SecAggLimits& l) {
  std::vector<uint64_t> aligned;
  const auto* m = body<fb::SecAggKeys>(bytes, l.max_bytes, fb::Body::SecAggKeys, 8, aligned);
  return SecAggKeysMsg{m->nonce(), advertOf(m)};
}

SecAggAdvertsMsg decodeSecAggAdverts(std::span<const uint8_t> bytes, const SecAggLimits& l) {
  std::vector<uint64_t> aligned;
  const auto* m = body<fb::SecAggAdverts>(bytes, l.max_bytes, fb::Body::SecAggAdverts,
                                          8 + 2 * size_t{l.max_neighbours}, aligned);
  SecAggAdvertsMsg out{m->round(), m->nonce(), {}};
  countWithin(m->adverts(), l.max_neighbours, "adverts");
  for (flatbuffers::uoffset_t i = 0; i < m->adverts()->size(); ++i)
    out.adverts.push_back(advertOf(m->adverts()->Get(i)));
  return out;
}

SecAggSharesMsg decodeSecAggShares(std::span<const uint8_t> bytes, const SecAggLimits& l) {
  std::vector<uint64_t> aligned;
  const auto* m = body<fb::SecAggShares>(bytes, l.max_bytes, fb::Body::SecAggShares,
                                         8 + 2 * size_t{l.max_neighbours}, aligned);
  SecAggSharesMsg out{m->client_id(), m->round(), m->nonce(), {}};
  countWithin(m->shares(), l.max_neighbours, "shares");
  for (flatbuffers::uoffset_t i = 0; i < m->shares()->size(); ++i) {
    const fb::SecAggShare* s = m->shares()->Get(i);
    if (!s || !s->ciphertext() || s->ciphertext()->size() == 0)
      fail(Errc::kMissingField, "secagg: a share without its ciphertext");
    if (s->ciphertext()->size() > kMaxCiphertext)
      fail(Errc::kSizeMismatch, "secagg: a share of " + std::to_string(s->ciphertext()->size()) +
                                    " bytes (at most " + std::to_string(kMaxCiphertext) + ")");
    out.shares.push_back(pv::EncryptedShare{
        s->from(), s->to(), out.round, {s->ciphertext()->begin(), s->ciphertext()->end()}});
  }
  return out;
}

SecAggMaskedMsg decodeSecAggMasked(std::span<const uint8_t> bytes, uint64_t dim,
                                   const SecAggLimits& l) {
  std::vector<uint64_t> aligned;
  const auto* m = body<fb::SecAggMasked>(bytes, l.max_bytes, fb::Body::SecAggMasked,
                                         8 + 2 * l.max_metrics, aligned);
  SecAggMaskedMsg out;
  out.client = m->client_id();
  out.nonce = m->nonce();
  out.bits = m->bits();
  out.input.round = m->round();
  if (out.bits < pv::RingSpec::kMinBits || out.bits > pv::RingSpec::kMaxBits)
    fail(Errc::kSizeMismatch,
         "secagg: a masked input in a ring of " + std::to_string(out.bits) + " bits");
  if (m->dim() != dim)
    fail(Errc::kSizeMismatch, "secagg: a masked input of " + std::to_string(m->dim()) +
                                  " words, the round's inputs have " + std::to_string(dim));
  out.input.clients = ids(m->clients(), l.max_clients, "contributors");
  if (!m->packed()) fail(Errc::kMissingField, "secagg: a masked input without its words");
  const size_t want = compression::packedBytes(dim, out.bits);
  if (m->packed()->size() != want)
    fail(Errc::kSizeMismatch, "secagg: a masked input of " + std::to_string(m->packed()->size()) +
                                  " bytes, " + std::to_string(dim) + " words of " +
                                  std::to_string(out.bits) + " bits take " + std::to_string(want));
  unpackWords(m->packed()->data(), dim, out.bits, out.input.words);
  if (const auto* ms = m->metrics()) {
    if (ms->size() > l.max_metrics)
      fail(Errc::kSizeMismatch, "secagg: " + std::to_string(ms->size()) + " metrics (at most " +
                                    std::to_string(l.max_metrics) + ")");
    std::set<std::string> names;
    for (flatbuffers::uoffset_t i = 0; i < ms->size(); ++i) {
      const fb::Metric* x = ms->Get(i);
      if (!x || !x->name() || x->name()->size() == 0 || x->name()->size() > l.max_metric_name)
        fail(Errc::kMissingField, "secagg: a metric without a name, or with a name too long");
      std::string name(x->name()->c_str(), x->name()->size());
      for (char c : name)
        if (!std::isprint(static_cast<unsigned char>(c)))
          fail(Errc::kMissingField, "secagg: a metric name with a non-printable byte");
      if (!std::isfinite(x->value()))
        fail(Errc::kNonFinite, "secagg: metric " + name + " is not finite");
      if (!names.insert(name).second) fail(Errc::kDuplicate, "secagg: metric " + name + " twice");
      out.metrics.push_back(Metric{std::move(name), x->value()});
    }
  }
  return out;
}

SecAggUnmaskMsg decodeSecAggUnmask(std::span<const uint8_t> bytes, const SecAggLimits& l) {
  std::vector<uint64_t> aligned;
  const auto* m = body<fb::SecAggUnmask>(bytes, l.max_bytes, fb::Body::SecAggUnmask,
                                         8 + size_t{l.max_neighbours}, aligned);
  SecAggUnmaskMsg out;
  out.nonce = m->nonce();
  out.request.round = m->round();
  out.request.dropped = ids(m->dropped(), l.max_neighbours, "dropped neighbours", true);
  out.request.survived = ids(m->survived(), l.max_neighbours, "surviving neighbours", true);
  if (const auto* sigs = m->signatures()) {
    countWithin(sigs, l.max_neighbours, "survivors signatures");
    for (flatbuffers::uoffset_t i = 0; i < sigs->size(); ++i) {
      const fb::SecAggSigned* s = sigs->Get(i);
      if (!s) fail(Errc::kMissingField, "secagg: an empty survivors signature");
      if (!out.request.signatures.empty() && s->client_id() <= out.request.signatures.back().client)
        fail(Errc::kDuplicate, "secagg: survivors signatures not by ascending client");
      out.request.signatures.push_back(
          {s->client_id(), s->round(), fixed<64>(s->signature(), "survivors signature")});
    }
  }
  return out;
}

SecAggSurvivorsMsg decodeSecAggSurvivors(std::span<const uint8_t> bytes, const SecAggLimits& l) {
  std::vector<uint64_t> aligned;
  const auto* m =
      body<fb::SecAggSurvivors>(bytes, l.max_bytes, fb::Body::SecAggSurvivors, 8, aligned);
  SecAggSurvivorsMsg out;
  out.nonce = m->nonce();
  out.request.round = m->round();
  out.request.absent = ids(m->absent(), l.max_clients, "absent clients", true);
  return out;
}

SecAggSignedMsg decodeSecAggSigned(std::span<const uint8_t> bytes, const SecAggLimits& l) {
  std::vector<uint64_t> aligned;
  const auto* m = body<fb::SecAggSigned>(bytes, l.max_bytes, fb::Body::SecAggSigned, 8, aligned);
  return SecAggSignedMsg{
      m->nonce(), {m->client_id(), m->round(), fixed<64>(m->signature(), "survivors signature")}};
}

SecAggRevealMsg decodeSecAggReveal(std::span<const uint8_t> bytes, const SecAggLimits& l) {
  std::vector<uint64_t> aligned;
  const auto* m = body<fb::SecAggReveal>(bytes, l.max_bytes, fb::Body::SecAggReveal,
                                         8 + 2 * size_t{l.max_neighbours}, aligned);
  SecAggRevealMsg out;
  out.nonce = m->nonce();
  out.response.client = m->client_id();
  out.response.round = m->round();
  countWithin(m->shares(), l.max_neighbours, "revealed shares");
  for (flatbuffers::uoffset_t i = 0; i < m->shares()->size(); ++i) {
    const fb::SecAggRevealed* s = m->shares()->Get(i);
    if (!s) fail(Errc::kMissingField, "secagg: an empty revealed share");
    pv::RevealedShare r;
    r.of = s->of();
    r.mask_key = s->mask_key();
    // A pairwise key (about a dropped neighbour) or a share: exactly one of them.
    if (s->pairwise()) {
      if (s->share() || !r.mask_key)
        fail(Errc::kInconsistentShares,
             "secagg: a revealed pairwise key beside a share, or for a survivor");
      r.pairwise = fixed<32>(s->pairwise(), "revealed pairwise key");
      out.response.shares.push_back(r);
      continue;
    }
    const auto raw = fixed<pv::Share::kBytes>(s->share(), "revealed share");
    try {
      r.share = pv::Share::fromBytes(raw);
    } catch (const InvalidArgument& e) {
      fail(Errc::kInconsistentShares, std::string("secagg: ") + e.what());
    }
    out.response.shares.push_back(r);
  }
  return out;
}

SecAggRelayMsg decodeSecAggRelay(std::span<const uint8_t> bytes, const SecAggLimits& l) {
  std::vector<uint64_t> aligned;
  const auto* m = body<fb::SecAggRelay>(bytes, l.max_bytes, fb::Body::SecAggRelay,
                                        8 + 2 * static_cast<size_t>(l.max_clients), aligned);
  SecAggRelayMsg out;
  out.from = m->from();
  out.round = m->round();
  out.nonce = m->nonce();
  out.deadline_ms = m->deadline_ms();
  if (m->stage() > static_cast<uint8_t>(kLastRelayStage))
    fail(Errc::kUnexpectedEncoding, "secagg relay: stage " + std::to_string(m->stage()) +
                                        " is none of 0 to " +
                                        std::to_string(static_cast<int>(kLastRelayStage)));
  out.stage = static_cast<RelayStage>(m->stage());
  const bool roster = out.stage == RelayStage::kRoster;
  if (m->common() && m->common()->size() > 0) {
    if (out.stage != RelayStage::kAdvertise)
      fail(Errc::kUnexpectedEncoding, "secagg relay: a common message outside the advertise step");
    out.common.assign(m->common()->begin(), m->common()->end());
  }
  // Items carry no message in a roster and beside a common one.
  const bool bare = roster || !out.common.empty();
  if (!m->items()) {
    if (!roster) fail(Errc::kMissingField, "secagg relay: no items");
    return out;
  }
  countWithin(m->items(), l.max_clients, "relayed items");
  out.items.reserve(m->items()->size());
  for (flatbuffers::uoffset_t i = 0; i < m->items()->size(); ++i) {
    const fb::SecAggRelayed* x = m->items()->Get(i);
    if (!x) fail(Errc::kMissingField, "secagg relay: an empty item");
    if (!out.items.empty() && x->client() <= out.items.back().client)
      fail(Errc::kDuplicate, "secagg relay: clients not strictly ascending (" +
                                 std::to_string(out.items.back().client) + ", then " +
                                 std::to_string(x->client()) + ")");
    const bool has = x->message() && x->message()->size() > 0;
    if (bare && has)
      fail(Errc::kUnexpectedEncoding,
           roster ? "secagg relay: a roster item with a message"
                  : "secagg relay: an item with a message beside the common one");
    if (!bare && !has)
      fail(Errc::kMissingField,
           "secagg relay: client " + std::to_string(x->client()) + "'s item without its message");
    SecAggRelayMsg::Item item{x->client(), {}};
    if (has) item.message.assign(x->message()->begin(), x->message()->end());
    out.items.push_back(std::move(item));
  }
  return out;
}

}  // namespace starling::protocol
