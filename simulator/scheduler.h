#pragma once
// Heterogeneity-aware scheduling of a round's sampled clients onto the simulator's workers.
//
// A worker trains its clients one after another, so a round's wall time is the largest worker's
// load (the makespan). The clients are assigned longest job first, each to the worker that would
// finish it earliest (LPT: within 4/3 of the optimal makespan for identical workers):
//   lpt           a job's cost is its examples x epochs, the workers taken as equally fast; the
//                 assignment is a function of the round's clients alone, so a rerun of a seed adds
//                 the same updates in the same order on each worker and gives the same bits
//                 (the default);
//   lpt_measured  the cost is examples x epochs x the seconds per example of the worker, fitted
//                 online from what the worker actually took (CostModel; LPT on uniform machines,
//                 for workers of unlike speeds): measured times change with what else the machine
//                 runs, so the assignment, and with it the order of the float sums, can differ
//                 from one run of a seed to the next (the results then agree to the last bits only
//                 while no assignment differs);
//   round_robin   the listed order dealt to the workers in turn, for comparison.
// Ties go to the lower worker index and the lower client id. Which worker trains a client never
// changes what it sends: every client's training stream is keyed by (run seed, round, client id).
// Only the order in which the workers' partial sums add up follows the assignment.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace starling::simulator {

enum class SchedulePolicy { kLpt, kLptMeasured, kRoundRobin };
SchedulePolicy parseSchedulePolicy(
    std::string_view s);  // "lpt", "lpt_measured", "round_robin"; ConfigError otherwise
const char* schedulePolicyName(SchedulePolicy p);

struct ClientJob {
  uint64_t client_id = 0;
  uint64_t examples = 0;
};

// Seconds per example per worker: a prior until the first observation, then an exponential moving
// average of what the worker measured (a worker's speed drifts with thermal state and neighbours).
class CostModel {
 public:
  // `prior` is the seconds per example assumed before a worker has measured anything (> 0);
  // `smoothing` in (0, 1] is the weight of a new observation.
  explicit CostModel(int workers, double prior = 1e-4, double smoothing = 0.3);

  int workers() const { return static_cast<int>(spe_.size()); }
  double secondsPerExample(int worker) const { return spe_.at(static_cast<size_t>(worker)); }
  double estimate(int worker, uint64_t examples, uint32_t epochs) const;
  // A worker trained `examples` x `epochs` in `seconds` (ignored when either is 0 or not finite).
  void observe(int worker, uint64_t examples, uint32_t epochs, double seconds);

 private:
  std::vector<double> spe_;
  std::vector<bool> measured_;
  double smoothing_;
};

struct Assignment {
  std::vector<std::vector<uint64_t>> per_worker;  // client ids, in the order each worker runs them
  std::vector<double> predicted_seconds;          // per worker, by the cost model
  double predicted_makespan = 0.0;
};

// Assigns every job to a worker. Jobs are trained in the listed order within a worker (LPT:
// longest first; round-robin: the order given). predicted_seconds follow `cost` under every policy
// (under lpt, at the workers' mean seconds per example); only lpt_measured assigns by them.
Assignment schedule(std::span<const ClientJob> jobs, const CostModel& cost, uint32_t epochs,
                    SchedulePolicy policy);

}  // namespace starling::simulator
