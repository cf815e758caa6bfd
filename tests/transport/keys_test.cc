// Key files and allow-lists: round trips, and every malformed file is a ConfigError that names
// the file (and the line).
#include "transport/keys.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>

#include "check_throws.h"
#include "core/error.h"
#include "transport_util.h"

namespace fs = std::filesystem;
using namespace starling;
using namespace starling::transport;
using namespace starling::transport::testing;
using Catch::Matchers::Contains;

namespace {
void writeText(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}
std::string readText(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST_CASE("generated key pairs are Z85 and consistent", "[transport]") {
  const CurveKeyPair a = generateKeyPair(), b = generateKeyPair();
  CHECK(isZ85Key(a.public_key));
  CHECK(isZ85Key(a.secret_key));
  CHECK(publicKeyOf(a.secret_key) == a.public_key);
  CHECK(a.public_key != b.public_key);
  CHECK_FALSE(isZ85Key(a.public_key.substr(1)));
  CHECK_FALSE(isZ85Key(std::string(40, '~')));
}

TEST_CASE("key files round-trip, refuse overwriting, and keep the secret private", "[transport]") {
  TempDir dir;
  const CurveKeyPair pair = generateKeyPair();
  writeKeyFiles(dir.path / "sub", "client-7", pair, 7, false);
  const fs::path pub = dir.path / "sub/client-7.key", sec = dir.path / "sub/client-7.key_secret";

  const KeyFile k = loadKeyFile(pub);
  CHECK(k.id == 7u);
  CHECK(k.public_key == pair.public_key);
  CHECK_FALSE(k.secret_key);
  CHECK(readText(pub).find(pair.secret_key) ==
        std::string::npos);  // the public file holds no secret
  const CurveKeyPair back = loadKeyPair(sec);
  CHECK(back.public_key == pair.public_key);
  CHECK(back.secret_key == pair.secret_key);
  CHECK(loadPublicKey(sec) == pair.public_key);
  CHECK(loadKeyFile(sec).id == 7u);

  struct stat st {};
  REQUIRE(::stat(sec.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  CHECK_THROWS_MATCHING(loadKeyPair(pub), ConfigError,
                        Contains("client-7.key") && Contains("no secret-key"));
  const CurveKeyPair other = generateKeyPair();
  CHECK_THROWS_MATCHING(writeKeyFiles(dir.path / "sub", "client-7", other, 7, false), ConfigError,
                        Contains("already exists"));
  CHECK(loadPublicKey(pub) == pair.public_key);  // untouched
  writeKeyFiles(dir.path / "sub", "client-7", other, std::nullopt, true);
  CHECK(loadPublicKey(pub) == other.public_key);
  CHECK_FALSE(loadKeyFile(pub).id);
  // No temp files are left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path / "sub")) files += e.is_regular_file();
  CHECK(files == 2);

  CHECK_THROWS_AS(writeKeyFiles(dir.path, "../evil", pair, 1, false), ConfigError);
  CHECK_THROWS_AS(writeKeyFiles(dir.path, ".hidden", pair, 1, false), ConfigError);
  CHECK_THROWS_AS(
      writeKeyFiles(dir.path, "x", CurveKeyPair{pair.public_key, other.secret_key}, 1, false),
      ConfigError);
}

TEST_CASE("a malformed key file is a ConfigError naming the file and line", "[transport]") {
  TempDir dir;
  const CurveKeyPair pair = generateKeyPair(), other = generateKeyPair();
  writeKeyFiles(dir.path, "k", pair, 3, false);
  const fs::path sec = dir.path / "k.key_secret";
  const std::string good = readText(sec);
  const std::string bad_file = (dir.path / "bad.key_secret").string();

  struct Case {
    std::string text, expect;
  };
  std::string corrupted = good;
  corrupted[corrupted.find("public-key = \"") + 20] = '~';  // not in the Z85 alphabet
  const std::vector<Case> cases = {
      {corrupted, ":3: public-key is not a 40-character Z85"},
      {"public-key = \"" + pair.public_key.substr(1) + "\"\n", ":1: public-key is not"},
      {"public-key = " + pair.public_key + "\n", ":1: public-key must be a quoted"},
      {"id = 1\nid = 2\npublic-key = \"" + pair.public_key + "\"\n", ":2: second id"},
      {"id = -1\n", ":1: id must be a decimal"},
      {"id = 18446744073709551616\n", ":1: id must be a decimal"},
      {"\n# comment\ncolor = \"blue\"\n", ":3: unknown name"},
      {"public-key \"" + pair.public_key + "\"\n", ":1: expected `name = value`"},
      {"id = 4\n", "no public-key line"},
      {"public-key = \"" + pair.public_key + "\"\nsecret-key = \"" + other.secret_key + "\"\n",
       ":2: secret-key does not belong"},
      {"public-key = \"" + pair.public_key + "\" trailing\n", ":1: public-key must be a quoted"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    writeText(bad_file, c.text);
    CHECK_THROWS_MATCHING(loadKeyFile(bad_file), ConfigError,
                          Contains(bad_file) && Contains(c.expect));
  }
  CHECK_THROWS_AS(loadKeyFile(dir.path / "missing.key"), IoError);
  writeText(bad_file, std::string(100000, '#'));
  CHECK_THROWS_MATCHING(loadKeyFile(bad_file), ConfigError, Contains("not a key file"));
}

TEST_CASE("an allow-list folder admits its *.key files under their ids", "[transport]") {
  TempDir dir;
  std::vector<CurveKeyPair> pairs;
  for (uint64_t id : {5, 6, 7}) {
    pairs.push_back(generateKeyPair());
    writeKeyFiles(dir.path, "client-" + std::to_string(id), pairs.back(), id, false);
  }
  const AllowList list =
      AllowList::load(dir.path);  // the *.key_secret files beside them are ignored
  CHECK(list.size() == 3);
  CHECK(list.find(pairs[1].public_key) == 6u);
  uint8_t bin[32];
  REQUIRE(zmq_z85_decode(bin, pairs[2].public_key.c_str()));
  CHECK(list.find(std::string_view(reinterpret_cast<const char*>(bin), 32)) == 7u);
  CHECK_FALSE(list.find(generateKeyPair().public_key));
  CHECK_FALSE(list.find("short"));

  SECTION("a duplicate id names both files") {
    writeKeyFiles(dir.path, "zz-dup", generateKeyPair(), 6, false);
    CHECK_THROWS_MATCHING(
        AllowList::load(dir.path), ConfigError,
        Contains("client id 6") && Contains("client-6.key") && Contains("zz-dup.key"));
  }
  SECTION("a duplicate key names both files") {
    writeText(dir.path / "zz-copy.key", "id = 99\npublic-key = \"" + pairs[0].public_key + "\"\n");
    CHECK_THROWS_MATCHING(
        AllowList::load(dir.path), ConfigError,
        Contains("client-5.key") && Contains("zz-copy.key") && Contains("same public key"));
  }
  SECTION("a key file without an id") {
    writeKeyFiles(dir.path, "server", generateKeyPair(), std::nullopt, false);
    CHECK_THROWS_MATCHING(AllowList::load(dir.path), ConfigError,
                          Contains("server.key") && Contains("id"));
  }
  SECTION("a corrupted key file") {
    writeText(dir.path / "client-6.key", "id = 6\npublic-key = \"garbage\"\n");
    CHECK_THROWS_MATCHING(AllowList::load(dir.path), ConfigError, Contains("client-6.key:2"));
  }
}

TEST_CASE("an allow-list file of `<id> <key>` lines", "[transport]") {
  TempDir dir;
  const CurveKeyPair a = generateKeyPair(), b = generateKeyPair();
  const fs::path f = dir.path / "allow.txt";
  writeText(f, "# clients\n1 " + a.public_key + "\n\n  2\t" + b.public_key + "  \n");
  const AllowList list = AllowList::load(f);
  CHECK(list.size() == 2);
  CHECK(list.find(a.public_key) == 1u);
  CHECK(list.find(b.public_key) == 2u);

  writeText(f, "1 " + a.public_key + "\n1 " + b.public_key + "\n");
  CHECK_THROWS_MATCHING(AllowList::load(f), ConfigError,
                        Contains("allow.txt:1") && Contains("allow.txt:2"));
  writeText(f, "1 " + a.public_key + "\nx " + b.public_key + "\n");
  CHECK_THROWS_MATCHING(AllowList::load(f), ConfigError, Contains("allow.txt:2"));
  writeText(f, "# nobody\n");
  CHECK_THROWS_MATCHING(AllowList::load(f), ConfigError, Contains("admits no client"));
  CHECK_THROWS_AS(AllowList::load(dir.path / "nope"), ConfigError);
}

TEST_CASE("security and limits are validated with clear messages", "[transport]") {
  const Keys keys(1);
  CHECK_NOTHROW(keys.serverSide().validate(true));
  CHECK_NOTHROW(keys.clientSide(keys.clients[0]).validate(false));
  CHECK_NOTHROW(insecure().validate(true));
  SecurityConfig s = keys.serverSide();
  s.allow = nullptr;
  CHECK_THROWS_MATCHING(s.validate(true), ConfigError, Contains("allow-list"));
  SecurityConfig c = keys.clientSide(keys.clients[0]);
  c.server_public_key.clear();
  CHECK_THROWS_MATCHING(c.validate(false), ConfigError, Contains("server's public key"));
  c = keys.clientSide(keys.clients[0]);
  c.own.secret_key = keys.server.secret_key;
  CHECK_THROWS_MATCHING(c.validate(false), ConfigError, Contains("does not belong"));

  CHECK_NOTHROW(TransportLimits{}.validate());
  TransportLimits l;
  l.max_reassembly_bytes = l.max_message_bytes - 1;
  CHECK_THROWS_MATCHING(l.validate(), ConfigError, Contains("max_reassembly_bytes"));
  l = {};
  l.burst = 0.5;
  CHECK_THROWS_MATCHING(l.validate(), ConfigError, Contains("burst"));
  l = {};
  l.heartbeat_timeout_ms = 10;
  CHECK_THROWS_MATCHING(l.validate(), ConfigError, Contains("heartbeat_timeout_ms"));
  l = {};
  l.chunk_bytes = 0;
  CHECK_THROWS_MATCHING(l.validate(), ConfigError, Contains("chunk_bytes"));
}

TEST_CASE("key files carry signing lines, and an authority's files have no CURVE key",
          "[transport]") {
  TempDir dir;
  const CurveKeyPair pair = generateKeyPair();
  SigningLines lines;
  for (size_t i = 0; i < 32; ++i) {
    lines.public_key[i] = static_cast<uint8_t>(i * 7 + 1);
    (*(lines.seed = std::array<uint8_t, 32>{}))[i] = static_cast<uint8_t>(255 - i);
  }
  std::array<uint8_t, 64> cert{};
  for (size_t i = 0; i < 64; ++i) cert[i] = static_cast<uint8_t>(i * 3);
  lines.certificate = cert;
  writeKeyFiles(dir.path, "c", pair, 5, false, &lines);
  const KeyFile sec = loadKeyFile(dir.path / "c.key_secret"), pub = loadKeyFile(dir.path / "c.key");
  REQUIRE(sec.signing);
  CHECK(sec.signing->public_key == lines.public_key);
  CHECK(sec.signing->seed == lines.seed);
  CHECK(sec.signing->certificate == cert);
  REQUIRE(pub.signing);
  CHECK_FALSE(pub.signing->seed);  // the secret seed stays in the .key_secret
  CHECK(pub.signing->certificate == cert);
  CHECK(readText(dir.path / "c.key").find("signing-key") == std::string::npos);
  // A client's file is no authority's.
  CHECK_THROWS_MATCHING(loadAuthorityKey(dir.path / "c.key"), ConfigError,
                        Contains("not the authority's"));
  // The allow-list still reads the client's public file.
  CHECK(AllowList::load(dir.path).size() == 1);

  SigningLines auth;
  auth.public_key = lines.public_key;
  auth.seed = lines.seed;
  writeAuthorityFiles(dir.path / "auth", "authority", auth, false);
  CHECK(loadAuthorityKey(dir.path / "auth/authority.key") == auth.public_key);
  // Its secret file is refused where the public one belongs (it must not reach the root).
  CHECK_THROWS_MATCHING(loadAuthorityKey(dir.path / "auth/authority.key_secret"), ConfigError,
                        Contains("SECRET file"));
  CHECK_FALSE(loadKeyFile(dir.path / "auth/authority.key").signing->seed);
  CHECK(loadKeyFile(dir.path / "auth/authority.key_secret").signing->seed == auth.seed);
  CHECK(loadKeyFile(dir.path / "auth/authority.key").public_key.empty());
  // Where a CURVE key is needed, an authority's file is refused by name.
  CHECK_THROWS_MATCHING(loadPublicKey(dir.path / "auth/authority.key"), ConfigError,
                        Contains("an authority's key file"));
  CHECK_THROWS_AS(loadKeyPair(dir.path / "auth/authority.key_secret"), ConfigError);
  fs::copy_file(dir.path / "auth/authority.key", dir.path / "authority.key");
  CHECK_THROWS_MATCHING(AllowList::load(dir.path), ConfigError,
                        Contains("authority.key") && Contains("an authority's key file"));
  CHECK_THROWS_AS(writeAuthorityFiles(dir.path / "auth2", "authority", lines, false),
                  ConfigError);  // a certificate: a client's lines

  // Malformed signing lines: the file and line named.
  const std::string bad = (dir.path / "bad.key").string();
  const std::string pk = readText(dir.path / "c.key")
                             .substr(readText(dir.path / "c.key").find("signing-public-key = \""));
  const std::string spk = pk.substr(0, pk.find('\n'));
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases = {
      {"signing-public-key = \"abc\"\n", ":1: signing-public-key is not a 40-character Z85"},
      {"certificate = \"" + pair.public_key + "\"\n", ":1: certificate is not a 80-character"},
      {"signing-key = \"" + pair.public_key + "\"\n", "signing-key without a signing-public-key"},
      {spk + "\n" + spk + "\n", ":2: second signing-public-key"},
      {spk + "\nid = 3\n", "only an authority's file has none"},
      {"public-key = \"" + pair.public_key + "\"\ncertificate = " + pair.public_key + "\n",
       ":2: certificate must be a quoted"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    writeText(bad, c.text);
    CHECK_THROWS_MATCHING(loadKeyFile(bad), ConfigError, Contains(bad) && Contains(c.expect));
  }
}
