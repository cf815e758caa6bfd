#include "privacy/secagg.h"

#include <sodium.h>

#include <algorithm>
#include <bit>
#include <string_view>

#include "core/error.h"

namespace starling::privacy {
namespace {

void putU64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t getU64(std::span<const uint8_t> b, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[at + i]) << (8 * i);
  return v;
}

Key32 hashKey(const Key32& k) {
  ensureSodium();
  Key32 h;
  static constexpr char kDomain[] = "starling secagg self-mask seed v1";
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(kDomain), sizeof kDomain - 1);
  crypto_generichash_update(&st, k.data(), k.size());
  crypto_generichash_final(&st, h.data(), h.size());
  return h;
}

// What a sealed share is bound to: sender, recipient, run and round.
std::vector<uint8_t> shareContext(uint64_t from, uint64_t to, uint64_t run, uint64_t round) {
  std::vector<uint8_t> c;
  putU64(c, from);
  putU64(c, to);
  putU64(c, run);
  putU64(c, round);
  return c;
}

// The plaintext of a sealed pair of shares: from, to, round, then the two shares (the mask key's,
// then the self-mask seed's). A signed round deals the seed's only: it never rebuilds a mask key
// (SecAggClient::unmask), so t colluding neighbours hold nothing of one.
constexpr size_t kSharePlain = 3 * 8 + 2 * Share::kBytes;
constexpr size_t kSeedSharePlain = 3 * 8 + Share::kBytes;

uint64_t point(uint64_t client) { return client + 1; }  // Shamir points start at 1

// The public key of an X25519 secret key.
Key32 publicOf(const Key32& secret) {
  ensureSodium();
  Key32 pk;
  crypto_scalarmult_base(pk.data(), secret.data());
  return pk;
}

// Shamir points are ids + 1, below the field's prime.
void checkIds(std::span<const uint64_t> clients) {
  for (uint64_t c : clients)
    if (c >= kShamirPrime - 1)
      STARLING_THROW(InvalidArgument, "secagg: client id ", c, " is at or above 2^61 - 2");
}

void checkRound(uint64_t got, uint64_t want, const char* what) {
  if (got != want) failInput(Errc::kWrongRound, what, " of round ", got, " in round ", want);
}

Key32 sortedRoster(std::span<const uint64_t> clients) {
  std::vector<uint64_t> sorted(clients.begin(), clients.end());
  std::sort(sorted.begin(), sorted.end());
  return rosterHash(sorted);
}

}  // namespace

void SecAggParams::validate() const {
  if (neighbours < 2 || neighbours % 2 != 0)
    STARLING_THROW(ConfigError, "secagg.neighbours must be even and at least 2, got ", neighbours);
  if (threshold < 2 || threshold > neighbours)
    STARLING_THROW(ConfigError, "secagg.threshold must be in [2, secagg.neighbours = ", neighbours,
                   "], got ", threshold);
  if (dim == 0) STARLING_THROW(ConfigError, "secure aggregation of a model of 0 values");
  if (clip_count && dim < 2)
    STARLING_THROW(ConfigError, "secure aggregation of a clip count and no update value");
  ring.validate();
}

Key32 rosterHash(std::span<const uint64_t> sorted_clients) {
  for (size_t i = 1; i < sorted_clients.size(); ++i)
    STARLING_CHECK_ARG(sorted_clients[i] > sorted_clients[i - 1],
                       "secagg: a roster not strictly ascending (", sorted_clients[i - 1],
                       ", then ", sorted_clients[i], ")");
  return hashWords("starling secagg roster v1", sorted_clients);
}

namespace {

// What every signature of a round's exchange starts with: its domain, the run, the round, the
// setup's session and the roster.
std::vector<uint8_t> exchangeBytes(std::string_view domain, const SecAggParams& p, uint64_t round,
                                   const Key32& roster) {
  std::vector<uint8_t> b(domain.begin(), domain.end());
  putU64(b, p.run_seed);
  putU64(b, round);
  putU64(b, p.phase);  // derivation 4
  putU64(b, p.session);
  b.insert(b.end(), roster.begin(), roster.end());
  return b;
}

// An advert's client and its fresh keys.
void appendAdvertKeys(std::vector<uint8_t>& b, const KeyAdvert& a) {
  putU64(b, a.client);
  b.insert(b.end(), a.cipher_pk.begin(), a.cipher_pk.end());
  b.insert(b.end(), a.mask_pk.begin(), a.mask_pk.end());
  b.insert(b.end(), a.self_mask_hash.begin(), a.self_mask_hash.end());
}

}  // namespace

