#include "simulator/launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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
  const char* local_world;
  // torchrun's LOCAL_WORLD_SIZE is always one number (anything else is an error); srun's per-node
  // list may have other forms, which leave the count unknown.
  bool local_world_may_be_list;
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
    STARLING_THROW(ConfigError, "MASTER_PORT is not set: a world of ", info.world_size,
                   " processes (", info.source,
                   ") needs the port of rank 0's rendezvous store (e.g. export MASTER_PORT=29500)");
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
    STARLING_THROW(ConfigError, f.rank, "=", info.rank, " is not below ", f.world, "=",
                   info.world_size);
  }
  const std::optional<std::string> local = env(f.local);
  info.local_rank = local ? parseInt(f.local, *local, 0, kMaxWorld) : 0;
  if (info.local_rank >= info.world_size) {
    STARLING_THROW(ConfigError, f.local, "=", info.local_rank, " is not below ", f.world, "=",
                   info.world_size);
  }
  info.local_world_size = 0;  // not said
  if (const std::optional<std::string> lw = env(f.local_world)) {
    // srun writes "2(x3)" for 2 tasks on each of 3 nodes and "2,1" for uneven ones: only a plain
    // number says how many share this node.
    const bool plain = !lw->empty() && lw->find_first_not_of("0123456789") == std::string::npos;
    if (plain || !f.local_world_may_be_list) {
      info.local_world_size = parseInt(f.local_world, *lw, 1, kMaxWorld);
      if (info.local_rank >= info.local_world_size)
        STARLING_THROW(ConfigError, f.local, "=", info.local_rank, " is not below ", f.local_world,
                       "=", info.local_world_size);
    }
  }
  return true;
}

}  // namespace

LaunchInfo parseLaunchInfo(const EnvLookup& env) {
  LaunchInfo info;
  if (parseFamily(info, env, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", false})) {
    const std::optional<std::string> spawned = env("STARLING_SPAWNED");
    info.source = spawned && *spawned == "1" ? "spawned" : "torchrun";
    fillMaster(info, env, nullptr);
    return info;
  }
  if (parseFamily(
          info, env,
          {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", true})) {
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
      "LOCAL_WORLD_SIZE=" + std::to_string(info.local_world_size),
      "MASTER_ADDR=" + info.master_addr,
      "MASTER_PORT=" + std::to_string(info.master_port),
      "STARLING_SPAWNED=1",
  };
}

namespace {

bool isLauncherVariable(std::string_view entry) {
  static constexpr std::string_view kNames[] = {
      "RANK=",        "WORLD_SIZE=",  "LOCAL_RANK=",       "LOCAL_WORLD_SIZE=",
      "MASTER_ADDR=", "MASTER_PORT=", "STARLING_SPAWNED=", "SLURM_"};
  for (std::string_view n : kNames) {
    if (entry.substr(0, n.size()) == n) return true;
  }
  return false;
}

}  // namespace

std::vector<int> spawnLocalRanks(const std::string& program, const std::vector<std::string>& args,
                                 int world_size, int port, const SpawnOptions& o) {
  if (world_size < 1)
    STARLING_THROW(InvalidArgument, "spawnLocalRanks: world size ", world_size, " < 1");
  if (o.first_rank < 0 || o.first_rank > world_size)
    STARLING_THROW(InvalidArgument, "spawnLocalRanks: first rank ", o.first_rank, " outside [0, ",
                   world_size, "]");
  const auto started = static_cast<size_t>(world_size - o.first_rank);
  if (o.die_with_parent && gettid() != getpid())
    STARLING_THROW(InvalidArgument,
                   "spawnLocalRanks: die_with_parent from a thread other than the main one (the "
                   "children would be killed when that thread ends)");
  if (!o.stderr_paths.empty() && o.stderr_paths.size() != started) {
    STARLING_THROW(InvalidArgument, "spawnLocalRanks: ", o.stderr_paths.size(),
                   " stderr paths for ", started, " ranks");
  }
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e) {
    if (!isLauncherVariable(*e)) base_env.emplace_back(*e);
  }
  std::vector<std::string> argv_s{o.argv0.empty() ? program : o.argv0};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t parent = getpid();
  std::vector<int> pids;
  const auto fail = [&](int r, int err) {
    for (int p : pids) kill(p, SIGKILL);
    for (int p : pids) waitpid(p, nullptr, 0);
    STARLING_THROW(IoError, "spawning rank ", r, " of ", world_size, " (", program,
                   ") failed: ", std::strerror(err));
  };
  for (int r = o.first_rank; r < world_size; ++r) {
    // Everything the child needs is built before fork: between fork and exec it only makes
    // async-signal-safe calls (the parent may have threads).
    std::vector<std::string> env_s = base_env;
    for (auto& v :
         spawnEnvironment(LaunchInfo{r, world_size, r, world_size, "127.0.0.1", port, "spawned"}))
      env_s.push_back(std::move(v));
    std::vector<char*> envp;
    for (auto& v : env_s) envp.push_back(v.data());
    envp.push_back(nullptr);
    const char* err_path = o.stderr_paths.empty()
                               ? nullptr
                               : o.stderr_paths[static_cast<size_t>(r - o.first_rank)].c_str();
    // The child reports a failed exec through this pipe (closed on a successful exec).
    int report[2];
    if (pipe2(report, O_CLOEXEC) != 0) fail(r, errno);
    // _Fork: no atfork handlers in the child (LibTorch's, CUDA's), which only execs.
    const pid_t pid = _Fork();
    if (pid < 0) {
      const int err = errno;
      close(report[0]);
      close(report[1]);
      fail(r, err);
    }
    if (pid == 0) {
      close(report[0]);
      if (o.die_with_parent) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);  // the parent died before the line above
      }
      if (err_path) {
        const int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 2) < 0) {
          const int err = errno;
          (void)!write(report[1], &err, sizeof err);
          _exit(127);
        }
        if (fd != 2) close(fd);
      }
      execve(program.c_str(), argv.data(), envp.data());
      const int err = errno;
      (void)!write(report[1], &err, sizeof err);
      _exit(127);
    }
    close(report[1]);
    int child_err = 0;
    ssize_t got;
    do {
      got = read(report[0], &child_err, sizeof child_err);
    } while (got < 0 && errno == EINTR);
    close(report[0]);
    if (got == static_cast<ssize_t>(sizeof child_err)) {
      waitpid(pid, nullptr, 0);
      fail(r, child_err);
    }
    pids.push_back(pid);
  }
  return pids;
}

