// The round on the device (torch_trainer/device_round.h) against ClientAlgorithm's host path, here
// on the CPU; test_torch_gpu runs the same check on a GPU.
#include <cmath>
#include <functional>

#include "client/eigen_trainer.h"
#include "torch_trainer/device_round_check.h"

using namespace starling;

TEST_CASE(
    "the round on the device sends the host path's payloads and keeps its residual, round after "
    "round",
    "[torch_trainer][device_round][isa]") {
  testing::checkDeviceRoundMatchesHost(torch_trainer::Device{});
}

TEST_CASE(
    "PowerSGD and ACP-SGD in the round on the device send the host path's factors and keep its "
    "buffers, round after round",
    "[torch_trainer][device_round][isa]") {
  testing::checkDeviceLowRankRoundMatchesHost(torch_trainer::Device{});
}

TEST_CASE(
    "the round on the device serves top-k, stc, rand-k, random-block, sign, QSGD, PowerSGD and "
    "ACP-SGD, needs a LibTorch trainer, and refuses as the host path",
    "[torch_trainer][device_round]") {
  const data::Dataset d = testing::blobImages(32, 28, 28, 10, 4);
  auto trainer = torch_trainer::makeTorchTrainer("logreg", d);
  const auto round = torch_trainer::makeDeviceUpdate(*trainer);
  CHECK(round->serves(*compression::makeCompressor("topk:density=0.1")));
  CHECK(round->serves(*compression::makeCompressor("stc:density=0.1")));
  CHECK(round->serves(*compression::makeCompressor("randk:density=0.1")));
  CHECK(round->serves(*compression::makeCompressor("randblock:density=0.1")));
  CHECK(round->serves(*compression::makeCompressor("sign")));
  CHECK(round->serves(*compression::makeCompressor("qsgd:levels=4")));
  CHECK(round->serves(*compression::makeCompressor("powersgd:rank=2")));
  CHECK(round->serves(*compression::makeCompressor("powersgd:rank=2,mode=local")));
  CHECK(round->serves(*compression::makeCompressor("acpsgd:rank=2")));
  CHECK_FALSE(round->serves(*compression::makeCompressor("none")));
  CHECK_FALSE(round->serves(*compression::makeCompressor("fp16")));
  auto eigen = client::makeTrainer("logreg", d);
  CHECK_THROWS_AS(torch_trainer::makeDeviceUpdate(*eigen), InvalidArgument);

  // Residual + update past the bound: InvalidArgument, and the state as it was, as on the host.
  const auto comp = compression::makeCompressor("topk:density=0.1");
  client::ClientAlgorithm alg(*comp, *trainer,
                              client::FitConfig{.epochs = 1, .batch_size = 8, .lr = 0.1});
  client::ClientAlgorithm host(*comp, *trainer, alg.config());
  alg.setDeviceUpdate(round.get());
  const ParamLayout& layout = trainer->layout();
  std::vector<float> global(layout.numel());
  trainer->initParameters(global, 1);
  // A residual just over the bound (what no compressor keeps, but a state file could hold).
  const std::vector<float> residual(layout.numel(),
                                    std::nextafter(compression::kMaxCompressMagnitude, INFINITY));
  const auto withResidual = [&](ClientState& state) {
    std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>> items;
    auto r = std::make_unique<compression::ResidualState>();
    r->values = residual;
    r->round = 1;
    items.emplace_back(std::string(compression::kResidualComponent), std::move(r));
    state.commit(items);
  };
  ClientState state(layout.fingerprint()), host_state(layout.fingerprint());
  withResidual(state);
  withResidual(host_state);
  compression::PhaseBroadcast b;
  b.run_seed = 3;
  b.round = 2;
  const auto idx = testing::allIndices(d);
  const auto messageOf = [&](client::ClientAlgorithm& a, ClientState& s) -> std::string {
    try {
      a.runPhase(b, 1, global, client::DataView{&d, idx}, s);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no InvalidArgument";
  };
  const std::string host_message = messageOf(host, host_state);
  CHECK_THAT(host_message, Catch::Contains("residual + update value") &&
                               Catch::Contains("not finite or exceeds"));
  CHECK(messageOf(alg, state) == host_message);
  CHECK(round->updates() == 0);
  REQUIRE(testing::residualOf(state) != nullptr);
  CHECK(testing::sameBits(*testing::residualOf(state), residual));
  // A state of another model is refused, as on the host (after the fit, in the host's order).
  ClientState other(layout.fingerprint() + 1), other_host(layout.fingerprint() + 1);
  const std::string other_message = messageOf(alg, other);
  CHECK(other_message == messageOf(host, other_host));
  CHECK_THAT(other_message, Catch::Contains("belongs to another model"));
  // A clean state: one update made on the device.
  ClientState fresh(layout.fingerprint());
  alg.runPhase(b, 1, global, client::DataView{&d, idx}, fresh);
  CHECK(round->updates() == 1);
  // The round on the device trains its own trainer: it serves only a client algorithm of that one.
  auto another = torch_trainer::makeTorchTrainer("logreg", d);
  client::ClientAlgorithm elsewhere(*comp, *another, alg.config());
  CHECK_THROWS_AS(elsewhere.setDeviceUpdate(round.get()), InvalidArgument);
  elsewhere.setDeviceUpdate(nullptr);
}

TEST_CASE(
    "SCAFFOLD in the round on the device forms the host path's control change and c_i, a refused "
    "c_i+ leaves the state as it was",
    "[torch_trainer][device_round][isa]") {
  testing::checkDeviceScaffoldRoundMatchesHost(torch_trainer::Device{});
  testing::checkDeviceDivisionRoundsAsHost(torch::kCPU);

  // The change is staged before the compressor touches the state: a refusal there (what the host
  // does for a c_i+ that is not finite) leaves the residual as it was, and no update is counted.
  const data::Dataset d = testing::blobImages(32, 28, 28, 10, 7);
  auto trainer = torch_trainer::makeTorchTrainer("logreg", d);
  const auto round = torch_trainer::makeDeviceUpdate(*trainer);
  const auto comp = compression::makeCompressor("topk:density=0.1");
  const ParamLayout& layout = trainer->layout();
  std::vector<float> global(layout.numel());
  trainer->initParameters(global, 1);
  ClientState state(layout.fingerprint());
  {
    std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>> items;
    auto r = std::make_unique<compression::ResidualState>();
    r->values.assign(layout.numel(), 0.25f);
    r->round = 1;
    items.emplace_back(std::string(compression::kResidualComponent), std::move(r));
    state.commit(items);
  }
  const std::vector<float> residual = *testing::residualOf(state);
  compression::PhaseBroadcast b;
  b.run_seed = 3;
  b.round = 2;
  const auto idx = testing::allIndices(d);
  const client::DataView view{&d, idx};
  const client::FitConfig cfg{.epochs = 1, .batch_size = 8, .lr = 0.1};
  const std::vector<float> server(layout.numel(), 0.01f);
  std::vector<float> delta;
  bool staged = false;
  const auto attempt = [&](std::span<const float> c, std::function<void()> stage) {
    RngStream rng(StreamKey{b.run_seed, b.round, 1, StreamPurpose::kTraining, 0});
    client::FitResult fit;
    const client::ControlChange change{c, 2.0, &delta, std::move(stage)};
    round->fitAndCompress(*comp, global, view, cfg, rng, fit, state, b.context(1), nullptr,
                          &change);
  };
  CHECK_THROWS_WITH(attempt(server,
                            [&] {
                              staged = true;
                              STARLING_THROW(InvalidArgument, "c_i+ refused");
                            }),
                    Catch::Contains("c_i+ refused"));
  CHECK(staged);
  CHECK(delta.size() == layout.numel());  // the change was formed before the stage
  CHECK(round->updates() == 0);
  CHECK(testing::sameBits(*testing::residualOf(state), residual));
  // A server control variate of the wrong size: InvalidArgument, the state as it was.
  staged = false;
  const std::vector<float> short_server(layout.numel() - 1, 0.0f);
  CHECK_THROWS_AS(attempt(short_server, [&] { staged = true; }), InvalidArgument);
  CHECK_FALSE(staged);
  CHECK(testing::sameBits(*testing::residualOf(state), residual));
  // Accepted: the residual changes and one update is counted.
  attempt(server, [&] { staged = true; });
  CHECK(staged);
  CHECK(round->updates() == 1);
  CHECK_FALSE(testing::sameBits(*testing::residualOf(state), residual));

  // Through the client algorithm: a residual over the bound is refused after c_i+ was staged,
  // with the host path's message, and neither c_i+ nor a residual is kept.
  client::ClientAlgorithm host(*comp, *trainer, cfg), dev(*comp, *trainer, cfg);
  dev.setDeviceUpdate(round.get());
  const auto overBound = [&] {
    ClientState s(layout.fingerprint());
    std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>> items;
    auto r = std::make_unique<compression::ResidualState>();
    r->values.assign(layout.numel(), std::nextafter(compression::kMaxCompressMagnitude, INFINITY));
    r->round = 1;
    items.emplace_back(std::string(compression::kResidualComponent), std::move(r));
    s.commit(items);
    return s;
  };
  ClientState host_state = overBound(), dev_state = overBound();
  const std::vector<float> over = *testing::residualOf(host_state);
  const auto messageOf = [&](client::ClientAlgorithm& a, ClientState& st) -> std::string {
    try {
      a.runPhase(b, 1, global, view, st, server);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no InvalidArgument";
  };
  const std::string host_message = messageOf(host, host_state);
  CHECK_THAT(host_message, Catch::Contains("residual + update value"));
  CHECK(messageOf(dev, dev_state) == host_message);
  CHECK(round->updates() == 1);
  CHECK(dev_state.find<client::ControlVariateState>(client::kControlVariate) == nullptr);
  CHECK(testing::sameBits(*testing::residualOf(dev_state), over));
}