std::vector<uint8_t> advertBytes(const KeyAdvert& a, const SecAggParams& p, const Key32& roster) {
  std::vector<uint8_t> b = exchangeBytes("starling secagg advert v3", p, a.round, roster);
  // The round's parameters: a server that gives neighbours different k, t, rings or sizes is
  // caught as a swapped key is.
  putU64(b, p.neighbours);
  putU64(b, p.threshold);
  putU64(b, p.ring.bits);
  putU64(b, std::bit_cast<uint64_t>(p.ring.scale));
  putU64(b, std::bit_cast<uint64_t>(p.ring.clip));
  putU64(b, p.ring.max_clients);
  putU64(b, p.dim);
  putU64(b, std::bit_cast<uint64_t>(p.ring.noise));  // derivation 3
  putU64(b, p.clip_count ? 1 : 0);                   // derivation 5
  appendAdvertKeys(b, a);
  return b;
}

SecAggSigner SecAggSigner::certified(const SigningKeyPair& authority, uint64_t id,
                                     const Key32& seed) {
  SecAggSigner s;
  s.key = SigningKeyPair::fromSeed(seed);
  s.credential = {s.key.public_key, certify(authority, id, s.key.public_key)};
  return s;
}

bool advertSigned(const KeyAdvert& a, const Key32& authority, const SecAggParams& p,
                  const Key32& roster) {
  return credentialValid(authority, a.client, a.credential) &&
         verify(a.credential.signing_key, advertBytes(a, p, roster), a.signature);
}

std::vector<uint8_t> survivorsBytes(const SecAggParams& p, const Key32& roster,
                                    std::span<const uint64_t> absent, const KeyAdvert& signer) {
  std::vector<uint8_t> b = exchangeBytes("starling secagg survivors v1", p, p.round, roster);
  const Key32 h = hashWords("starling secagg absent v1", absent);
  b.insert(b.end(), h.begin(), h.end());
  appendAdvertKeys(b, signer);
  return b;
}

// ---------------------------------------------------------------- client

SecAggClient::SecAggClient(SecAggParams params, uint64_t id, std::span<const uint64_t> clients,
                           const SecAggSigner* signer)
    : p_((params.validate(), std::move(params))),
      id_(id),
      roster_(sortedRoster(clients)),
      neighbours_(
          (checkIds(clients), hararyNeighbours(clients, p_.neighbours, p_.run_seed, p_.round, id))),
      cipher_(DhKeyPair::generate()),
      mask_(DhKeyPair::generate()),
      self_seed_(randomKey()) {
  if (p_.signed_keys && signer == nullptr)
    STARLING_THROW(ConfigError, "secagg with signed keys: client ", id, " has no signing key");
  // The unmask step's bound (unmask) counts on t above half of the neighbours it can have.
  if (p_.signed_keys && 2 * static_cast<size_t>(p_.threshold) <= neighbours_.size())
    STARLING_THROW(InvalidArgument, "secagg: threshold ", p_.threshold, " of ", neighbours_.size(),
                   " neighbours: a signed round needs more than half");
  advert_.client = id;
  advert_.round = p_.round;
  advert_.cipher_pk = cipher_.public_key;
  advert_.mask_pk = mask_.public_key;
  advert_.self_mask_hash = hashKey(self_seed_);
  if (p_.signed_keys) {
    advert_.signature = sign(signer->key, advertBytes(advert_, p_, roster_));
    advert_.credential = signer->credential;
    signing_ = signer->key;
  }
}

KeyAdvert SecAggClient::advertise() const { return advert_; }

