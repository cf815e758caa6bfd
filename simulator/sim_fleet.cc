#include "simulator/sim_fleet.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <numeric>
#include <set>

#include "client/algorithm.h"
#include "compression/registry.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/framed_file.h"
#include "privacy/crypto.h"
#include "protocol/codec.h"
#include "protocol/control.h"

namespace starling::simulator {

namespace {
// (client, message) pairs between workers: a count, then each client's id, length and bytes.
std::vector<uint8_t> packMessages(std::span<const std::pair<uint64_t, std::vector<uint8_t>>> m) {
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.u64(m.size());
  for (const auto& [id, bytes] : m) {
    w.u64(id);
    w.u64(bytes.size());
    w.bytes(bytes.data(), bytes.size());
  }
  return out;
}
std::vector<std::pair<uint64_t, std::vector<uint8_t>>> unpackMessages(
    std::span<const uint8_t> bytes, const std::string& what) {
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> out;
  ByteReader r(bytes, what);
  for (uint64_t n = r.u64(); n > 0; --n) {
    const uint64_t id = r.u64();
    const auto b = r.view(r.u64());
    out.emplace_back(id, std::vector<uint8_t>(b.begin(), b.end()));
  }
  r.finish();
  return out;
}
// Which worker holds each client's state: (client, worker) pairs in the files' frame
// (core/framed_file.h).
constexpr FileFormat kHomesFile{0x4d484c53 /* "SLHM" */, "file of the client states' workers", 1, 1,
                                1};
}  // namespace
namespace cz = starling::compression;
namespace pr = starling::protocol;
using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock

namespace {
// Whole microseconds from `from` to now (a stage's time, PhaseCounts::stage).
uint64_t microsSince(Steady::time_point from) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Steady::now() - from).count());
}
}  // namespace

SimFleet::SimFleet(SimFleetConfig config, const SimClients& clients, client::Trainer& trainer,
                   ClientStateStore& store, Collectives& collectives, const data::Dataset* test)
    : config_(config),
      clients_(clients),
      trainer_(trainer),
      store_(store),
      coll_(collectives),
      test_(test),
      cost_(collectives.size(), config.reference_seconds_per_example),
      state_(trainer.layout().fingerprint()) {
  STARLING_CHECK_ARG(clients.train != nullptr, "the simulation needs a training set");
  if (config_.secure_signed) authority_ = simAuthority(config_.seed);
  copies_ = server::ClientCopies::forDownlink(trainer.layout(), config_.downlink,
                                              config_.downlink_density, config_.downlink_copies);
  STARLING_CHECK_ARG(clients.shards.size() == clients.devices.size(), clients.shards.size(),
                     " shards but ", clients.devices.size(), " devices");
  // The pool's ids travel as 4 bytes (waitForClients' list of those online).
  STARLING_CHECK_ARG(clients.shards.size() <= UINT32_MAX, "a pool of ", clients.shards.size(),
                     " clients: at most 2^32 - 1");
  if (!config_.homes_file.empty() && std::filesystem::exists(config_.homes_file)) {
    const std::vector<uint8_t> file = readFile(config_.homes_file, uint64_t{1} << 32);
    // Before the frame the file was the list alone (no client count's low word is the magic).
    const std::span<const uint8_t> bytes =
        hasMagic(file, kHomesFile.magic) ? unframe(kHomesFile, file, config_.homes_file).payload
                                         : std::span<const uint8_t>(file);
    ByteReader r(bytes, config_.homes_file);
    const uint64_t n = r.u64();
    if (n > r.remaining() / 12) r.fail("claims ", n, " clients");
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t id = r.u64();
      const uint32_t w = r.u32();
      if (w >= static_cast<uint32_t>(collectives.size()))
        r.fail("client ", id, " is at worker ", w, " of ", collectives.size(),
               " (resume with as many workers)");
      home_[id] = static_cast<int>(w);
    }
    r.finish();
  }
}

const cz::Compressor& SimFleet::compressor(const std::string& spec) {
  auto& c = compressors_[spec];
  if (!c) c = cz::makeCompressor(spec);
  return *c;
}

server::ClientPool SimFleet::waitForClients(size_t, std::chrono::milliseconds, uint64_t round) {
  // With windows of time: the engine's first call for a round samples its clients among those
  // online, and when none is, the clock moves on to the first that comes online (the same on every
  // worker). A second call for the round is its evaluation's, which is central: every client
  // counts.
  const bool windows = clients_.devices.hasWindows();
  const bool sampling = windows && round != waited_round_;
  waited_round_ = round;
  const uint64_t n = clients_.shards.size();
  if (sampling) {
    double next = std::numeric_limits<double>::infinity();
    for (uint64_t c = 0; c < n; ++c)
      if (clients_.shards.examples(c) > 0)
        next = std::min(next, clients_.devices.nextOnline(c, clock_));
    if (next > clock_ && next < std::numeric_limits<double>::infinity()) {
      wait_ = next - clock_;  // part of the round's simulated duration (runPhase reports it)
      clock_ = next;
    }
  }
  // eval_examples > 0 lets the engine ask for an evaluation; this fleet evaluates centrally.
  const SimClients* clients = &clients_;
  auto make = [clients](uint64_t c) {
    const uint64_t e = clients->shards.examples(c);
    return server::ClientInfo{c, pr::Role::kClient, e, e, 0, false, false};
  };
  // A drawn pool whose every device is always available: every client, none held.
  if (clients_.shards.drawn() && clients_.devices.alwaysAvailable())
    return server::ClientPool::generated(n, make);
  std::vector<uint32_t> ids;  // data.num_clients <= 10,000,000
  for (uint64_t c = 0; c < n; ++c) {
    const bool online = windows ? !sampling || clients_.devices.onlineAt(c, clock_)
                                : clients_.devices.available(c, round, config_.seed);
    if (clients_.shards.examples(c) > 0 && online) ids.push_back(static_cast<uint32_t>(c));
  }
  return server::ClientPool::generated(std::move(ids), make);
}

