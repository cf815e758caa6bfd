#pragma once
// Split fine-tuning over ZeroMQ (docs/split.md, "Edge and cloud over the network"): the cloud
// serves the top part to many edge devices; each edge device runs its bottom part on its private
// data. The same transport, security (CURVE by default) and message checks as the deployment
// (transport/socket.h, protocol/control.h): FlatBuffers SplitHello, SplitStep and SplitReply
// messages, Reject for a refusal, Shutdown for an edge's goodbye.
//
// Session: an edge sends SplitHello (its id, the fingerprint of the cut model and both codec
// specs); the cloud refuses another model or other codecs, and under CURVE an edge id other than
// the one its key is listed under; otherwise it opens a session (a fresh id) and answers a
// SplitReply of step 0. A hello from an edge id that already has a session replaces it (the edge
// restarted; its codec state on the cloud is dropped), except a hello repeated on the same
// connection before any step, which gets the same session again. A Reject echoes the request it
// refuses (session in `nonce`, step or epoch in `round`); an edge skips refusals of earlier ones.
//
// Steps: step ids increase within a session. The cloud runs each step as it arrives (edges are
// served interleaved, one step at a time) and answers with the loss, the number correct, its
// compute time and the encoded gradient. It keeps its last reply per session: a repeated step id
// (the edge timed out and sent again) gets that reply again without a second update; a lower one
// is refused (kLate). A step the cloud refuses (SplitCloud's checks: shape, sizes, values,
// labels, a non-finite result) changes nothing on the cloud.
//
// Faults. An edge that vanishes mid-step: the cloud has applied the step to its top part (an
// honest step on real data), its reply cannot be delivered and is dropped, the edge's half of the
// step never happens; the others carry on. A session silent for `edge_timeout` is closed and its
// codec state dropped. A cloud that restarts: it reloads its top part from its checkpoint (written
// atomically every `checkpoint_every` training steps and at exit), so it loses at most that many
// steps; the edge, on its next step, times out or is told kNotRegistered, opens a new session and
// sends the step again.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/idx.h"
#include "protocol/control.h"
#include "split/roles.h"
#include "split/trainer.h"
#include "transport/socket.h"

