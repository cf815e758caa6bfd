// The plug-in property: the client algorithm (client/algorithm.h), written against the Trainer
// interface, runs a phase with the LibTorch trainer and a top-k compressor unchanged.
#include <catch2/catch.hpp>

#include "client/algorithm.h"
#include "compression/registry.h"
#include "torch_trainer/blobs.h"
#include "torch_trainer/torch_trainer.h"

using namespace starling;

TEST_CASE("ClientAlgorithm runs a phase with the LibTorch trainer and top-k", "[torch_trainer]") {
  const data::Dataset d = testing::blobImages(48, 12, 12, 3, 11);
  std::vector<size_t> shard;
  for (size_t i = 0; i < d.size(); i += 2) shard.push_back(i);
  const client::DataView view{&d, shard};
  auto trainer = torch_trainer::makeTorchTrainer("cnn", d);
  const ParamLayout& layout = trainer->layout();
  std::vector<float> global(layout.numel());
  trainer->initParameters(global, 1);
  const auto topk = compression::makeCompressor("topk:density=0.01");
  const client::FitConfig cfg{.epochs = 1, .batch_size = 8, .lr = 0.05};
  client::ClientAlgorithm alg(*topk, *trainer, cfg);

  ClientState state(layout.fingerprint());
  const compression::PhaseBroadcast b{42, 3, 0, nullptr};
  const client::PhaseResult res = alg.runPhase(b, 7, global, view, state);

  CHECK(res.update.header.layout_fingerprint == layout.fingerprint());
  CHECK(res.update.header.num_examples == shard.size());
  CHECK(res.fit.num_examples == shard.size());
  REQUIRE(res.update.tensors.size() == layout.size());
  size_t sent = 0;
  for (size_t t = 0; t < layout.size(); ++t) {
    INFO(layout[t].name);
    const auto* sp = std::get_if<compression::Sparse>(&res.update.tensors[t]);
    REQUIRE(sp != nullptr);
    CHECK(sp->values.size() == compression::countForDensity(0.01, layout[t].numel));
    sent += sp->values.size();
  }
  CHECK(sent < layout.numel() / 50);
  bool has_loss = false;
  for (const auto& m : res.update.metrics) has_loss |= m.name == "train_loss";
  CHECK(has_loss);

  // Error feedback: what was sent plus the new residual is the whole update, trained - global,
  // where "trained" is the trainer's fit on the client's own stream (run seed, round, client).
  std::vector<float> trained = global;
  RngStream rng(StreamKey{42, 3, 7, StreamPurpose::kTraining, 0});
  trainer->fit(trained, view, cfg, rng);
  std::vector<float> dense(layout.numel());
  compression::densifyUpdate(layout, res.update.tensors, dense);
  const auto& residual =
      state.get<compression::ResidualState>(compression::kResidualComponent).values;
  REQUIRE(residual.size() == layout.numel());
  size_t mismatches = 0;
  for (size_t i = 0; i < dense.size(); ++i)
    mismatches += dense[i] + residual[i] != trained[i] - global[i];
  CHECK(mismatches == 0);

  // The next round starts from the residual; the same algorithm object serves another client.
  const client::PhaseResult next = alg.runPhase({42, 4, 0, nullptr}, 7, global, view, state);
  CHECK(next.update.tensors.size() == layout.size());
  ClientState other(layout.fingerprint());
  CHECK(alg.runPhase(b, 8, global, view, other).update.header.client_id == 8);
}