void SimFleet::allReduceCounts(std::vector<uint64_t>& counts) {
  // Each count as four 16-bit pieces: a float sums up to 2^24 exactly, so up to 256 workers.
  std::vector<float> pieces(counts.size() * 4);
  for (size_t i = 0; i < counts.size(); ++i)
    for (size_t k = 0; k < 4; ++k)
      pieces[4 * i + k] = static_cast<float>((counts[i] >> (16 * k)) & 0xffff);
  coll_.allReduceSum(pieces);
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = 0;
    for (size_t k = 0; k < 4; ++k)
      counts[i] += static_cast<uint64_t>(pieces[4 * i + k]) << (16 * k);
  }
}

uint64_t phaseZeroUpdateBytes(const ParamLayout& layout, const cz::Compressor& comp,
                              const cz::PhaseBroadcast& broadcast,
                              const std::vector<std::string>& metrics, bool with_control,
                              uint64_t client_id) {
  cz::Update u;
  u.header = {layout.fingerprint(), broadcast.round, 0, client_id, 1, 1};
  // FlatBuffers leaves a field at its default out: a zero scale (sign, QSGD) or metric would be
  // bytes short of any client's, so an update of ones, unless zeros give the least (STC).
  const float fill = comp.updateSizeVaries() ? 0.0f : 1.0f;
  const std::vector<float> values(layout.numel(), fill);
  u.tensors = comp.compress(layout, values, broadcast.context(client_id));
  for (const auto& m : metrics) u.metrics.push_back(Metric{m, fill});
  if (with_control) u.control.assign(layout.numel(), 0.0f);
  return pr::encodedSize(u);
}

// The exact wire sizes of this phase: each participant's task (a delta or top-k downlink depends
// on the version it holds, 0: none yet) and a zero update's (exact unless the compressor's size
// depends on the values: runPhase then measures each). Every participant downloads its task,
// stragglers included, and then holds its version.
SimFleet::PhaseBytes SimFleet::phaseBytes(const server::PhaseTask& task,
                                          std::span<const server::ClientInfo> participants,
                                          const cz::Compressor& comp) {
  const ParamLayout& layout = trainer_.layout();
  const pr::TaskMsg& h = task.header;
  PhaseBytes b;
  b.task = server::encodeTask(task, 0).size();
  // SCAFFOLD: the task carries c (in the task's size, as encoded), each update its change.
  if (h.phase == 0) {
    b.update = phaseZeroUpdateBytes(layout, comp, task.broadcast, h.metrics, !h.control.empty());
    const bool has_zero = std::any_of(participants.begin(), participants.end(),
                                      [](const server::ClientInfo& c) { return c.id == 0; });
    if (has_zero)  // client 0's id is left out of its messages
      b.update_of_zero =
          phaseZeroUpdateBytes(layout, comp, task.broadcast, h.metrics, !h.control.empty(), 0);
  }
  b.down.assign(participants.size(), b.task);
  b.up.resize(participants.size());
  for (size_t i = 0; i < participants.size(); ++i)
    b.up[i] = participants[i].id == 0 ? b.update_of_zero : b.update;
  const bool per_client = h.phase == 0 && server::downlinkPerHeld(task.downlink);
  held_before_.clear();
  if (per_client && server::downlinkMirrored(task.downlink)) {
    // Each participant's task against its own copy (every worker encodes them all, so the copies
    // are the same everywhere); the copy is what it trains from.
    STARLING_CHECK_ARG(copies_.has_value(), "a ", server::downlinkName(task.downlink),
                       " task to a fleet configured for another downlink");
    if (participants.size() > copies_->capacity())
      STARLING_THROW(ConfigError, "downlink.copies = ", copies_->capacity(),
                     " keeps fewer clients' copies than round ", h.round, "'s ",
                     participants.size(), " participants: raise it to at least that");
    for (size_t i = 0; i < participants.size(); ++i) {
      const auto it = held_.find(participants[i].id);
      const uint64_t v = it == held_.end() ? 0 : it->second;
      b.down[i] = server::encodeTask(task, copies_->encode(participants[i].id, v,
                                                           task.model.current(), h.model_version))
                      .size();
    }
  } else if (per_client) {
    std::map<uint64_t, uint64_t>
        size_for;  // one encoding per version held, as ZmqFleet caches them
    for (size_t i = 0; i < participants.size(); ++i) {
      const auto it = held_.find(participants[i].id);
      const uint64_t v = it == held_.end() ? 0 : it->second;
      auto [pos, fresh] = size_for.try_emplace(v, 0);
      if (fresh) pos->second = server::encodeTask(task, v).size();
      b.down[i] = pos->second;
    }
  }
  if (per_client) {
    for (const auto& c : participants) {
      const auto it = held_.find(c.id);
      held_before_[c.id] = it == held_.end() ? 0 : it->second;
      held_[c.id] = h.model_version;
    }
  }
  if (task.secure) {
    // Secure aggregation: each task comes with the shares addressed to its client, and the
    // client answers with its masked input (metrics as phaseZeroUpdateBytes counts them).
    std::vector<Metric> metrics;
    for (const auto& m : h.metrics) metrics.push_back(Metric{m, 1.0});
    for (size_t i = 0; i < participants.size(); ++i) {
      b.down[i] +=
          task.secure->request(server::SecureStage::kMaskedInput, participants[i].id).size();
      b.up[i] = task.secure->maskedBytes(participants[i].id, metrics);
    }
  }
  return b;
}

