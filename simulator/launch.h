#pragma once
// Where this simulator process sits among its peers: rank, world size, local rank and the address
// of the rendezvous store (a c10d TCPStore that rank 0 hosts), read from the environment the way
// existing launchers set it, so that torchrun or srun can start `starling-sim` on several machines
// and `starling-sim --workers W` can start W processes on this one.
//
// Precedence (the first that applies wins):
//   1. torchrun: RANK and WORLD_SIZE (both, or neither), LOCAL_RANK (default 0), LOCAL_WORLD_SIZE
//      (optional), MASTER_ADDR and MASTER_PORT (required when WORLD_SIZE > 1). torchrun inside a
//      SLURM allocation
//      (`srun torchrun ...`) sets both families; RANK is then the global rank and SLURM_PROCID is
//      the node's task, so torchrun's variables win. With STARLING_SPAWNED=1 as well (what
//      spawnEnvironment() adds) the source is "spawned" instead of "torchrun".
//   2. srun: SLURM_PROCID and SLURM_NTASKS (both, or neither), SLURM_LOCALID (default 0),
//      SLURM_STEP_TASKS_PER_NODE (optional; the step's, which srun sets, rather than the job's
//      SLURM_NTASKS_PER_NODE that a smaller srun inherits; a value such as "2(x3)" counts as not
//      given).
//      MASTER_PORT is required when SLURM_NTASKS > 1 (srun sets no port); MASTER_ADDR defaults to
//      SLURM_LAUNCH_NODE_IPADDR, the node srun was started from, which is where rank 0 runs when
//      srun is started from the first node of the allocation (an sbatch script is) with the default
//      block distribution; otherwise export MASTER_ADDR to rank 0's node.
//   3. neither: a single process, rank 0 of 1 ("single").
//
// Every inconsistent value is a ConfigError naming the variable and the value: a non-numeric or
// out-of-range number, RANK >= WORLD_SIZE, a missing partner variable, a missing master address or
// port for a world of several processes.
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace starling::simulator {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Processes on this machine: torchrun's LOCAL_WORLD_SIZE, srun's SLURM_STEP_TASKS_PER_NODE (when
  // it is one number), 1 for a single process; 0 when the launcher does not say. GPU placement
  // (torch_trainer/device.h) checks with it that sim.workers_per_gpu divides the node's workers.
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            // 0 for a single process, which hosts no store
  std::string source = "single";  // "torchrun", "slurm", "spawned", "single"
};

// Looks a variable up; nullopt when it is not set. An empty value counts as set (and is invalid
// for every numeric variable).
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

// Parses the variables above through `env`. Throws ConfigError (see the header comment).
LaunchInfo parseLaunchInfo(const EnvLookup& env);
// The same from this process's environment (::getenv).
LaunchInfo launchInfoFromEnvironment();

// "NAME=value" entries that make parseLaunchInfo() return `info` with source "spawned" in a child
// process: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
// STARLING_SPAWNED=1. A spawner
// appends them to the child's environment (after removing any SLURM_* or torchrun variables it
// inherited, which these override anyway by precedence).
std::vector<std::string> spawnEnvironment(const LaunchInfo& info);

// `starling-sim --workers W` on one machine (and the tests and benchmarks of the collectives):
// starts copies of `program` with `args` (argv[0] is `program`), rank r with this process's
// environment minus every launcher variable (torchrun's, SLURM_*, STARLING_SPAWNED) plus
// spawnEnvironment({r, W, r, W, "127.0.0.1", port, "spawned"}).
struct SpawnOptions {
  int first_rank = 0;  // ranks first_rank..W-1 are started (1: the caller is rank 0 itself)
  // The children get SIGKILL when the spawning process dies (PR_SET_PDEATHSIG), so a crashed or
  // killed rank 0 leaves no worker behind. The kernel ties it to the thread that forks: only the
  // main thread may ask for it (InvalidArgument otherwise).
  bool die_with_parent = false;
  std::vector<std::string> stderr_paths;  // empty, or one per started rank: its stderr goes there
  std::string argv0;                      // the children's argv[0] (empty: `program`)
};
// Returns the children's process ids, in rank order. IoError if a start fails (the ranks already
// started are killed and reaped first); InvalidArgument for a bad world size, first rank or number
// of stderr paths.
std::vector<int> spawnLocalRanks(const std::string& program, const std::vector<std::string>& args,
                                 int world_size, int port, const SpawnOptions& options);
// Every rank, 0 to W-1, with rank r's stderr into stderr_paths[r] when given.
std::vector<int> spawnLocalRanks(const std::string& program, const std::vector<std::string>& args,
                                 int world_size, int port,
                                 const std::vector<std::string>& stderr_paths = {});

// Waits for the processes until `deadline` from now; those still running then are killed with
// SIGKILL (by their pid) and reaped. Returns, per process, its exit status, or -signal if a signal
// ended it (-9 for the ones killed here).
std::vector<int> waitRanks(const std::vector<int>& pids, std::chrono::milliseconds deadline);

// `starling-sim --sim.workers W` without a launcher: this process becomes rank 0 of W on this
// machine and starts ranks 1..W-1 as copies of itself (/proc/self/exe, the very binary even if its
// file was replaced since, with `args` and argv[0] the executable's path, so that ps shows its
// name) that die with it, rendezvousing on a free loopback port. From the main thread only.
struct LocalWorld {
  LaunchInfo self;            // rank 0 of W, source "spawned"
  std::vector<int> children;  // ranks 1..W-1
};
LocalWorld startLocalWorld(int workers, const std::vector<std::string>& args);
// Waits for every child of a LocalWorld to end; returns those that failed (a non-zero exit or a
// signal), with their statuses as waitRanks reports them (-signal for a signal).
std::vector<std::pair<int, int>> waitLocalWorld(const LocalWorld& world);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0 and released): for a local
// rendezvous. A race with another process taking it is possible, and then the rendezvous fails.
int freeLoopbackPort();

}  // namespace starling::simulator
