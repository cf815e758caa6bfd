#pragma once
// The round on the device (torch_trainer/device_round.h) against ClientAlgorithm's host path:
// shared by the CPU suite (device_round_test.cc) and test_torch_gpu (the same on a GPU). Both paths
// train on a trainer of the same device, so they train the same bits and must send the same
// payloads and keep the same residual, bit for bit.
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "client/algorithm.h"
#include "client/synthetic.h"
#include "compression/registry.h"
#include "torch_trainer/blobs.h"
#include "torch_trainer/device_compress_check.h"  // first: LibTorch before Catch
#include "torch_trainer/device_round.h"
#include "torch_trainer/torch_trainer.h"

namespace starling::testing {

inline const std::vector<float>* residualOf(const ClientState& s) {
  const auto* r = s.find<compression::ResidualState>(compression::kResidualComponent);
  return r ? &r->values : nullptr;
}

// n empty client states of `layout`.
inline std::vector<ClientState> freshStates(const ParamLayout& layout, size_t n) {
  std::vector<ClientState> states;
  for (size_t i = 0; i < n; ++i) states.emplace_back(layout.fingerprint());
  return states;
}

// The data set's indices in two halves: two clients' shards.
inline std::vector<std::vector<size_t>> twoShards(const data::Dataset& d) {
  const std::vector<size_t> all = allIndices(d);
  const auto half = static_cast<std::ptrdiff_t>(all.size() / 2);
  return {{all.begin(), all.begin() + half}, {all.begin() + half, all.end()}};
}

// The same metrics, in the same order: the fit's are the same training's; error feedback's
// diagnostics are summed in another order.
inline void checkMetricsEqual(const client::PhaseResult& h, const client::PhaseResult& g) {
  REQUIRE(h.update.metrics.size() == g.update.metrics.size());
  for (size_t m = 0; m < h.update.metrics.size(); ++m) {
    INFO(h.update.metrics[m].name);
    CHECK(h.update.metrics[m].name == g.update.metrics[m].name);
    CHECK(g.update.metrics[m].value ==
          Approx(h.update.metrics[m].value).epsilon(1e-9).margin(1e-12));
  }
}

inline void checkDeviceRoundMatchesHost(const torch_trainer::Device& device) {
  const data::Dataset d = blobImages(96, 28, 28, 10, 4);
  const std::vector<std::vector<size_t>> shards = twoShards(d);
  struct Case {
    const char* model;
    const char* spec;
    double prox_mu;
  };
  for (const Case& k :
       {Case{"cnn", "topk:density=0.05", 0}, Case{"cnn", "topk:density=0.02,scope=global", 0},
        Case{"cnn", "stc:density=0.05", 0}, Case{"cnn", "topk:density=0.05,ef=false", 0},
        Case{"cnn", "topk:density=0.05,ef_decay=0.9,ef_preview=0.5", 0.01},
        Case{"cnn:momentum=0.9", "stc:density=0.1,ef_max_age=1", 0},
        Case{"cnn", "randk:density=0.05", 0}, Case{"cnn", "randk:density=0.1", 0},
        Case{"cnn", "randblock:density=0.05", 0},
        Case{"cnn", "randblock:density=0.05,offset=client", 0}, Case{"cnn", "sign", 0},
        Case{"cnn", "sign:ef_preview=0,ef_decay=0.9", 0.01}, Case{"cnn", "qsgd:levels=16", 0},
        Case{"cnn", "qsgd:levels=4,ef=true", 0},
        // BatchNorm's running statistics travel in the layout after the parameters.
        Case{"resnet", "topk:density=0.05", 0}}) {
    INFO(k.model << ", " << k.spec << ", prox_mu " << k.prox_mu);
    const auto comp = compression::makeCompressor(k.spec);
    auto host_trainer = torch_trainer::makeTorchTrainer(k.model, d, device);
    auto dev_trainer = torch_trainer::makeTorchTrainer(k.model, d, device);
    client::FitConfig cfg{.epochs = 1, .batch_size = 16, .lr = 0.05};
    cfg.prox_mu = k.prox_mu;
    client::ClientAlgorithm host(*comp, *host_trainer, cfg), dev(*comp, *dev_trainer, cfg);
    const auto round_on_device = torch_trainer::makeDeviceUpdate(*dev_trainer);
    REQUIRE(round_on_device->serves(*comp));
    dev.setDeviceUpdate(round_on_device.get());
    const ParamLayout& layout = host_trainer->layout();
    std::vector<float> global(layout.numel());
    host_trainer->initParameters(global, 1);
    std::vector<ClientState> host_states = freshStates(layout, 2),
                             dev_states = freshStates(layout, 2);
    for (uint64_t round = 1; round <= 4; ++round) {
      std::vector<float> sum(layout.numel());
      for (uint64_t id = 0; id < 2; ++id) {
        if (id == 1 && round == 3)
          continue;  // client 1 skips a round: ef_max_age=1 drops its residual
        INFO("round " << round << ", client " << id);
        compression::PhaseBroadcast b;
        b.run_seed = 9;
        b.round = round;
        const client::DataView view{&d, shards[id]};
        const client::PhaseResult h = host.runPhase(b, id, global, view, host_states[id]);
        const client::PhaseResult g = dev.runPhase(b, id, global, view, dev_states[id]);
        checkPayloadsEqual(h.update.tensors, g.update.tensors);
        const auto* hr = residualOf(host_states[id]);
        const auto* gr = residualOf(dev_states[id]);
        REQUIRE((hr == nullptr) == (gr == nullptr));
        if (hr) CHECK(sameBits(*hr, *gr));
        CHECK(h.update.header.num_examples == g.update.header.num_examples);
        checkMetricsEqual(h, g);
        const std::vector<float> dense = densify(layout, h.update.tensors);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += 0.5f * dense[i];
      }
      for (size_t i = 0; i < global.size(); ++i) global[i] += sum[i];
    }
  }
}

// PowerSGD (local, and two-phase's phase P followed by phase Q on the host) and ACP-SGD (Q, then
// P, fixed) in the round on the device against the host path: payloads, kept buffers and staged
// factors bit for bit over four rounds of two clients; the global model moves between rounds.
inline void checkDeviceLowRankRoundMatchesHost(const torch_trainer::Device& device) {
  using compression::SharedFactors;
  const data::Dataset d = blobImages(64, 28, 28, 10, 5);
  const std::vector<std::vector<size_t>> shards = twoShards(d);
  for (const auto& [model, spec] : {std::pair<const char*, const char*>{"cnn", "acpsgd:rank=2"},
                                    {"cnn:momentum=0.9", "acpsgd:rank=4,ef=false"},
                                    {"cnn", "powersgd:rank=2,mode=local"},
                                    {"cnn", "powersgd:rank=3,mode=local,ef=false"},
                                    {"cnn", "powersgd:rank=2"}}) {
    INFO(model << ", " << spec);
    const auto comp = compression::makeCompressor(spec);
    auto host_trainer = torch_trainer::makeTorchTrainer(model, d, device);
    auto dev_trainer = torch_trainer::makeTorchTrainer(model, d, device);
    const client::FitConfig cfg{.epochs = 1, .batch_size = 16, .lr = 0.05};
    client::ClientAlgorithm host(*comp, *host_trainer, cfg), dev(*comp, *dev_trainer, cfg);
    const auto round_on_device = torch_trainer::makeDeviceUpdate(*dev_trainer);
    REQUIRE(round_on_device->serves(*comp));
    dev.setDeviceUpdate(round_on_device.get());
    const ParamLayout& layout = host_trainer->layout();
    const auto* acp = dynamic_cast<const compression::AcpSgdCompressor*>(comp.get());
    const compression::LowRankOptions o = *compression::lowRankOptionsOf(*comp);
    std::vector<float> global(layout.numel());
    host_trainer->initParameters(global, 1);
    std::vector<ClientState> host_states = freshStates(layout, 2),
                             dev_states = freshStates(layout, 2);
    const uint64_t before = round_on_device->updates();
    for (uint64_t round = 1; round <= 4; ++round) {
      compression::PhaseBroadcast b;
      b.run_seed = 9;
      b.round = round;
      if (acp || comp->phases() == 2)
        b.shared = std::make_shared<const SharedFactors>(
            round % 2 == 0 && acp ? randomShared(layout, o, SharedFactors::Side::kP, round)
                                  : comp->initialShared(layout, round));
      for (uint64_t id = 0; id < 2; ++id) {
        INFO("round " << round << ", client " << id);
        const client::DataView view{&d, shards[id]};
        const client::PhaseResult h = host.runPhase(b, id, global, view, host_states[id]);
        const client::PhaseResult g = dev.runPhase(b, id, global, view, dev_states[id]);
        checkPayloadsEqual(h.update.tensors, g.update.tensors);
        if (comp->phases() == 2) {  // phase Q continues from what each path kept
          compression::PhaseBroadcast q = b;
          q.phase = 1;
          q.shared = std::make_shared<const SharedFactors>(
              randomShared(layout, o, SharedFactors::Side::kP, 50 + round));
          checkPayloadsEqual(host.runPhase(q, id, {}, view, host_states[id]).update.tensors,
                             dev.runPhase(q, id, {}, view, dev_states[id]).update.tensors);
        }
        const auto* hr = residualOf(host_states[id]);
        const auto* gr = residualOf(dev_states[id]);
        REQUIRE((hr == nullptr) == (gr == nullptr));
        if (hr) CHECK(sameBits(*hr, *gr));
        checkPowerSgdStatesEqual(host_states[id], dev_states[id]);
      }
      for (size_t i = 0; i < global.size(); ++i)
        global[i] += 1e-3f * std::sin(static_cast<float>(i + round));
    }
    CHECK(round_on_device->updates() == before + 8);  // every phase 0 was formed on the device
  }
}

inline const client::ControlVariateState* controlOf(const ClientState& s) {
  return s.find<client::ControlVariateState>(client::kControlVariate);
}

// SCAFFOLD rounds in the round on the device against the host path: the corrected training, the
// payloads, the control change and the client's c_i (committed, or pending for a deployed client's
// acknowledgement) and residual, bit for bit over four rounds of two clients; the server's c moves
// by the mean change between rounds, as the engine's does.
inline void checkDeviceScaffoldRoundMatchesHost(const torch_trainer::Device& device) {
  const data::Dataset d = blobImages(64, 28, 28, 10, 6);
  const std::vector<std::vector<size_t>> shards = twoShards(d);
  struct Case {
    const char* model;
    const char* spec;
    bool acknowledged;  // deployed: c_i+ pending until the server's acknowledgement
  };
  for (const Case& k :
       {Case{"cnn", "topk:density=0.05", false},
        Case{"cnn", "stc:density=0.05,ef_preview=0.5", false}, Case{"cnn", "sign", true},
        Case{"cnn", "powersgd:rank=2,mode=local", false},
        // BatchNorm's running statistics follow the parameters: corrected and changed too.
        Case{"resnet", "topk:density=0.05", false}}) {
    INFO(k.model << ", " << k.spec << (k.acknowledged ? ", acknowledged" : ""));
    const auto comp = compression::makeCompressor(k.spec);
    auto host_trainer = torch_trainer::makeTorchTrainer(k.model, d, device);
    auto dev_trainer = torch_trainer::makeTorchTrainer(k.model, d, device);
    const client::FitConfig cfg{.epochs = 1, .batch_size = 16, .lr = 0.05};
    client::ClientAlgorithm host(*comp, *host_trainer, cfg), dev(*comp, *dev_trainer, cfg);
    const auto round_on_device = torch_trainer::makeDeviceUpdate(*dev_trainer);
    dev.setDeviceUpdate(round_on_device.get());
    const ParamLayout& layout = host_trainer->layout();
    std::vector<float> global(layout.numel()), control(layout.numel(), 0.0f);
    host_trainer->initParameters(global, 1);
    std::vector<ClientState> host_states = freshStates(layout, 2),
                             dev_states = freshStates(layout, 2);
    for (uint64_t round = 1; round <= 4; ++round) {
      compression::PhaseBroadcast b;
      b.run_seed = 11;
      b.round = round;
      std::vector<float> mean(layout.numel(), 0.0f);
      for (uint64_t id = 0; id < 2; ++id) {
        INFO("round " << round << ", client " << id);
        const client::DataView view{&d, shards[id]};
        // A deployed client's acknowledgement: the last round's change was counted (odd rounds) or
        // not (even rounds: the pending c_i+ is dropped).
        const std::optional<uint64_t> ack =
            k.acknowledged ? std::optional<uint64_t>(round % 2 ? round - 1 : 0) : std::nullopt;
        const client::PhaseResult h =
            host.runPhase(b, id, global, view, host_states[id], control, ack);
        const client::PhaseResult g =
            dev.runPhase(b, id, global, view, dev_states[id], control, ack);
        checkPayloadsEqual(h.update.tensors, g.update.tensors);
        REQUIRE(h.control_delta.size() == layout.numel());
        CHECK(sameBits(h.control_delta, g.control_delta));
        CHECK(h.control_dropped == g.control_dropped);
        const auto* hc = controlOf(host_states[id]);
        const auto* gc = controlOf(dev_states[id]);
        REQUIRE(hc != nullptr);
        REQUIRE(gc != nullptr);
        CHECK(sameBits(hc->values, gc->values));
        CHECK(sameBits(hc->pending, gc->pending));
        CHECK(hc->pending_round == gc->pending_round);
        const auto* hr = residualOf(host_states[id]);
        const auto* gr = residualOf(dev_states[id]);
        REQUIRE((hr == nullptr) == (gr == nullptr));
        if (hr) CHECK(sameBits(*hr, *gr));
        checkPowerSgdStatesEqual(host_states[id], dev_states[id]);
        checkMetricsEqual(h, g);
        const std::vector<float> dense = densify(layout, h.update.tensors);
        for (size_t i = 0; i < global.size(); ++i) {
          global[i] += 0.5f * dense[i];
          mean[i] += 0.5f * h.control_delta[i];
        }
      }
      for (size_t i = 0; i < control.size(); ++i) control[i] += mean[i];
    }
    CHECK(round_on_device->updates() == 8);  // every update was formed on the device
  }
}

// The control change's division on `device`, as the round makes it (a double tensor divided by a
// 0-dim double tensor on the same device), against the host's division, bit for bit, over 2^20
// random quotients of wide range; and the product by the reciprocal (what LibTorch's CUDA kernel
// does for a host scalar) differs, so the check can tell the two apart.
inline void checkDeviceDivisionRoundsAsHost(const torch::Device& device) {
  constexpr int64_t n = int64_t{1} << 20;
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-60, 60);
  std::vector<double> x(static_cast<size_t>(n));
  for (double& v : x) v = std::ldexp(mantissa(gen), exponent(gen));
  for (const double divisor : {0.05 * 3, 0.1 * 7, 1e-3 * 19, 0.0123 * 40}) {
    INFO("divisor " << divisor);
    const torch::Tensor on_device =
        torch::from_blob(x.data(), {n}, torch::kFloat64)
            .clone()  // on the CPU, to() would return x itself, and div_ would change it
            .to(device)
            .div_(torch::full({}, divisor, torch::TensorOptions(torch::kFloat64).device(device)))
            .to(torch::kCPU)
            .contiguous();
    const double* got = on_device.data_ptr<double>();
    size_t differ = 0, reciprocal_differs = 0;
    const double inv = 1.0 / divisor;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = x[i] / divisor;
      differ += std::memcmp(&got[i], &want, sizeof want) != 0;
      const double by_inverse = x[i] * inv;
      reciprocal_differs += std::memcmp(&by_inverse, &want, sizeof want) != 0;
    }
    CHECK(differ == 0);
    CHECK(reciprocal_differs > 0);
  }
}

}  // namespace starling::testing
