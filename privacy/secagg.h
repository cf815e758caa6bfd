#pragma once
// SecAgg+ (Bell, Bonawitz, Gascón, Lepoint, Raykova, CCS 2020) as pure logic: a client's side and
// the server's, over message structs, with no sockets and no round engine (the round's
// phases and the wire format come with the one engine). Each round's clients U are public (the
// round's sample); every party derives the same SecAgg+ graph from U and the round's seed
// (privacy/graph.h) and masks and shares only among its k neighbours, with threshold t.
//
//   0 advertise    client u: two fresh X25519 pairs (c_u for encrypting shares, s_u for masks), a
//                  fresh self-mask seed b_u; sends both public keys and a hash of b_u. When the
//                  run signs its keys (SecAggParams::signed_keys, secagg.threat =
//                  malicious-server), it signs them with its long-term Ed25519 key and sends its
//                  credential (privacy/crypto.h): that key certified by the federation's
//                  authority. Every party checks both against the authority's public key, so a
//                  server that swaps a key, or answers for a client it invents, is caught.
//   1 share keys   u receives its advertising neighbours' keys (>= t of them), splits s_u's secret
//                  key and b_u t-of-n among them (Shamir, privacy/shamir.h; recipient v's point is
//                  v + 1) and sends each pair of shares sealed to its recipient (privacy/crypto.h).
//                  A signed round shares b_u only: it never rebuilds a mask key (step 3), so no
//                  t neighbours together hold u's.
//   2 masked input u receives the sealed shares of the neighbours that sent theirs (>= t), and
//   sends
//                  y_u = encode(x_u) + PRG(b_u) + sum over those neighbours v of +-PRG(s_uv) in
//                  Z_2^b (+ when u < v), s_uv agreed from s_u and s_v.
//   2b survivors   a signed round only (the consistency step, Bonawitz et al. 2017, section 4,
//                  on the SecAgg+ graph): the server closes the masked inputs (U3) and tells each
//                  survivor which of the round's clients are absent from them; each signs that
//                  list, once a round, and at the unmask step reveals anything only when t of
//                  the neighbours it masked with signed the same list. An honest client thus
//                  tells no two stories: clients the server told different lists form groups
//                  in which each reveals only when t of its own neighbours are in its group.
//   3 unmask       (a signed round: each signer, with its neighbours' signatures of the list)
//                  the server closes the masked inputs (U3) and asks each survivor for, per
//                  neighbour, the share of b_v (v survived) or of s_v's key (v dropped after
//                  sending its shares) -- never both for one v: an honest client refuses that,
//                  and answers one request only. A signed round asks, for a dropped v, the
//                  pairwise key s_uv itself (no share of s_v's key), and a client reveals at most
//                  (its masking neighbours - t) of them (SecAggClient::unmask).
//   finish         the server rebuilds each survivor's b_u (checked against its advertised hash)
//                  and each dropped client's mask key (checked against its advertised public key;
//                  a signed round takes the revealed pairwise keys instead, unchecked), removes
//                  the self masks and the pairwise masks the dropped left behind, and has the sum
//                  of the survivors' inputs, or says why not (fewer than t shares).
//
// What the server sees: each y_u, which is uniform in Z_2^b to anyone without b_u and the pairwise
// keys; the sum; who dropped when. Up to t - 1 colluding clients learn nothing of another's input.
// An edge aggregator adds masked inputs in the ring (MaskedInput carries its contributors) and
// relays the rest; it learns no more than the server. The sum is exact: the same bits flat or
// through any tree of aggregators.
//
// Errors: InputError with a code per attack (docs/privacy.md): kNotNeighbour, kBadSignature,
// kInconsistentShares, kRevealBoth, kTooFewSurvivors, kInconsistentSurvivors; kSizeMismatch (a
// masked input of the wrong length, or words beyond the ring), kWrongRound (a message of another
// round: a replay), kDuplicate, kWrongSender (a client's share addressed to itself, a message
// naming another), kLate (a message for a phase the server closed). Client ids are below 2^61 - 2
// (Shamir's points are ids + 1). Nothing a party refuses changes its state.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/input_error.h"
#include "privacy/crypto.h"
#include "privacy/graph.h"
#include "privacy/ring.h"
#include "privacy/shamir.h"