// Phase 0: the simulated clock decides who is accepted (the rest fail: dropped by the deadline or
// past the target), by each participant's task and update bytes.
std::set<uint64_t> SimFleet::timeClients(const server::PhaseTask& task,
                                         std::span<const server::ClientInfo> participants,
                                         size_t target, const PhaseBytes& bytes,
                                         server::PhaseReport& rep) {
  const pr::TaskMsg& h = task.header;
  std::set<uint64_t> failed;
  std::vector<ClientTiming> timings;
  for (size_t i = 0; i < participants.size(); ++i) {
    const auto& c = participants[i];
    const ClientTiming t =
        timeClient(clients_.devices[c.id], c.id, c.num_examples, h.fit.epochs,
                   config_.reference_seconds_per_example, bytes.down[i], bytes.up[i]);
    // Offline before it would finish (the devices' windows of time): a dropout, as FedScale's.
    if (!clients_.devices.onlineAt(c.id, clock_ + t.total()))
      failed.insert(c.id);
    else
      timings.push_back(t);
  }
  const RoundTiming rt = simulateRound(timings, target, config_.deadline_seconds);
  failed.insert(rt.dropped.begin(), rt.dropped.end());
  rep.sim_seconds = rt.seconds;
  // Every client dropped out: the round still took until the first of them went offline (or
  // its deadline, if that came first).
  if (timings.empty() && !participants.empty()) {
    double first_gone = std::numeric_limits<double>::infinity();
    for (const auto& c : participants)
      first_gone = std::min(first_gone, clients_.devices.nextOffline(c.id, clock_) - clock_);
    if (config_.deadline_seconds > 0) first_gone = std::min(first_gone, config_.deadline_seconds);
    rep.sim_seconds = first_gone;
  }
  return failed;
}

// The scheduler decides which worker trains whom (states move to their new workers); a later
// phase of the round keeps the assignment.
void SimFleet::assign(std::vector<uint64_t> ids, uint32_t epochs, uint64_t round) {
  std::sort(ids.begin(), ids.end());
  std::vector<ClientJob> jobs;
  for (uint64_t id : ids) jobs.push_back(ClientJob{id, clients_.shards.examples(id)});
  assignment_ = schedule(jobs, cost_, epochs, config_.schedule);
  assignment_round_ = round;
  migrateStates();
}

double SimFleet::laterPhaseSeconds(std::span<const server::ClientInfo> participants,
                                   const PhaseBytes& bytes) const {
  double longest = 0.0;
  for (const auto& c : participants)
    longest = std::max(longest, static_cast<double>(bytes.task) / clients_.devices[c.id].bandwidth);
  return longest;
}

