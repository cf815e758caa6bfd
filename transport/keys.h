#pragma once
// CURVE key pairs, Starling's key files and the server's allow-list.
//
// Key files are small UTF-8 text files, one `name = value` per line; blank lines and lines whose
// first non-blank character is `#` are comments. Names:
//   id         = 7                                            (decimal uint64, optional)
//   public-key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"   (Z85, 40 characters, quoted)
//   secret-key = "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"   (Z85, only in NAME.key_secret)
// and, for secure aggregation under the malicious-server threat model (docs/privacy.md), the
// Ed25519 lines (privacy/crypto.h):
//   signing-public-key = "..."   (Z85, 40 characters: 32 bytes)
//   signing-key        = "..."   (Z85, 40: the 32-byte seed of its signing key; NAME.key_secret)
//   certificate        = "..."   (Z85, 80: 64 bytes, the authority's certificate of a client's
//                                 signing key for its id)
// An authority's files (starling-keygen --new-authority) hold the signing lines only, no CURVE key.
// A name may appear once; any other name, a missing `=`, an unquoted key, text after the value or
// a key that is not valid Z85 is a ConfigError naming the file and the line.
//
//   NAME.key         public key (+ id): safe to share. A client's goes into the server's
//                    allow-list folder; the server's is given to clients (--server-key).
//   NAME.key_secret  public key + secret key (+ id), mode 0600: stays with its owner.
//
// Both are written atomically (temp file, fsync, rename or link, fsync of the folder), so a crash
// leaves either the old file or the new one, never a torn one.
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace starling::transport {

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// A fresh key pair from libsodium's CSPRNG (zmq_curve_keypair). Throws IoError if libzmq was built
// without CURVE.
CurveKeyPair generateKeyPair();

// The Z85 public key that belongs to a Z85 secret key (zmq_curve_public); ConfigError if invalid.
std::string publicKeyOf(std::string_view z85_secret_key);

// True for a 40-character string that decodes as Z85.
bool isZ85Key(std::string_view s);

// A key file's signing lines, as bytes. Whether the seed is the public key's, and the certificate
// the authority's, is checked where they are used (client::SecAggTrust): this layer has no Ed25519.
struct SigningLines {
  std::array<uint8_t, 32> public_key{};
  std::optional<std::array<uint8_t, 32>> seed;         // secret: NAME.key_secret only
  std::optional<std::array<uint8_t, 64>> certificate;  // a client's, by the authority
};

// What one key file holds. `secret_key` is present for NAME.key_secret files only; `public_key`
// is empty for an authority's files (signing lines only).
struct KeyFile {
  std::optional<uint64_t> id;
  std::string public_key;
  std::optional<std::string> secret_key;
  std::optional<SigningLines> signing;
};

// Reads and checks a key file (format above): public-key is required unless the file is an
// authority's (signing-public-key and no CURVE line); when secret-key is present it must be the
// secret of public-key; signing-key and certificate need signing-public-key. ConfigError (file and
// line) on malformed content, IoError when the file cannot be read.
KeyFile loadKeyFile(const std::filesystem::path& path);
// A NAME.key_secret file's pair; ConfigError when it holds no secret key.
CurveKeyPair loadKeyPair(const std::filesystem::path& key_secret_path);
// Any key file's public key (NAME.key or NAME.key_secret).
std::string loadPublicKey(const std::filesystem::path& key_path);
// An authority's public signing key (its NAME.key: signing-public-key, no certificate, no seed);
// ConfigError for a client's file, one without it, or the authority's secret file (which must not
// travel to the root or the clients).
std::array<uint8_t, 32> loadAuthorityKey(const std::filesystem::path& path);

// Writes dir/NAME.key and dir/NAME.key_secret (creating dir if needed). Refuses (ConfigError)
// when either exists unless `force`, before writing anything. NAME is 1..100 characters of
// [A-Za-z0-9._-] not starting with '.'. IoError on a failed write.
// `signing`: the signing lines to add (the seed only into NAME.key_secret).
void writeKeyFiles(const std::filesystem::path& dir, std::string_view name,
                   const CurveKeyPair& pair, std::optional<uint64_t> id, bool force,
                   const SigningLines* signing = nullptr);
// An authority's NAME.key (signing-public-key) and NAME.key_secret (and its seed), the same way.
void writeAuthorityFiles(const std::filesystem::path& dir, std::string_view name,
                         const SigningLines& signing, bool force);

// The client public keys a server admits, each under its 64-bit client id (which the ZAP handler
// hands to the server socket as the peer's authenticated id). Immutable once built; concurrent
// const calls are safe (the ZAP thread reads it while the server's thread owns the socket).
class AllowList {
 public:
  // `path` is either a folder, whose every `*.key` file (not `*.key_secret`) is one client and
  // must carry an `id`, or a file of lines `<id> <Z85 public key>` (`#` comments and blank lines
  // allowed). A duplicate key or id is a ConfigError naming both places; so is an empty list.
  static AllowList load(const std::filesystem::path& path);

  // Adds one client; `origin` (e.g. "clients/a.key" or "allow.txt:3") names it in errors.
  // ConfigError on an invalid key or a duplicate key or id.
  void add(uint64_t id, std::string_view z85_public_key, std::string origin);

  // The id of a public key given as Z85 (40 characters) or binary (32 bytes); nullopt otherwise.
  std::optional<uint64_t> find(std::string_view z85_or_binary32) const;
  size_t size() const { return by_key_.size(); }
  // The listed ids, ascending; whether `id` is listed; where it was listed (empty if not).
  std::vector<uint64_t> ids() const;
  bool has(uint64_t id) const { return id_origin_.count(id) != 0; }
  std::string origin(uint64_t id) const;
  // Client `id`'s public key (32 bytes), empty if it is not listed.
  std::string keyOf(uint64_t id) const;
  // Drops client `id` (its key with it); false when it was not listed.
  bool remove(uint64_t id);

 private:
  struct Entry {
    uint64_t id;
    std::string origin;
  };
  std::unordered_map<std::string, Entry> by_key_;        // binary 32-byte key -> entry
  std::unordered_map<uint64_t, std::string> id_origin_;  // id -> where it was listed
};

}  // namespace starling::transport
