#pragma once
// A federation of real processes for the deployment tests: keys from starling-keygen, allow-list
// folders per server, and starling-server / starling-client processes with short timings, all on
// 127.0.0.1, all killed by pid when the Federation goes out of scope.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "integration/harness.h"
#include "ops/control_socket.h"

namespace starling::testing {

class Federation {
 public:
  explicit Federation(const std::string& tag) : dir_(tag) {
    std::filesystem::create_directories(dir_ / "keys");
    keygen({"--out", keys(), "--server"});
  }

  std::string keys() const { return dir_ / "keys"; }
  std::string path(const std::string& name) const { return dir_ / name; }

  void keygen(std::vector<std::string> args) {
    args.insert(args.begin(), binDir() + "/starling-keygen");
    Proc p(args, dir_ / "keygen.log");
    if (p.wait(std::chrono::seconds(30)) != 0)
      throw std::runtime_error("keygen failed: " + readText(dir_ / "keygen.log"));
  }
  void clientKeys(uint64_t first, uint64_t n) {
    keygen({"--out", keys(), "--clients", std::to_string(n), "--first-id", std::to_string(first)});
  }
  void namedKey(const std::string& name, uint64_t id) {
    keygen({"--out", keys(), "--name", name, "--id", std::to_string(id)});
  }
  // A folder holding the public key files NAME.key of `names` (an allow-list).
  std::string allowList(const std::string& folder, const std::vector<std::string>& names) {
    const std::string d = dir_ / folder;
    std::filesystem::create_directories(d);
    for (const auto& n : names)
      std::filesystem::copy_file(keys() + "/" + n + ".key", d + "/" + n + ".key",
                                 std::filesystem::copy_options::overwrite_existing);
    return d;
  }

  // The experiment of these tests where it differs from the shared defaults (apps/settings.h: the
  // simulator's demo, the CNN): softmax trains in a blink. Every process takes it.
  static std::vector<std::string> modelArgs() { return {"--model.spec", "softmax"}; }
  // A client's split: IID shards (the defaults' Dirichlet(0.5) would leave a class-poor shard).
  static std::vector<std::string> clientArgs() {
    std::vector<std::string> a = modelArgs();
    for (const char* x : {"--data.partition", "iid"}) a.push_back(x);
    return a;
  }
  // Settings that keep the tests short: fast heartbeats, a client silent 1.5 s is failed; rounds
  // sample every registered client (by fraction) and evaluate only when a test asks.
  static std::vector<std::string> fastServerArgs() {
    std::vector<std::string> a = modelArgs();
    for (const char* x : {"--net.heartbeat_ms", "200", "--net.silence_ms", "1500", "--log.level",
                          "info", "--train.lr", "0.05", "--train.batch_size", "32",
                          "--sampling.fraction", "1.0", "--eval.every", "0"})
      a.push_back(x);
    return a;
  }