std::vector<EncryptedShare> SecAggClient::shareKeys(std::span<const KeyAdvert> adverts,
                                                    const Key32* authority) {
  if (shared_) failInput(Errc::kDuplicate, "client ", id_, " already shared its keys");
  std::map<uint64_t, KeyAdvert> got;
  for (const KeyAdvert& a : adverts) {
    checkRound(a.round, p_.round, "an advertised key");
    if (a.client == id_) failInput(Errc::kWrongSender, "client ", id_, " was sent its own key");
    if (!std::binary_search(neighbours_.begin(), neighbours_.end(), a.client))
      failInput(Errc::kNotNeighbour, "client ", a.client, " is not a neighbour of client ", id_);
    if (p_.signed_keys && (!authority || !advertSigned(a, *authority, p_, roster_)))
      failInput(Errc::kBadSignature, "the key advertised for client ", a.client,
                " is not signed with a key the authority certified for it (a server that "
                "substituted it, or a client it invented?)");
    if (!got.emplace(a.client, a).second)
      failInput(Errc::kDuplicate, "client ", a.client, "'s key advertised twice");
  }
  if (got.size() < p_.threshold)
    failInput(Errc::kTooFewSurvivors, got.size(), " of client ", id_,
              "'s neighbours advertised keys; its secrets need ", p_.threshold);
  std::vector<uint64_t> points;
  for (const auto& [v, a] : got) points.push_back(point(v));
  const std::vector<Share> key_shares =
      p_.signed_keys ? std::vector<Share>{} : shamirSplit(mask_.secret_key, p_.threshold, points);
  const std::vector<Share> seed_shares = shamirSplit(self_seed_, p_.threshold, points);
  std::vector<EncryptedShare> out;
  size_t i = 0;
  for (const auto& [v, a] : got) {
    std::vector<uint8_t> plain;
    putU64(plain, id_);
    putU64(plain, v);
    putU64(plain, p_.round);
    if (!p_.signed_keys) {
      const auto ks = key_shares[i].bytes();
      plain.insert(plain.end(), ks.begin(), ks.end());
    }
    const auto ss = seed_shares[i].bytes();
    plain.insert(plain.end(), ss.begin(), ss.end());
    const Key32 k =
        agree(cipher_, a.cipher_pk, p_.run_seed, p_.round, KeyPurpose::kShareEncryption);
    out.push_back({id_, v, p_.round, seal(k, plain, shareContext(id_, v, p_.run_seed, p_.round))});
    sodium_memzero(plain.data(), plain.size());
    ++i;
  }
  advertised_ = std::move(got);
  shared_ = true;
  return out;
}

MaskedInput SecAggClient::maskedInput(std::span<const EncryptedShare> to_me,
                                      std::span<const float> x) {
  return maskedInput(to_me, x, randomKey());
}

MaskedInput SecAggClient::maskedInput(std::span<const EncryptedShare> to_me,
                                      std::span<const float> x, const Key32& rounding_key) {
  if (!shared_) failInput(Errc::kWrongRound, "client ", id_, ": masked input before its shares");
  if (masked_) failInput(Errc::kDuplicate, "client ", id_, " already sent its masked input");
  STARLING_CHECK_ARG(x.size() == p_.dim, "secagg: an input of ", x.size(), " values, the round's ",
                     p_.dim);
  std::map<uint64_t, std::pair<Share, Share>> held;
  for (const EncryptedShare& e : to_me) {
    checkRound(e.round, p_.round, "a share");
    if (e.to != id_) failInput(Errc::kWrongSender, "a share for client ", e.to, " sent to ", id_);
    if (e.from == id_) failInput(Errc::kWrongSender, "client ", id_, " was sent its own share");
    const auto a = advertised_.find(e.from);
    if (a == advertised_.end())
      failInput(Errc::kNotNeighbour, "a share from client ", e.from, ", not a neighbour of client ",
                id_, " that advertised keys");
    const Key32 k =
        agree(cipher_, a->second.cipher_pk, p_.run_seed, p_.round, KeyPurpose::kShareEncryption);
    const auto plain = open(k, e.ciphertext, shareContext(e.from, id_, p_.run_seed, p_.round));
    const size_t want = p_.signed_keys ? kSeedSharePlain : kSharePlain;
    if (!plain || plain->size() != want || getU64(*plain, 0) != e.from ||
        getU64(*plain, 8) != id_ || getU64(*plain, 16) != p_.round)
      failInput(Errc::kInconsistentShares, "the share from client ", e.from, " to client ", id_,
                " does not open");
    const std::span<const uint8_t> body(*plain);
    Share ks, ss;  // a signed round's ks stays empty: no mask key is shared
    try {
      if (!p_.signed_keys) ks = Share::fromBytes(body.subspan(24, Share::kBytes));
      ss = Share::fromBytes(body.subspan(want - Share::kBytes, Share::kBytes));
    } catch (const InvalidArgument& err) {
      failInput(Errc::kInconsistentShares, "the share from client ", e.from, ": ", err.what());
    }
    if ((!p_.signed_keys && ks.x != point(id_)) || ss.x != point(id_))
      failInput(Errc::kInconsistentShares, "the share from client ", e.from, " is not at client ",
                id_, "'s point");
    if (!held.emplace(e.from, std::make_pair(ks, ss)).second)
      failInput(Errc::kDuplicate, "two shares from client ", e.from);
  }
  if (held.size() < p_.threshold)
    failInput(Errc::kTooFewSurvivors, held.size(), " of client ", id_,
              "'s neighbours sent their shares; the round needs ", p_.threshold);
  MaskedInput m;
  m.round = p_.round;
  m.clients = {id_};
  m.words.assign(p_.dim, 0);
  encode(p_.ring, x, rounding_key, p_.round, m.words);
  addNoise(p_.ring, m.words, rounding_key, p_.round);  // distributed DP's share (ring.noise > 0)
  applyMask(m.words, self_seed_, p_.round, MaskStream::kSelfMask, 0, p_.ring.bits, false);
  for (const auto& [v, shares] : held) {
    const Key32 s =
        agree(mask_, advertised_.at(v).mask_pk, p_.run_seed, p_.round, KeyPurpose::kMask);
    applyMask(m.words, s, p_.round, MaskStream::kPairwiseMask, 0, p_.ring.bits,
              /*subtract=*/id_ > v);
  }
  held_ = std::move(held);
  masked_ = true;
  return m;
}

