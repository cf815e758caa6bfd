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
#include <span>
#include <vector>

#include "client/trainer.h"
#include "compression/compressor.h"
#include "core/client_state.h"

namespace starling::client {

struct PhaseResult {
  compression::Update update;  // what the client sends
  FitResult fit;               // phase 0 only: examples and training metrics
  // SCAFFOLD only (phase 0 with a server control variate): the change of this client's control
  // variate, c_i+ - c_i, numel floats; what the server averages into its own (sent dense).
  std::vector<float> control_delta;
};

// SCAFFOLD's client control variate c_i (Karimireddy et al., "SCAFFOLD: Stochastic Controlled
// Averaging for Federated Learning", ICML 2020), kept in the ClientState under kControlVariate.
class ControlVariateState final : public StateComponent {
 public:
  std::vector<float> values;
  uint32_t version() const override { return 1; }
  void save(ByteWriter& w) const override { w.floats(values); }
  void load(ByteReader& r, uint32_t version) override;
  size_t memoryBytes() const override { return values.capacity() * sizeof(float); }
};
inline constexpr const char* kControlVariate = "scaffold.control";

// SCAFFOLD's c_i+ = c_i - c + (x - y) / (K lr) takes the K local steps to be plain SGD steps of
// lr: with momentum it would overestimate c_i by up to 1 / (1 - momentum). ConfigError naming the
// spec when `trainer` uses momentum; the simulator and the server check their model with it.
void checkScaffoldTrainer(const Trainer& trainer);

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
  // stored in `state`; result.control_delta = c_i+ - c_i. With c = c_i = 0 the training is FedAvg's.
  PhaseResult runPhase(const compression::PhaseBroadcast& b, uint64_t client_id, std::span<const float> global,
                       const DataView& data, ClientState& state, std::span<const float> server_control = {});

  const FitConfig& config() const { return config_; }

 private:
  const compression::Compressor& compressor_;
  Trainer& trainer_;
  FitConfig config_;
  std::vector<float> params_, correction_, start_;
  compression::Workspace workspace_;
};

}  // namespace starling::client
