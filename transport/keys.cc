#include "transport/keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "transport/key_text.h"

namespace starling::transport {

namespace fs = std::filesystem;

CurveKeyPair generateKeyPair() {
  std::array<char, 41> pub{}, sec{};
  if (zmq_curve_keypair(pub.data(), sec.data()) != 0)
    STARLING_THROW(IoError, "zmq_curve_keypair failed: ", zmq_strerror(zmq_errno()),
                   " (libzmq built without CURVE?)");
  return {std::string(pub.data(), 40), std::string(sec.data(), 40)};
}

bool isZ85Key(std::string_view s) {
  if (s.size() != 40) return false;
  const std::string z(s);
  uint8_t bin[32];
  return zmq_z85_decode(bin, z.c_str()) != nullptr;
}

std::string publicKeyOf(std::string_view z85_secret_key) {
  if (!isZ85Key(z85_secret_key))
    STARLING_THROW(ConfigError, "not a Z85 secret key (40 characters)");
  const std::string sec(z85_secret_key);
  std::array<char, 41> pub{};
  if (zmq_curve_public(pub.data(), sec.c_str()) != 0)
    STARLING_THROW(ConfigError, "zmq_curve_public failed: ", zmq_strerror(zmq_errno()));
  return std::string(pub.data(), 40);
}

namespace {
template <size_t N>
std::array<uint8_t, N> bytesOf(const std::string& z85) {
  const auto bin = detail::z85Decode(z85, N / 4 * 5);
  std::array<uint8_t, N> out{};
  std::copy(bin->begin(), bin->end(), out.begin());  // parseKeyText checked it decodes
  return out;
}
}  // namespace

KeyFile loadKeyFile(const fs::path& path) {
  const std::string where = path.string();
  const auto fields = detail::parseKeyText(detail::readSmallFile(path), where);
  KeyFile k;
  k.id = fields.id;
  if (fields.signing_public_key) {
    SigningLines s;
    s.public_key = bytesOf<32>(*fields.signing_public_key);
    if (fields.signing_key) s.seed = bytesOf<32>(*fields.signing_key);
    if (fields.certificate) s.certificate = bytesOf<64>(*fields.certificate);
    k.signing = s;
  } else if (fields.signing_key || fields.certificate) {
    STARLING_THROW(ConfigError, where, ":",
                   fields.signing_key ? fields.signing_line : fields.certificate_line, ": ",
                   fields.signing_key ? "signing-key" : "certificate",
                   " without a signing-public-key line");
  }
  if (!fields.public_key) {
    if (!k.signing) STARLING_THROW(ConfigError, where, ": no public-key line");
    if (fields.secret_key || k.id || k.signing->certificate)
      STARLING_THROW(ConfigError, where,
                     ": no public-key line (only an authority's file has none, and it has no "
                     "secret-key, id or certificate)");
    return k;  // an authority's
  }
  k.public_key = *fields.public_key;
  if (fields.secret_key) {
    if (publicKeyOf(*fields.secret_key) != k.public_key)
      STARLING_THROW(ConfigError, where, ":", fields.secret_line,
                     ": secret-key does not belong to the public-key of line ", fields.public_line);
    k.secret_key = fields.secret_key;
  }
  return k;
}

CurveKeyPair loadKeyPair(const fs::path& key_secret_path) {
  KeyFile k = loadKeyFile(key_secret_path);
  if (!k.secret_key)
    STARLING_THROW(ConfigError, key_secret_path.string(),
                   ": no secret-key line (give the NAME.key_secret file, not NAME.key)");
  return {k.public_key, *k.secret_key};
}

std::string loadPublicKey(const fs::path& key_path) {
  KeyFile k = loadKeyFile(key_path);
  if (k.public_key.empty())
    STARLING_THROW(ConfigError, key_path.string(),
                   ": an authority's key file (signing lines only), not a CURVE key");
  return k.public_key;
}

std::array<uint8_t, 32> loadAuthorityKey(const fs::path& path) {
  const KeyFile k = loadKeyFile(path);
  if (!k.signing)
    STARLING_THROW(ConfigError, path.string(),
                   ": no signing-public-key line (give the authority's public file, written by "
                   "starling-keygen --new-authority)");
  if (k.signing->certificate || !k.public_key.empty())
    STARLING_THROW(ConfigError, path.string(),
                   ": a client's key file, not the authority's (starling-keygen --new-authority "
                   "writes it)");
  if (k.signing->seed)
    STARLING_THROW(ConfigError, path.string(),
                   ": the authority's SECRET file (it has a signing-key line): give its public "
                   "file authority.key, and keep this one off the root and the clients");
  return k.signing->public_key;
}

namespace {

bool validName(std::string_view name) {
  if (name.empty() || name.size() > 100 || name.front() == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

[[noreturn]] void ioFail(const std::string& what, const fs::path& p) {
  STARLING_THROW(IoError, what, " ", p.string(), ": ", std::strerror(errno));
}

void fsyncDir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) ioFail("cannot open folder", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) ioFail("cannot fsync folder", dir);
}

// Writes `text` to `target` through a temp file in the same folder: create (O_EXCL, `mode`),
// write, fsync, then rename (force) or link (fails if target exists), then fsync the folder.
void writeAtomically(const fs::path& target, const std::string& text, mode_t mode, bool force) {
  std::random_device rd;
  std::ostringstream tmp_name;  // (not operator+: GCC 12 warns falsely on that chain, -Wrestrict)
  tmp_name << '.' << target.filename().string() << ".tmp" << ::getpid() << '-' << rd();
  const fs::path tmp = target.parent_path() / tmp_name.str();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) ioFail("cannot create", tmp);
  bool ok = ::fchmod(fd, mode) == 0;  // exact mode whatever the umask
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    errno = saved;
    ioFail("cannot write", tmp);
  }
  const int rc =
      force ? ::rename(tmp.c_str(), target.c_str()) : ::link(tmp.c_str(), target.c_str());
  const int link_errno = errno;
  if (!force || rc != 0) ::unlink(tmp.c_str());
  if (rc != 0) {
    if (!force && link_errno == EEXIST)
      STARLING_THROW(ConfigError, target.string(), " already exists (use --force to overwrite)");
    errno = link_errno;
    ioFail("cannot move the new key file to", target);
  }
  fsyncDir(target.parent_path());
}