SurvivorsSigned SecAggClient::signSurvivors(const SurvivorsRequest& request) {
  if (!p_.signed_keys)
    failInput(Errc::kUnexpectedMessage, "client ", id_,
              " was sent a survivors list in a round that does not sign its keys");
  checkRound(request.round, p_.round, "a survivors list");
  if (!masked_)
    failInput(Errc::kWrongRound, "client ", id_, ": a survivors list before its masked input");
  if (absent_)
    failInput(Errc::kDuplicate, "client ", id_,
              " already signed the round's survivors (a second list could tell its neighbours "
              "another story)");
  const std::vector<uint64_t>& absent = request.absent;
  for (size_t i = 1; i < absent.size(); ++i)
    if (absent[i] <= absent[i - 1])
      failInput(Errc::kDuplicate, "a survivors list whose absent clients are not ascending");
  if (std::binary_search(absent.begin(), absent.end(), id_))
    failInput(Errc::kInconsistentSurvivors, "client ", id_,
              " is told its own masked input is absent, which it sent");
  size_t survived = 0;
  for (const auto& [v, shares] : held_)
    if (!std::binary_search(absent.begin(), absent.end(), v)) ++survived;
  if (survived < p_.threshold)
    failInput(Errc::kTooFewSurvivors, "the survivors list leaves ", survived, " of the ",
              held_.size(), " neighbours client ", id_, " masked with; the round needs ",
              p_.threshold);
  SurvivorsSigned out{id_, p_.round, sign(*signing_, survivorsBytes(p_, roster_, absent, advert_))};
  absent_ = absent;
  return out;
}

UnmaskResponse SecAggClient::unmask(const UnmaskRequest& request) {
  checkRound(request.round, p_.round, "an unmask request");
  if (!masked_) failInput(Errc::kWrongRound, "client ", id_, ": unmask before its masked input");
  if (answered_)
    failInput(Errc::kRevealBoth, "client ", id_,
              " already answered an unmask request (a second could ask for the other share)");
  if (p_.signed_keys) checkSurvivors(request);
  std::set<uint64_t> dropped(request.dropped.begin(), request.dropped.end()),
      survived(request.survived.begin(), request.survived.end());
  if (dropped.size() != request.dropped.size() || survived.size() != request.survived.size())
    failInput(Errc::kDuplicate, "an unmask request names a client twice");
  for (uint64_t v : dropped)
    if (survived.count(v))
      failInput(Errc::kRevealBoth, "asked for both shares of client ", v,
                " (its mask key and "
                "its self-mask seed): that would unmask its input");
  for (const auto* list : {&dropped, &survived})
    for (uint64_t v : *list) {
      if (v == id_) failInput(Errc::kRevealBoth, "client ", id_, " asked about itself");
      if (!held_.count(v))
        failInput(Errc::kNotNeighbour, "asked about client ", v, ", whose shares client ", id_,
                  " does not hold");
    }
  // Signed rounds: at most (masking neighbours - t) of them dropped. A server that wants this
  // client's input must remove every pairwise mask in it, each revealed by this client (for a
  // neighbour said to have dropped) or by that neighbour (told this one dropped), and rebuild its
  // self-mask seed from t neighbours told it survived, which then reveal nothing else about it:
  // (m - t) + (m - t) < m for t > m / 2.
  if (p_.signed_keys && dropped.size() + p_.threshold > held_.size())
    failInput(Errc::kTooFewSurvivors, "asked to reveal its pairwise keys with ", dropped.size(),
              " of the ", held_.size(), " neighbours client ", id_, " masked with; at most ",
              held_.size() - p_.threshold,
              " may have dropped (more would let the server unmask its input)");
  UnmaskResponse r;
  r.client = id_;
  r.round = p_.round;
  for (uint64_t v : dropped) {
    RevealedShare s{v, true, held_.at(v).first, std::nullopt};
    if (p_.signed_keys) {
      s.share = Share{};
      s.pairwise =
          agree(mask_, advertised_.at(v).mask_pk, p_.run_seed, p_.round, KeyPurpose::kMask);
    }
    r.shares.push_back(std::move(s));
  }
  for (uint64_t v : survived) r.shares.push_back({v, false, held_.at(v).second, std::nullopt});
  answered_ = true;
  return r;
}

