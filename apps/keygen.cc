// starling-keygen: writes CURVE key pairs in Starling's key-file format (transport/keys.h), and
// the federation authority that certifies clients' signing keys (secure aggregation under the
// malicious-server threat model, docs/privacy.md).
// Exit status: 0 on success, 2 on bad input (options, names, existing files), 1 on I/O failure.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "privacy/crypto.h"
#include "privacy/secagg.h"
#include "transport/keys.h"

namespace {

constexpr const char* kHelp =
    R"(Writes CURVE key pairs for Starling's encrypted, authenticated transport.

Each pair is two files in --out:
  NAME.key          the public key (and the client id, if any). Safe to share.
  NAME.key_secret   the public and the secret key (and the id), mode 0600. Keep it secret.

Modes (exactly one):
  --name NAME [--id N]       one pair: NAME.key / NAME.key_secret
  --clients N [--first-id K] N client pairs client-K .. client-(K+N-1), with ids K .. K+N-1
  --server                   the server's pair: server.key / server.key_secret (no id)
  --new-authority            the federation authority: authority.key / authority.key_secret,
                             an Ed25519 key that certifies clients' signing keys

  --authority FILE           with --clients or --name --id: give each client a signing key
                             too, certified for its id by the authority FILE (its .key_secret),
                             for secure aggregation under secagg.threat = malicious-server

How they are used:
  * The server loads its own server.key_secret and an allow-list: a folder holding the
    client-*.key files (public halves only; each must carry its id). A client whose key is not
    in that folder cannot connect; the id in its file is the id the server knows it by.
    Keep server.key* out of the allow-list folder (it has no id).
  * Each client loads its own client-K.key_secret and is given the server's public key file
    (server.key) with --server-key, so it only talks to that server.
  * Copy each client-K.key_secret to its device only; never copy a .key_secret anywhere else.

  * Under secagg.threat = malicious-server every root and client is given the authority's
    public file (secagg.authority = authority.key); its .key_secret stays with the operator,
    off the root (a root holding it could certify clients it invents).

Example:
  starling-keygen --out keys/server --server
  starling-keygen --out keys/clients --clients 10 --first-id 1
  # server: allow-list folder keys/clients (the *.key files), own key keys/server/server.key_secret
  # client 3: own key keys/clients/client-3.key_secret, --server-key keys/server/server.key
  starling-keygen --out keys/authority --new-authority
  starling-keygen --out keys/clients --clients 10 --authority keys/authority/authority.key_secret
)";

