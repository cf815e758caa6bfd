#pragma once
// Buffered asynchronous aggregation: FedBuff's server step (Nguyen et al., "Federated Learning
// with Buffered Asynchronous Aggregation", AISTATS 2022), over the same RoundScheme, validation
// and streaming sums as a synchronous round.
//
// The server's model has a version v. A client trains from the version it downloaded, v_i, and its
// update arrives with staleness tau = v - v_i. The update is checked against v_i's phase (the
// same checks a synchronous round makes: the round field is the version it trained from, so a
// compressor's round-determined choices are v_i's), scaled by s(tau) and added to the buffer.
// After K accepted updates the buffer gives one step,
//
//   delta = sum_i n_i s(tau_i) update_i / sum_i n_i,
//
// and the buffer starts empty; the caller advances the version once it applied the step. With K =
// the cohort, tau = 0 and s = 1 that is a synchronous FedAvg round, bit for bit (tested). An update
// beyond the staleness bound is refused with kStale, one from a version not made yet with
// kWrongRound, a second one of a client from the same version (even after a step) with
// kDuplicate.
//
// Memory: one aggregate (numel floats) per version among the buffered updates, at most
// min(K, max_staleness + 1). Splitting a phase's checks from its sum would need one.
//
// Edge aggregators: a partial aggregate of updates trained from one version v (addPartial) enters
// as its updates would one by one, each scaled by s(tau) and counted toward K.
//
// This is the core of buffered asynchronous aggregation (FedBuff): server/async_server.h steps with
// it, and the simulator's event clock (simulator/async_sim.h) and the root's asynchronous rounds
// (server/async_root.h) drive that (docs/aggregation.md).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "aggregation/round_scheme.h"
#include "core/bytes.h"

namespace starling::aggregation {

// The staleness weights of FedAsync (Xie et al. 2019) and FedBuff:
//   constant           s(tau) = 1
//   polynomial:a=A     s(tau) = (1 + tau)^-A          (A > 0; FedBuff's choice: a=0.5, the default)
//   hinge:a=A,b=B      s(tau) = 1 for tau <= B, else 1 / (A (tau - B) + 1)   (A > 0, B >= 0; both
//                      required)
class Staleness {
 public:
  // ConfigError naming the spec for an unknown kind, a missing, extra or out-of-range parameter.
  static Staleness parse(std::string_view spec);
  double weight(uint64_t tau) const;  // in (0, 1]
  const std::string& spec() const { return spec_; }

 private:
  enum class Kind { kConstant, kPolynomial, kHinge };
  Kind kind_ = Kind::kConstant;
  double a_ = 0.0, b_ = 0.0;
  std::string spec_ = "constant";
};

struct AsyncOptions {
  uint64_t buffer_size = 10;    // K: accepted updates per server step (FedBuff's K = 10)
  uint64_t max_staleness = 20;  // an update trained more than this many versions ago is refused
  std::string staleness = "polynomial:a=0.5";
  void validate() const;  // ConfigError naming the option
  // The weight at the staleness bound is at least 1e-6 (an update there would count toward K and
  // add nothing): ConfigError naming both keys otherwise.
  void checkWeightAtBound() const;
};

// What a buffered step cannot take, as a ConfigError whose message continues its subject ("does
// not run ...", the caller names the mode) and names what to change: a compressor of
// several phases or with factors shared across rounds, a rule that keeps every update (one that
// does not stream), SCAFFOLD (its control variate needs every counted client to have trained
// against the same c, and a buffered step mixes model versions). AsyncBuffer checks this, and
// apps::checkRoundMode before a run starts.
void checkBufferable(const compression::Compressor& compressor, const AggregationRule& rule,
                     bool scaffold);

class AsyncBuffer {
 public:
  // `scheme` must outlive the buffer and pass checkBufferable() (powersgd:mode=local does), and
  // the weight at the staleness bound must be at least 1e-6 (checkWeightAtBound): ConfigError
  // otherwise. `version`: the server model's version now (>= 1).
  AsyncBuffer(const RoundScheme& scheme, AsyncOptions options, uint64_t version = 1);

