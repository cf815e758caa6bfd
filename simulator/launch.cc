#include "simulator/launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace starling::simulator {

namespace {

// A decimal integer in [lo, hi], the whole value (no sign for non-negative ranges, no spaces).
int parseInt(std::string_view name, const std::string& value, long lo, long hi) {
  long v = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || p != end) {
    STARLING_THROW(ConfigError, "environment variable ", name, "='", value,
                   "' is not a decimal integer");
  }
  if (v < lo || v > hi) {
    STARLING_THROW(ConfigError, "environment variable ", name, "=", value, " is out of range [", lo,
                   ", ", hi, "]");
  }
  return static_cast<int>(v);
}

constexpr long kMaxWorld = 1 << 20;

struct Family {
  const char* rank;
  const char* world;
  const char* local;
};

void fillMaster(LaunchInfo& info, const EnvLookup& env, const char* fallback_addr_var) {
  std::optional<std::string> addr = env("MASTER_ADDR");
  const char* addr_name = "MASTER_ADDR";
  if (!addr && fallback_addr_var) {
    addr = env(fallback_addr_var);
    addr_name = fallback_addr_var;
  }
  const std::optional<std::string> port = env("MASTER_PORT");
  if (info.world_size == 1) {
    // One process hosts the store itself; the address only matters if someone set it.
    if (addr && !addr->empty()) info.master_addr = *addr;
    info.master_port = port ? parseInt("MASTER_PORT", *port, 0, 65535) : 0;
    return;
  }
  if (!addr) {
    STARLING_THROW(ConfigError, "MASTER_ADDR is not set: a world of ", info.world_size,
                   " processes (", info.source, ") needs the address of rank 0's rendezvous store",
                   fallback_addr_var ? std::string(" (nor is ") + fallback_addr_var + ")" : "");
  }
  if (addr->empty()) STARLING_THROW(ConfigError, "environment variable ", addr_name, " is empty");
  if (!port) {
    STARLING_THROW(ConfigError, "MASTER_PORT is not set: a world of ", info.world_size, " processes (",
                   info.source, ") needs the port of rank 0's rendezvous store (e.g. export MASTER_PORT=29500)");
  }
  info.master_addr = *addr;
  info.master_port = parseInt("MASTER_PORT", *port, 1, 65535);
}

// Reads one launcher's family; false when none of its rank/world variables is set.
bool parseFamily(LaunchInfo& info, const EnvLookup& env, const Family& f) {
  const std::optional<std::string> rank = env(f.rank), world = env(f.world);
  if (!rank && !world) return false;
  if (!rank) STARLING_THROW(ConfigError, f.world, " is set but ", f.rank, " is not");
  if (!world) STARLING_THROW(ConfigError, f.rank, " is set but ", f.world, " is not");
  info.world_size = parseInt(f.world, *world, 1, kMaxWorld);
  info.rank = parseInt(f.rank, *rank, 0, kMaxWorld);
  if (info.rank >= info.world_size) {
    STARLING_THROW(ConfigError, f.rank, "=", info.rank, " is not below ", f.world, "=", info.world_size);
  }
  const std::optional<std::string> local = env(f.local);
  info.local_rank = local ? parseInt(f.local, *local, 0, kMaxWorld) : 0;
  if (info.local_rank >= info.world_size) {
    STARLING_THROW(ConfigError, f.local, "=", info.local_rank, " is not below ", f.world, "=",
                   info.world_size);
  }
  return true;
}

}  // namespace

LaunchInfo parseLaunchInfo(const EnvLookup& env) {
  LaunchInfo info;
  if (parseFamily(info, env, {"RANK", "WORLD_SIZE", "LOCAL_RANK"})) {
    const std::optional<std::string> spawned = env("STARLING_SPAWNED");
    info.source = spawned && *spawned == "1" ? "spawned" : "torchrun";
    fillMaster(info, env, nullptr);
    return info;
  }
  if (parseFamily(info, env, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"})) {
    info.source = "slurm";
    fillMaster(info, env, "SLURM_LAUNCH_NODE_IPADDR");
    return info;
  }
  return info;  // single
}

LaunchInfo launchInfoFromEnvironment() {
  return parseLaunchInfo([](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

std::vector<std::string> spawnEnvironment(const LaunchInfo& info) {
  return {
      "RANK=" + std::to_string(info.rank),
      "WORLD_SIZE=" + std::to_string(info.world_size),
      "LOCAL_RANK=" + std::to_string(info.local_rank),
      "MASTER_ADDR=" + info.master_addr,
      "MASTER_PORT=" + std::to_string(info.master_port),
      "STARLING_SPAWNED=1",
  };
}

namespace {

bool isLauncherVariable(std::string_view entry) {
  static constexpr std::string_view kNames[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=",
                                                "MASTER_PORT=", "STARLING_SPAWNED=", "SLURM_"};
  for (std::string_view n : kNames) {
    if (entry.substr(0, n.size()) == n) return true;
  }
  return false;
}

}  // namespace

std::vector<int> spawnLocalRanks(const std::string& program, const std::vector<std::string>& args,
                                 int world_size, int port, const std::vector<std::string>& stderr_paths) {
  if (world_size < 1) STARLING_THROW(InvalidArgument, "spawnLocalRanks: world size ", world_size, " < 1");
  if (!stderr_paths.empty() && stderr_paths.size() != static_cast<size_t>(world_size)) {
    STARLING_THROW(InvalidArgument, "spawnLocalRanks: ", stderr_paths.size(), " stderr paths for ",
                   world_size, " ranks");
  }
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e) {
    if (!isLauncherVariable(*e)) base_env.emplace_back(*e);
  }
  std::vector<std::string> argv_s{program};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<int> pids;
  for (int r = 0; r < world_size; ++r) {
    LaunchInfo info{r, world_size, r, "127.0.0.1", port, "spawned"};
    std::vector<std::string> env_s = base_env;
    for (auto& v : spawnEnvironment(info)) env_s.push_back(std::move(v));
    std::vector<char*> envp;
    for (auto& v : env_s) envp.push_back(v.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (!stderr_paths.empty()) {
      posix_spawn_file_actions_addopen(&fa, 2, stderr_paths[static_cast<size_t>(r)].c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, program.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      for (int p : pids) kill(p, SIGKILL);
      for (int p : pids) waitpid(p, nullptr, 0);
      STARLING_THROW(IoError, "spawning rank ", r, " of ", world_size, " (", program, ") failed: ",
                     std::strerror(rc));
    }
    pids.push_back(pid);
  }
  return pids;
}

std::vector<int> waitRanks(const std::vector<int>& pids, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::vector<int> status(pids.size(), 0);
  std::vector<bool> done(pids.size(), false);
  auto decode = [](int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -1; };
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int st = 0;
      const pid_t r = waitpid(pids[i], &st, WNOHANG);
      if (r == pids[i] || (r < 0 && errno == ECHILD)) {
        status[i] = r == pids[i] ? decode(st) : -1;
        done[i] = true;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() >= until) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        kill(pids[i], SIGKILL);
        int st = 0;
        waitpid(pids[i], &st, 0);
        status[i] = decode(st);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

int freeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) STARLING_THROW(IoError, "freeLoopbackPort: socket: ", std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int err = errno;
    close(fd);
    STARLING_THROW(IoError, "freeLoopbackPort: bind 127.0.0.1:0: ", std::strerror(err));
  }
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace starling::simulator