namespace starling::split {

// What both sides compare at hello: the cut model's layouts (bottom and top, so the cut point and
// the weight-side rank), the activation size and both codec specs.
uint64_t sessionFingerprint(const SplitModel& model, const std::string& up,
                            const std::string& down);

// The cloud's checkpoint: its top part, the training steps it has served, and the session
// fingerprint (a checkpoint of another cut or codecs is refused). Written atomically.
void saveCloudCheckpoint(const std::string& path, uint64_t fingerprint, uint64_t steps,
                         std::span<const float> top);
// nullopt when the file does not exist; IoError naming the file for anything else wrong with it.
struct CloudCheckpoint {
  uint64_t steps = 0;
  std::vector<float> top;
};
std::optional<CloudCheckpoint> loadCloudCheckpoint(const std::string& path, uint64_t fingerprint,
                                                   size_t numel);

struct CloudServerConfig {
  std::string bind = "tcp://127.0.0.1:5700";
  transport::SecurityConfig security;
  transport::TransportLimits limits;
  uint64_t fingerprint = 0;  // sessionFingerprint of the cloud's model and codecs
  std::string up, down;      // the codec specs, for the refusal's message
  std::chrono::milliseconds edge_timeout{60000};  // a session silent this long is closed
  // Sessions at once; a hello beyond is refused (kBusy). Each keeps its last reply (up to the
  // largest step's gradient) to answer a repeated step, so memory grows with this.
  size_t max_sessions = 64;
  std::string checkpoint;                       // "" : none
  uint64_t checkpoint_every = 50;               // training steps between checkpoints
  uint64_t steps_done = 0;                      // from the checkpoint loaded at start
  std::function<void(const std::string&)> log;  // progress and refusals (optional)
  // SplitFed: the number of edge devices whose bottoms are averaged after each epoch (0: off). An
  // epoch's average is sent to its contributors once that many bottoms came, or `splitfed_wait`
  // after the first one (an edge that vanished is left out); a bottom arriving after its epoch's
  // average gets that average. Bottoms are checked: the bottom part's size, values within max_abs.
  uint32_t splitfed_edges = 0;
  std::chrono::milliseconds splitfed_wait{300000};
  double max_abs = 1e6;
};

struct CloudStats {
  uint64_t hellos = 0;
  uint64_t steps = 0;            // training steps applied to the top part (including steps_done)
  uint64_t evaluations = 0;      // evaluation steps
  uint64_t refused = 0;          // messages refused (a Reject was sent, or the peer was dropped)
  uint64_t duplicates = 0;       // repeated steps answered from the cache
  uint64_t replies_dropped = 0;  // replies that could not be delivered (the edge vanished)
  uint64_t timed_out = 0;        // sessions closed for silence
  uint64_t goodbyes = 0;         // sessions closed by the edge
  double compute_seconds = 0;    // in SplitCloud::step and evaluate
  uint64_t averages = 0;         // SplitFed epochs averaged
  uint64_t averages_short = 0;   // of them, averaged with fewer bottoms than splitfed_edges
};

class SplitCloudServer {
 public:
  // Binds at once (ConfigError for bad security settings, IoError when the endpoint is taken).
  SplitCloudServer(transport::Context& context, SplitCloud& cloud, CloudServerConfig config);
  ~SplitCloudServer();
  std::string endpoint() const;
  // Handles one message, waiting at most `timeout`, then closes silent sessions. Never throws: a
  // message it cannot serve (a peer's lie, or a fault of the cloud's own such as memory) gets a
  // Reject and is logged; a failed periodic checkpoint is logged and tried again later.
  void poll(std::chrono::milliseconds timeout);
  // Polls until `stop` is set or, when goodbyes > 0, that many sessions have said goodbye; then
  // writes the checkpoint.
  void serve(const std::atomic<bool>& stop, uint64_t goodbyes = 0);
  void saveCheckpoint();
  const CloudStats& stats() const { return stats_; }
  size_t sessions() const { return sessions_.size(); }

 private:
  struct Session {
    uint64_t edge_id = 0;
    uint64_t id = 0;
    uint64_t last_step = 0;
    std::vector<uint8_t> last_reply;
    std::chrono::steady_clock::time_point last_seen;
  };
  void handle(const transport::Received& r);
  void hello(const transport::Received& r);
  // The sender's session if it is `session` (refreshed); else a NotRegistered reject and null.
  // InputError (kWrongSender) when another key speaks in it.
  Session* sessionOf(const transport::Received& r, uint64_t session, uint64_t request,
                     const char* what);
  void step(const transport::Received& r);
  void refuse(const std::string& peer, int kind, Errc code, const std::string& message);
  void bottom(const transport::Received& r);
  struct FedEpoch;
  void complete(uint64_t epoch, FedEpoch& f);
  void close(std::map<std::string, Session>::iterator it);
  void note(const std::string& s) const;

