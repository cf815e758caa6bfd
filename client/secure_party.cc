#include "client/secure_party.h"

#include <algorithm>
#include <cmath>

#include "compression/payload.h"
#include "core/error.h"

namespace starling::client {
namespace pr = starling::protocol;
namespace pv = starling::privacy;

SecureParty::SecureParty(uint64_t id, const pv::SigningKeyPair* signing, pr::SecAggLimits limits)
    : id_(id), signing_(signing), limits_(limits) {}

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
  if (m.params.signed_keys)  // the root would need to send its clients' long-term keys too
    throw InputError(Errc::kMissingField,
                     "secagg: a round with signed keys, which this client does not run yet");
  // A new round: whatever the last one held goes (a restarted root runs a round again with new
  // keys; nothing of the old one is kept to be asked about).
  client_.reset();
  client_.emplace(m.params, id_, m.clients, signing_);
  params_ = m.params;
  return pr::encode(pr::SecAggKeysMsg{m.nonce, client_->advertise()});
}

std::vector<uint8_t> SecureParty::shareKeys(std::span<const uint8_t> bytes) {
  pr::SecAggAdvertsMsg m = pr::decodeSecAggAdverts(bytes, limits_);
  checkRound(m.round, "adverts");
  for (const auto& a : m.adverts) checkRound(a.round, "an advert");
  pr::SecAggSharesMsg out{id_, params_.round, m.nonce, {}};
  try {
    out.shares = client_->shareKeys(m.adverts);
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
  if (x.size() != params_.dim)
    STARLING_THROW(InvalidArgument, "secagg: an update of ", x.size(), " values, the round has ",
                   params_.dim);
  const std::vector<float> clipped = clipForRing(x, params_.ring.clip);
  pr::SecAggMaskedMsg out;
  out.client = id_;
  out.nonce = m.nonce;
  out.bits = params_.ring.bits;
  out.input = rounding_key ? client_->maskedInput(m.shares, clipped, *rounding_key)
                           : client_->maskedInput(m.shares, clipped);
  out.metrics.assign(metrics.begin(), metrics.end());
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
  const compression::SharedSupport support = compressor.sharedSupport(layout, ctx);
  std::vector<float> dense(layout.numel());
  compression::densifyUpdate(layout, update, dense);
  if (support.all) return dense;
  std::vector<float> out(support.size(dense.size()));
  support.gather(dense, out);
  return out;
}

std::vector<float> clipForRing(std::span<const float> x, double clip) {
  double sq = 0.0;
  for (float v : x) {
    if (!std::isfinite(v)) STARLING_THROW(InvalidArgument, "secagg: a non-finite update value");
    sq += static_cast<double>(v) * v;
  }
  const double norm = std::sqrt(sq);
  const double s = norm > clip ? clip / norm : 1.0;
  float c = static_cast<float>(clip);
  if (static_cast<double>(c) > clip) c = std::nextafter(c, 0.0f);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = std::clamp(static_cast<float>(static_cast<double>(x[i]) * s), -c, c);
  return out;
}

}  // namespace starling::client
