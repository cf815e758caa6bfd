#include "client/algorithm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/finite.h"

namespace starling::client {

ClientAlgorithm::ClientAlgorithm(const compression::Compressor& compressor, Trainer& trainer,
                                 FitConfig config)
    : compressor_(compressor), trainer_(trainer), config_(config) {
  config_.check();
}

void ClientAlgorithm::setDeviceUpdate(DeviceUpdate* device) {
  STARLING_CHECK_ARG(!device || &device->trainer() == &trainer_,
                     "the round on the device trains another model replica (",
                     device ? device->trainer().spec() : "", ") than this client algorithm's (",
                     trainer_.spec(), ")");
  device_ = device;
}

bool ControlVariateState::acknowledge(uint64_t acked_round) {
  const bool commit = pending_round != 0 && pending_round == acked_round;
  if (commit) values = std::move(pending);
  pending.clear();
  pending_round = 0;
  return commit;
}

void ControlVariateState::save(ByteWriter& w) const {
  w.floats(values);
  w.u64(pending_round);
  w.floats(pending);
}

// Version 1 (before commit on acknowledgement): c_i alone.
void ControlVariateState::load(ByteReader& r, uint32_t version) {
  if (version != 1 && version != 2)
    r.fail("SCAFFOLD control variate version ", version, " is not 1 or 2");
  r.floats(values);
  pending_round = 0;
  pending.clear();
  if (version >= 2) {
    pending_round = r.u64();
    r.floats(pending);
    if ((pending_round == 0) != pending.empty())
      r.fail("SCAFFOLD control variate: a pending round without values, or values without a round");
    if (!pending.empty() && !values.empty() && pending.size() != values.size())
      r.fail("SCAFFOLD control variate: pending c_i+ of ", pending.size(), " floats, c_i of ",
             values.size());
  }
  for (const auto* v : {&values, &pending})
    for (float x : *v)
      if (!std::isfinite(x)) r.fail("SCAFFOLD control variate holds a non-finite value");
}

void controlChange(std::span<const float> server, std::span<const float> update, double steps_lr,
                   std::vector<float>& delta) {
  STARLING_CHECK_ARG(server.size() == update.size(), "SCAFFOLD: the server control variate has ",
                     server.size(), " floats, the update ", update.size());
  delta.resize(update.size());
  for (size_t i = 0; i < update.size(); ++i)
    delta[i] = static_cast<float>(-static_cast<double>(server[i]) -
                                  static_cast<double>(update[i]) / steps_lr);
}

namespace {

// c_i+ = c_i + delta (c_i: zeros when `ci` is null), checked finite; with `pending` (deployed) it
// waits for the server's acknowledgement of `round`, and c_i stays as it is.
std::unique_ptr<ControlVariateState> nextControl(const ControlVariateState* ci,
                                                 std::span<const float> delta, uint64_t client_id,
                                                 uint64_t round, bool pending) {
  auto next = std::make_unique<ControlVariateState>();
  std::vector<float>& plus = pending ? next->pending : next->values;
  plus.assign(delta.begin(), delta.end());
  for (size_t i = 0; i < plus.size(); ++i) plus[i] = (ci ? ci->values[i] : 0.0f) + plus[i];
  STARLING_CHECK_ARG(allFinite(plus), "client ", client_id,
                     ": its SCAFFOLD control variate is not finite");
  if (pending) {
    STARLING_CHECK_ARG(round != 0, "client ", client_id, ": a SCAFFOLD task of round 0");
    next->pending_round = round;
    if (ci) next->values = ci->values;
  }
  return next;
}

}  // namespace

void checkScaffoldTrainer(const Trainer& trainer) {
  if (trainer.momentum() != 0.0)
    STARLING_THROW(ConfigError, "train.scaffold needs plain local SGD, and model.spec = '",
                   trainer.spec(), "' uses momentum ", trainer.momentum(), " (set momentum=0)");
}

FitConfig fitConfig(const protocol::FitSettings& f, const std::atomic<bool>* stop) {
  FitConfig fit{.epochs = f.epochs, .batch_size = f.batch_size, .lr = f.lr};
  fit.prox_mu = f.prox_mu;
  fit.stop = stop;
  return fit;
}

PhaseResult ClientAlgorithm::takeTurn(const TurnRequest& task, uint64_t client_id,
                                      const DataView& data, ClientState& state) {
  PhaseResult res =
      runPhase(task.broadcast, client_id, task.model, data, state, task.control, task.control_ack);
  res.update.control = std::move(res.control_delta);
  res.control_delta.clear();
  std::erase_if(res.update.metrics, [&](const Metric& m) {
    return std::find(task.metrics.begin(), task.metrics.end(), m.name) == task.metrics.end();
  });
  res.update.header.nonce = task.nonce;
  return res;
}

PhaseResult ClientAlgorithm::runPhase(const compression::PhaseBroadcast& b, uint64_t client_id,
                                      std::span<const float> global, const DataView& data,
                                      ClientState& state, std::span<const float> server_control,
                                      std::optional<uint64_t> control_ack) {
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
  STARLING_CHECK_ARG(global.size() == layout.numel(), "client ", client_id, ": global model has ",
                     global.size(), " floats, the model needs ", layout.numel());
  FitConfig cfg = config_;
  const bool scaffold = !server_control.empty();
  // The client checks too: its model spec is its own (the layout fingerprint omits momentum).
  if (scaffold) checkScaffoldTrainer(trainer_);
  const ControlVariateState* ci = nullptr;
  // Deployed: the pending c_i+ of an earlier round, resolved against the server's acknowledgement
  // (a copy, committed to `state` with this round's result, so a throw leaves `state` as it was).
  std::unique_ptr<ControlVariateState> resolved;
  if (scaffold) {
    STARLING_CHECK_ARG(server_control.size() == layout.numel(), "client ", client_id,
                       ": the server control variate has ", server_control.size(),
                       " floats, the model needs ", layout.numel());
    ci = state.find<ControlVariateState>(kControlVariate);
    if (ci && control_ack) {
      resolved = std::make_unique<ControlVariateState>(*ci);
      const uint64_t pending = resolved->pending_round;
      if (!resolved->acknowledge(*control_ack)) out.control_dropped = pending;
      ci = resolved.get();
    }
    if (ci && !ci->values.empty() && ci->values.size() != layout.numel())
      STARLING_THROW(InvalidArgument, "client ", client_id, ": its SCAFFOLD control variate has ",
                     ci->values.size(), " floats, the model needs ", layout.numel());
    if (ci && ci->values.empty()) ci = nullptr;  // nothing committed yet: zeros
    correction_.resize(layout.numel());
    for (size_t i = 0; i < correction_.size(); ++i)
      correction_[i] = server_control[i] - (ci ? ci->values[i] : 0.0f);
    cfg.correction = correction_;
  }
  // Step-ahead error feedback (ef_preview = a): training starts from global + a residual, and the
  // update is the displacement from that start; compressWithFeedback then adds the residual.
  const compression::ErrorFeedback& ef = compressor_.feedback();
  const compression::ResidualState* preview =
      ef.preview > 0 ? compressor_.liveResidual(state, b.round) : nullptr;
  if (preview && preview->values.size() != layout.numel())
    preview = nullptr;  // compressWithFeedback refuses it
  std::span<const float> start = global;
  if (preview) {
    const auto alpha = static_cast<float>(ef.preview);
    start_.resize(layout.numel());
    for (size_t i = 0; i < start_.size(); ++i) start_[i] = global[i] + alpha * preview->values[i];
    start = start_;
  }
  // FedProx's anchor is the start point: with step-ahead EF, a pull toward the global model would
  // wear the residual away, and error feedback would no longer lose nothing.
  if (cfg.prox_mu > 0) cfg.prox_anchor = start;
  RngStream rng(StreamKey{b.run_seed, b.round, client_id, StreamPurpose::kTraining, 0});
  compression::FeedbackStats stats;
  compression::FeedbackStats* want_stats = compressor_.usesErrorFeedback() ? &stats : nullptr;
  // SCAFFOLD: c_i+ - c_i = -c + (start - trained) / (K lr) = -c - update / (K lr), the
  // displacement of the K steps from the global model or the step-ahead start; c_i+ is staged
  // before the compressor changes the state, and committed with it.
  std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>> staged;
  const double steps_lr = static_cast<double>(cfg.steps(data.size())) * cfg.lr;
  const auto stageControl = [&] {
    staged.emplace_back(kControlVariate, nextControl(ci, out.control_delta, client_id, b.round,
                                                     control_ack.has_value()));
  };
  const auto fit_start = std::chrono::steady_clock::now();
  const auto fitDone = [&] {
    fit_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - fit_start).count();
  };
  if (device_ && device_->serves(compressor_)) {
    const ControlChange change{server_control, steps_lr, &out.control_delta, stageControl};
    out.update.tensors = device_->fitAndCompress(compressor_, start, data, cfg, rng, out.fit, state,
                                                 ctx, want_stats, scaffold ? &change : nullptr);
    fitDone();  // the update's forming and compression on the device with it
    STARLING_ENFORCE(staged.size() == (scaffold ? 1u : 0u),
                     "the round on the device staged SCAFFOLD's c_i+ ", staged.size(),
                     " times, not once");
  } else {
    params_.assign(start.begin(), start.end());
    out.fit = trainer_.fit(params_, data, cfg, rng);
    fitDone();
    for (size_t i = 0; i < params_.size(); ++i) params_[i] -= start[i];  // the update
    if (scaffold) {
      controlChange(server_control, params_, steps_lr, out.control_delta);
      stageControl();
    }
    out.update.tensors =
        compressor_.compressWithFeedback(layout, params_, state, ctx, &workspace_, want_stats);
  }
  if (!staged.empty()) state.commit(staged);
  finish(out, stats);
  return out;
}

void ClientAlgorithm::finish(PhaseResult& out, const compression::FeedbackStats& stats) const {
  out.update.metrics = out.fit.metrics;
  if (compressor_.usesErrorFeedback() && compressor_.phases() == 1) {
    // The diagnostics of docs/compression.md, averaged by the server when declared.
    // Capped well inside the server's metric bound (bounds.max_metric_abs), so that a diagnostic
    // can never get an update refused: a client whose displacement is tiny but whose residual is
    // not.
    constexpr double kCap = 1e6;
    if (stats.local_on_sent > 0)
      out.update.metrics.push_back({"ef_gain", std::min(stats.gain(), kCap)});
    if (stats.local_norm > 0)
      out.update.metrics.push_back(
          {"ef_residual_ratio", std::min(stats.residual_norm / stats.local_norm, kCap)});
    out.update.metrics.push_back(
        {"ef_residual_age", std::min(static_cast<double>(stats.residual_age), kCap)});
  }
  out.update.header.num_examples = out.fit.num_examples;
}

}  // namespace starling::client