// This worker's share of the phase, one client after another on the one model replica, into
// `agg`, or, with `held`, kept there (the store unchanged). Fills this worker's entries of
// `counts` (PhaseCounts).
void SimFleet::trainMine(const server::PhaseTask& task,
                         std::span<const server::ClientInfo> participants,
                         const cz::Compressor& comp, aggregation::PhaseAggregator& agg,
                         PhaseCounts& counts, std::vector<Held>* held) {
  const pr::TaskMsg& h = task.header;
  client::ClientAlgorithm algorithm(comp, trainer_, client::fitConfig(h.fit));
  algorithm.setDeviceUpdate(config_.device_update);
  // What each client trains from: the broadcast model, or with a quantised downlink the whole
  // model decoded from its task when it was not one version behind (the same for all of them).
  server::ModelStore::WholeModelCache whole;
  const auto modelOf = [&](uint64_t id) {
    if (copies_ && server::downlinkMirrored(task.downlink) && h.phase == 0)
      return copies_->sent(id);
    const auto it = held_before_.find(id);
    return task.model.clientModel(it == held_before_.end() ? 0 : it->second, task.downlink, whole);
  };
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < participants.size(); ++i) index[participants[i].id] = i;
  std::vector<uint64_t> mine;
  for (uint64_t id : assignment_.per_worker.at(static_cast<size_t>(coll_.rank())))
    if (index.count(id)) mine.push_back(id);
  // In id order: the worker's sums (floats, so order-dependent) follow which clients it has, not
  // the order the scheduler listed them in (a one-worker run then adds updates as an in-process
  // fleet that takes its clients by id does; a real root adds them as they arrive).
  std::sort(mine.begin(), mine.end());
  uint64_t work = 0;
  // Secure aggregation on several workers: the masked inputs go to every worker's engine in
  // batches, as many on every worker (each knows the others' shares of the phase).
  const bool pooled = task.secure && coll_.size() > 1;
  std::vector<std::pair<uint64_t, std::vector<uint8_t>>> pending;
  std::map<uint64_t, ClientState> pending_states;
  size_t per_batch = 1, batches = 0, sent_batches = 0;
  if (pooled && !participants.empty()) {
    std::vector<Metric> declared;
    for (const auto& m : h.metrics) declared.push_back(Metric{m, 1.0});
    // A client's masked input, and its state held beside it until its verdict (an error-feedback
    // residual is the model's size whatever the compressor sends): the same estimate everywhere.
    const uint64_t client_bytes = task.secure->maskedBytes(participants[0].id, declared) +
                                  4 * uint64_t{trainer_.layout().numel()};
    const uint64_t per_worker = config_.secure_batch_bytes / static_cast<uint64_t>(coll_.size());
    per_batch = static_cast<size_t>(std::max<uint64_t>(1, per_worker / client_bytes));
    for (const auto& ids : assignment_.per_worker) {
      size_t n = 0;
      for (uint64_t id : ids) n += index.count(id);
      batches = std::max(batches, (n + per_batch - 1) / per_batch);
    }
  }
  const auto t_start = Steady::now();
  // Each stage's time (PhaseCounts::Stage), lap by lap.
  auto mark = t_start;
  const auto elapsed = [&mark] {  // microseconds since the last lap
    const uint64_t us = microsSince(mark);
    mark = Steady::now();
    return us;
  };
  const auto lap = [&](PhaseCounts::Stage s) { counts.stage(s) += elapsed(); };
  const auto flush = [&] {
    mark = Steady::now();
    replyMasked(*task.secure, pending, index, counts);
    lap(PhaseCounts::kAggregate);
    for (auto& [id, st] : pending_states)
      if (counts.outcome(index.at(id)) == PhaseCounts::kCompleted) {
        store_.store(id, st);
        if (h.phase == 0) work += clients_.shards.examples(id) * h.fit.epochs;
        ++trained_;
      }
    lap(PhaseCounts::kStore);
    pending.clear();
    pending_states.clear();
    ++sent_batches;
  };
  size_t at = 0;
  for (uint64_t id : mine) {
    if (pooled && at > 0 && at % per_batch == 0) flush();
    ++at;
    mark = Steady::now();
    const client::DataView data{clients_.train, clients_.shards.shard(id, shard_)};
    try {
      store_.load(id, state_);
      lap(PhaseCounts::kLoad);
    } catch (const IoError& e) {  // its stored state does not read back: it fails this round
      std::fprintf(stderr, "starling-sim: client %llu fails round %llu: %s\n",
                   static_cast<unsigned long long>(id), static_cast<unsigned long long>(h.round),
                   e.what());
      counts.outcome(index[id]) = PhaseCounts::kFailed;
      continue;
    }
    try {
      const client::TurnRequest turn{task.broadcast, modelOf(id), h.metrics, 1, h.control};
      const double fit_before = algorithm.fitSeconds();
      client::PhaseResult res = algorithm.takeTurn(turn, id, data, state_);
      const uint64_t size = pr::encodedSize(res.update);
      // The turn: its fit's time, and the rest (the update formed, compressed, encoded).
      const uint64_t turn_us = elapsed(),
                     fit_us = std::min(turn_us, static_cast<uint64_t>(
                                                    (algorithm.fitSeconds() - fit_before) * 1e6));
      counts.stage(PhaseCounts::kTrain) += fit_us;
      counts.stage(PhaseCounts::kUpdate) += turn_us - fit_us;
      counts.size(index[id]) = size;
      if (held) {
        held->push_back(Held{id, index[id], size, std::move(res.update), std::move(state_)});
        state_ = ClientState(trainer_.layout().fingerprint());
      } else if (task.secure) {
        // Its update on the round's shared support, clipped and masked by its own side; what it
        // sends is the masked input (refused: the client fails, its state as it was).
        const std::vector<float> x = client::secureInput(
            trainer_.layout(), comp, task.broadcast.context(id), res.update.tensors);
        // Rounded by a key from the run seed: the simulated run is a function of its seed (the
        // sum in the ring is the roundings' alone; the masks cancel exactly).
        // (A later phase's, two-phase powersgd's phase Q, from a key of its own.)
        const privacy::Key32 rounding = privacy::publicKey(
            "starling sim secagg rounding " + std::to_string(id) +
                (h.phase == 0 ? std::string() : " phase " + std::to_string(h.phase)),
            h.run_seed, h.round);
        try {
          const std::vector<uint8_t> masked =
              parties_.at(id).mask(task.secure->request(server::SecureStage::kMaskedInput, id), x,
                                   res.update.metrics, &rounding);
          counts.size(index[id]) = masked.size();
          counts.uplink() += masked.size();
          if (pooled) {  // its verdict, and its state's storing, after the batch's replies
            pending.emplace_back(id, masked);
            pending_states.emplace(id, std::move(state_));
            state_ = ClientState(trainer_.layout().fingerprint());
            lap(PhaseCounts::kAggregate);  // its masking
            continue;
          }
          task.secure->reply(server::SecureStage::kMaskedInput, id, masked);
          lap(PhaseCounts::kAggregate);
        } catch (const InputError&) {  // its side or the server's refused: it drops out
          counts.outcome(index[id]) = PhaseCounts::kFailed;
          continue;
        }
        store_.store(id, state_);
        lap(PhaseCounts::kStore);
      } else {
        counts.uplink() += size;
        agg.add(cz::view(res.update), aggregation::ClientLimits{data.size()});
        lap(PhaseCounts::kAggregate);
        store_.store(id, state_);
        lap(PhaseCounts::kStore);
      }
      counts.outcome(index[id]) = PhaseCounts::kCompleted;
      if (h.phase == 0) work += data.size() * h.fit.epochs;
      ++trained_;
    } catch (const InvalidArgument&) {  // a refused update, or a compressor's refusal
      counts.outcome(index[id]) = PhaseCounts::kFailed;
    } catch (const client::DivergenceError&) {
      counts.outcome(index[id]) = PhaseCounts::kFailed;
    }
  }
  if (pooled)
    while (sent_batches < batches) flush();
  const double seconds = std::chrono::duration<double>(Steady::now() - t_start).count();
  counts.work(coll_.rank()) = work;
  counts.micros(coll_.rank()) = static_cast<uint64_t>(seconds * 1e6);
}

