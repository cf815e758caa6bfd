#pragma once
// The server side of buffered asynchronous aggregation (FedBuff): the model and its
// version, the buffer of staleness-weighted updates (aggregation/async_buffer.h) and the server
// optimizer's step, written once for whatever drives it: the simulator's event clock
// (simulator/async_sim.h) and the root's asynchronous rounds (server/async_root.h).
//
//   client downloads version v (broadcast(v), model())  ->  trains  ->  add(update from v)
//   -> after K accepted updates: step() = buffer.take(), the optimizer's step, version + 1
//
// A step whose optimizer output is not finite is not applied (the buffer is spent, the version
// stays), as a synchronous round that would make the model non-finite. Each step is reported as a
// RoundRecord (round = the step's number), with the staleness of its updates in its metrics:
// staleness_mean and staleness_max (versions).
//
// Checkpoints (the root's, server/async_root.h): saveCheckpoint() writes the model, its version,
// the optimizer's state and the buffer with its sums atomically (core/file_io.h), and a server
// constructed with the same configuration resumes from it with loadCheckpoint(), every buffered
// update kept: its next step is the one the saved server would have taken, bit for bit (tested).
// SCAFFOLD is refused (apps::checkRoundMode says why: a buffered step mixes model versions, and
// SCAFFOLD's control variate needs every counted client to have trained against the same c).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "aggregation/async_buffer.h"
#include "aggregation/server_optimizer.h"
#include "server/engine.h"

namespace starling::server {

struct AsyncServerConfig {
  aggregation::RoundSchemeOptions scheme;  // compressor, rule, run seed, bounds, metrics
  std::string server_opt = "fedavg";
  aggregation::AsyncOptions async;  // K, the staleness bound and weight
  // What tasks carry (server/model_store.h): with delta and topk the store keeps `history`
  // versions to encode against; topk is lossy (clients train from the broadcast model, refreshed
  // by `density` of its coordinates per version, the server's residual kept).
  Downlink downlink = Downlink::kDense;
  size_t history = 4;
  double density = 0.01;
};

class AsyncServer {
 public:
  // ConfigError for a compressor, rule, optimizer or staleness the buffer cannot take
  // (aggregation::AsyncBuffer's conditions); InvalidArgument if `initial` does not fit `layout`.
  AsyncServer(std::shared_ptr<const ParamLayout> layout, AsyncServerConfig config,
              std::vector<float> initial);

  uint64_t version() const { return model_.version(); }  // 1 before the first step
  uint64_t steps() const { return steps_; }              // steps taken, applied or not
  const ModelStore& model() const { return model_; }
  const aggregation::RoundScheme& scheme() const { return scheme_; }
  const AsyncServerConfig& config() const { return config_; }
  // What a client that downloads version v (the current one, or an older one it holds) trains
  // under.
  compression::PhaseBroadcast broadcast(uint64_t v) const { return buffer_.broadcast(v); }

  // Adds an update trained from version u.header.round, weighted by its staleness. Throws
  // InputError (kStale beyond the bound, kWrongRound from a version not made yet, kDuplicate, or
  // any code a synchronous round gives), the server unchanged.
  void add(const compression::UpdateView& u, const aggregation::ClientLimits& limits = {});
  // An edge aggregator's partial of updates trained from version p.header.round
  // (aggregation::AsyncBuffer::addPartial): p.header.count updates toward K, the same refusals.
  void addPartial(const compression::PartialView& p, uint64_t source);
  // A refusal counted again (a journal's record of one): the next step's updates_rejected has it.
  void countRefusal() { buffer_.countRefusal(); }
  uint64_t buffered() const { return buffer_.size(); }
  bool ready() const { return buffer_.ready(); }
  // The buffered step (InvalidArgument when the buffer is empty). rec.applied is false, with the
  // reason, when the step would have made the model non-finite; the version advances only when
  // it is applied. rec.updates_rejected counts the refusals since the last step.
  RoundRecord step();
  // A step with nothing to apply (a semi-synchronous round where no update was accepted): counted,
  // not applied, with `reason` and the refusals since the last step; the version unchanged.
  RoundRecord skip(const std::string& reason);
  // Whether `client` sent an accepted update from version v.
  bool hasUpdate(uint64_t client, uint64_t v) const { return buffer_.hasUpdate(client, v); }

  // The checkpoint file: magic, format, the layout's fingerprint, the compressor, rule, optimizer
  // and staleness specs (a resume with others is refused, naming the key), then the state.
  // loadCheckpoint throws IoError for an unreadable, corrupt or mismatched file and changes
  // nothing then.
  void saveCheckpoint(const std::string& path) const;
  void loadCheckpoint(const std::string& path);
  // The same state inside another file (the simulator's checkpoint): load() reads exactly what
  // save() wrote, all of `bytes`, and names `what` in its IoError.
  void save(ByteWriter& w) const;
  void load(std::span<const uint8_t> bytes, const std::string& what);

 private:
  void noteStaleness(uint64_t v, uint64_t count);

  AsyncServerConfig config_;
  aggregation::RoundScheme scheme_;
  std::unique_ptr<aggregation::ServerOptimizer> optimizer_;
  ModelStore model_;
  aggregation::AsyncBuffer buffer_;
  uint64_t steps_ = 0;
  double staleness_sum_ = 0.0;  // of the buffered updates
  uint64_t staleness_max_ = 0;
  std::shared_ptr<const ParamLayout> layout_;
};

}  // namespace starling::server