namespace starling::privacy {

// The version of how this build derives what the parties must agree on: the pairwise and share
// keys (crypto.h agree), the mask streams, the Shamir points and shares, the graph and the ring's
// encoding. Bumped whenever any of them changes; a setup of another derivation is refused
// (protocol/secagg_wire.h), so that a root and a client of builds that would disagree fail loudly
// instead of summing to a wrong model.
// 2: a signed round deals shares of the self-mask seed only (no mask key's).
// 3: the setup names each client's discrete Gaussian noise (RingSpec::noise; distributed DP),
// which a client adds after rounding: a client of derivation 2 would ignore it and send no noise.
// 4: the setup names the round's phase (two-phase PowerSGD runs an exchange per phase), which the
// signed adverts and survivors lists cover.
// 5: the setup says whether the input's last value is the clip count (adaptive clipping), which
// the signed adverts cover.
inline constexpr uint32_t kSecAggDerivation = 5;

// Client ids secure aggregation takes are below this (Shamir's points are ids + 1, in GF(2^61-1)).
inline constexpr uint64_t kMaxSecAggId = (uint64_t{1} << 61) - 2;

struct SecAggParams {
  uint64_t run_seed = 0, round = 0;
  // The round's phase whose sum this exchange is (two-phase PowerSGD runs an exchange per phase,
  // each with fresh keys); a client masks one input per round and phase at most.
  uint32_t phase = 0;
  // The setup's nonce (the exchange's): a signed advert of another attempt at the round does not
  // verify in this one.
  uint64_t session = 0;
  uint32_t neighbours = 8;  // k: even; n <= k + 1 is the complete graph (SecAgg)
  uint32_t threshold = 5;   // t: shares that rebuild a secret, in 2 .. k
  RingSpec ring;
  size_t dim = 0;            // values per input
  bool signed_keys = false;  // malicious-server threat model: adverts signed and certified
  // Adaptive clipping under central DP (privacy.adaptive_clip): the input's last value is whether
  // the client's update was within ring.clip (the clip, or 0), so that the sum counts the updates
  // within it and no one else learns a client's; dim counts it.
  bool clip_count = false;
  void validate() const;  // ConfigError naming the field
};

struct KeyAdvert {
  uint64_t client = 0, round = 0;
  Key32 cipher_pk{}, mask_pk{}, self_mask_hash{};
  Signature signature{};    // all zero unless signed_keys
  Credential credential{};  // all zero unless signed_keys
};

// A client's long-term signing key and its credential (the authority's certificate of it).
struct SecAggSigner {
  SigningKeyPair key;
  Credential credential;
  // The signing key of `seed`, certified by `authority` for client `id` (starling-keygen's, the
  // simulator's, the tests').
  static SecAggSigner certified(const SigningKeyPair& authority, uint64_t id, const Key32& seed);
};

struct EncryptedShare {
  uint64_t from = 0, to = 0, round = 0;
  std::vector<uint8_t> ciphertext;
};

// One client's masked input, or an edge aggregator's ring sum of several.
struct MaskedInput {
  uint64_t round = 0;
  std::vector<uint64_t> clients;  // ascending
  std::vector<uint64_t> words;    // dim ring elements
};

// A signed round's consistency step: who the server says is absent from the masked inputs.
struct SurvivorsRequest {
  uint64_t round = 0;
  // The round's clients whose masked input the server does not hold (ascending); the survivors
  // are the others. It grows with the dropouts, not with the round.
  std::vector<uint64_t> absent;
};

// A client's signature of a round's survivors (survivorsBytes), with its signing key.
struct SurvivorsSigned {
  uint64_t client = 0, round = 0;
  Signature signature{};
};

struct UnmaskRequest {
  uint64_t round = 0;
  std::vector<uint64_t> dropped, survived;  // the client's neighbours, by what the server needs
  // A signed round: its neighbours' signatures of the survivors (ascending by client); empty
  // otherwise.
  std::vector<SurvivorsSigned> signatures;
};

struct RevealedShare {
  uint64_t of = 0;        // whose secret
  bool mask_key = false;  // about a neighbour that dropped, else one that survived (its seed's)
  Share share;            // the share (not for a signed round's dropped neighbour)
  // A signed round's dropped neighbour: not a share of its mask key but the pairwise mask key
  // the revealer shares with it (see SecAggClient::unmask).
  std::optional<Key32> pairwise;
};

struct UnmaskResponse {
  uint64_t client = 0, round = 0;
  std::vector<RevealedShare> shares;
};

// The digest of a round's clients (strictly ascending: InvalidArgument otherwise, since another
// order of the same clients would give another digest) that every signed advert binds: parties
// that were given different client lists (so different graphs) do not verify each other's adverts.
Key32 rosterHash(std::span<const uint64_t> sorted_clients);
// What a signature covers (bytes, for sign/verify): the advert's fields, the run, the round, the
// setup's session, the roster, and the round's k, t, ring and size.
std::vector<uint8_t> advertBytes(const KeyAdvert& a, const SecAggParams& p, const Key32& roster);
// Whether a signed advert is its client's in this exchange: its credential certified by
// `authority` for a.client, and its signature, over advertBytes, made with the credential's key.
bool advertSigned(const KeyAdvert& a, const Key32& authority, const SecAggParams& p,
                  const Key32& roster);
// What a survivors signature covers (bytes): the run, the round, the setup's session, the roster,
// the absent clients (ascending) and the signer's advert of this exchange (its client and its
// fresh keys): a signature made in another attempt at the round, whose session and roster a root
// can give again, does not verify beside the signer's keys of this one.
std::vector<uint8_t> survivorsBytes(const SecAggParams& p, const Key32& roster,
                                    std::span<const uint64_t> absent, const KeyAdvert& signer);

class SecAggClient {
 public:
  // `clients`: the round's clients (any order; `id` among them). `signer`: its long-term key and
  // credential (required when params.signed_keys, else ignored).
  SecAggClient(SecAggParams params, uint64_t id, std::span<const uint64_t> clients,
               const SecAggSigner* signer = nullptr);

