#include "privacy/crypto.h"

#include <sodium.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace starling::privacy {

void ensureSodium() {
  static std::once_flag once;
  static int rc = 0;
  std::call_once(once, [] { rc = sodium_init(); });
  if (rc < 0) STARLING_THROW(IoError, "libsodium could not be initialised (sodium_init)");
}

Key32 randomKey() {
  ensureSodium();
  Key32 k;
  randombytes_buf(k.data(), k.size());
  return k;
}

DhKeyPair DhKeyPair::generate() {
  ensureSodium();
  DhKeyPair p;
  randombytes_buf(p.secret_key.data(), p.secret_key.size());
  crypto_scalarmult_base(p.public_key.data(), p.secret_key.data());
  return p;
}

namespace {
void putU64(crypto_generichash_state& st, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  crypto_generichash_update(&st, b, sizeof b);
}
}  // namespace

Key32 hashWords(const std::string& domain, std::span<const uint64_t> words) {
  ensureSodium();
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(domain.data()), domain.size());
  putU64(st, words.size());
  for (uint64_t w : words) putU64(st, w);
  Key32 out{};
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

Key32 agree(const DhKeyPair& mine, const Key32& their_public, uint64_t run, uint64_t round,
            KeyPurpose purpose) {
  ensureSodium();
  uint8_t point[crypto_scalarmult_BYTES];
  if (crypto_scalarmult(point, mine.secret_key.data(), their_public.data()) != 0)
    STARLING_THROW(InvalidArgument,
                   "key agreement: the peer's public key is a low-order point (refused)");
  const bool mine_first = std::memcmp(mine.public_key.data(), their_public.data(), 32) < 0;
  const Key32& lo = mine_first ? mine.public_key : their_public;
  const Key32& hi = mine_first ? their_public : mine.public_key;
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  static constexpr char kDomain[] = "starling secagg key v1";
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(kDomain), sizeof kDomain - 1);
  crypto_generichash_update(&st, point, sizeof point);
  crypto_generichash_update(&st, lo.data(), lo.size());
  crypto_generichash_update(&st, hi.data(), hi.size());
  putU64(st, run);
  putU64(st, round);
  const uint8_t p = static_cast<uint8_t>(purpose);
  crypto_generichash_update(&st, &p, 1);
  Key32 out;
  crypto_generichash_final(&st, out.data(), out.size());
  sodium_memzero(point, sizeof point);
  return out;
}

KeyStream::KeyStream(const Key32& key, uint64_t round, MaskStream purpose, uint32_t index)
    : key_(key) {
  ensureSodium();
  // IETF ChaCha20: a 12-byte nonce (the round's low 7 bytes, the purpose, the index) and a 32-bit
  // block counter, so one stream gives 2^32 blocks of 64 bytes: 2^35 words, far above any model.
  for (int i = 0; i < 7; ++i) nonce_[i] = static_cast<uint8_t>(round >> (8 * i));
  nonce_[7] = static_cast<uint8_t>(purpose);
  for (int i = 0; i < 4; ++i) nonce_[8 + i] = static_cast<uint8_t>(index >> (8 * i));
}

KeyStream::~KeyStream() {
  sodium_memzero(key_.data(), key_.size());
  sodium_memzero(words_.data(), sizeof words_);
}

void KeyStream::refill() {
  static_assert(crypto_stream_chacha20_ietf_NONCEBYTES == 12);
  std::array<uint8_t, kWords * 8> buf{};  // the stream itself: XOR onto zeros
  crypto_stream_chacha20_ietf_xor_ic(buf.data(), buf.data(), buf.size(), nonce_.data(), block_,
                                     key_.data());
  block_ += static_cast<uint32_t>(buf.size() / 64);
  for (size_t i = 0; i < kWords; ++i) {
    uint64_t w = 0;
    for (int b = 0; b < 8; ++b) w |= static_cast<uint64_t>(buf[i * 8 + b]) << (8 * b);
    words_[i] = w;
  }
  sodium_memzero(buf.data(), buf.size());
  at_ = 0;
}

uint64_t KeyStream::next() {
  if (at_ == kWords) refill();
  return words_[at_++];
}

uint64_t KeyStream::below(uint64_t n) {
  STARLING_CHECK_ARG(n >= 1, "KeyStream::below(0)");
  // The largest multiple of n in [0, 2^64) is 2^64 - (2^64 mod n).
  const uint64_t reject_from = 0 - ((0 - n) % n);
  for (;;) {
    const uint64_t w = next();
    if (reject_from == 0 || w < reject_from) return w % n;
  }
}

double keyedUniform(const Key32& key, uint64_t round, MaskStream purpose, uint64_t index) {
  ensureSodium();
  crypto_generichash_state st;
  crypto_generichash_init(&st, key.data(), key.size(), 8);
  putU64(st, round);
  putU64(st, static_cast<uint64_t>(purpose));
  putU64(st, index);
  uint8_t out[8];
  crypto_generichash_final(&st, out, sizeof out);
  uint64_t w = 0;
  for (int i = 7; i >= 0; --i) w = (w << 8) | out[i];
  return static_cast<double>(w >> 11) * 0x1.0p-53;
}

Key32 publicKey(const std::string& label, uint64_t run, uint64_t round) {
  ensureSodium();
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(label.data()), label.size());
  putU64(st, run);
  putU64(st, round);
  Key32 out;
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