// Global aggregation: every worker ends with the whole phase, or, in the last phase of a sharded
// step, with the head whole and its shard of the dense sum.
void SimFleet::reduceGlobal(const server::PhaseTask& task, const cz::Compressor& comp,
                            aggregation::PhaseAggregator& agg) {
  const std::span<float> buf = agg.partial().buffer();
  if (config_.sharded_step && coll_.size() > 1 && task.header.phase + 1 == comp.phases()) {
    const size_t head = agg.partial().layout().denseOffset();
    coll_.allReduceSum(buf.first(head));
    const std::span<float> dense = buf.subspan(head);
    coll_.reduceScatterSum(dense);
    const auto [lo, hi] = coll_.shard(dense.size());
    std::fill(dense.begin(), dense.begin() + static_cast<std::ptrdiff_t>(lo), 0.0f);
    std::fill(dense.begin() + static_cast<std::ptrdiff_t>(hi), dense.end(), 0.0f);
  } else {
    coll_.allReduceSum(buf);
  }
}

uint64_t SimFleet::agreeNonce(uint64_t mine) {
  if (coll_.size() == 1) return mine;
  std::vector<uint8_t> out;
  ByteWriter(out).u64(mine);
  const auto all = allGatherBytes(coll_, out);
  ByteReader r(all.at(0), "the first worker's nonce");
  const uint64_t first = r.u64();
  r.finish();
  return first;
}

bool SimFleet::ownsSecure(uint64_t id) const {
  if (coll_.size() == 1) return true;
  const auto it = secure_owner_.find(id);
  return it != secure_owner_.end() && it->second == coll_.rank();
}

void SimFleet::replyMasked(server::SecureSteps& round,
                           std::vector<std::pair<uint64_t, std::vector<uint8_t>>>& mine,
                           const std::map<uint64_t, size_t>& index, PhaseCounts& counts) {
  const std::vector<std::vector<uint8_t>> all = allGatherBytes(coll_, packMessages(mine));
  for (size_t r = 0; r < all.size(); ++r) {
    for (const auto& [id, bytes] :
         unpackMessages(all[r], "worker " + std::to_string(r) + "'s masked inputs")) {
      bool taken = true;
      try {
        round.reply(server::SecureStage::kMaskedInput, id, bytes);
      } catch (const InputError&) {  // refused: it drops out (on every worker alike)
        taken = false;
      } catch (const InvalidArgument&) {
        taken = false;
      }
      if (static_cast<int>(r) == coll_.rank())
        counts.outcome(index.at(id)) = taken ? PhaseCounts::kCompleted : PhaseCounts::kFailed;
    }
  }
}

server::PhaseReport SimFleet::runPhase(const server::PhaseTask& task,
                                       std::span<const server::ClientInfo> participants,
                                       size_t target, aggregation::PhaseAggregator& agg) {
  server::PhaseReport rep;
  const pr::TaskMsg& h = task.header;
  const cz::Compressor& comp = compressor(h.compressor);
  PhaseBytes bytes = phaseBytes(task, participants, comp);
  const bool later = h.phase != 0 && assignment_round_ == h.round;
  // STC's sizes are known once its updates are made: every participant trains first. When the
  // clock cannot turn anyone away (no deadline, no over-commitment, no windows of time) the updates
  // go into the aggregate as they are made; otherwise each waits, with its state, until the clock
  // has decided (memory: this worker's share of the phase's states).
  const bool measure = !later && comp.updateSizeVaries();
  const bool everyone = target >= participants.size() && !(config_.deadline_seconds > 0) &&
                        !clients_.devices.hasWindows();
  // Per participant its outcome and its update's bytes, and each worker's training: summed over
  // the workers.
  PhaseCounts counts(participants.size(), coll_.size());
  std::set<uint64_t> failed;
  std::vector<Held> held;
  // (A later phase keeps phase 0's assignment: under secure aggregation each client's side of
  // the round's exchanges stays where phase 0 placed it, SimFleet::exchange.)
  if (later) {
    rep.sim_seconds = laterPhaseSeconds(participants, bytes);
  } else if (!measure) {
    failed = timeClients(task, participants, target, bytes, rep);
    std::vector<uint64_t> accepted;
    for (const auto& c : participants)
      if (!failed.count(c.id)) accepted.push_back(c.id);
    if (task.secure && coll_.size() > 1) {
      // Each client trains and masks where its side of the round lives.
      assignment_ = Assignment{};
      assignment_.per_worker.resize(static_cast<size_t>(coll_.size()));
      for (uint64_t id : accepted)
        assignment_.per_worker.at(static_cast<size_t>(secure_owner_.at(id))).push_back(id);
      assignment_round_ = h.round;
      migrateStates();
    } else {
      assign(std::move(accepted), h.fit.epochs, h.round);
    }
  } else {
    std::vector<uint64_t> ids;
    for (const auto& c : participants) ids.push_back(c.id);
    assign(std::move(ids), h.fit.epochs, h.round);
    trainMine(task, participants, comp, agg, counts, everyone ? nullptr : &held);
    allReduceCounts(counts.values);
    for (size_t i = 0; i < participants.size(); ++i)
      if (counts.outcome(i) == PhaseCounts::kCompleted) bytes.up[i] = counts.size(i);
    failed = timeClients(task, participants, target, bytes, rep);
  }
  clock_ += rep.sim_seconds.value_or(0.0);  // the same on every worker
  // A wait for the first client to come online (waitForClients) is part of the round.
  if (wait_ > 0) rep.sim_seconds = rep.sim_seconds.value_or(0.0) + wait_;
  wait_ = 0.0;
  if (!measure) {
    trainMine(task, participants, comp, agg, counts);
  } else if (!everyone) {
    // The accepted ones, in id order as trainMine's; a straggler's state stays as it was. An
    // update the aggregator refuses was sent: its bytes count, as in the other path.
    PhaseCounts added(participants.size(), coll_.size());
    for (Held& c : held) {
      if (failed.count(c.id)) continue;
      added.uplink() += c.bytes;
      const auto t0 = Steady::now();
      try {
        agg.add(cz::view(c.update), aggregation::ClientLimits{clients_.shards.examples(c.id)});
      } catch (const InvalidArgument&) {
        added.outcome(c.index) = PhaseCounts::kFailed;
        continue;
      }
      added.stage(PhaseCounts::kAggregate) += microsSince(t0);
      const auto t1 = Steady::now();
      store_.store(c.id, c.state);
      added.stage(PhaseCounts::kStore) += microsSince(t1);
      added.outcome(c.index) = PhaseCounts::kCompleted;
    }
    held.clear();
    allReduceCounts(added.values);
    for (size_t i = 0; i < participants.size(); ++i)
      if (counts.outcome(i) != PhaseCounts::kFailed) counts.outcome(i) = added.outcome(i);
    counts.uplink() = added.uplink();
    for (size_t s = 0; s < server::kStages; ++s) counts.stage(s) += added.stage(s);
  }
  reduceGlobal(task, comp, agg);
  if (!measure) allReduceCounts(counts.values);

  for (size_t i = 0; i < participants.size(); ++i) {
    if (counts.outcome(i) == PhaseCounts::kCompleted)
      rep.completed.push_back(participants[i].id);
    else if (counts.outcome(i) == PhaseCounts::kFailed)
      failed.insert(participants[i].id);
  }
  rep.failed.assign(failed.begin(), failed.end());
  rep.uplink_bytes = counts.uplink();
  rep.downlink_bytes = std::accumulate(bytes.down.begin(), bytes.down.end(), uint64_t{0});
  double makespan = 0.0;
  for (int w = 0; w < coll_.size(); ++w) {
    const double sec = static_cast<double>(counts.micros(w)) * 1e-6;
    makespan = std::max(makespan, sec);
    if (h.phase == 0) cost_.observe(w, counts.work(w), 1, sec);  // identical on every worker
  }
  rep.makespan_seconds = makespan;
  for (size_t s = 0; s < server::kStages; ++s)
    rep.stage_seconds.push_back(static_cast<double>(counts.stage(s)) * 1e-6);
  return rep;
}

