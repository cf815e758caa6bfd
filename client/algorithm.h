#pragma once
// The client's side of a round, written once: the simulator calls it for every simulated client
// and the deployed client runtime for its one client, so what a researcher simulates is what
// ships.
//
//   phase 0:  params = global; trainer.fit(params, data)  ->  update = params - global
//             -> compressor.compressWithFeedback(update, state, broadcast)  ->  Update
//   phase p:  compressor.compressWithFeedback({}, state, broadcast)  ->  Update  (PowerSGD's Q)
//
// The training stream is (run seed, round, client id, kTraining), so a client's result never
// depends on which worker or thread ran it. The object keeps scratch buffers (a parameter copy,
// the compressor's workspace) and no per-client state: one ClientAlgorithm serves many clients
// one after another. Not thread-safe.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "client/trainer.h"
#include "compression/compressor.h"
#include "core/client_state.h"
#include "protocol/control.h"

namespace starling::client {

struct PhaseResult {
  compression::Update update;  // what the client sends
  FitResult fit;               // phase 0 only: examples and training metrics
  // SCAFFOLD only (phase 0 with a server control variate): the change of this client's control
  // variate, c_i+ - c_i, numel floats; what the server averages into its own (sent dense).
  std::vector<float> control_delta;
  // SCAFFOLD deployed: the round of a pending c_i+ the acknowledgement dropped (the server did not
  // count it), 0 for none; for the client's log.
  uint64_t control_dropped = 0;
};

// SCAFFOLD's client control variate c_i (Karimireddy et al., "SCAFFOLD: Stochastic Controlled
// Averaging for Federated Learning", ICML 2020), kept in the ClientState under kControlVariate.
//
// Commit on acknowledgement (deployment): c_i+ of round r is kept in `pending` until a later task
// says the server counted round r's change (TaskMsg::control_ack == r); any other acknowledgement
// drops it. So c stays the mean of the c_i when an update is refused (late, over a bound) or lost
// with a root that stopped mid-round. The simulator, whose every trained client is counted,
// commits at once.
class ControlVariateState final : public StateComponent {
 public:
  std::vector<float> values;   // c_i (empty: zeros)
  uint64_t pending_round = 0;  // 0: nothing pending
  std::vector<float> pending;  // c_i+ of pending_round, awaiting the server's acknowledgement

  // Resolves the pending c_i+ against the server's acknowledgement: commits it when the server
  // counted its round, drops it otherwise. Returns whether it committed.
  bool acknowledge(uint64_t acked_round);

  uint32_t version() const override { return 2; }
  void save(ByteWriter& w) const override;
  void load(ByteReader& r, uint32_t version) override;
  size_t memoryBytes() const override {
    return (values.capacity() + pending.capacity()) * sizeof(float);
  }
};
inline constexpr const char* kControlVariate = "scaffold.control";

// SCAFFOLD's c_i+ = c_i - c + (x - y) / (K lr) takes the K local steps to be plain SGD steps of
// lr: with momentum it would overestimate c_i by up to 1 / (1 - momentum). ConfigError naming the
// spec when `trainer` uses momentum; the simulator and the server check their model with it.
void checkScaffoldTrainer(const Trainer& trainer);

// SCAFFOLD's change of a client's control variate from its update u = trained - start, after K
// local steps of learning rate lr:
//   delta_i = float(-double(c_i) - double(u_i) / (K lr))   (c: the server's control variate),
// each operation in double and then rounded once to float. A division, not a multiplication by
// 1 / (K lr): no compiler contracts it into a fused multiply-add, and a device that divides by a
// tensor on the device (not a host scalar, which LibTorch's CUDA kernel turns into a product by
// the reciprocal) rounds as the host does; so the host (controlChange) and the device
// (DeviceUpdate) form the same bits.
void controlChange(std::span<const float> server, std::span<const float> update, double steps_lr,
                   std::vector<float>& delta);

// A SCAFFOLD round's part in DeviceUpdate::fitAndCompress: the training is corrected by the
// FitConfig's correction (c - c_i), then the device forms `delta` as controlChange does and calls
// `stage` once, before the compressor changes the state; `stage` checks and stages c_i+ on the
// host and may throw (the state is then unchanged). c_i+ is committed after the call returns.
struct ControlChange {
  std::span<const float> server;        // c, numel floats
  double steps_lr = 0;                  // K lr
  std::vector<float>* delta = nullptr;  // out: numel floats
  std::function<void()> stage;
};

// Optional: a client's phase-0 training, update and compression where the trainer trains (a GPU),
// so that only the payload, the kept residual and SCAFFOLD's control change cross to the host.
// torch_trainer/device_round.h implements it for the LibTorch trainer.
class DeviceUpdate {
 public:
  virtual ~DeviceUpdate() = default;
  // Whether it serves `compressor` (ClientAlgorithm takes its host path for the others).
  virtual bool serves(const compression::Compressor& compressor) const = 0;
  // Trains from `start` as Trainer::fit(start, data, cfg, rng) would, then compresses the update
  // (trained - start) as compressor.compressWithFeedback(layout, update, state, ctx, ...) would:
  // the same payloads, the same residual kept in `state`, `stats` (when given) to double rounding.
  // With `control` (a SCAFFOLD round), the control change too, between the fit and the
  // compression. Throws as those; on a throw `state` is unchanged.
  virtual std::vector<compression::Payload> fitAndCompress(
      const compression::Compressor& compressor, std::span<const float> start, const DataView& data,
      const FitConfig& cfg, RngStream& rng, FitResult& fit, ClientState& state,
      const compression::RoundContext& ctx, compression::FeedbackStats* stats,
      const ControlChange* control) = 0;
  // The trainer it trains with: a ClientAlgorithm takes it only for its own trainer.
  virtual const Trainer& trainer() const = 0;
  // Updates it formed and compressed so far.
  virtual uint64_t updates() const = 0;
};

// The FitConfig of a task's fit settings, every driver's one conversion; `stop`: a deployed
// client's SIGTERM (FitConfig::stop).
FitConfig fitConfig(const protocol::FitSettings& f, const std::atomic<bool>* stop = nullptr);

// What a task asks of one client's turn, however it reached the client: decoded from the wire
// (the client runtime) or made by a simulator.
struct TurnRequest {
  TurnRequest(compression::PhaseBroadcast b, std::span<const float> m,
              std::vector<std::string> declared, uint64_t task_nonce = 1,
              std::span<const float> server_control = {},
              std::optional<uint64_t> ack = std::nullopt)
      : broadcast(std::move(b)),
        model(m),
        metrics(std::move(declared)),
        nonce(task_nonce),
        control(server_control),
        control_ack(ack) {}
  // Held by value (a broadcast shares its factors), so a request made from temporaries is whole;
  // the spans are views: what they show must outlive the request.
  compression::PhaseBroadcast broadcast;
  std::span<const float> model;      // what the client trains from (phase 0)
  std::vector<std::string> metrics;  // the server's declared metrics: only these are sent
  uint64_t nonce = 1;  // the task's; a simulated one's 1 (a deployed nonce is never 0: 8 bytes)
  std::span<const float> control{};     // SCAFFOLD: the server's c; empty: none
  std::optional<uint64_t> control_ack;  // SCAFFOLD deployed: the task's acknowledgement
};

class ClientAlgorithm {
 public:
  // `compressor` and `trainer` must outlive this object.
  ClientAlgorithm(const compression::Compressor& compressor, Trainer& trainer, FitConfig config);

