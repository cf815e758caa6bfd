#include "client/secure_party.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "compression/payload.h"
#include "core/error.h"
#include "transport/keys.h"

namespace starling::client {
namespace pr = starling::protocol;
namespace pv = starling::privacy;

void SecAggTrust::validate(uint64_t id) const {
  if (!(std::isfinite(min_noise) && min_noise >= 0))
    STARLING_THROW(ConfigError, "secagg.min_noise must be finite and >= 0, got ", min_noise);
  if (min_clients > 0 && !require_signed)
    STARLING_THROW(ConfigError,
                   "secagg.min_clients needs secagg.threat = malicious-server: only a signed "
                   "round tells each client who survived before it unmasks, so only there can it "
                   "count the inputs of the sum it would help release");
  if (require_signed && !authority)
    STARLING_THROW(ConfigError,
                   "secagg.threat = malicious-server needs secagg.authority: the federation "
                   "authority's public key file (starling-keygen --new-authority writes it)");
  if (require_signed && !signer)
    STARLING_THROW(ConfigError,
                   "secagg.threat = malicious-server needs a signing key and its certificate in "
                   "this client's key file (starling-keygen --clients N --authority ...)");
  if (signer && authority && !pv::credentialValid(*authority, id, signer->credential))
    STARLING_THROW(ConfigError,
                   "the certificate in this client's key file is not the authority's "
                   "for client id ",
                   id,
                   " (certified for another id, or by another authority): write its keys again "
                   "with starling-keygen --name NAME --id ",
                   id, " --authority authority.key_secret");
  if (signer && !pv::equalKeys(signer->key.public_key, signer->credential.signing_key))
    STARLING_THROW(ConfigError,
                   "the certificate in this client's key file is not of its signing key (a "
                   "file put together by hand?): write its keys again with starling-keygen "
                   "--authority");
}

SecAggTrust loadSecAggTrust(bool require_signed, const std::string& authority_file,
                            const std::string& key_file, uint64_t id) {
  SecAggTrust t;
  t.require_signed = require_signed;
  if (!authority_file.empty()) t.authority = transport::loadAuthorityKey(authority_file);
  if (!key_file.empty()) {
    const transport::KeyFile k = transport::loadKeyFile(key_file);
    if (k.signing && k.signing->seed && k.signing->certificate) {
      pv::SecAggSigner signer;
      signer.key = pv::SigningKeyPair::fromSeed(*k.signing->seed);
      if (!pv::equalKeys(signer.key.public_key, k.signing->public_key))
        STARLING_THROW(ConfigError, key_file,
                       ": its signing-key is not the secret of its signing-public-key");
      signer.credential = {k.signing->public_key, *k.signing->certificate};
      t.signer = signer;
    } else if (require_signed) {
      STARLING_THROW(ConfigError, key_file,
                     ": no signing-key and certificate lines, which secagg.threat = "
                     "malicious-server needs (starling-keygen --clients N --authority "
                     "authority.key_secret writes them)");
    }
  } else if (require_signed) {
    STARLING_THROW(ConfigError,
                   "secagg.threat = malicious-server needs this client's key file (security.key), "
                   "which carries its certified signing key");
  }
  t.validate(id);
  return t;
}

SecureParty::SecureParty(uint64_t id, SecAggTrust trust, pr::SecAggLimits limits)
    : id_(id), trust_(std::move(trust)), limits_(limits) {
  trust_.validate(id_);
}

void SecureParty::checkRound(uint64_t round, const char* what) const {
  if (!client_)
    throw InputError(Errc::kUnexpectedMessage,
                     std::string("secagg: ") + what + " before the round's setup");
  if (round != params_.round)
    throw InputError(Errc::kWrongRound, std::string("secagg: ") + what + " of round " +
                                            std::to_string(round) + ", the round is " +
                                            std::to_string(params_.round));
}

std::vector<uint8_t> SecureParty::setup(std::span<const uint8_t> bytes) {
  pr::SecAggSetupMsg m = pr::decodeSecAggSetup(bytes, limits_);
  if (!std::binary_search(m.clients.begin(), m.clients.end(), id_))
    throw InputError(Errc::kWrongSender, "secagg: a setup for a round client " +
                                             std::to_string(id_) + " is not one of");
  // What makes the round safe for this client, whatever the server says: at least 3 clients
  // (with 2, the other learns its update from the sum) and a threshold above half of its
  // neighbours (else the server could ask half of them for its seed and half for its mask key).
  const uint64_t have = std::min<uint64_t>(m.params.neighbours, m.clients.size() - 1);
  if (m.clients.size() < 3 || 2 * static_cast<uint64_t>(m.params.threshold) <= have)
    throw InputError(Errc::kMissingField,
                     "secagg: a setup of " + std::to_string(m.clients.size()) +
                         " clients and threshold " + std::to_string(m.params.threshold) + " of " +
                         std::to_string(have) + " neighbours, which would not hide its update");
  // Which rounds it runs: signed ones only under the malicious-server threat model (a server that
  // does not sign could swap its neighbours' keys), and signed ones only with its credential.
  if (trust_.require_signed && !m.params.signed_keys)
    throw InputError(Errc::kUnsignedRound,
                     "secagg: a round whose keys are not signed, which this client refuses "
                     "(secagg.threat = malicious-server: an unsigned key could be a server's)");
  if (m.params.signed_keys && (!trust_.signer || !trust_.authority))
    throw InputError(Errc::kNoCredential,
                     "secagg: a round with signed keys, and this client has no signing key or "
                     "no secagg.authority (docs/privacy.md)");
  // Distributed DP: the noise this client adds is the root's to ask; its floor is the client's.
  if (trust_.min_noise > 0) {
    const double need = trust_.min_noise * m.params.ring.sensitivity();
    if (!(m.params.ring.noise >= need * (1 - 1e-9)))
      throw InputError(Errc::kTooLittleNoise,
                       "secagg: a round asking for noise " + std::to_string(m.params.ring.noise) +
                           " in its ring, below secagg.min_noise = " +
                           std::to_string(trust_.min_noise) + " x the update's sensitivity (" +
                           std::to_string(need) + "): this client adds at least that");
  }
  // Its floor on the clients of a sum: a round of fewer cannot reach it.
  if (trust_.min_clients > 0 && m.clients.size() < trust_.min_clients)
    throw InputError(
        Errc::kTooLittleNoise,
        "secagg: a round of " + std::to_string(m.clients.size()) +
            " clients, below secagg.min_clients = " + std::to_string(trust_.min_clients) +
            ": this client helps release no sum of fewer clients' inputs");
  // A later phase of a round (two-phase PowerSGD's Q) continues from this client's masked input
  // of the phase before it, in this round: without it, its phase would be a sum of stale state
  // the server chose to ask about. In a signed round its clients must be exactly the survivors of
  // the phase before that this client signed: a later phase's sum without one of them would
  // differ from the phase before's by that client's update seen through the shared factors.
  if (m.params.phase > 0) {
    if (!masked_ || *masked_ != std::pair(m.params.round, m.params.phase - 1))
      throw InputError(Errc::kWrongRound,
                       "secagg: a setup of round " + std::to_string(m.params.round) + " phase " +
                           std::to_string(m.params.phase) +
                           " before this client sent its masked input of the phase before it");
    if (m.params.signed_keys &&
        (!signed_ || signed_->round != m.params.round || signed_->phase + 1 != m.params.phase ||
         signed_->clients != m.clients))
      throw InputError(Errc::kInconsistentSurvivors,
                       "secagg: a setup of round " + std::to_string(m.params.round) + " phase " +
                           std::to_string(m.params.phase) +
                           " whose clients are not the survivors of the phase before, as this "
                           "client signed them: a sum of other clients would reveal the "
                           "difference");
  }
  // (Under secagg.min_noise too: averaging a round's sums over several runs would average away
  // the noise.)
  if ((trust_.require_signed || trust_.min_noise > 0) && masked_ &&
      std::pair(m.params.round, m.params.phase) <= *masked_)
    throw InputError(
        Errc::kWrongRound,
        "secagg: a setup of round " + std::to_string(m.params.round) + " phase " +
            std::to_string(m.params.phase) + " after this client sent its masked input of round " +
            std::to_string(masked_->first) + " phase " + std::to_string(masked_->second) +
            ": a phase run twice could give the server the difference of two sums");
  // A new round: whatever the last one held goes (a restarted root runs a round again with new
  // keys, which a client under require_signed refuses once it masked in it, above; nothing of the
  // old one is kept to be asked about).
  client_.reset();
  client_.emplace(m.params, id_, m.clients, trust_.signer ? &*trust_.signer : nullptr);
  params_ = m.params;
  round_ids_ = m.clients;
  return pr::encode(pr::SecAggKeysMsg{m.nonce, client_->advertise()});
}

std::vector<uint8_t> SecureParty::shareKeys(std::span<const uint8_t> bytes) {
  pr::SecAggAdvertsMsg m = pr::decodeSecAggAdverts(bytes, limits_);
  checkRound(m.round, "adverts");
  for (const auto& a : m.adverts) checkRound(a.round, "an advert");
  pr::SecAggSharesMsg out{id_, params_.round, m.nonce, {}};
  try {
    out.shares = client_->shareKeys(m.adverts, trust_.authority ? &*trust_.authority : nullptr);
  } catch (const InputError&) {  // the protocol's refusals keep their codes
    throw;
  } catch (const InvalidArgument& e) {  // a key no agreement can use (a low-order point)
    throw InputError(Errc::kMalformed, std::string("secagg: ") + e.what());
  }
  return pr::encode(out);
}

std::vector<uint8_t> SecureParty::mask(std::span<const uint8_t> bytes, std::span<const float> x,
                                       std::span<const Metric> metrics,
                                       const pv::Key32* rounding_key) {
  pr::SecAggSharesMsg m = pr::decodeSecAggShares(bytes, limits_);
  checkRound(m.round, "shares");
  if (m.client != id_)
    throw InputError(Errc::kWrongSender, "secagg: shares for client " + std::to_string(m.client) +
                                             " sent to client " + std::to_string(id_));
  // (With the clip count, the round's last value is this client's, below.)
  const size_t values = params_.clip_count ? params_.dim - 1 : params_.dim;
  if (x.size() != values)
    STARLING_THROW(InvalidArgument, "secagg: an update of ", x.size(), " values, the round has ",
                   values);
  std::vector<float> clipped = clipForRing(x, params_.ring.clip);
  if (params_.clip_count) {
    // Adaptive clipping (Andrew et al. 2021): whether its update was within the round's clip, as
    // one more masked value, the clip or 0: the unmasked sum counts the updates within it, and
    // no one learns this client's (clipForRing refused a non-finite x).
    double sq = 0.0;
    for (float v : x) sq += static_cast<double>(v) * v;
    clipped.push_back(std::sqrt(sq) <= params_.ring.clip ? clipAsFloat(params_.ring.clip) : 0.0f);
  }
  pr::SecAggMaskedMsg out;
  out.client = id_;
  out.nonce = m.nonce;
  out.bits = params_.ring.bits;
  out.input = rounding_key ? client_->maskedInput(m.shares, clipped, *rounding_key)
                           : client_->maskedInput(m.shares, clipped);
  masked_ = std::pair(params_.round, params_.phase);
  out.metrics.assign(metrics.begin(), metrics.end());
  return pr::encode(out);
}

std::vector<uint8_t> SecureParty::signSurvivors(std::span<const uint8_t> bytes) {
  pr::SecAggSurvivorsMsg m = pr::decodeSecAggSurvivors(bytes, limits_);
  checkRound(m.request.round, "a survivors list");
  // The sum it would help unmask holds the round's clients but the absent (an absent id outside
  // the round, which SecAggClient::signSurvivors does not look for, only lowers the count: the
  // floor errs on the side of refusing).
  const size_t round_clients = round_ids_.size();
  if (trust_.min_clients > 0 && (m.request.absent.size() >= round_clients ||
                                 round_clients - m.request.absent.size() < trust_.min_clients))
    throw InputError(
        Errc::kTooLittleNoise,
        "secagg: a survivors list of " +
            std::to_string(round_clients - std::min(round_clients, m.request.absent.size())) +
            " masked inputs, below secagg.min_clients = " + std::to_string(trust_.min_clients) +
            ": this client signs for no sum of fewer clients' inputs");
  // A later phase's survivors are every client of it: its sum must hold each input of the phase
  // before's (see setup).
  if (params_.phase > 0 && !m.request.absent.empty())
    throw InputError(Errc::kInconsistentSurvivors,
                     "secagg: a survivors list of round " + std::to_string(params_.round) +
                         " phase " + std::to_string(params_.phase) + " naming " +
                         std::to_string(m.request.absent.size()) +
                         " absent: a later phase's sum without an input of the phase before's "
                         "would reveal the difference");
  pr::SecAggSignedMsg out{m.nonce, client_->signSurvivors(m.request)};
  // Who the next phase's setup must name: the round's clients but the absent.
  SignedSurvivors s{params_.round, params_.phase, {}};
  const std::set<uint64_t> absent(m.request.absent.begin(), m.request.absent.end());
  for (uint64_t c : round_ids_)
    if (!absent.count(c)) s.clients.push_back(c);
  signed_ = std::move(s);
  return pr::encode(out);
}

std::vector<uint8_t> SecureParty::unmask(std::span<const uint8_t> bytes) {
  pr::SecAggUnmaskMsg m = pr::decodeSecAggUnmask(bytes, limits_);
  checkRound(m.request.round, "an unmask request");
  return pr::encode(pr::SecAggRevealMsg{m.nonce, client_->unmask(m.request)});
}

std::vector<float> secureInput(const ParamLayout& layout, const compression::Compressor& compressor,
                               const compression::RoundContext& ctx,
                               const std::vector<compression::Payload>& update) {
  return compressor.secureValues(layout, ctx, update);
}

float clipAsFloat(double clip) {
  float c = static_cast<float>(clip);
  if (static_cast<double>(c) > clip) c = std::nextafter(c, 0.0f);
  return c;
}

std::vector<float> clipForRing(std::span<const float> x, double clip) {
  double sq = 0.0;
  for (float v : x) {
    if (!std::isfinite(v)) STARLING_THROW(InvalidArgument, "secagg: a non-finite update value");
    sq += static_cast<double>(v) * v;
  }
  const double norm = std::sqrt(sq);
  const double s = norm > clip ? clip / norm : 1.0;
  const float c = clipAsFloat(clip);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = std::clamp(static_cast<float>(static_cast<double>(x[i]) * s), -c, c);
  return out;
}

}  // namespace starling::client