  KeyAdvert advertise() const;
  // Phase 1: the adverts the server forwarded (its neighbours'; `authority`: the public key whose
  // credentials it accepts, required when signed_keys). The shares to send, one per neighbour
  // that advertised.
  std::vector<EncryptedShare> shareKeys(std::span<const KeyAdvert> adverts,
                                        const Key32* authority = nullptr);
  // Phase 2: the shares addressed to it; x (dim values, clipped to the ring's clip), rounded into
  // the ring by a fresh randomKey()'s stream (privacy/ring.h).
  MaskedInput maskedInput(std::span<const EncryptedShare> to_me, std::span<const float> x);
  // The same with the rounding stream of `rounding_key`: a test's fixed key reproduces a rounding.
  MaskedInput maskedInput(std::span<const EncryptedShare> to_me, std::span<const float> x,
                          const Key32& rounding_key);
  // Phase 2b, a signed round only (kUnexpectedMessage otherwise): signs the survivors the server
  // names, once (kDuplicate after), after its masked input (kWrongRound before; a list of another
  // round too). Refused when the absent clients are not strictly ascending (kDuplicate), when the
  // list says its own input is absent (kInconsistentSurvivors), or leaves fewer than t of the
  // neighbours it masked with (kTooFewSurvivors): no unmask request could then be answered.
  SurvivorsSigned signSurvivors(const SurvivorsRequest& request);
  // Phase 3: answered once; refuses a request for both shares of one client. In a signed round
  // (the malicious-server model) a dropped neighbour v is answered with the pairwise mask key of
  // this client and v, never a share of v's mask key, and a request that declares more than
  // (its masking neighbours - t) of them dropped is refused (kTooFewSurvivors): then no server
  // can remove every pairwise mask of one client's input while it also rebuilds that client's
  // self-mask seed, whatever it tells whom (docs/privacy.md has the count). A signed round's
  // request must also follow the survivors this client signed (its dropped neighbours exactly
  // those the list says are absent) and carry t valid signatures of that list from distinct
  // neighbours it masked with and the list says survived (kInconsistentSurvivors; a signature
  // that does not verify, kBadSignature; one of a client that is no such neighbour, or its own,
  // kNotNeighbour; one signer twice, kDuplicate; a signature of another round, kWrongRound).
  UnmaskResponse unmask(const UnmaskRequest& request);

  uint64_t id() const { return id_; }
  // Its neighbours in the round's graph (ascending): all it keeps of the graph.
  std::span<const uint64_t> neighbours() const { return neighbours_; }