void SecAggClient::checkSurvivors(const UnmaskRequest& request) const {
  if (!absent_)
    failInput(Errc::kInconsistentSurvivors, "client ", id_,
              " was asked to unmask before it signed the round's survivors");
  const std::vector<uint64_t>& absent = *absent_;
  std::vector<uint64_t> dropped, survived;  // ascending, as held_
  for (const auto& [v, shares] : held_)
    (std::binary_search(absent.begin(), absent.end(), v) ? dropped : survived).push_back(v);
  std::vector<uint64_t> asked_dropped = request.dropped, asked_survived = request.survived;
  std::sort(asked_dropped.begin(), asked_dropped.end());
  std::sort(asked_survived.begin(), asked_survived.end());
  if (asked_dropped != dropped || asked_survived != survived)
    failInput(Errc::kInconsistentSurvivors, "client ", id_,
              " was asked about neighbours other than the survivors list it signed names (",
              request.dropped.size(), " dropped, ", request.survived.size(),
              " survived, where the list gives ", dropped.size(), " and ", survived.size(), ")");
  std::set<uint64_t> signers;
  for (const SurvivorsSigned& s : request.signatures) {
    checkRound(s.round, p_.round, "a survivors signature");
    if (s.client == id_ || !std::binary_search(survived.begin(), survived.end(), s.client))
      failInput(Errc::kNotNeighbour, "a survivors signature of client ", s.client,
                ", not a surviving neighbour client ", id_, " masked with");
    if (!signers.insert(s.client).second)
      failInput(Errc::kDuplicate, "two survivors signatures of client ", s.client);
    const KeyAdvert& a = advertised_.at(s.client);
    if (!verify(a.credential.signing_key, survivorsBytes(p_, roster_, absent, a), s.signature))
      failInput(Errc::kBadSignature, "client ", s.client,
                "'s signature is not of the survivors list client ", id_, " signed");
  }
  if (signers.size() < p_.threshold)
    failInput(Errc::kInconsistentSurvivors, signers.size(), " of client ", id_,
              "'s neighbours signed the survivors list it signed; it reveals nothing without ",
              p_.threshold);
}

// ---------------------------------------------------------------- server

SecAggServer::SecAggServer(SecAggParams params, std::span<const uint64_t> clients,
                           const Key32* authority)
    : p_((params.validate(), std::move(params))),
      graph_((checkIds(clients), harary(clients, p_.neighbours, p_.run_seed, p_.round))),
      roster_(rosterHash(graph_.clients)),
      sum_(p_.dim, 0) {
  if (p_.signed_keys) {
    if (!authority) STARLING_THROW(ConfigError, "secagg with signed keys: no authority's key");
    authority_ = *authority;
  }
}

void SecAggServer::setSession(uint64_t session) {
  STARLING_CHECK_ARG(adverts_.empty() && !adverts_closed_,
                     "secagg: the session is set before the first advert");
  p_.session = session;
}

void SecAggServer::onAdvert(const KeyAdvert& a) {
  checkRound(a.round, p_.round, "an advertised key");
  if (adverts_closed_)
    failInput(Errc::kLate, "client ", a.client, "'s keys after the phase closed");
  if (!std::binary_search(graph_.clients.begin(), graph_.clients.end(), a.client))
    failInput(Errc::kWrongSender, "client ", a.client, " is not in round ", p_.round);
  if (adverts_.count(a.client))
    failInput(Errc::kDuplicate, "client ", a.client, " advertised twice");
  if (p_.signed_keys) {
    if (!advertSigned(a, authority_, p_, roster_))
      failInput(Errc::kBadSignature, "client ", a.client,
                "'s advertised keys are not signed with a key the authority certified for it");
  }
  adverts_.emplace(a.client, a);
}