// A fresh signing key for client `id`, certified by `authority`.
starling::transport::SigningLines certifiedKey(const starling::privacy::SigningKeyPair& authority,
                                               uint64_t id) {
  namespace pv = starling::privacy;
  const pv::Key32 seed = pv::randomKey();
  const pv::SecAggSigner signer = pv::SecAggSigner::certified(authority, id, seed);
  starling::transport::SigningLines s;
  s.public_key = signer.key.public_key;
  s.seed = seed;
  s.certificate = signer.credential.certificate;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kHelp, "starling-keygen"};
  std::string out, name;
  std::optional<uint64_t> id;
  uint64_t clients = 0, first_id = 1;
  bool server = false, force = false, new_authority = false;
  std::string authority_file;
  app.add_option("--out", out, "folder to write the key files into (created if missing)")
      ->required();
  auto* name_opt = app.add_option("--name", name, "write NAME.key and NAME.key_secret");
  auto* id_opt = app.add_option("--id", id, "the client id to record in the files (with --name)");
  auto* clients_opt =
      app.add_option("--clients", clients, "write N client pairs client-K..client-(K+N-1)")
          ->check(CLI::Range(1, 1000000));
  auto* first_opt =
      app.add_option("--first-id", first_id, "the first client id K (with --clients; default 1)");
  auto* server_opt =
      app.add_flag("--server", server, "write the server's pair server.key / server.key_secret");
  auto* new_authority_opt =
      app.add_flag("--new-authority", new_authority,
                   "write the federation authority's key: authority.key / authority.key_secret");
  auto* authority_opt = app.add_option(
      "--authority", authority_file,
      "with --clients or --name --id: certify a signing key for each client with this "
      "authority.key_secret");
  app.add_flag("--force", force, "overwrite existing key files");
  id_opt->needs(name_opt);
  first_opt->needs(clients_opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  const int modes = (name_opt->count() > 0) + (clients_opt->count() > 0) +
                    (server_opt->count() > 0) + (new_authority_opt->count() > 0);
  if (modes != 1) {
    std::cerr << "starling-keygen: give exactly one of --name, --clients, --server or "
                 "--new-authority (see --help)\n";
    return 2;
  }
  if (authority_opt->count() > 0 && !(clients_opt->count() > 0 || id_opt->count() > 0)) {
    std::cerr << "starling-keygen: --authority certifies clients: give it with --clients, or "
                 "with --name and --id\n";
    return 2;
  }
  if (clients > 0 && first_id > UINT64_MAX - (clients - 1)) {
    std::cerr << "starling-keygen: --first-id " << first_id << " + " << clients
              << " clients overflows 64 bits\n";
    return 2;
  }
  try {
    namespace pv = starling::privacy;
    std::optional<pv::SigningKeyPair> authority;
    if (!authority_file.empty()) {
      const auto k = starling::transport::loadKeyFile(authority_file);
      if (!k.signing || !k.signing->seed || k.signing->certificate || !k.public_key.empty())
        throw starling::ConfigError(authority_file +
                                    ": not an authority's secret file (authority.key_secret, "
                                    "written by --new-authority)");
      authority = pv::SigningKeyPair::fromSeed(*k.signing->seed);
      if (authority->public_key != k.signing->public_key)
        throw starling::ConfigError(authority_file +
                                    ": its signing-key is not its signing-public-key's");
    }
    if (new_authority) {
      for (const char* ext : {".key", ".key_secret"})
        if (!force &&
            std::filesystem::exists(std::filesystem::path(out) / ("authority" + std::string(ext))))
          throw starling::ConfigError(out + "/authority" + ext +
                                      " already exists (use --force to overwrite)");
      const pv::Key32 seed = pv::randomKey();
      starling::transport::SigningLines s;
      s.public_key = pv::SigningKeyPair::fromSeed(seed).public_key;
      s.seed = seed;
      starling::transport::writeAuthorityFiles(out, "authority", s, force);
      std::cout << out << "/authority.key (keep authority.key_secret off the root)\n";
      return 0;
    }
    std::vector<std::pair<std::string, std::optional<uint64_t>>> todo;
    if (server) todo.emplace_back("server", std::nullopt);
    if (name_opt->count()) todo.emplace_back(name, id);
    for (uint64_t i = 0; i < clients; ++i)
      todo.emplace_back("client-" + std::to_string(first_id + i), first_id + i);
    // Refuse before writing anything, so a refused run leaves no half-written set behind.
    for (const auto& [n, i] : todo)
      for (const char* ext : {".key", ".key_secret"})
        if (!force && std::filesystem::exists(std::filesystem::path(out) / (n + ext)))
          throw starling::ConfigError(out + "/" + n + ext +
                                      " already exists (use --force to overwrite)");
    for (const auto& [n, i] : todo) {
      std::optional<starling::transport::SigningLines> signing;
      if (authority) signing = certifiedKey(*authority, *i);
      starling::transport::writeKeyFiles(out, n, starling::transport::generateKeyPair(), i, force,
                                         signing ? &*signing : nullptr);
      std::cout << out << "/" << n << ".key"
                << (i ? " (id " + std::to_string(*i) + ")" : std::string()) << "\n";
    }
  } catch (const starling::ConfigError& e) {
    std::cerr << "starling-keygen: " << e.what() << "\n";
    return 2;
  } catch (const starling::Error& e) {
    std::cerr << "starling-keygen: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