 private:
  SecAggParams p_;
  uint64_t id_;
  Key32 roster_{};  // rosterHash of the round's clients
  std::vector<uint64_t> neighbours_;
  DhKeyPair cipher_, mask_;
  Key32 self_seed_{};
  KeyAdvert advert_;
  std::map<uint64_t, KeyAdvert> advertised_;          // neighbours that advertised
  std::map<uint64_t, std::pair<Share, Share>> held_;  // v -> (its mask key's, its seed's)
  std::optional<SigningKeyPair> signing_;             // a signed round's
  std::optional<std::vector<uint64_t>> absent_;       // the survivors list it signed
  // A signed round's unmask request against the survivors it signed (unmask's checks).
  void checkSurvivors(const UnmaskRequest& request) const;
  bool shared_ = false, masked_ = false, answered_ = false;
};

class SecAggServer {
 public:
  // `clients`: the round's clients. `authority`: whose credentials it accepts (signed_keys).
  SecAggServer(SecAggParams params, std::span<const uint64_t> clients,
               const Key32* authority = nullptr);

  // Each phase closes when the next begins: the first advertsFor() closes the adverts (U1), the
  // first sharesFor() or masked input closes the shares (U2), the first unmaskRequestFor() or
  // finish() the masked inputs (U3); what comes for a closed phase is kLate. So every client is
  // given the same U1 and U2, and the server's unmasking counts on exactly the masks they added.
  // The exchange's session (SecAggParams::session: the setup's nonce), before the first advert
  // (InvalidArgument after).
  void setSession(uint64_t session);
  void onAdvert(const KeyAdvert& a);
  // The adverts of `client`'s neighbours that advertised.
  std::vector<KeyAdvert> advertsFor(uint64_t client);
  void onShares(uint64_t from, std::span<const EncryptedShare> shares);
  // The shares addressed to `client` by its neighbours that sent theirs.
  std::vector<EncryptedShare> sharesFor(uint64_t client);
  void onMaskedInput(const MaskedInput& m);
  // A signed round's consistency step (kUnexpectedMessage in another): closes the masked inputs
  // on the first call, and tells `client` (one of them; kWrongSender for another) who is absent,
  // every client alike.
  SurvivorsRequest survivorsFor(uint64_t client);
  // `r.client`'s signature of the survivors: refused in an unsigned round (kUnexpectedMessage), of
  // another round (kWrongRound), when it is not one (kWrongSender), twice (kDuplicate), after the
  // first unmask request (kLate), or when it does not verify with its certified key
  // (kBadSignature).
  void onSurvivorsSigned(const SurvivorsSigned& r);
  // Closes the masked inputs on the first call: what `client` (one of them) is asked to reveal.
  // A signed round closes the signatures too, asks only the clients that signed (kWrongSender
  // otherwise) and hands each its neighbours' signatures.
  UnmaskRequest unmaskRequestFor(uint64_t client);
  void onUnmask(const UnmaskResponse& r);

  struct Result {
    bool ok = false;
    std::string reason;               // why not, when !ok
    std::vector<uint64_t> sum;        // the survivors' inputs summed in the ring (dim words)
    std::vector<uint64_t> survivors;  // whose inputs it holds (ascending)
    // Whose revealed share was off the polynomial the other shares define (ascending): the
    // secrets are decoded around them (Berlekamp-Welch, privacy/shamir.h), as long as at most
    // floor((m - t) / 2) of the m shares of a secret are wrong; more fail the round. The server
    // cannot tell who lied: the revealer, or the secret's owner, which dealt it a wrong share (a
    // recipient cannot check the share it holds). Once named, a client's shares are left out of
    // the later secrets that have enough without them (each liar costs one decoding).
    std::vector<uint64_t> liars;
  };
  // Rebuilds the secrets and unmasks; a result that is not ok reveals nothing. In a signed round a
  // wrong revealed pairwise key cannot be told from a right one: the result is ok and its sum is
  // noise, which the caller's norm check must refuse (server::SecureRound::finish does).
  Result finish();

  const Neighbourhoods& graph() const { return graph_; }

 private:
  void closeInputs();

  SecAggParams p_;
  Neighbourhoods graph_;
  Key32 roster_{};
  Key32 authority_{};
  std::map<uint64_t, KeyAdvert> adverts_;                   // U1
  std::map<uint64_t, std::vector<EncryptedShare>> shares_;  // U2: by sender
  std::vector<uint64_t> sum_;                               // the masked inputs' sum
  std::set<uint64_t> masked_;                               // U3 (as received)
  std::vector<uint64_t> absent_;                            // the round's clients not in U3
  std::map<uint64_t, SurvivorsSigned> signed_;              // a signed round's U3 signatures
  bool adverts_closed_ = false, shares_closed_ = false, closed_ = false, signatures_closed_ = false;
  std::map<uint64_t, UnmaskRequest> asked_;     // by client
  std::map<uint64_t, UnmaskResponse> answers_;  // U4
};

}  // namespace starling::privacy
