#include "client/algorithm.h"

#include "core/error.h"

namespace starling::client {

ClientAlgorithm::ClientAlgorithm(const compression::Compressor& compressor, Trainer& trainer, FitConfig config)
    : compressor_(compressor), trainer_(trainer), config_(config) {
  config_.check();
}

PhaseResult ClientAlgorithm::runPhase(const compression::PhaseBroadcast& b, uint64_t client_id,
                                      std::span<const float> global, const DataView& data, ClientState& state) {
  const ParamLayout& layout = trainer_.layout();
  PhaseResult out;
  auto& h = out.update.header;
  h.layout_fingerprint = layout.fingerprint();
  h.round = b.round;
  h.phase = b.phase;
  h.client_id = client_id;
  h.num_examples = data.size();
  const compression::RoundContext ctx = b.context(client_id);
  if (b.phase > 0) {
    out.update.tensors = compressor_.compressWithFeedback(layout, {}, state, ctx, &workspace_);
    return out;
  }
  STARLING_CHECK_ARG(global.size() == layout.numel(), "client ", client_id, ": global model has ", global.size(),
                     " floats, the model needs ", layout.numel());
  params_.assign(global.begin(), global.end());
  RngStream rng(StreamKey{b.run_seed, b.round, client_id, StreamPurpose::kTraining, 0});
  out.fit = trainer_.fit(params_, data, config_, rng);
  for (size_t i = 0; i < params_.size(); ++i) params_[i] -= global[i];  // the update: trained - global
  out.update.tensors = compressor_.compressWithFeedback(layout, params_, state, ctx, &workspace_);
  out.update.metrics = out.fit.metrics;
  h.num_examples = out.fit.num_examples;
  return out;
}

}  // namespace starling::client