  SplitCloud& cloud_;
  CloudServerConfig cfg_;
  std::unique_ptr<transport::ServerSocket> socket_;
  std::map<std::string, Session> sessions_;            // by routing id
  std::map<uint64_t, std::unique_ptr<FedEpoch>> fed_;  // SplitFed, by epoch (at most 4 kept)
  CloudStats stats_;
  uint64_t next_session_;
  uint64_t since_checkpoint_ = 0;
  // The request being served (session, step or epoch), echoed in a Reject's nonce and round.
  uint64_t cur_session_ = 0, cur_step_ = 0;
};

struct EdgeClientConfig {
  std::string cloud = "tcp://127.0.0.1:5700";
  transport::SecurityConfig security;
  transport::TransportLimits limits;
  uint64_t edge_id = 1;
  uint64_t fingerprint = 0;
  std::string up, down;
  std::chrono::milliseconds step_timeout{10000};  // per try
  uint32_t tries = 6;                             // per step (and per hello) before giving up
  // SplitFed: how long to wait for the epoch's average (the other edges finish their epochs).
  std::chrono::milliseconds splitfed_wait{600000};
  std::function<void(const std::string&)> log;
};

struct EdgeStepResult {
  double loss = 0;
  size_t correct = 0;
  uint64_t up_bytes = 0;     // the encoded activations (what the codec produced)
  uint64_t down_bytes = 0;   // the encoded gradient
  double cloud_seconds = 0;  // the cloud's compute time for the step
};

struct EdgeClientStats {
  uint64_t sessions = 0;  // hellos answered (more than one: the cloud restarted or forgot us)
  uint64_t resent = 0;    // steps sent again after a timeout or a lost session
  uint64_t wire_up = 0, wire_down = 0;  // whole messages, as ZeroMQ carried them
};

class SplitEdgeClient {
 public:
  SplitEdgeClient(transport::Context& context, SplitEdge& edge, EdgeClientConfig config);
  ~SplitEdgeClient();  // says goodbye, best effort (the socket lingers up to limits.linger_ms, 500
                       // ms if 0)
  // Opens the session. ConfigError when the cloud serves another model or codecs (its message
  // says which), IoError when it does not answer within the tries.
  void connect();
  // One training step on n examples: the bottom's forward pass, the activations up, the gradient
  // down, the bottom's SGD step (with `train_bottom` false the cloud sends no gradient and the
  // bottom stays). IoError when the cloud does not answer; InvalidArgument when it refuses the
  // step (its code and message); InputError when its gradient lies (the bottom unchanged).
  EdgeStepResult train(std::span<const float> x, std::span<const uint8_t> labels, size_t n,
                       bool train_bottom = true);
  // The whole model's loss and correct count on n examples: uncompressed activations, no update.
  EdgeStepResult evaluate(std::span<const float> x, std::span<const uint8_t> labels, size_t n);
  // SplitFed: sends the bottom part after `epoch` with its weight `examples`, waits (up to
  // splitfed_wait) for the cloud's average of the epoch and adopts it. Returns the number of edge
  // devices averaged. IoError when none comes; InputError for an average of the wrong size.
  uint32_t average(uint64_t epoch, uint64_t examples);
  void bye();
  const EdgeClientStats& stats() const { return stats_; }

 private:
  struct Answer;
  Answer exchange(int kind, std::span<const uint8_t> labels, std::vector<uint8_t> activations,
                  size_t n);
  enum class Wait { kDone, kAgain, kTimeout };
  // Sends `bytes` and waits until `deadline` for a message `accept` takes (kDone). kAgain when the
  // cloud was busy or forgot our session (then session_ is 0); `refused` throws for any other
  // Reject. Malformed messages are logged and skipped.
  // Rejects whose nonce and round are not (expect_session, expect_request) answer an earlier
  // request and are skipped.
  Wait await(std::span<const uint8_t> bytes, uint64_t expect_session, uint64_t expect_request,
             std::chrono::steady_clock::time_point deadline,
             const std::function<void(const protocol::RejectMsg&)>& refused,
             const std::function<bool(const transport::Received&)>& accept);
  void note(const std::string& s) const;

  SplitEdge& edge_;
  EdgeClientConfig cfg_;
  std::unique_ptr<transport::ClientSocket> socket_;
  uint64_t session_ = 0;
  uint64_t step_ = 0;
  bool said_bye_ = false;
  EdgeClientStats stats_;
};

// One epoch of an edge device over the network, as InProcessSplit::runEpoch does it for one edge
// (the same shuffling for `shard` and cfg.seed, the same steps, so one networked edge computes what
// the in-process mode does): every batch of train[idx] trained through the cloud, with
// cfg.splitfed the SplitFed average (SplitEdgeClient::average, weighted by idx.size()), then the
// whole model's loss and accuracy on test[test_idx] through the cloud (uncompressed activations,
// counted as eval_bytes; skipped when test_idx is empty). `progress` is called after each step with
// the steps done and the steps of the epoch.
EpochRecord runEdgeEpoch(SplitEdgeClient& client, const SplitTrainConfig& cfg, uint32_t epoch,
                         size_t shard, const data::Dataset& train, std::span<const size_t> idx,
                         const data::Dataset& test, std::span<const size_t> test_idx,
                         const std::function<void(size_t, size_t)>& progress = {});

}  // namespace starling::split