std::vector<KeyAdvert> SecAggServer::advertsFor(uint64_t client) {
  adverts_closed_ = true;
  std::vector<KeyAdvert> out;
  for (uint64_t v : graph_.neighbours(client))
    if (const auto it = adverts_.find(v); it != adverts_.end()) out.push_back(it->second);
  return out;
}

void SecAggServer::onShares(uint64_t from, std::span<const EncryptedShare> shares) {
  if (shares_closed_) failInput(Errc::kLate, "client ", from, "'s shares after the phase closed");
  if (!adverts_.count(from))
    failInput(Errc::kWrongSender, "shares from client ", from, ", which advertised no keys");
  if (shares_.count(from)) failInput(Errc::kDuplicate, "client ", from, " sent its shares twice");
  std::set<uint64_t> to;
  for (const EncryptedShare& e : shares) {
    checkRound(e.round, p_.round, "a share");
    if (e.from != from) failInput(Errc::kWrongSender, "client ", from, " sent a share as ", e.from);
    if (e.to == from) failInput(Errc::kWrongSender, "client ", from, " sent a share to itself");
    if (!graph_.adjacent(from, e.to) || !adverts_.count(e.to))
      failInput(Errc::kNotNeighbour, "a share from client ", from, " for client ", e.to,
                ", not a neighbour that advertised keys");
    if (!to.insert(e.to).second) failInput(Errc::kDuplicate, "two shares for client ", e.to);
  }
  // Every advertised neighbour must get one: a client that held some back could leave its pairs'
  // masks unrecoverable.
  for (uint64_t v : graph_.neighbours(from))
    if (adverts_.count(v) && !to.count(v))
      failInput(Errc::kInconsistentShares, "client ", from, " sent no share to its neighbour ", v);
  if (to.size() < p_.threshold)
    failInput(Errc::kTooFewSurvivors, "client ", from, " shared among ", to.size(),
              " neighbours; its secrets need ", p_.threshold);
  shares_.emplace(from, std::vector<EncryptedShare>(shares.begin(), shares.end()));
}

std::vector<EncryptedShare> SecAggServer::sharesFor(uint64_t client) {
  shares_closed_ = true;
  std::vector<EncryptedShare> out;
  for (uint64_t v : graph_.neighbours(client))
    if (const auto it = shares_.find(v); it != shares_.end())
      for (const EncryptedShare& e : it->second)
        if (e.to == client) out.push_back(e);
  return out;
}

void SecAggServer::onMaskedInput(const MaskedInput& m) {
  checkRound(m.round, p_.round, "a masked input");
  if (closed_) failInput(Errc::kLate, "a masked input after the round's inputs closed");
  // Only once the shares were handed out (sharesFor closed them): an early one, refused, must not
  // close the honest clients' shares either.
  if (!shares_closed_)
    failInput(Errc::kWrongRound, "a masked input before the round's shares were handed out");
  if (m.words.size() != p_.dim)
    failInput(Errc::kSizeMismatch, "a masked input of ", m.words.size(), " words, the round's ",
              p_.dim);
  const uint64_t mask = p_.ring.mask();
  for (uint64_t w : m.words)
    if ((w & ~mask) != 0)
      failInput(Errc::kSizeMismatch, "a masked input's word ", w, " is beyond Z_2^", p_.ring.bits);
  if (m.clients.empty()) failInput(Errc::kWrongSender, "a masked input of no client");
  std::set<uint64_t> seen;
  for (uint64_t c : m.clients) {
    if (!shares_.count(c))
      failInput(Errc::kWrongSender, "a masked input of client ", c, ", which sent no shares");
    if (masked_.count(c) || !seen.insert(c).second)
      failInput(Errc::kDuplicate, "client ", c, "'s masked input twice (a replay?)");
  }
  add(p_.ring, sum_, m.words);
  masked_.insert(m.clients.begin(), m.clients.end());
}

void SecAggServer::closeInputs() {
  if (closed_) return;
  closed_ = true;
  for (uint64_t c : graph_.clients)
    if (!masked_.count(c)) absent_.push_back(c);
  for (uint64_t u : masked_) {
    UnmaskRequest r;
    r.round = p_.round;
    // u holds shares of the neighbours that sent theirs to it: dropped ones (shares sent, no
    // masked input) give their mask key, survivors their self-mask seed.
    for (uint64_t v : graph_.neighbours(u)) {
      if (!shares_.count(v) || !shares_.count(u)) continue;
      (masked_.count(v) ? r.survived : r.dropped).push_back(v);
    }
    asked_.emplace(u, std::move(r));
  }
}