server::PhaseReport SimFleet::exchange(server::SecureStage stage, server::SecureSteps& round,
                                       std::span<const server::ClientInfo> participants,
                                       uint32_t /*deadline_ms: the simulated clock's own*/) {
  server::PhaseReport rep;
  double waited = 0.0;
  // A later phase's exchange of the same round (two-phase PowerSGD's Q) keeps each client's side
  // where it was: its party remembers its masked input of the phase before, which that setup
  // requires, and its state is there.
  const bool later_exchange = stage == server::SecureStage::kAdvertise &&
                              round.round() == secure_round_ && !secure_owner_.empty();
  if (stage == server::SecureStage::kAdvertise) secure_round_ = round.round();
  if (stage == server::SecureStage::kAdvertise && !later_exchange) {
    parties_.clear();
    // Each participant's side lives on one worker for the round: the one holding its state while
    // that worker has fewer than its share (no state moves), the others each to the worker with
    // the fewest (the lowest rank of those). The same on every worker.
    secure_owner_.clear();
    std::vector<uint64_t> ids;
    for (const auto& c : participants) ids.push_back(c.id);
    std::sort(ids.begin(), ids.end());
    const auto workers = static_cast<size_t>(coll_.size());
    const size_t cap = (ids.size() + workers - 1) / workers;
    std::vector<size_t> owned(workers, 0);
    std::vector<uint64_t> rest;
    for (uint64_t id : ids) {
      const auto home = home_.find(id);
      if (home != home_.end() && owned[static_cast<size_t>(home->second)] < cap) {
        secure_owner_[id] = home->second;
        ++owned[static_cast<size_t>(home->second)];
      } else {
        rest.push_back(id);
      }
    }
    for (uint64_t id : rest) {
      const auto w =
          static_cast<size_t>(std::min_element(owned.begin(), owned.end()) - owned.begin());
      secure_owner_[id] = static_cast<int>(w);
      ++owned[w];
    }
  }
  if (stage == server::SecureStage::kAdvertise) {
    // A wait for the first client to come online (waitForClients) is part of the round.
    waited = wait_;
    wait_ = 0.0;
  }
  // Each worker's own participants answer (an empty answer: the client refused the request).
  std::map<uint64_t, std::vector<uint8_t>> answers;
  std::vector<size_t> request_bytes(participants.size());
  for (size_t i = 0; i < participants.size(); ++i) {
    const uint64_t id = participants[i].id;
    const std::vector<uint8_t> req = round.request(stage, id);
    request_bytes[i] = req.size();
    if (!ownsSecure(id)) continue;
    std::vector<uint8_t>& answer = answers[id];
    try {
      if (stage == server::SecureStage::kAdvertise) {
        answer = parties_
                     .try_emplace(id, id,
                                  authority_ ? simTrust(*authority_, config_.seed, id)
                                             : client::SecAggTrust{})
                     .first->second.setup(req);
      } else {
        client::SecureParty& party = parties_.at(id);
        switch (stage) {                         // no default: a new step is a -Wswitch error here
          case server::SecureStage::kAdvertise:  // above
          case server::SecureStage::kMaskedInput:  // runPhase's, never exchanged
            break;
          case server::SecureStage::kShareKeys:
            answer = party.shareKeys(req);
            break;
          case server::SecureStage::kSurvivors:
            answer = party.signSurvivors(req);
            break;
          case server::SecureStage::kUnmask:
            answer = party.unmask(req);
            break;
        }
      }
    } catch (const Error&) {  // the client refused the request (InputError, InvalidArgument)
      answer.clear();
    }
  }
  if (coll_.size() > 1) {
    const std::vector<std::pair<uint64_t, std::vector<uint8_t>>> mine(answers.begin(),
                                                                      answers.end());
    answers.clear();
    for (const auto& theirs : allGatherBytes(coll_, packMessages(mine)))
      for (auto& [id, bytes] : unpackMessages(theirs, "a worker's secure-aggregation answers"))
        answers[id] = std::move(bytes);
  }
  // Every worker takes every answer, in the participants' order.
  double longest = 0.0;
  for (size_t i = 0; i < participants.size(); ++i) {
    const auto& c = participants[i];
    rep.downlink_bytes += request_bytes[i];
    const std::vector<uint8_t>& answer = answers.at(c.id);
    if (answer.empty()) {
      rep.failed.push_back(c.id);
      continue;
    }
    const ClientTiming t =
        timeClient(clients_.devices[c.id], c.id, c.num_examples, 0,
                   config_.reference_seconds_per_example, request_bytes[i], answer.size());
    if (!clients_.devices.onlineAt(c.id, clock_ + t.total()) ||
        (config_.deadline_seconds > 0 && t.total() > config_.deadline_seconds)) {
      rep.failed.push_back(c.id);
      continue;
    }
    longest = std::max(longest, t.total());
    rep.uplink_bytes += answer.size();
    try {
      round.reply(stage, c.id, answer);
      rep.completed.push_back(c.id);
    } catch (const Error&) {  // refused (InputError, InvalidArgument): it drops out
      ++rep.refused;
      rep.failed.push_back(c.id);
    }
  }
  // A step with a client that never answers lasts until the deadline, as at a root.
  if (!rep.failed.empty() && config_.deadline_seconds > 0) longest = config_.deadline_seconds;
  clock_ += longest;
  rep.sim_seconds = waited + longest;
  rep.makespan_seconds = 0.0;
  return rep;
}

