#pragma once
// The cryptography of secure aggregation, all of it libsodium's (never core/rng's
// statistical streams, which are for reproducible experiments, not secrets):
// - X25519 key agreement: a pair's 32-byte shared key, the same on both sides, bound to both public
//   keys and to a context (round, purpose) by a BLAKE2b hash of the raw shared point;
// - mask expansion: ChaCha20 keyed by a shared key, one stream per (round, purpose), read as b-bit
//   ring elements (privacy/ring.h);
// - authenticated encryption of a share to its recipient: XChaCha20-Poly1305 with a random nonce,
//   the sender, recipient and round bound as associated data;
// - Ed25519 signatures of the advertised keys with a client's long-term signing key;
// - secret randomness: randombytes.
// sodium_init() is called once, thread-safely, by the first use (ensureSodium).
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace starling::privacy {

using Key32 = std::array<uint8_t, 32>;

// libsodium initialised (idempotent, thread-safe); IoError if it cannot be.
void ensureSodium();

// 32 bytes from the operating system's cryptographic source.
Key32 randomKey();

struct DhKeyPair {
  Key32 public_key{}, secret_key{};
  static DhKeyPair generate();
};

// What a shared key is for: the pairwise masks, or the encryption of shares between a pair.
enum class KeyPurpose : uint8_t { kMask = 1, kShareEncryption = 2 };

// The key `mine` shares with the holder of `their_public` for `purpose` in round `round` of run
// `run`: BLAKE2b(X25519(mine, theirs) || lower public key || higher public key || run || round ||
// purpose). Symmetric: both sides compute the same key. InvalidArgument for a public key whose
// shared point is all zeros (a low-order point, which X25519 refuses).
Key32 agree(const DhKeyPair& mine, const Key32& their_public, uint64_t run, uint64_t round,
            KeyPurpose purpose);

// What a ChaCha20 stream expands into: domain separation of the streams of one key.
enum class MaskStream : uint8_t {
  kPairwiseMask = 1,
  kSelfMask = 2,
  kNoise = 3,
  kRounding = 4,  // a client's stochastic rounding into the ring (privacy/ring.h)
  kGraph = 5,     // a round's SecAgg+ graph (privacy/graph.h), from a public key
  kSampling = 6,  // a round's Poisson sampling (server/engine.h)
};

// The 64-bit little-endian words of the ChaCha20 stream keyed by `key` with the nonce (round,
// purpose, index), in order: what applyMask adds, and every draw the privacy code makes (stochastic
// rounding, the graph's permutation), so that none comes from core/rng's statistical streams.
class KeyStream {
 public:
  KeyStream(const Key32& key, uint64_t round, MaskStream purpose, uint32_t index);
  ~KeyStream();  // the key and the buffered words wiped
  KeyStream(const KeyStream&) = delete;
  KeyStream& operator=(const KeyStream&) = delete;
  uint64_t next();
  // Uniform in [0, n) (n >= 1), unbiased: words at or above the largest multiple of n are redrawn.
  uint64_t below(uint64_t n);
  // Uniform in [0, 1): the top 53 bits of a word.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  void refill();
  static constexpr size_t kWords = 512;  // 64 ChaCha20 blocks at a time
  Key32 key_;
  std::array<uint8_t, 12> nonce_{};
  uint32_t block_ = 0;
  std::array<uint64_t, kWords> words_{};
  size_t at_ = kWords;
};

// A uniform draw in [0, 1) of its own for each (round, purpose, index) under `key`: the top 53 bits
// of BLAKE2b keyed by `key` over them. One client's draw depends on nothing but its id (a Poisson
// sample: who else is online changes no one's draw).
double keyedUniform(const Key32& key, uint64_t round, MaskStream purpose, uint64_t index);

// A key every party derives alike from public values: BLAKE2b of `label`, run and round. For
// draws that must be the same everywhere and hide nothing (a round's SecAgg+ graph).
Key32 publicKey(const std::string& label, uint64_t run, uint64_t round);

// Adds (subtract: subtracts) to `x` the ring elements of the ChaCha20 stream keyed by `key` with
// the nonce (round, purpose, index): element i is the stream's little-endian word i, of 32 bits
// in a ring of at most 32 bits (half the stream to generate) and of 64 otherwise (KeyStream's
// words), masked to `bits`. Arithmetic mod 2^bits.
void applyMask(std::span<uint64_t> x, const Key32& key, uint64_t round, MaskStream purpose,
               uint32_t index, uint32_t bits, bool subtract);

// Authenticated encryption under a 32-byte key: a random 24-byte nonce, then the ciphertext and
// its 16-byte tag. `context` is bound as associated data (sender, recipient, round): a ciphertext
// moved to another context fails to open.
std::vector<uint8_t> seal(const Key32& key, std::span<const uint8_t> plaintext,
                          std::span<const uint8_t> context);
// The plaintext, or nullopt when the ciphertext is short, altered, or sealed under another key or
// context.
std::optional<std::vector<uint8_t>> open(const Key32& key, std::span<const uint8_t> sealed,
                                         std::span<const uint8_t> context);

// Ed25519: a client's long-term signing key (its key file carries it; the root's allow-list its
// public half).
struct SigningKeyPair {
  Key32 public_key{};
  std::array<uint8_t, 64> secret_key{};
  static SigningKeyPair generate();
  // The pair of a 32-byte seed (what a key file keeps): the same seed, the same pair.
  static SigningKeyPair fromSeed(const Key32& seed);
};
using Signature = std::array<uint8_t, 64>;
Signature sign(const SigningKeyPair& key, std::span<const uint8_t> message);
bool verify(const Key32& public_key, std::span<const uint8_t> message, const Signature& sig);

// A client's credential under the malicious-server threat model: its long-term signing key, and
// the federation authority's signature over it and the client's id ("starling client credential
// v1" || id || signing key). The authority is an Ed25519 key its operator keeps off the root
// (starling-keygen --new-authority); every party holds its public half. A root or an aggregator
// that swaps a client's advertised keys, or answers for a client it invents, would need the
// authority's secret key to certify the signing key it signs them with.
struct Credential {
  Key32 signing_key{};
  Signature certificate{};
};
Signature certify(const SigningKeyPair& authority, uint64_t id, const Key32& signing_key);
bool credentialValid(const Key32& authority, uint64_t id, const Credential& c);

// BLAKE2b of `domain` and the little-endian words: a digest every party computes alike.
Key32 hashWords(const std::string& domain, std::span<const uint64_t> words);

// Compares in constant time.
bool equalKeys(const Key32& a, const Key32& b);

}  // namespace starling::privacy