SurvivorsRequest SecAggServer::survivorsFor(uint64_t client) {
  if (!p_.signed_keys)
    failInput(Errc::kUnexpectedMessage, "a survivors list in a round that does not sign its keys");
  closeInputs();
  if (!masked_.count(client))
    failInput(Errc::kWrongSender, "client ", client, " sent no masked input: nothing to ask it");
  return {p_.round, absent_};
}

void SecAggServer::onSurvivorsSigned(const SurvivorsSigned& r) {
  if (!p_.signed_keys)
    failInput(Errc::kUnexpectedMessage, "a survivors signature in a round that does not sign");
  checkRound(r.round, p_.round, "a survivors signature");
  if (!closed_ || !masked_.count(r.client))
    failInput(Errc::kWrongSender, "a survivors signature from client ", r.client, ", not asked");
  if (signatures_closed_)
    failInput(Errc::kLate, "client ", r.client, "'s survivors signature after the step closed");
  if (signed_.count(r.client))
    failInput(Errc::kDuplicate, "client ", r.client, " signed the survivors twice");
  const KeyAdvert& a = adverts_.at(r.client);
  if (!verify(a.credential.signing_key, survivorsBytes(p_, roster_, absent_, a), r.signature))
    failInput(Errc::kBadSignature, "client ", r.client,
              "'s signature of the survivors does not verify with its certified key");
  signed_.emplace(r.client, r);
}

UnmaskRequest SecAggServer::unmaskRequestFor(uint64_t client) {
  closeInputs();
  const auto it = asked_.find(client);
  if (it == asked_.end())
    failInput(Errc::kWrongSender, "client ", client, " sent no masked input: nothing to ask it");
  if (!p_.signed_keys) return it->second;
  if (!signed_.count(client))
    failInput(Errc::kWrongSender, "client ", client,
              " did not sign the round's survivors: nothing to ask it");
  signatures_closed_ = true;
  UnmaskRequest r = it->second;
  for (uint64_t v : graph_.neighbours(client))
    if (const auto s = signed_.find(v); s != signed_.end()) r.signatures.push_back(s->second);
  return r;
}

void SecAggServer::onUnmask(const UnmaskResponse& r) {
  checkRound(r.round, p_.round, "an unmask response");
  const auto it = asked_.find(r.client);
  if (!closed_ || it == asked_.end() ||
      (p_.signed_keys && (!signatures_closed_ || !signed_.count(r.client))))
    failInput(Errc::kWrongSender, "an unmask response from client ", r.client, ", not asked");
  if (answers_.count(r.client)) failInput(Errc::kDuplicate, "client ", r.client, " answered twice");
  const UnmaskRequest& asked = it->second;
  std::set<std::pair<uint64_t, bool>> want, got;
  for (uint64_t v : asked.dropped) want.insert({v, true});
  for (uint64_t v : asked.survived) want.insert({v, false});
  for (const RevealedShare& s : r.shares) {
    if (!want.count({s.of, s.mask_key}))
      failInput(Errc::kNotNeighbour, "client ", r.client, " revealed a share of client ", s.of,
                " it was not asked for");
    if (!got.insert({s.of, s.mask_key}).second)
      failInput(Errc::kDuplicate, "client ", r.client, " revealed client ", s.of, "'s share twice");
    // A signed round's dropped neighbour is answered with a pairwise key, all else with a share.
    const bool pairwise = p_.signed_keys && s.mask_key;
    if (s.pairwise.has_value() != pairwise)
      failInput(Errc::kInconsistentShares, "client ", r.client, " revealed ",
                pairwise ? "a share of dropped client " : "a pairwise key for client ", s.of,
                pairwise ? " where this round takes their pairwise key" : "");
    if (!pairwise && s.share.x != point(r.client))
      failInput(Errc::kInconsistentShares, "client ", r.client,
                " revealed a share at another point");
  }
  answers_.emplace(r.client, r);
}