uint32_t SimFleet::stepShards() const {
  return config_.sharded_step ? static_cast<uint32_t>(coll_.size()) : 1;
}

void SimFleet::gatherModel(std::span<float> model) {
  STARLING_ENFORCE(config_.sharded_step, "gatherModel without the sharded step");
  coll_.allGather(model);
}

// The fleet's part of the checkpoint: version 6 | u32 workers | u64 count, then (client, model
// version held) pairs (what delta downlinks cost), then f64 the simulated clock (version 4; the
// devices' windows of time follow it), the devices' fingerprint (5), and u8 whether the clients'
// copies of a mirrored downlink follow, then them (6: server::ClientCopies::write). Versions 1 and
// 2 had a SCAFFOLD flag and c after the worker count (the simulator kept c before the round engine
// did): read without SCAFFOLD.
std::vector<uint8_t> SimFleet::saveState() const {
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  w.u32(6);
  w.u32(static_cast<uint32_t>(coll_.size()));
  w.u64(held_.size());
  for (const auto& [id, v] : held_) {
    w.u64(id);
    w.u64(v);
  }
  w.f64(clock_);
  w.u64(clients_.devices.fingerprint());  // version 5
  w.u8(copies_ ? 1 : 0);                  // version 6
  if (copies_) copies_->write(w);
  return bytes;
}

void SimFleet::restoreState(std::span<const uint8_t> bytes) {
  ByteReader r(bytes, "the simulator's state in the checkpoint");
  const uint32_t version = r.u32();
  if (version < 1 || version > 6) r.fail("version ", version, " is not 1 to 6");
  // Clients' states are where the run's workers left them (homes): the same workers must go on.
  if (const uint32_t w = r.u32(); w != static_cast<uint32_t>(coll_.size()))
    r.fail("the run had ", w, " worker(s), this one has ", coll_.size(),
           ": resume with as many workers");
  if (version <= 2 && r.u8() != 0)
    r.fail(
        "it was written by a SCAFFOLD run of an older build, whose simulator kept the control "
        "variate itself: it cannot resume here; start the run again");
  std::map<uint64_t, uint64_t> held;
  if (version >= 2) {
    const uint64_t n = r.u64();
    if (n > r.remaining() / 16)
      r.fail("claims ", n, " held model versions, only ", r.remaining(), " bytes left");
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t id = r.u64();
      held[id] = r.u64();
    }
  }
  double clock = 0.0;
  if (version >= 4) {
    clock = r.f64();
    if (!(clock >= 0.0) || !std::isfinite(clock))
      r.fail("its simulated clock ", clock, " is not a time");
  }
  if (version >= 5 && r.u64() != clients_.devices.fingerprint())
    r.fail(
        "it was written for another device population (devices.*: the speeds, bandwidths and "
        "availability, their seed, or the trace files): resume with the same");
  const uint8_t flag = version >= 6 ? r.u8() : 0;
  if (flag > 1) r.fail("its client copies are marked ", int{flag});
  const bool had_copies = flag == 1;
  if (had_copies != copies_.has_value())
    r.fail(
        had_copies
            ? "it was written by a run with a mirrored downlink (q3-mirror, q2-mirror, stc-mirror)"
            : "it was written by a run without a mirrored downlink",
        ", this one is ", server::downlinkName(config_.downlink),
        ": resume with the run's downlink.mode");
  std::optional<server::ClientCopies> copies;
  if (copies_) {
    copies.emplace(trainer_.layout(), copies_->bits(), copies_->capacity(), copies_->density());
    copies->read(r);
  }
  r.finish();
  // Only a state read whole changes the fleet.
  copies_ = std::move(copies);
  held_ = std::move(held);
  clock_ = clock;
  waited_round_ = 0;  // the next call is a round's first
  wait_ = 0.0;
}

void SimFleet::checkpoint() {
  if (config_.durable_states) store_.flush();
  writeHomes();
  coll_.barrier();  // every worker's states (and optimizer shard) are durable before the checkpoint
}

