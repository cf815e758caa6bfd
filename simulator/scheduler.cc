#include "simulator/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace starling::simulator {

SchedulePolicy parseSchedulePolicy(std::string_view s) {
  if (s == "lpt") return SchedulePolicy::kLpt;
  if (s == "lpt_measured") return SchedulePolicy::kLptMeasured;
  if (s == "round_robin") return SchedulePolicy::kRoundRobin;
  STARLING_THROW(ConfigError, "schedule must be lpt, lpt_measured or round_robin, got '", s, "'");
}

const char* schedulePolicyName(SchedulePolicy p) {
  switch (p) {
    case SchedulePolicy::kLpt:
      return "lpt";
    case SchedulePolicy::kLptMeasured:
      return "lpt_measured";
    case SchedulePolicy::kRoundRobin:
      return "round_robin";
  }
  return "?";
}

CostModel::CostModel(int workers, double prior, double smoothing)
    : spe_(static_cast<size_t>(std::max(workers, 0)), prior),
      measured_(static_cast<size_t>(std::max(workers, 0)), false),
      smoothing_(smoothing) {
  STARLING_CHECK_ARG(workers >= 1, "a cost model needs at least one worker, got ", workers);
  STARLING_CHECK_ARG(prior > 0 && std::isfinite(prior),
                     "prior seconds per example must be positive, got ", prior);
  STARLING_CHECK_ARG(smoothing > 0 && smoothing <= 1, "smoothing must be in (0, 1], got ",
                     smoothing);
}

double CostModel::estimate(int worker, uint64_t examples, uint32_t epochs) const {
  return secondsPerExample(worker) * static_cast<double>(examples) * static_cast<double>(epochs);
}

void CostModel::observe(int worker, uint64_t examples, uint32_t epochs, double seconds) {
  const auto w = static_cast<size_t>(worker);
  STARLING_CHECK_ARG(w < spe_.size(), "worker ", worker, " out of range");
  if (examples == 0 || epochs == 0 || !(seconds > 0) || !std::isfinite(seconds)) return;
  const double spe = seconds / (static_cast<double>(examples) * static_cast<double>(epochs));
  spe_[w] = measured_[w] ? (1 - smoothing_) * spe_[w] + smoothing_ * spe : spe;
  measured_[w] = true;
}

Assignment schedule(std::span<const ClientJob> jobs, const CostModel& cost, uint32_t epochs,
                    SchedulePolicy policy) {
  const int w = cost.workers();
  Assignment a;
  a.per_worker.assign(static_cast<size_t>(w), {});
  a.predicted_seconds.assign(static_cast<size_t>(w), 0.0);
  if (policy == SchedulePolicy::kRoundRobin) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      const int k = static_cast<int>(i % static_cast<size_t>(w));
      a.per_worker[static_cast<size_t>(k)].push_back(jobs[i].client_id);
      a.predicted_seconds[static_cast<size_t>(k)] += cost.estimate(k, jobs[i].examples, epochs);
    }
  } else {
    std::vector<size_t> order(jobs.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      if (jobs[x].examples != jobs[y].examples) return jobs[x].examples > jobs[y].examples;
      return jobs[x].client_id < jobs[y].client_id;
    });
    // lpt weighs the workers alike, by a cost model of one second an example that has measured
    // nothing: every load is a whole number of examples x epochs, exact in a double, so no
    // measured speed and no rounding can tip a choice; lpt_measured by the fitted speeds.
    const CostModel equal(w, 1.0);
    const CostModel& by = policy == SchedulePolicy::kLpt ? equal : cost;
    for (size_t i : order) {
      int best = 0;
      double best_finish = 0.0;
      for (int k = 0; k < w; ++k) {
        const double finish =
            a.predicted_seconds[static_cast<size_t>(k)] + by.estimate(k, jobs[i].examples, epochs);
        if (k == 0 || finish < best_finish) {
          best = k;
          best_finish = finish;
        }
      }
      a.per_worker[static_cast<size_t>(best)].push_back(jobs[i].client_id);
      a.predicted_seconds[static_cast<size_t>(best)] = best_finish;
    }
    if (policy == SchedulePolicy::kLpt) {  // seconds at the workers' mean measured speed
      double spe = 0.0;
      for (int k = 0; k < w; ++k) spe += cost.secondsPerExample(k) / static_cast<double>(w);
      for (double& s : a.predicted_seconds) s *= spe;
    }
  }
  a.predicted_makespan = *std::max_element(a.predicted_seconds.begin(), a.predicted_seconds.end());
  return a;
}

}  // namespace starling::simulator
