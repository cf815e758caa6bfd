#include "torch_trainer/device_round.h"

#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "torch_trainer/device_compress.h"
#include "torch_trainer/trainer_device.h"

namespace starling::torch_trainer {
namespace {

namespace cz = starling::compression;

class DeviceRound final : public client::DeviceUpdate {
 public:
  explicit DeviceRound(client::Trainer& trainer) : trainer_(trainer) {
    STARLING_CHECK_ARG(detail::isTorchTrainer(trainer),
                       "the round on the device needs a LibTorch trainer, not ", trainer.spec());
  }

  bool serves(const cz::Compressor& c) const override { return encodesOnDevice(c); }

  std::vector<cz::Payload> fitAndCompress(const cz::Compressor& c, std::span<const float> start,
                                          const client::DataView& data,
                                          const client::FitConfig& cfg, RngStream& rng,
                                          client::FitResult& fit, ClientState& state,
                                          const cz::RoundContext& ctx, cz::FeedbackStats* stats,
                                          const client::ControlChange* control) override {
    STARLING_CHECK_ARG(serves(c), "the round on the device does not serve ", c.spec());
    const ParamLayout& layout = trainer_.layout();
    const auto n = static_cast<int64_t>(layout.numel());
    STARLING_CHECK_ARG(start.size() == layout.numel(), c.name(), ": the start model has ",
                       start.size(), " floats, the layout needs ", layout.numel());
    // In the host path's order: the fit (its checks, its divergence), then compressWithFeedback's
    // checks, the update's bound among them.
    // The start as the fit loaded it, copied on the device (not uploaded a second time).
    fit = detail::fitOnDevice(trainer_, start, data, cfg, rng, &start_);
    const torch::Tensor trained = detail::deviceValues(trainer_);
    const torch::Tensor u = trained - start_;  // the update, as the host forms it
    if (control) controlChange(*control, u);
    const cz::ResidualState* live =
        c.beginFeedback(layout, state, ctx, [&] { checkBound(c, u, "update"); });
    cz::StagedState staged;
    if (!c.keepsBuffer()) {
      torch::Tensor acc = u;
      std::vector<cz::Payload> out = encodeOnDevice(c, layout, acc, false, ctx, &state, &staged);
      std::vector<float> none;
      c.endFeedback(layout, state, ctx, none, staged);  // local PowerSGD's warm factors
      ++updates_;
      return out;
    }
    torch::Tensor r;
    if (live) r = upload(live->values, residual_);
    torch::Tensor acc = live ? r + u : u.clone();  // residual + update, in float as the host adds
    if (live) checkBound(c, acc, "residual + update");
    // Diagnostics and decay belong to a one-phase compressor's round (two-phase PowerSGD's phase
    // P keeps M for phase Q, as it is).
    const bool one_phase = c.phases() == 1;
    if (!one_phase) stats = nullptr;
    const torch::Tensor before = stats ? acc.clone() : torch::Tensor();
    std::vector<cz::Payload> out = encodeOnDevice(c, layout, acc, true, ctx, &state, &staged);
    const double decay = one_phase && c.usesErrorFeedback() ? c.feedback().decay : 1.0;
    if (stats) {
      // compressWithFeedback's diagnostics: sent = residual + update - kept (in float, before
      // decay), the local displacement update + ef_preview x residual (in double).
      const torch::Tensor sent = (before - acc).to(torch::kFloat64);
      torch::Tensor moved = u.to(torch::kFloat64);
      if (live) moved = moved + c.feedback().preview * r.to(torch::kFloat64);
      const torch::Tensor moved2 = moved.square();
      const torch::Tensor sums =
          torch::stack({moved2.sum(), sent.square().sum(), moved2.masked_select(sent != 0).sum(),
                        acc.to(torch::kFloat64).square().sum()})
              .to(torch::kCPU);
      const double* s = sums.data_ptr<double>();
      *stats = cz::FeedbackStats{std::sqrt(s[0]), std::sqrt(s[1]), std::sqrt(s[2]),
                                 decay * std::sqrt(s[3]), cz::residualAge(live, ctx.round)};
    }
    if (decay != 1.0) acc.mul_(static_cast<float>(decay));
    kept_.resize(static_cast<size_t>(n));
    torch::from_blob(kept_.data(), {n}, torch::kFloat32).copy_(acc);
    c.endFeedback(layout, state, ctx, kept_, staged);  // kept_ takes the old residual's storage
    ++updates_;
    return out;
  }

  const client::Trainer& trainer() const override { return trainer_; }
  uint64_t updates() const override { return updates_; }

 private:
  // The caller's host floats on the trainer's device, in `buf` (kept between clients).
  torch::Tensor upload(std::span<const float> v, torch::Tensor& buf) const {
    const torch::Tensor values = detail::deviceValues(trainer_);
    if (!buf.defined() || buf.numel() != static_cast<int64_t>(v.size()) ||
        buf.device() != values.device())
      buf = torch::empty({static_cast<int64_t>(v.size())}, values.options());
    buf.copy_(torch::from_blob(const_cast<float*>(v.data()), {static_cast<int64_t>(v.size())},
                               torch::kFloat32));
    return buf;
  }

  // SCAFFOLD's control change (client::controlChange's operations, each in double, rounded once;
  // the divisor a tensor on the device, so that no kernel turns the division into a product by
  // a reciprocal), brought to the host and staged there before the compressor changes the state.
  void controlChange(const client::ControlChange& control, const torch::Tensor& u) {
    const int64_t n = u.numel();
    STARLING_CHECK_ARG(control.delta && control.stage, "SCAFFOLD: no control change to fill");
    STARLING_CHECK_ARG(control.server.size() == static_cast<size_t>(n),
                       "SCAFFOLD: the server control variate has ", control.server.size(),
                       " floats, the update ", n);
    const torch::Tensor c = upload(control.server, control_);
    const torch::Tensor divisor =
        torch::full({}, control.steps_lr, u.options().dtype(torch::kFloat64));
    // In place on two double temporaries: -c, then minus u / (K lr).
    const torch::Tensor delta =
        c.to(torch::kFloat64).neg_().sub_(u.to(torch::kFloat64).div_(divisor));
    control.delta->resize(static_cast<size_t>(n));
    torch::from_blob(control.delta->data(), {n}, torch::kFloat32).copy_(delta);
    control.stage();
  }

  // compressWithFeedback's bound: every |value| finite and at most kMaxCompressMagnitude (one wait
  // for the device; the offending index only when there is one).
  static void checkBound(const cz::Compressor& c, const torch::Tensor& t, const char* what) {
    const torch::Tensor ok = t.abs() <= cz::kMaxCompressMagnitude;  // NaN compares false
    if (ok.all().item<bool>()) return;
    const int64_t i = (~ok).nonzero().flatten()[0].item<int64_t>();
    // The host's message (compression/compressor.cc), word for word.
    STARLING_THROW(InvalidArgument, c.name(), ": ", what, " value ", i, " (", t[i].item<float>(),
                   ") is not finite or exceeds ", cz::kMaxCompressMagnitude,
                   what[0] == 'r' ? " (diverged?)" : "");
  }

  client::Trainer& trainer_;
  // Device buffers for the start model, the residual and SCAFFOLD's server control variate.
  torch::Tensor start_, residual_, control_;
  std::vector<float> kept_;  // the kept residual on the host, handed to the state
  uint64_t updates_ = 0;
};

}  // namespace

std::unique_ptr<client::DeviceUpdate> makeDeviceUpdate(client::Trainer& trainer) {
  return std::make_unique<DeviceRound>(trainer);
}

}  // namespace starling::torch_trainer
