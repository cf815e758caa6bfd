#pragma once
// A run's record, written once for every mode: what a round (synchronous) or a server step
// (FedBuff, semi-synchronous) leaves behind, and the order in which it is left.
//
//   RoundRecord   one round's or step's figures; its JSON line is the metrics file's format
//   MetricsLog    the metrics file (JSON Lines), appended and, after a resume, completed
//   RunRecorder   whether an evaluation is due (the engine runs it before closing: a fleet's
//                 federated evaluation, a server's own test set), and how every engine closes a
//                 record: its wall time (the evaluation included), the round's state made
//                 durable (the engine's checkpoint, the root's journal, the simulation's
//                 checkpoint: a callback, so that the line never runs ahead of what a restart
//                 would find), then the metrics line, the engine's own last step before progress
//                 (a buffered engine's next task), and `progress`; the line and progress on the
//                 lead worker only (the simulator's first; a root is one).
//
// RoundEngine (server/engine.h) and AsyncEngine (server/async_engine.h) each hold one.
#include <chrono>
#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace starling::server {

// The stages of a simulated round's time, as the metrics line's keys: the clients' states loaded
// (and drawn shards), their training, the rest of their turn (the update formed, compressed with
// error feedback, encoded), their updates added to the aggregate (or masked), and their states
// stored. (The workers' reduction of the aggregate is the rest of the round's wall time.)
inline constexpr const char* kStageKeys[] = {"time_load_s", "time_train_s", "time_update_s",
                                             "time_aggregate_s", "time_store_s"};
inline constexpr size_t kStages = std::size(kStageKeys);

struct RoundRecord {
  uint64_t round = 0;
  bool applied = false;
  std::string reason;  // why the round was not applied
  uint64_t clients_selected = 0, clients_completed = 0, clients_failed = 0, updates_rejected = 0;
  uint64_t uplink_bytes = 0, downlink_bytes = 0;
  std::optional<double> train_loss;
  std::map<std::string, double>
      metrics;  // the other declared metrics (weighted means), e.g. ef_gain
  std::optional<double> test_accuracy, test_loss;
  std::optional<double> sim_seconds, makespan_seconds;  // simulated fleets only
  std::vector<double> stage_seconds;  // simulated fleets only: kStageKeys, summed over the phases
  std::optional<double> dp_epsilon;   // central DP: epsilon spent after this round (all so far)
  std::optional<double> dp_clip;      // adaptive clipping: the clip this round used
  // Secure aggregation: the clients whose revealed share was wrong and decoded around (each the
  // revealer or the secret's owner, which dealt it; their updates are in the sum). In the JSON
  // line when there are some.
  std::vector<uint64_t> secagg_wrong_shares;
  uint64_t model_version = 0;
  double wall_seconds = 0.0;
  std::string json() const;  // one JSON object, no newline
};

// The run's metrics file: JSON Lines, one RoundRecord per round or server step, appended by the
// RunRecorder of either engine (and completed by the asynchronous simulation after a resume). An
// empty path: none, and every call does nothing.
class MetricsLog {
 public:
  explicit MetricsLog(std::string path = {}) : path_(std::move(path)) {}
  // One line; IoError naming the file when it cannot be appended to.
  void append(const RoundRecord& rec) const { appendLine(rec.json()); }
  // For a run resumed from a checkpoint that holds the record `json` of round (or step) `round`
  // (the asynchronous simulation's does; the round engine's and the root's do not, and a kill
  // between their checkpoint and their line loses the line):
  // a partial last line (the kill came in the middle of it) is cut, and the record is appended
  // unless the file's last line is of that round or a later one.
  void complete(uint64_t round, const std::string& json) const;
  // One line of another record (an edge aggregator's, server/aggregator.h); IoError as append.
  void appendLine(const std::string& json) const;

 private:
  std::string path_;
};

struct RecorderConfig {
  std::string metrics;      // the metrics file (JSON Lines); empty: none
  bool lead = true;         // writes the metrics line and reports progress
  uint32_t eval_every = 0;  // an evaluation is due every this many rounds or steps (0: never)
  bool eval_applied_only = false;  // and only after one that was applied
};

class RunRecorder {
 public:
  using Progress = std::function<void(const RoundRecord&)>;
  explicit RunRecorder(RecorderConfig config);

  const RecorderConfig& config() const { return config_; }
  // `progress` is called with every record closed (on the lead only) while the returned guard
  // lives: an engine's run() holds it, so a caller's callback is never kept past the call.
  class Reporting {
   public:
    explicit Reporting(RunRecorder& r) : r_(r) {}
    Reporting(const Reporting&) = delete;
    Reporting& operator=(const Reporting&) = delete;
    ~Reporting() { r_.progress_ = {}; }

   private:
    RunRecorder& r_;
  };
  [[nodiscard]] Reporting reportTo(Progress progress) {
    progress_ = std::move(progress);
    return Reporting(*this);
  }
  // A round begins now: the next record's wall time counts from here. Without a call, from the
  // last close (a buffered engine's steps follow one another) or the recorder's construction.
  void begin() { since_ = Steady::now(); }
  // Whether `rec`'s round or step is one after which the model is evaluated.
  bool evaluationDue(const RoundRecord& rec) const {
    return config_.eval_every != 0 && rec.round % config_.eval_every == 0 &&
           (rec.applied || !config_.eval_applied_only);
  }
  // Closes `rec`: its wall_seconds, then `durable` (every worker's; may be empty), then, on the
  // lead, its metrics line, then `then` (every worker's; may be empty), then, on the lead,
  // progress. What `durable` or the line throws (IoError) goes through, with the line not written
  // and progress not called.
  void close(RoundRecord& rec, const std::function<void()>& durable = {},
             const std::function<void()>& then = {});

 private:
  using Steady = std::chrono::steady_clock;
  RecorderConfig config_;
  MetricsLog log_;
  Progress progress_;
  Steady::time_point since_;
};

}  // namespace starling::server
