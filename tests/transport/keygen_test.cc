// starling-keygen end to end: the files it writes are what the server's allow-list and the
// client's key loading read, and a CURVE client using them reaches the server under its id.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdlib>

#include "core/error.h"
#include "privacy/crypto.h"
#include "transport_util.h"

using namespace starling;
using namespace starling::transport;
using namespace starling::transport::testing;

namespace {
int keygen(const std::string& args) {
  const std::string cmd = std::string(STARLING_KEYGEN) + " " + args + " >/dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}
}  // namespace

TEST_CASE("starling-keygen writes key files the sockets use", "[transport]") {
  TempDir dir;
  const std::string srv = (dir.path / "server").string(), cl = (dir.path / "clients").string();
  REQUIRE(keygen("--out " + srv + " --server") == 0);
  REQUIRE(keygen("--out " + cl + " --clients 3 --first-id 10") == 0);
  CHECK(keygen("--out " + cl + " --clients 3 --first-id 12") == 2);  // client-12 exists: refused
  CHECK_FALSE(std::filesystem::exists(dir.path / "clients/client-13.key"));  // nothing half-written
  CHECK(keygen("--out " + cl + " --clients 3 --first-id 12 --force") == 0);
  CHECK(keygen("--out " + cl + " --name a --server") == 2);
  CHECK(keygen("--out " + cl + " --name ../x") == 2);
  CHECK(keygen("--out " + cl + " --clients 0") == 2);
  CHECK(keygen("--name a") == 2);
  CHECK(keygen("--help") == 0);

  auto allow = std::make_shared<AllowList>(AllowList::load(cl));
  CHECK(allow->size() == 5);  // client-10 .. client-14
  const CurveKeyPair server_pair = loadKeyPair(dir.path / "server/server.key_secret");
  const KeyFile client_file = loadKeyFile(dir.path / "clients/client-11.key_secret");
  REQUIRE(client_file.id == 11u);
  REQUIRE(client_file.secret_key);

  Context server_ctx, client_ctx;
  ServerSocket server(server_ctx, kAnyPort, SecurityConfig{false, server_pair, {}, allow},
                      testLimits());
  const SecurityConfig client_sec{false,
                                  {client_file.public_key, *client_file.secret_key},
                                  loadPublicKey(dir.path / "server/server.key"),
                                  {}};
  ClientSocket client(client_ctx, server.endpoint(), client_sec, testLimits());
  REQUIRE(client.send(pattern(32, 1)));
  auto r = receiveMessage(server);
  REQUIRE(r);
  CHECK(r->authenticated_id == 11u);
}

TEST_CASE("starling-keygen certifies clients' signing keys with a federation authority",
          "[transport][secagg]") {
  TempDir dir;
  const std::string auth = (dir.path / "auth").string(), cl = (dir.path / "clients").string();
  REQUIRE(keygen("--out " + auth + " --new-authority") == 0);
  CHECK(keygen("--out " + auth + " --new-authority") == 2);  // exists: refused
  const std::string secret = auth + "/authority.key_secret";
  REQUIRE(keygen("--out " + cl + " --clients 3 --first-id 7 --authority " + secret) == 0);
  REQUIRE(keygen("--out " + cl + " --name solo --id 20 --authority " + secret) == 0);
  // --authority certifies clients: not the server's pair, not a name without an id, and only an
  // authority's secret file.
  CHECK(keygen("--out " + cl + " --server --authority " + secret) == 2);
  CHECK(keygen("--out " + cl + " --name x --authority " + secret) == 2);
  CHECK(keygen("--out " + cl + " --clients 1 --first-id 30 --authority " + auth +
               "/authority.key") == 2);
  CHECK(keygen("--out " + cl + " --clients 1 --first-id 31 --authority " + cl +
               "/client-7.key_secret") == 2);
  CHECK_FALSE(std::filesystem::exists(dir.path / "clients/client-30.key"));

  const auto authority = loadAuthorityKey(auth + "/authority.key");
  std::vector<std::pair<std::string, uint64_t>> files{
      {"client-7", 7}, {"client-8", 8}, {"client-9", 9}, {"solo", 20}};
  for (const auto& [name, id] : files) {
    INFO(name);
    const KeyFile k = loadKeyFile(dir.path / "clients" / (name + ".key_secret"));
    REQUIRE(k.signing);
    REQUIRE(k.signing->seed);
    REQUIRE(k.signing->certificate);
    CHECK(k.id == id);
    // The seed is the key's, and the certificate the authority's for this id and no other.
    CHECK(privacy::SigningKeyPair::fromSeed(*k.signing->seed).public_key == k.signing->public_key);
    const privacy::Credential cred{k.signing->public_key, *k.signing->certificate};
    CHECK(privacy::credentialValid(authority, id, cred));
    CHECK_FALSE(privacy::credentialValid(authority, id + 1, cred));
  }
  // The CURVE keys and the allow-list work as before.
  CHECK(AllowList::load(cl).size() == 4);
  // A client pair without --authority has no signing lines.
  REQUIRE(keygen("--out " + cl + " --clients 1 --first-id 40") == 0);
  CHECK_FALSE(loadKeyFile(dir.path / "clients/client-40.key_secret").signing);
}