void SimFleet::writeHomes() const {
  if (config_.homes_file.empty()) return;
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  w.u64(home_.size());
  for (const auto& [id, worker] : home_) {
    w.u64(id);
    w.u32(static_cast<uint32_t>(worker));
  }
  writeFramed(config_.homes_file, kHomesFile, bytes);
}

void SimFleet::migrateStates() {
  struct Move {
    uint64_t client;
    int from, to;
  };
  std::vector<Move> moves;
  for (size_t w = 0; w < assignment_.per_worker.size(); ++w)
    for (uint64_t id : assignment_.per_worker[w]) {
      auto it = home_.find(id);
      if (it != home_.end() && it->second != static_cast<int>(w))
        moves.push_back(Move{id, it->second, static_cast<int>(w)});
      home_[id] = static_cast<int>(w);
    }
  if (moves.empty() || coll_.size() == 1) return;  // the same decision on every worker
  migrated_ += moves.size();
  const int rank = coll_.rank();
  // Every state's size first (one small all-reduce), so that every worker cuts the same batches.
  std::vector<uint64_t> sizes(moves.size(), 0);
  std::vector<uint8_t> blob;
  for (size_t i = 0; i < moves.size(); ++i)
    if (moves[i].from == rank) {
      store_.load(moves[i].client, state_);
      if (state_.size() != 0) state_.saveTo(blob);
      sizes[i] = state_.size() != 0 ? blob.size() : 0;
    }
  allReduceCounts(sizes);
  // Then the states, in batches of at most kMigrationBatchBytes (one state at least), so that the
  // batch, not the number of clients moving, bounds this worker's extra memory: each worker's
  // states of the batch, in move order, to every worker (allGatherBytes: a copy, exact).
  constexpr uint64_t kMigrationBatchBytes = uint64_t{32} << 20;
  std::vector<uint8_t> mine;
  for (size_t begin = 0; begin < moves.size();) {
    size_t end = begin;
    uint64_t bytes = 0;
    while (end < moves.size() && (end == begin || bytes + sizes[end] <= kMigrationBatchBytes))
      bytes += sizes[end++];
    mine.clear();
    for (size_t i = begin; i < end; ++i) {
      if (moves[i].from != rank || sizes[i] == 0) continue;
      store_.load(moves[i].client, state_);
      state_.saveTo(blob);
      STARLING_ENFORCE(blob.size() == sizes[i], "client ", moves[i].client,
                       "'s state changed size while moving");
      mine.insert(mine.end(), blob.begin(), blob.end());
    }
    const std::vector<std::vector<uint8_t>> all = allGatherBytes(coll_, mine);
    std::vector<size_t> at(all.size(), 0);  // how far each sender's bytes are read
    for (size_t i = begin; i < end; ++i) {
      const auto from = static_cast<size_t>(moves[i].from);
      STARLING_ENFORCE(at[from] + sizes[i] <= all[from].size(), "worker ", from, " sent ",
                       all[from].size(), " bytes of states, fewer than due");
      const std::span<const uint8_t> bytes_of(all[from].data() + at[from], sizes[i]);
      at[from] += sizes[i];
      if (moves[i].from == rank) {
        store_.store(moves[i].client,
                     ClientState(trainer_.layout().fingerprint()));  // the sender keeps no copy
        continue;
      }
      if (moves[i].to != rank) continue;
      ClientState st(trainer_.layout().fingerprint());
      if (!bytes_of.empty()) st.loadFrom(bytes_of);
      store_.store(moves[i].client, st);  // an empty state erases a stale copy
    }
    for (size_t r = 0; r < all.size(); ++r)
      STARLING_ENFORCE(at[r] == all[r].size(), "worker ", r, " sent ", all[r].size(),
                       " bytes of states, ", at[r], " were due");
    begin = end;
  }
}

server::EvalReport SimFleet::evaluate(const server::PhaseTask& task, const server::ClientPool&) {
  server::EvalReport ev;
  if (!test_ || test_->size() == 0) return ev;
  const size_t n = test_->size(), workers = static_cast<size_t>(coll_.size()),
               rank = static_cast<size_t>(coll_.rank());
  const size_t lo = n * rank / workers, hi = n * (rank + 1) / workers;
  std::vector<size_t> idx(hi - lo);
  std::iota(idx.begin(), idx.end(), lo);
  std::vector<float> sums(3, 0.0f);
  if (!idx.empty()) {
    const client::EvalResult r =
        trainer_.evaluate(task.model.current(), client::DataView{test_, idx});
    sums = {static_cast<float>(r.loss * static_cast<double>(r.num_examples)),
            static_cast<float>(std::llround(r.accuracy * static_cast<double>(r.num_examples))),
            static_cast<float>(r.num_examples)};
  }
  coll_.allReduceSum(sums);
  ev.examples = static_cast<uint64_t>(sums[2]);
  ev.clients = ev.examples ? 1 : 0;
  if (ev.examples) {
    ev.loss = sums[0] / sums[2];
    ev.accuracy = sums[1] / sums[2];
  }
  return ev;
}

privacy::SigningKeyPair simAuthority(uint64_t run_seed) {
  return privacy::SigningKeyPair::fromSeed(
      privacy::publicKey("starling simulated authority", run_seed, 0));
}

client::SecAggTrust simTrust(const privacy::SigningKeyPair& authority, uint64_t run_seed,
                             uint64_t client) {
  client::SecAggTrust t;
  t.require_signed = true;
  t.authority = authority.public_key;
  t.signer = privacy::SecAggSigner::certified(
      authority, client, privacy::publicKey("starling simulated signing key", run_seed, client));
  return t;
}

}  // namespace starling::simulator