  uint64_t version() const { return version_; }
  // What a client that downloads version v trains under (the round field of its update is v).
  PhaseBroadcast broadcast(uint64_t v) const;
  // The staleness weight an update from version v would get now; kStale / kWrongRound as add().
  double weightFor(uint64_t v) const;

  // Validates `u` against its version's phase and adds it scaled by s(tau). Throws InputError
  // (kStale, kWrongRound, or any code a synchronous round gives), leaving the buffer unchanged.
  void add(const compression::UpdateView& u, const ClientLimits& limits = {});
  // An edge aggregator's partial aggregate of updates its clients trained from version
  // p.header.round (the task it relayed): checked as a synchronous round checks a partial, its
  // sums scaled by s(tau) (each update in it weighted as if it had come alone), and counted as
  // p.header.count updates toward K. One partial per aggregator (`source`) and version, as one
  // update per client; the same refusals as add(). The caller checks its weight against what
  // the aggregator registered.
  void addPartial(const compression::PartialView& p, uint64_t source);

  uint64_t size() const { return count_; }                   // accepted updates in the buffer
  bool ready() const { return count_ >= opt_.buffer_size; }  // a partial may take it past K
  uint64_t rejected() const { return rejected_total_; }      // every refusal since construction
  // The buffered step (delta, metrics, count, total weight; `rejected`: the refusals since the
  // last step), and the buffer empties. InvalidArgument when the buffer is empty.
  RoundResult take();
  // The refusals since the last step (or the last call), which the count then starts over from:
  // for a step that has nothing to take (a semi-synchronous round where nothing was accepted).
  uint64_t takeRejected();
  // One refusal counted again, with nothing added: a journal's record of a refusal (the
  // asynchronous root's, server/async_root.h), so that a resumed step counts it.
  void countRefusal() {
    ++rejected_total_;
    ++rejected_step_;
  }
  // The server applied a step: the version advances (staleness is counted from it).
  void advance();
  // The server did not apply the last take() (its step would have made the model non-finite):
  // its clients may send again from their versions, instead of every client of the current
  // version being shut out of it for good. (Clients whose updates were restored by load() are not
  // known by name and stay counted.)
  void discardTaken();
  // Whether `client` (or edge aggregator) sent an accepted update (partial) from version v (a
  // second one would be a duplicate).
  bool hasUpdate(uint64_t client, uint64_t v) const;

  // The whole state (version, the buffered versions' sums, the clients seen per version, the
  // counts), for the root's checkpoint: load() into a buffer of the same scheme and options gives
  // the same steps, bit for bit. load() checks everything before it changes anything: a version
  // outside the staleness bound, a sum of another layout, a non-finite value, counts that do not
  // add up, are ByteReader failures (IoError naming the file).
  // `format`: what save() writes is kFormat; load() reads 1 (before edge aggregators: one update
  // per sender) too.
  static constexpr uint32_t kFormat = 2;
  void save(ByteWriter& w) const;
  void load(ByteReader& r, uint32_t format = kFormat);
  // The most updates one version's sum may hold (its count is a float: exact up to 2^24); a
  // partial that would pass it is refused (kBadWeight).
  static constexpr uint64_t kMaxVersionCount = uint64_t{1} << 24;

 private:
  // add() and addPartial(): the staleness and duplicate checks, then `into` adds to version v's
  // aggregate with the weight s(tau); a refusal is counted and leaves everything unchanged.
  void buffer(uint64_t v, uint64_t sender, uint64_t count, const char* who, const char* what,
              const std::function<void(PhaseAggregator&, double)>& into);

  const RoundScheme& scheme_;
  AsyncOptions opt_;
  Staleness staleness_;
  uint64_t version_;
  // One phase aggregator per version the buffered updates trained from (at most max_staleness + 1).
  std::map<uint64_t, std::unique_ptr<PhaseAggregator>> by_version_;
  // The clients (and edge aggregators) that sent an update (a partial) from each version still
  // inside the staleness bound, with the updates each brought (1, or the partial's count).
  std::map<uint64_t, std::unordered_map<uint64_t, uint64_t>> seen_;
  uint64_t count_ = 0, rejected_total_ = 0, rejected_step_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> last_taken_;  // (version, client) of the last take()
};

}  // namespace starling::aggregation
