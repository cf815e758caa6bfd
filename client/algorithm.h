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
};

class ClientAlgorithm {
 public:
  // `compressor` and `trainer` must outlive this object.
  ClientAlgorithm(const compression::Compressor& compressor, Trainer& trainer, FitConfig config);

  // The client's part of phase b.phase. `global` is the model the round started from (used in
  // phase 0). `state` must be bound to the trainer's layout. On a throw, `state` is unchanged.
  PhaseResult runPhase(const compression::PhaseBroadcast& b, uint64_t client_id, std::span<const float> global,
                       const DataView& data, ClientState& state);

  const FitConfig& config() const { return config_; }

 private:
  const compression::Compressor& compressor_;
  Trainer& trainer_;
  FitConfig config_;
  std::vector<float> params_;
  compression::Workspace workspace_;
};

}  // namespace starling::client