  // The root: `allow` is an allow-list folder; extra arguments override.
  Proc& root(const std::string& name, int port, const std::string& allow,
             std::vector<std::string> extra) {
    std::vector<std::string> a{
        binDir() + "/starling-server", "--server.bind",      endpoint(port), "--security.key",
        keys() + "/server.key_secret", "--security.clients", allow};
    for (auto& x : fastServerArgs()) a.push_back(x);
    for (auto& x : extra) a.push_back(x);
    return start(name, a);
  }
  // An edge aggregator `id` (key NAME agg-ID) listening on `port`, upstream `upstream_port`.
  Proc& aggregator(uint64_t id, int port, int upstream_port, const std::string& allow,
                   std::vector<std::string> extra) {
    const std::string name = "agg-" + std::to_string(id);
    std::vector<std::string> a{binDir() + "/starling-server",
                               "--server.role",
                               "aggregator",
                               "--server.id",
                               std::to_string(id),
                               "--server.bind",
                               endpoint(port),
                               "--server.upstream",
                               endpoint(upstream_port),
                               "--security.key",
                               keys() + "/" + name + ".key_secret",
                               "--security.server_key",
                               keys() + "/server.key",
                               "--security.clients",
                               allow};
    for (auto& x : fastServerArgs()) a.push_back(x);
    for (auto& x : extra) a.push_back(x);
    return start(name, a);
  }
  // Client `id` of `num_clients` shards, connecting to `port` whose public key file is
  // `server_key_name`.key.
  Proc& client(uint64_t id, int port, const std::string& server_key_name, uint64_t num_clients,
               std::vector<std::string> extra = {}) {
    return start(
        "client-" + std::to_string(id),
        clientArgv({binDir() + "/starling-client"}, id, port, server_key_name, num_clients, extra));
  }
  // The same client on a slow device: each fit first waits `wait_ms` (starling-test-slow-client,
  // tests/integration/slow_client.cc); fitsStarted() counts its fits begun. With a wait of 0: a
  // client whose fits a test can see begin.
  Proc& slowClient(uint64_t id, int port, const std::string& server_key_name, uint64_t num_clients,
                   uint64_t wait_ms, std::vector<std::string> extra = {}) {
    const std::string name = "client-" + std::to_string(id);
    return start(name, clientArgv({binDir() + "/starling-test-slow-client", "--test.wait_ms",
                                   std::to_string(wait_ms), "--test.fits", path(name + ".fits")},
                                  id, port, server_key_name, num_clients, extra));
  }
  // The fits slow client `name` began (its trainer's events: a line each, before the fit's wait),
  // over every process started under that name (the file is never truncated).
  size_t fitsStarted(const std::string& name) const {
    const std::string t = readText(dir_ / (name + ".fits"));
    return static_cast<size_t>(std::count(t.begin(), t.end(), '\n'));
  }
  std::vector<std::string> clientArgv(std::vector<std::string> a, uint64_t id, int port,
                                      const std::string& server_key_name, uint64_t num_clients,
                                      const std::vector<std::string>& extra) {
    for (const std::string& x : std::vector<std::string>{
             "--client.server", endpoint(port), "--client.id", std::to_string(id), "--security.key",
             keys() + "/client-" + std::to_string(id) + ".key_secret", "--security.server_key",
             keys() + "/" + server_key_name + ".key", "--data.num_clients",
             std::to_string(num_clients), "--net.chunk_bytes", "65536"})
      a.push_back(x);
    for (auto& x : clientArgs()) a.push_back(x);
    for (auto& x : extra) a.push_back(x);
    return a;
  }

  Proc& start(const std::string& name, const std::vector<std::string>& argv) {
    procs_[name] = Proc(argv, dir_ / (name + ".log"));
    return procs_[name];
  }
  Proc& proc(const std::string& name) { return procs_.at(name); }
  std::string log(const std::string& name) const { return readText(dir_ / (name + ".log")); }
  // Waits until `pred` holds, checking it again whenever a file of the federation's folder (its
  // processes' logs, metrics, checkpoints, the slow clients' fits) changes; false when `timeout`
  // passed first.
  bool waitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) const {
    return waitForFiles(dir_.path, pred, timeout);
  }
  // The same for a server's answer over its admin socket (adminStatus): asked again at least every
  // 200 ms, since the answer changes without a file changing.
  bool waitForStatus(const std::function<bool()>& pred, std::chrono::milliseconds timeout) const {
    return waitForFiles(dir_.path, pred, timeout, std::chrono::milliseconds(200));
  }
  // Every log, for a failing test's output.
  std::string allLogs() const {
    std::string out;
    for (const auto& [name, p] : procs_) out += "---- " + name + " ----\n" + log(name);
    return out;
  }

  static std::string endpoint(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

 private:
  TempDir dir_;
  std::map<std::string, Proc> procs_;
};

// The rounds in a metrics file, with one field of each (as text), e.g. field(line,
// "clients_failed").
inline std::string field(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t p = json.find(k);
  if (p == std::string::npos) return "";
  const size_t b = p + k.size();
  size_t e = b;
  while (e < json.size() && json[e] != ',' && json[e] != '}') ++e;
  return json.substr(b, e - b);
}

// A number in the status of the server whose admin socket is `sock` (--admin.socket; the answer
// of starling-admin status, server/admin.h), e.g. "registered" or "round"; -1 while the server
// does not answer (not listening yet, or gone).
inline long long adminStatus(const std::string& sock, const std::string& key) {
  try {
    const std::string v = field(ops::sendControl(sock, "status", 2000), key);
    return v.empty() ? -1 : std::stoll(v);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace starling::testing