std::vector<int> spawnLocalRanks(const std::string& program, const std::vector<std::string>& args,
                                 int world_size, int port,
                                 const std::vector<std::string>& stderr_paths) {
  return spawnLocalRanks(program, args, world_size, port, SpawnOptions{0, false, stderr_paths, {}});
}

std::vector<int> waitRanks(const std::vector<int>& pids, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  std::vector<int> status(pids.size(), 0);
  std::vector<bool> done(pids.size(), false);
  auto decode = [](int st) {
    return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -1;
  };
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

LocalWorld startLocalWorld(int workers, const std::vector<std::string>& args) {
  STARLING_CHECK_ARG(workers >= 1, "startLocalWorld: ", workers, " workers");
  LocalWorld w;
  const int port = freeLoopbackPort();
  if (workers > 1) {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    w.children =
        spawnLocalRanks("/proc/self/exe", args, workers, port,
                        SpawnOptions{.first_rank = 1,
                                     .die_with_parent = true,
                                     .stderr_paths = {},
                                     .argv0 = ec ? std::string("/proc/self/exe") : exe.string()});
  }
  w.self = LaunchInfo{0, workers, 0, workers, "127.0.0.1", port, "spawned"};
  return w;
}

std::vector<std::pair<int, int>> waitLocalWorld(const LocalWorld& world) {
  std::vector<std::pair<int, int>> failed;
  for (const int pid : world.children) {
    int st = 0;
    pid_t r = 0;
    do {
      r = waitpid(pid, &st, 0);  // blocking: a run takes as long as it takes
    } while (r < 0 && errno == EINTR);
    const int status = r != pid          ? -1
                       : WIFEXITED(st)   ? WEXITSTATUS(st)
                       : WIFSIGNALED(st) ? -WTERMSIG(st)
                                         : -1;
    if (status != 0) failed.emplace_back(pid, status);
  }
  return failed;
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