  // The client's part of phase b.phase. `global` is the model the round started from (used in
  // phase 0). Training starts from global + ef_preview x residual (step-ahead error feedback,
  // compression/compressor.h; the global model itself without it), which is also FedProx's anchor
  // when the config's prox_mu > 0. `state` must be bound to the trainer's layout. On a throw,
  // `state` is unchanged.
  //
  // SCAFFOLD (option II of the paper) when `server_control` (the server's control variate c,
  // numel floats) is given: every step's gradient is corrected by c - c_i (c_i from `state`, zeros
  // at first), and after the K = FitConfig::steps(examples) local steps of learning rate lr
  //   c_i+ = c_i - c + (global - trained) / (K lr),
  // stored in `state`; result.control_delta = c_i+ - c_i. With c = c_i = 0 the training is
  // FedAvg's. With `control_ack` (a deployed client: the task's TaskMsg::control_ack) the pending
  // c_i+ of an earlier round is first resolved against it, and this round's c_i+ is stored pending
  // under b.round instead of committed (ControlVariateState).
  PhaseResult runPhase(const compression::PhaseBroadcast& b, uint64_t client_id,
                       std::span<const float> global, const DataView& data, ClientState& state,
                       std::span<const float> server_control = {},
                       std::optional<uint64_t> control_ack = std::nullopt);

  // The client's turn, written once for every driver (the client runtime, which the Python
  // client runs too; both simulators; the demo): runPhase, then the update as a client sends it,
  // with SCAFFOLD's control change, only the declared metrics, and the task's nonce.
  PhaseResult takeTurn(const TurnRequest& task, uint64_t client_id, const DataView& data,
                       ClientState& state);

  const FitConfig& config() const { return config_; }
  // Wall seconds spent in the trainer's fit so far (with a DeviceUpdate, its fitAndCompress), the
  // rest of a turn being the update's forming and compression: a driver's breakdown of its time.
  double fitSeconds() const { return fit_seconds_; }

  // Phase 0 on the device when `device` serves the compressor (SCAFFOLD rounds too: the control
  // change is formed there): the same result as the host path.
  // Null (the default): always on the host. `device` must outlive this object. InvalidArgument
  // when it trains another trainer than this object's.
  void setDeviceUpdate(DeviceUpdate* device);

 private:
  const compression::Compressor& compressor_;
  Trainer& trainer_;
  FitConfig config_;
  std::vector<float> params_, correction_, start_;
  compression::Workspace workspace_;
  DeviceUpdate* device_ = nullptr;
  double fit_seconds_ = 0.0;

  // Phase 0's metrics (the fit's, and error feedback's diagnostics) and weight.
  void finish(PhaseResult& out, const compression::FeedbackStats& stats) const;
};

}  // namespace starling::client
