// starling-admin: administers a running root through its control socket (admin.socket; a Unix
// socket only its owner may open; server/admin.h says what each command does).
// Exit status: 0 when the root did it, 1 when it answered "error: ...", 2 on bad usage or when it
// cannot be reached.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/control_socket.h"

int main(int argc, char** argv) {
  CLI::App app(
      "starling-admin: administers a running Starling root without restarting it, through the "
      "root's control socket (--admin.socket on starling-server; docs/deployment.md, "
      "Operating).\n\n"
      "Commands:\n"
      "  status       the root's state as one JSON object (round, paused, draining, clients, "
      "revoked)\n"
      "  reload       read security.clients again: added keys are admitted at their next "
      "handshake, removed ones revoked\n"
      "  revoke ID    revoke client ID now (until the root restarts; remove its key file too)\n"
      "  drain        finish the round in progress, then stop the root\n"
      "  pause        start no new round until resume\n"
      "  resume\n\n"
      "Exit status: 0 done, 1 the root refused (its answer says why), 2 usage or unreachable.");
  std::string socket;
  std::vector<std::string> command;
  int timeout_ms = 10000;
  app.add_option("--socket", socket, "the root's admin.socket path")->required();
  app.add_option("--timeout_ms", timeout_ms, "how long to wait for the answer")
      ->check(CLI::Range(100, 600000));
  app.add_option("command", command, "status | reload | revoke ID | drain | pause | resume")
      ->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::string line;
  for (const auto& w : command) {
    if (!line.empty()) line += ' ';
    line += w;
  }
  try {
    const std::string answer = starling::ops::sendControl(socket, line, timeout_ms);
    if (answer.empty()) {
      std::fprintf(stderr, "starling-admin: %s closed without an answer (did the root stop?)\n",
                   socket.c_str());
      return 2;
    }
    std::fputs(answer.c_str(), stdout);
    return answer.rfind("error:", 0) == 0 ? 1 : 0;
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "starling-admin: %s\n", e.what());
    return 2;
  }
}