void applyMask(std::span<uint64_t> x, const Key32& key, uint64_t round, MaskStream purpose,
               uint32_t index, uint32_t bits, bool subtract) {
  STARLING_CHECK_ARG(bits >= 1 && bits <= 64, "applyMask: bits = ", bits);
  ensureSodium();
  const uint64_t m = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  // The stream's bytes, a chunk at a time (whole 64-byte blocks, so that the chunks are one
  // stream), read as little-endian words of 4 bytes for a ring of at most 32 bits (half the
  // stream), of 8 otherwise: KeyStream's words, then.
  const size_t width = bits <= 32 ? 4 : 8;
  // IETF ChaCha20's 32-bit block counter: 2^32 blocks of 64 bytes, far above any model.
  STARLING_CHECK_ARG(x.size() / (64 / width) < (uint64_t{1} << 32) - 1,
                     "applyMask: a vector beyond one ChaCha20 stream");
  constexpr size_t kChunkWords = 4096;
  std::array<uint8_t, 12> nonce{};
  for (int i = 0; i < 7; ++i) nonce[i] = static_cast<uint8_t>(round >> (8 * i));
  nonce[7] = static_cast<uint8_t>(purpose);
  for (int i = 0; i < 4; ++i) nonce[8 + i] = static_cast<uint8_t>(index >> (8 * i));
  std::vector<uint8_t> buf(kChunkWords * width);
  uint32_t block = 0;
  for (size_t off = 0; off < x.size(); off += kChunkWords) {
    const size_t n = std::min(kChunkWords, x.size() - off);
    const size_t bytes = (n * width + 63) / 64 * 64;
    std::fill(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(bytes), 0);
    crypto_stream_chacha20_ietf_xor_ic(buf.data(), buf.data(), bytes, nonce.data(), block,
                                       key.data());
    block += static_cast<uint32_t>(bytes / 64);
    for (size_t i = 0; i < n; ++i) {
      uint64_t w = 0;
      for (size_t b = 0; b < width; ++b) w |= static_cast<uint64_t>(buf[i * width + b]) << (8 * b);
      uint64_t& v = x[off + i];
      v = (subtract ? v - (w & m) : v + (w & m)) & m;
    }
  }
  sodium_memzero(buf.data(), buf.size());
}

std::vector<uint8_t> seal(const Key32& key, std::span<const uint8_t> plaintext,
                          std::span<const uint8_t> context) {
  ensureSodium();
  constexpr size_t kNonce = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
  std::vector<uint8_t> out(kNonce + plaintext.size() + crypto_aead_xchacha20poly1305_ietf_ABYTES);
  randombytes_buf(out.data(), kNonce);
  unsigned long long len = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(out.data() + kNonce, &len, plaintext.data(),
                                             plaintext.size(), context.data(), context.size(),
                                             nullptr, out.data(), key.data());
  out.resize(kNonce + len);
  return out;
}

std::optional<std::vector<uint8_t>> open(const Key32& key, std::span<const uint8_t> sealed,
                                         std::span<const uint8_t> context) {
  ensureSodium();
  constexpr size_t kNonce = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES,
                   kTag = crypto_aead_xchacha20poly1305_ietf_ABYTES;
  if (sealed.size() < kNonce + kTag) return std::nullopt;
  std::vector<uint8_t> out(sealed.size() - kNonce - kTag);
  unsigned long long len = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(out.data(), &len, nullptr, sealed.data() + kNonce,
                                                 sealed.size() - kNonce, context.data(),
                                                 context.size(), sealed.data(), key.data()) != 0)
    return std::nullopt;
  out.resize(len);
  return out;
}

SigningKeyPair SigningKeyPair::generate() {
  ensureSodium();
  SigningKeyPair k;
  crypto_sign_keypair(k.public_key.data(), k.secret_key.data());
  return k;
}

SigningKeyPair SigningKeyPair::fromSeed(const Key32& seed) {
  ensureSodium();
  SigningKeyPair k;
  crypto_sign_seed_keypair(k.public_key.data(), k.secret_key.data(), seed.data());
  return k;
}

namespace {
std::vector<uint8_t> credentialBytes(uint64_t id, const Key32& signing_key) {
  static constexpr char kDomain[] = "starling client credential v1";
  std::vector<uint8_t> b(kDomain, kDomain + sizeof kDomain - 1);
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(id >> (8 * i)));
  b.insert(b.end(), signing_key.begin(), signing_key.end());
  return b;
}
}  // namespace

Signature certify(const SigningKeyPair& authority, uint64_t id, const Key32& signing_key) {
  return sign(authority, credentialBytes(id, signing_key));
}

bool credentialValid(const Key32& authority, uint64_t id, const Credential& c) {
  return verify(authority, credentialBytes(id, c.signing_key), c.certificate);
}

Signature sign(const SigningKeyPair& key, std::span<const uint8_t> message) {
  ensureSodium();
  Signature s;
  crypto_sign_detached(s.data(), nullptr, message.data(), message.size(), key.secret_key.data());
  return s;
}

bool verify(const Key32& public_key, std::span<const uint8_t> message, const Signature& sig) {
  ensureSodium();
  return crypto_sign_verify_detached(sig.data(), message.data(), message.size(),
                                     public_key.data()) == 0;
}

bool equalKeys(const Key32& a, const Key32& b) {
  ensureSodium();
  return sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace starling::privacy