template <size_t N>
std::string z85(const std::array<uint8_t, N>& bytes) {
  static_assert(N % 4 == 0);
  std::array<char, N / 4 * 5 + 1> out{};
  zmq_z85_encode(out.data(), bytes.data(), N);
  return std::string(out.data(), N / 4 * 5);
}

// `pair`: null for an authority's files.
std::string keyText(const CurveKeyPair* pair, std::optional<uint64_t> id, bool secret,
                    const SigningLines* signing) {
  std::ostringstream os;
  if (!pair)
    os << (secret ? "# Starling federation authority. SECRET: keep it off the root and the "
                    "clients (mode 0600);\n# it certifies clients' signing keys "
                    "(starling-keygen --clients N --authority THIS).\n"
                  : "# Starling federation authority's public key: every root and client "
                    "under secagg.threat =\n# malicious-server is given it (secagg.authority).\n");
  else if (secret)
    os << "# Starling CURVE key pair. SECRET: keep it with its owner (mode 0600), never share "
          "it.\n";
  else
    os << "# Starling CURVE public key. Safe to share: a client's goes into the server's "
          "allow-list\n"
          "# folder, the server's is what clients pass as --server-key.\n";
  if (id) os << "id = " << *id << "\n";
  if (pair) os << "public-key = \"" << pair->public_key << "\"\n";
  if (pair && secret) os << "secret-key = \"" << pair->secret_key << "\"\n";
  if (signing) {
    os << "signing-public-key = \"" << z85(signing->public_key) << "\"\n";
    if (signing->certificate) os << "certificate = \"" << z85(*signing->certificate) << "\"\n";
    if (secret && signing->seed) os << "signing-key = \"" << z85(*signing->seed) << "\"\n";
  }
  return os.str();
}

// Writes dir/NAME.key_secret, then dir/NAME.key.
void writePair(const fs::path& dir, std::string_view name, const CurveKeyPair* pair,
               std::optional<uint64_t> id, bool force, const SigningLines* signing) {
  if (!validName(name))
    STARLING_THROW(ConfigError, "key name \"", name,
                   "\" must be 1..100 characters of [A-Za-z0-9._-] and not start with '.'");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) STARLING_THROW(IoError, "cannot create folder ", dir.string(), ": ", ec.message());
  const fs::path pub = dir / (std::string(name) + ".key");
  const fs::path sec = dir / (std::string(name) + ".key_secret");
  if (!force) {
    for (const auto& p : {pub, sec})
      if (fs::exists(p, ec))
        STARLING_THROW(ConfigError, p.string(), " already exists (use --force to overwrite)");
  }
  writeAtomically(sec, keyText(pair, id, true, signing), 0600, force);
  writeAtomically(pub, keyText(pair, id, false, signing), 0644, force);
}

}  // namespace

void writeKeyFiles(const fs::path& dir, std::string_view name, const CurveKeyPair& pair,
                   std::optional<uint64_t> id, bool force, const SigningLines* signing) {
  if (!isZ85Key(pair.public_key) || publicKeyOf(pair.secret_key) != pair.public_key)
    STARLING_THROW(ConfigError, "key pair for \"", name, "\" is not a valid CURVE pair");
  writePair(dir, name, &pair, id, force, signing);
}

void writeAuthorityFiles(const fs::path& dir, std::string_view name, const SigningLines& signing,
                         bool force) {
  if (!signing.seed || signing.certificate)
    STARLING_THROW(ConfigError, "an authority's key files need its seed and no certificate");
  writePair(dir, name, nullptr, std::nullopt, force, &signing);
}

}  // namespace starling::transport
