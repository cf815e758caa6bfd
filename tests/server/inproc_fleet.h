#pragma once
// An in-process fleet: the round engine's Fleet with its clients in the same process, every
// message going through the real encoders and decoders (encodeTask -> decodeTask -> applyModel on
// the client; encodeUpdate -> Decoder -> PhaseAggregator::add on the server). Tests the protocol
// logic of a federation fast, the way gloo tests many ranks in one process.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>

#include "client/algorithm.h"
#include "client/trainer.h"
#include "compression/registry.h"
#include "protocol/codec.h"
#include "protocol/control.h"
#include "server/engine.h"

namespace starling::testing {

class InProcFleet final : public server::Fleet {
 public:
  struct Client {
    uint64_t id;
    std::vector<size_t> shard;
    ClientState state;
    std::vector<float> model;
    uint64_t held = 0;
  };

  InProcFleet(client::Trainer& trainer, const data::Dataset& train,
              std::vector<std::vector<size_t>> shards)
      : trainer_(trainer), train_(train), decoder_(trainer.layout()) {
    for (size_t i = 0; i < shards.size(); ++i)
      clients_.push_back(Client{i, std::move(shards[i]),
                                ClientState(trainer.layout().fingerprint()),
                                std::vector<float>(trainer.layout().numel()), 0});
  }

  // Faults to inject: clients that never answer, and a round at which runPhase throws (a crash).
  std::set<uint64_t> silent;
  std::optional<uint64_t> crash_at_round;
  uint64_t tasks_sent = 0;

  server::ClientPool waitForClients(size_t, std::chrono::milliseconds, uint64_t) override {
    std::vector<server::ClientInfo> out;
    for (const auto& c : clients_)
      out.push_back(server::ClientInfo{c.id, protocol::Role::kClient, c.shard.size(),
                                       c.shard.size(), c.held});
    return out;
  }

  server::PhaseReport runPhase(const server::PhaseTask& task,
                               std::span<const server::ClientInfo> participants, size_t target,
                               aggregation::PhaseAggregator& agg) override {
    if (crash_at_round && task.header.round == *crash_at_round)
      throw std::runtime_error("simulated crash");
    server::PhaseReport rep;
    for (const auto& info : participants) {
      if (rep.completed.size() >= target) break;
      Client& c = clients_.at(info.id);
      if (silent.count(c.id)) {
        rep.failed.push_back(c.id);
        continue;
      }
      const std::vector<uint8_t> task_bytes = encodeFor(task, c);
      rep.downlink_bytes += task_bytes.size();
      ++tasks_sent;
      const std::vector<uint8_t> wire = clientAnswer(task_bytes, c);
      rep.uplink_bytes += wire.size();
      try {
        agg.add(decoder_.decodeUpdate(wire), aggregation::ClientLimits{c.shard.size()});
        rep.completed.push_back(c.id);
      } catch (const InputError&) {
        rep.failed.push_back(c.id);
      }
    }
    return rep;
  }

  server::EvalReport evaluate(const server::PhaseTask& task,
                              const server::ClientPool& participants) override {
    server::EvalReport ev;
    for (const auto& info : participants) {
      Client& c = clients_.at(info.id);
      const auto bytes = encodeFor(task, c);
      ev.downlink_bytes += bytes.size();
      const protocol::TaskMsg t = protocol::decodeTask(bytes, trainer_.layout());
      protocol::applyModel(trainer_.layout(), c.held, t.base_version, t.model, c.model);
      c.held = t.model_version;
      const auto r = trainer_.evaluate(c.model, client::DataView{&train_, c.shard});
      const double w = static_cast<double>(r.num_examples);
      ev.loss = (ev.loss * static_cast<double>(ev.examples) + r.loss * w) /
                (static_cast<double>(ev.examples) + w);
      ev.accuracy = (ev.accuracy * static_cast<double>(ev.examples) + r.accuracy * w) /
                    (static_cast<double>(ev.examples) + w);
      ev.examples += r.num_examples;
      ++ev.clients;
    }
    return ev;
  }

  void finish(const std::string&) override { finished_ = true; }
  bool finished() const { return finished_; }
  std::vector<Client>& clients() { return clients_; }

 private:
  std::vector<uint8_t> encodeFor(const server::PhaseTask& task, const Client& c) const {
    return server::encodeTask(task, c.held);
  }

  // What a deployed client does with a task (client/runtime.cc, without the socket).
  std::vector<uint8_t> clientAnswer(const std::vector<uint8_t>& bytes, Client& c) {
    protocol::TaskMsg t = protocol::decodeTask(bytes, trainer_.layout());
    if (!t.model.empty()) {
      protocol::applyModel(trainer_.layout(), c.held, t.base_version, t.model, c.model);
      c.held = t.model_version;
    }
    auto& comp = compressors_[t.compressor];
    if (!comp) comp = compression::makeCompressor(t.compressor);
    auto shared = std::make_shared<const compression::SharedFactors>(std::move(t.shared));
    const compression::PhaseBroadcast b{t.run_seed, t.round, t.phase,
                                        shared->factors.empty() ? nullptr : shared};
    client::FitConfig fit{.epochs = t.fit.epochs, .batch_size = t.fit.batch_size, .lr = t.fit.lr};
    fit.prox_mu = t.fit.prox_mu;
    client::ClientAlgorithm alg(*comp, trainer_, fit);
    client::PhaseResult res =
        alg.runPhase(b, c.id, c.model, client::DataView{&train_, c.shard}, c.state, t.control);
    res.update.control = std::move(res.control_delta);  // SCAFFOLD: empty otherwise
    res.update.header.nonce = t.nonce;
    // Only the metrics the server aggregates travel (client/runtime.cc).
    std::erase_if(res.update.metrics, [&](const Metric& m) {
      return std::find(t.metrics.begin(), t.metrics.end(), m.name) == t.metrics.end();
    });
    return protocol::encodeUpdate(res.update);
  }

  client::Trainer& trainer_;
  const data::Dataset& train_;
  protocol::Decoder decoder_;
  std::vector<Client> clients_;
  std::map<std::string, std::unique_ptr<compression::Compressor>> compressors_;
  bool finished_ = false;
};

}  // namespace starling::testing