SecAggServer::Result SecAggServer::finish() {
  closeInputs();
  Result res;
  const auto fail = [&](std::string why) {
    res.ok = false;
    res.reason = std::move(why);
    res.sum.clear();
    return res;
  };
  // Shares revealed, per (owner, kind).
  std::map<std::pair<uint64_t, bool>, std::vector<Share>> revealed;
  for (const auto& [c, r] : answers_)
    for (const RevealedShare& s : r.shares)
      if (!s.pairwise) revealed[{s.of, s.mask_key}].push_back(s.share);
  std::vector<uint64_t> sum = sum_;
  // A revealer whose share is off the polynomial the others define lied (or its share was
  // damaged): the secret is decoded without it (shamirRecover) and it is named.
  std::set<uint64_t> liars;
  const auto recover = [&](const std::vector<Share>& all) {
    std::vector<Share> shares;
    for (const Share& s : all)
      if (!liars.count(s.x - 1)) shares.push_back(s);
    if (shares.size() < p_.threshold) shares = all;
    Recovered r = shamirRecover(shares, p_.threshold);
    for (uint64_t x : r.wrong) liars.insert(x - 1);  // point(c) = c + 1
    return r.secret;
  };
  // Survivors: their self masks.
  for (uint64_t u : masked_) {
    const auto& shares = revealed[{u, false}];
    if (shares.size() < p_.threshold)
      return fail("client " + std::to_string(u) + "'s self mask: " + std::to_string(shares.size()) +
                  " shares revealed, " + std::to_string(p_.threshold) + " needed");
    Key32 seed;
    try {
      seed = recover(shares);
    } catch (const InvalidArgument& e) {
      return fail("client " + std::to_string(u) + "'s self-mask shares: " + e.what());
    }
    if (!equalKeys(hashKey(seed), adverts_.at(u).self_mask_hash))
      return fail("client " + std::to_string(u) +
                  "'s self-mask shares rebuild a seed it did not commit to (inconsistent shares)");
    applyMask(sum, seed, p_.round, MaskStream::kSelfMask, 0, p_.ring.bits, /*subtract=*/true);
  }
  // Dropped after sharing: the pairwise masks their surviving neighbours added with them.
  for (const auto& [v, unused] : shares_) {
    if (masked_.count(v)) continue;
    std::vector<uint64_t> partners;
    for (uint64_t w : graph_.neighbours(v))
      if (masked_.count(w)) partners.push_back(w);
    if (partners.empty()) continue;  // no survivor masked with it
    if (p_.signed_keys) {
      // Each partner revealed its pairwise key with v (unverifiable: a wrong one leaves noise in
      // the sum, which the caller's norm check refuses).
      for (uint64_t w : partners) {
        const Key32* key = nullptr;
        if (const auto a = answers_.find(w); a != answers_.end())
          for (const RevealedShare& s : a->second.shares)
            if (s.of == v && s.mask_key && s.pairwise) key = &*s.pairwise;
        if (!key)
          return fail("client " + std::to_string(w) + " did not reveal its pairwise key with " +
                      "dropped client " + std::to_string(v) +
                      " (a signed round needs every survivor beside a dropped client to answer; "
                      "one that lost more than its neighbours - t refuses, kTooFewSurvivors)");
        applyMask(sum, *key, p_.round, MaskStream::kPairwiseMask, 0, p_.ring.bits,
                  /*subtract=*/w < v);
      }
      continue;
    }
    const auto& shares = revealed[{v, true}];
    if (shares.size() < p_.threshold)
      return fail("dropped client " + std::to_string(v) +
                  "'s mask key: " + std::to_string(shares.size()) + " shares revealed, " +
                  std::to_string(p_.threshold) + " needed");
    DhKeyPair dropped;
    try {
      dropped.secret_key = recover(shares);
    } catch (const InvalidArgument& e) {
      return fail("dropped client " + std::to_string(v) + "'s mask-key shares: " + e.what());
    }
    dropped.public_key = publicOf(dropped.secret_key);
    if (!equalKeys(dropped.public_key, adverts_.at(v).mask_pk))
      return fail(
          "dropped client " + std::to_string(v) +
          "'s mask-key shares rebuild another key than it advertised (inconsistent shares)");
    for (uint64_t w : partners) {
      const Key32 s =
          agree(dropped, adverts_.at(w).mask_pk, p_.run_seed, p_.round, KeyPurpose::kMask);
      // w added +PRG when w < v, -PRG when w > v: undo it.
      applyMask(sum, s, p_.round, MaskStream::kPairwiseMask, 0, p_.ring.bits,
                /*subtract=*/w < v);
    }
    sodium_memzero(dropped.secret_key.data(), dropped.secret_key.size());
  }
  res.ok = true;
  res.sum = std::move(sum);
  res.survivors.assign(masked_.begin(), masked_.end());
  res.liars.assign(liars.begin(), liars.end());
  return res;
}

}  // namespace starling::privacy
