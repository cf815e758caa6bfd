#include "simulator/async_sim.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include "client/algorithm.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/framed_file.h"
#include "protocol/codec.h"
#include "server/async_engine.h"

namespace starling::simulator {
namespace cz = starling::compression;
namespace pr = starling::protocol;
using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock

namespace {
uint64_t clientsFingerprint(const SimClients& c);  // below, with the checkpoint's format
}  // namespace

void AsyncSimConfig::validate() const {
  if (steps == 0 || steps > 10'000'000)
    STARLING_THROW(ConfigError, "train.rounds (server steps) must be in [1, 10^7], got ", steps);
  if (concurrency == 0 || concurrency > 1'000'000)
    STARLING_THROW(ConfigError, "async.concurrency must be in [1, 10^6], got ", concurrency);
  if (!(round_seconds >= 0.0 && round_seconds <= 1e9))
    STARLING_THROW(ConfigError, "round.deadline_seconds must be in [0, 1e9], got ", round_seconds);
  if (!(reference_seconds_per_example > 0.0))
    STARLING_THROW(ConfigError, "sim.reference_seconds_per_example must be positive");
  if (fit.epochs == 0 || fit.batch_size == 0 || !(fit.lr > 0.0f))
    STARLING_THROW(ConfigError, "train.epochs, train.batch_size and train.lr must be positive");
}

AsyncSimulation::AsyncSimulation(AsyncSimConfig config, const SimClients& clients,
                                 client::Trainer& trainer, ClientStateStore& store,
                                 server::AsyncServer& server, const data::Dataset* test)
    : config_((config.validate(), std::move(config))),
      clients_(clients),
      trainer_(trainer),
      store_(store),
      server_(server),
      test_(test),
      algorithm_(server.scheme().compressor(), trainer, client::fitConfig(config_.fit)),
      picker_(StreamKey{config_.seed, 0, kAnyClient, StreamPurpose::kClientSampling, 2}),
      busy_(clients.shards.size(), 0),
      last_version_(clients.shards.size(), 0),
      held_(clients.shards.size(), 0),
      accepted_(clients.shards.size(), 0),
      state_(trainer.layout().fingerprint()),
      declared_(server.scheme().options().metrics) {
  algorithm_.setDeviceUpdate(config_.device_update);
  STARLING_CHECK_ARG(clients.train != nullptr, "the simulation needs a training set");
  copies_ = server::ClientCopies::forDownlink(trainer.layout(), server.config().downlink,
                                              server.config().density, config_.downlink_copies);
  STARLING_CHECK_ARG(clients.shards.size() == clients.devices.size(), clients.shards.size(),
                     " shards but ", clients.devices.size(), " devices");
  STARLING_CHECK_ARG(trainer.layout().fingerprint() == server.scheme().layout().fingerprint(),
                     "the trainer's model is not the server's");
  // A client trains at most once on a version (a second update from it would be a duplicate), so
  // a step needs K clients with data.
  const uint64_t k = server.config().async.buffer_size;
  uint64_t with_data = 0;
  for (uint64_t c = 0; c < clients.shards.size() && with_data < k; ++c)
    with_data += clients.shards.examples(c) > 0 ? 1 : 0;
  if (config_.round_seconds == 0 && with_data < k)
    STARLING_THROW(ConfigError, "async.buffer_size = ", k, " needs at least ", k,
                   " clients with data (a client trains once per model version); there are ",
                   with_data);
  if (!config_.checkpoint.empty()) clients_fingerprint_ = clientsFingerprint(clients_);
  resume();
}

namespace {
// 3: the device population's fingerprint after the data split's; 4: format 3 in the files' frame
// (core/framed_file.h); 5: a mirrored downlink's client copies at the end (a flag, then them).
constexpr FileFormat kSimFile{0x4d495341 /* "ASIM" */,
                              "checkpoint of an asynchronous simulation (round.mode = async or "
                              "semisync)",
                              3, 4, 5};

// What the run's clients are: the training set's size and every shard's indices (FNV-1a over
// their little-endian words, client by client: a drawn pool is never held whole).
uint64_t clientsFingerprint(const SimClients& c) {
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  w.u64(c.train->size());
  uint64_t h = fnv1a(bytes);
  std::vector<size_t> scratch;
  for (uint64_t k = 0; k < c.shards.size(); ++k) {
    const std::span<const size_t> shard = c.shards.shard(k, scratch);
    bytes.clear();
    w.u64(shard.size());
    for (size_t i : shard) w.u64(i);
    h = fnv1a(bytes, h);
  }
  return h;
}

// The step a checkpoint file was written at (read from its head: the frame's magic and version,
// then the step, behind the frame's length and checksum from format 4), or nullopt if it is not
// one. The checksum is not checked here: a damaged file is renamed as a whole one would be, and
// its reader (checkpointFields) refuses it saying so, the file kept.
std::optional<uint64_t> stepOf(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  uint8_t head[32];
  if (!in.read(reinterpret_cast<char*>(head), sizeof head)) return std::nullopt;
  ByteReader r(std::span<const uint8_t>(head, sizeof head), path.string());
  if (r.u32() != kSimFile.magic) return std::nullopt;
  const uint32_t version = r.u32();
  if (version < kSimFile.oldest || version > kSimFile.current) return std::nullopt;
  if (version >= kSimFile.framed_since) r.view(16);  // the length and the checksum
  return r.u64();
}
}  // namespace

// A checkpoint's fields after its frame, from the step it was written at on (a reader over them,
// kept by the caller with the bytes).
ByteReader AsyncSimulation::checkpointFields(std::span<const uint8_t> bytes,
                                             const std::string& what) {
  return ByteReader(unframe(kSimFile, bytes, what).payload, what);
}

// A checkpoint is written in two phases around the state store's flush, which records the step
// (its generation): CHECKPOINT.next, then the flush, then the rename over CHECKPOINT. A run killed
// anywhere leaves a checkpoint and a store of one step: before the flush the old pair (the .next
// is dropped here), after it the new one (the rename is finished here). A checkpoint whose step is
// not the store's is refused: its clients' states would not be the ones it expects.
//
// The first worker's store holds the states: it settles the pair and reads the checkpoint
// (settledCheckpoint). With several workers it then sends every worker the checkpoint's bytes, or
// its refusal, so that each refuses with the first worker's reason rather than failing in the
// next collective (no shared file system needed, and no file that the first worker may replace
// before a slower worker reads it).
void AsyncSimulation::resume() {
  if (config_.checkpoint.empty()) return;
  const bool several = config_.workers && config_.workers->size() > 1;
  std::vector<uint8_t> bytes;
  std::exception_ptr refused;
  if (lead()) {
    try {
      bytes = settledCheckpoint();
    } catch (const std::exception& e) {
      if (!several) throw;
      refused = std::current_exception();
      const std::string_view why = e.what();
      bytes.assign(why.begin(), why.end());
    }
    bytes.push_back(refused ? 1 : 0);  // the verdict, last
  }
  if (several) {
    std::vector<uint8_t> first;
    try {
      first = std::move(allGatherBytes(*config_.workers, bytes)[0]);
    } catch (...) {
      if (refused) std::rethrow_exception(refused);  // its reason, not the gather's failure
      throw;
    }
    if (!lead()) bytes = std::move(first);
  }
  if (refused) std::rethrow_exception(refused);
  if (bytes.empty() || bytes.back() > 1)
    STARLING_THROW(IoError, "checkpoint ", config_.checkpoint,
                   ": the first worker sent no verdict on resuming");
  const bool ok = bytes.back() == 0;
  bytes.pop_back();
  if (!ok)
    STARLING_THROW(IoError, "the first worker cannot resume: ",
                   std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (bytes.empty()) return;
  loadCheckpoint(bytes);
  resumed_ = true;
}

std::vector<uint8_t> AsyncSimulation::settledCheckpoint() {
  const std::filesystem::path path = config_.checkpoint, next = config_.checkpoint + ".next";
  const uint64_t generation = store_.generation();
  if (std::filesystem::exists(next)) {
    if (generation != 0 && stepOf(next) == generation)
      renameDurable(next, path);
    else
      std::filesystem::remove(next);
  }
  if (!std::filesystem::exists(path)) {
    if (generation != 0)
      STARLING_THROW(IoError, "the client-state store ", store_.spillDir().string(),
                     " holds the states of step ", generation, ", and the checkpoint ",
                     config_.checkpoint,
                     " is missing: restore it, or remove the store's folder to start over");
    return {};
  }
  std::vector<uint8_t> bytes = readFile(path, uint64_t{64} << 30);
  ByteReader r = checkpointFields(bytes, "checkpoint " + config_.checkpoint);
  if (const uint64_t step = r.u64(); step != generation)
    r.fail("it was written at step ", step, ", and the client-state store ",
           store_.spillDir().string(), " holds the states of ",
           generation == 0 ? "no step" : "step " + std::to_string(generation),
           ": they are of another run (restore the folder written with it)");
  return bytes;
}

// The configuration a run must resume with, then the server, then the simulation's own state.
std::vector<uint8_t> AsyncSimulation::checkpointBytes(const std::string& record) const {
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  w.u64(server_.steps());
  w.u64(clients_.shards.size());
  w.u64(clients_fingerprint_);
  w.u64(clients_.devices.fingerprint());
  w.u64(config_.concurrency);
  w.f64(config_.round_seconds);
  w.u64(config_.seed);
  w.f64(config_.reference_seconds_per_example);
  w.u32(config_.fit.epochs);
  w.u32(config_.fit.batch_size);
  w.f32(config_.fit.lr);
  w.f32(config_.fit.prox_mu);
  w.u64(server_.config().async.buffer_size);
  w.u32(static_cast<uint32_t>(server_.config().downlink));
  w.str(record);
  std::vector<uint8_t> server;
  ByteWriter ws(server);
  server_.save(ws);
  w.u64(server.size());
  w.bytes(server.data(), server.size());
  w.f64(now_);
  w.u64(trained_);
  picker_.save(w);
  for (size_t c = 0; c < busy_.size(); ++c) {
    w.u64(last_version_[c]);
    w.u64(held_[c]);
    w.u64(accepted_[c]);
  }
  w.u64(in_flight_.size());
  for (const auto& [key, job] : in_flight_) {
    w.f64(key.first);
    w.u64(key.second);
    w.u64(job.version);
    w.u64(job.down);
    w.u64(job.up);
    w.u8(job.update ? 1 : 0);
    if (job.update) {
      const std::vector<uint8_t> u = pr::encodeUpdate(*job.update);
      w.u64(u.size());
      w.bytes(u.data(), u.size());
    }
  }
  w.u8(copies_ ? 1 : 0);  // format 5
  if (copies_) copies_->write(w);
  return bytes;
}

// Everything is checked before anything changes: the server is loaded into a copy first.
void AsyncSimulation::loadCheckpoint(std::span<const uint8_t> bytes) {
  const std::string what = "checkpoint " + config_.checkpoint;
  const Unframed file = unframe(kSimFile, bytes, what);
  ByteReader r(file.payload, what);
  const uint64_t step = r.u64();  // the first worker checked it against its store
  const uint64_t n = clients_.shards.size();
  const auto same = [&](auto saved, auto now, const char* key) {
    if (saved != now) r.fail("it was written with ", key, " = ", saved, ", this run has ", now);
  };
  same(r.u64(), n, "data.num_clients");
  if (r.u64() != clients_fingerprint_)
    r.fail(
        "it was written for another data split (data.*: the training set, the partition or "
        "its seed)");
  if (r.u64() != clients_.devices.fingerprint())
    r.fail(
        "it was written for another device population (devices.*: the speeds, bandwidths and "
        "availability, their seed, or the trace files)");
  same(r.u64(), config_.concurrency, "async.concurrency");
  same(r.f64(), config_.round_seconds, "round.deadline_seconds (0: round.mode = async)");
  same(r.u64(), config_.seed, "model.seed");
  same(r.f64(), config_.reference_seconds_per_example, "sim.reference_seconds_per_example");
  same(r.u32(), config_.fit.epochs, "train.epochs");
  same(r.u32(), config_.fit.batch_size, "train.batch_size");
  same(r.f32(), config_.fit.lr, "train.lr");
  same(r.f32(), config_.fit.prox_mu, "train.prox_mu");
  same(r.u64(), server_.config().async.buffer_size, "async.buffer_size");
  same(r.u32(), static_cast<uint32_t>(server_.config().downlink), "downlink.mode (as a number)");
  std::string record = r.str(1 << 20);
  const std::span<const uint8_t> server = r.view(r.u64());
  server::AsyncServer copy(std::make_shared<const ParamLayout>(trainer_.layout()), server_.config(),
                           std::vector<float>(trainer_.layout().numel()));
  copy.load(server, what);
  if (copy.steps() != step) r.fail("its server took ", copy.steps(), " steps, not ", step);
  const uint64_t version = copy.version();
  const double now = r.f64();
  if (!(std::isfinite(now) && now >= 0)) r.fail("its clock reads ", now, " s");
  const uint64_t trained = r.u64();
  RngStream picker = picker_;
  picker.load(r);
  std::vector<uint64_t> last_version(n), held(n), accepted(n);
  for (uint64_t c = 0; c < n; ++c) {
    last_version[c] = r.u64();
    held[c] = r.u64();
    accepted[c] = r.u64();
    if (last_version[c] > version || held[c] > version)
      r.fail("client ", c, " holds model version ", std::max(last_version[c], held[c]),
             ", the server's is ", version);
  }
  const uint64_t flying = r.u64();
  if (flying > config_.concurrency)
    r.fail(flying, " clients in flight, more than async.concurrency = ", config_.concurrency);
  std::map<std::pair<double, uint64_t>, InFlight> in_flight;
  std::vector<char> busy(n, 0);
  for (uint64_t i = 0; i < flying; ++i) {
    const double finish = r.f64();
    const uint64_t id = r.u64();
    if (!(std::isfinite(finish) && finish >= now) || id >= n || busy[id])
      r.fail("a client in flight (", id, ", finishing at ", finish, " s) that cannot be");
    busy[id] = 1;
    InFlight job;
    job.version = r.u64();
    job.examples = clients_.shards.examples(id);
    job.down = r.u64();
    job.up = r.u64();
    if (job.version == 0 || job.version > version)
      r.fail("client ", id, " trains on model version ", job.version, ", the server's is ",
             version);
    const uint8_t has = r.u8();
    if (has > 1) r.fail("client ", id, "'s update is marked ", int{has});
    if (has) {
      const uint64_t len = r.u64();
      const std::span<const uint8_t> u = r.view(len);
      pr::DecodeLimits limits;
      limits.max_bytes = std::max<size_t>(limits.max_bytes, len);
      try {
        job.update = pr::decodeUpdate(u, trainer_.layout(), nullptr, limits);
      } catch (const InputError& e) {
        r.fail("client ", id, "'s update in flight does not decode: ", e.what());
      }
      if (job.update->header.round != job.version || job.update->header.client_id != id)
        r.fail("client ", id, "'s update in flight is of client ", job.update->header.client_id,
               " and version ", job.update->header.round);
    }
    in_flight.emplace(std::pair{finish, id}, std::move(job));
  }
  // (The downlink's mode was checked above: a format 4 file is of a run without copies.)
  std::optional<server::ClientCopies> copies;
  const uint8_t has_copies = file.version >= 5 ? r.u8() : 0;
  if (has_copies > 1) r.fail("its client copies are marked ", int{has_copies});
  if (has_copies) {
    if (!copies_) r.fail("it holds a mirrored downlink's client copies, and this run keeps none");
    copies.emplace(trainer_.layout(), copies_->bits(), copies_->capacity(), copies_->density());
    copies->read(r);
    for (uint64_t id : copies->ids())
      if (id >= n || copies->versionOf(id) != held[id])
        r.fail("client ", id, "'s copy is of version ", copies->versionOf(id),
               ", and the client holds ", id < n ? held[id] : 0);
  } else if (copies_ && file.version >= 5) {
    r.fail("it holds no client copies, and this run's downlink keeps them");
  }
  r.finish();
  server_.load(server, what);  // checked above, on the copy
  now_ = now;
  last_step_ = now;  // a checkpoint is taken at a step
  trained_ = trained;
  window_ = Window{};
  picker_ = picker;
  busy_ = std::move(busy);
  last_version_ = std::move(last_version);
  held_ = std::move(held);
  accepted_ = std::move(accepted);
  in_flight_ = std::move(in_flight);
  if (copies) copies_ = std::move(copies);
  completeMetrics(step, record);
}

// A run killed after its checkpoint and before the step's metrics line (or in the middle of it)
// gets the line from the checkpoint: a partial last line is cut, and the step's record appended
// unless the file already ends with it.
void AsyncSimulation::completeMetrics(uint64_t step, const std::string& record) const {
  if (lead()) server::MetricsLog(config_.metrics_file).complete(step, record);
}

// The task of the current version for a client that holds version `held` (0: none), in the
// server's downlink encoding: a dense or fp16 task has one size, a delta or top-k one depends on
// what the client holds (one encoding per version held, as a root caches them).
uint64_t AsyncSimulation::taskBytes(uint64_t held, const server::PhaseTask& task) {
  const uint64_t v = server_.version();
  const server::Downlink mode = server_.config().downlink;
  const bool per_held = server::downlinkPerHeld(mode);
  if (task_version_ != v) {
    task_bytes_.clear();
    task_version_ = v;
  }
  const uint64_t key = per_held ? held : 0;
  if (const auto it = task_bytes_.find(key); it != task_bytes_.end()) return it->second;
  // The engine's task of the version (no deadline on the simulated clock: round.deadline_seconds
  // is not a task's).
  const uint64_t bytes = server::encodeTask(task, key).size();
  task_bytes_.emplace(key, bytes);
  return bytes;
}

// The bytes of client `id`'s update, before it is made (phaseZeroUpdateBytes, sim_fleet.h): one
// size for every client but client 0, whose id is left out of its messages.
uint64_t AsyncSimulation::updateBytes(uint64_t id) {
  uint64_t& bytes = update_bytes_[id == 0 ? 0 : 1];
  if (bytes == 0)
    bytes = phaseZeroUpdateBytes(trainer_.layout(), server_.scheme().compressor(),
                                 server_.broadcast(server_.version()), declared_, false,
                                 id == 0 ? 0 : 1);
  return bytes;
}

// Its time from its start to its finish with `up` bytes of update (simulator/device_model.h).
double AsyncSimulation::timeOf(const Waiting& w, uint64_t up) const {
  return timeClient(clients_.devices[w.id], w.id, w.job.examples, config_.fit.epochs,
                    config_.reference_seconds_per_example, w.job.down, up)
      .total();
}

namespace {
void clientFails(uint64_t id, const std::string& why) {
  std::fprintf(stderr, "starling-sim: client %llu fails: %s\n", static_cast<unsigned long long>(id),
               why.c_str());
}
}  // namespace

// The client downloads the current version and waits to train on it (trainWaiting): its update
// is held until its simulated finish. A client offline by then (the devices' windows of time) is a
// dropout: it is not trained and its state is left as it was; it may try again on this version if
// one of its windows is long enough for its training.
void AsyncSimulation::startClient(uint64_t id, server::AsyncIntake& in) {
  const uint64_t v = server_.version();
  Waiting w;
  w.id = id;
  w.start = now_;
  w.held_before = held_[id];
  w.job.version = v;
  w.job.examples = clients_.shards.examples(id);
  if (copies_) {
    // A mirrored downlink: its task against its own copy, which it trains from (kept with it: the
    // copies may drop it before it trains).
    w.job.down =
        server::encodeTask(in.task(), copies_->encode(id, held_[id], server_.model().current(), v))
            .size();
    const std::span<const float> copy = copies_->sent(id);
    w.model.assign(copy.begin(), copy.end());
  } else {
    w.job.down = taskBytes(held_[id], in.task());
  }
  held_[id] = v;  // it downloads the version (a dropout too)
  w.previous = last_version_[id];
  busy_[id] = 1;
  last_version_[id] = v;
  in.started(w.job.down);
  // Offline by its finish: known now, unless the update's size varies (then once it is trained,
  // by its own bytes: finishesOffline).
  if (clients_.devices.hasWindows() && !server_.scheme().compressor().updateSizeVaries()) {
    const double total = timeOf(w, updateBytes(id));
    if (!clients_.devices.onlineAt(id, now_ + total)) {
      mayRetry(w, total);
      in_flight_.emplace(std::pair{now_ + total, id}, std::move(w.job));  // arrives failed
      return;
    }
  }
  // A failed client still takes its download and its compute time before the server notices: the
  // earliest it can finish is with nothing to upload.
  w.earliest = now_ + timeOf(w, 0);
  waiting_.push_back(std::move(w));
}

// Trains the client on the version it started on, from `state` (updated in place; stored by the
// caller only on success). No update: a compressor's refusal or a diverged training.
bool AsyncSimulation::train(Waiting& w, ClientState& state) {
  try {
    const client::DataView data{clients_.train, clients_.shards.shard(w.id, shard_)};
    const compression::PhaseBroadcast broadcast = server_.broadcast(w.job.version);
    const client::TurnRequest turn{
        broadcast,
        copies_ ? std::span<const float>(w.model)
                : server_.model().clientModel(w.held_before, server_.config().downlink, whole_),
        declared_};
    client::PhaseResult res = algorithm_.takeTurn(turn, w.id, data, state);
    w.job.up = pr::encodedSize(res.update);
    w.job.update = std::move(res.update);
    return true;
  } catch (const InvalidArgument&) {  // a compressor's refusal
  } catch (const client::DivergenceError&) {
  }
  return false;
}

// train(), then with `keep` the new state into the store. False (no update, nothing to upload) for
// a refusal, a divergence, or an IoError (the state not kept): the client fails.
bool AsyncSimulation::trainAndKeep(Waiting& w, ClientState& state, bool keep) {
  bool ok = false;
  try {
    ok = train(w, state);
    // A client that drops out keeps its state as it was (its update is sent, to every worker,
    // and dropped where each worker decides the same: takeUpdates, trainWaiting).
    if (ok && keep && !finishesOffline(w)) store_.store(w.id, state);
  } catch (const IoError& e) {
    clientFails(w.id, e.what());
    ok = false;
  }
  if (!ok) {
    w.job.update.reset();
    w.job.up = 0;
  }
  return ok;
}

void AsyncSimulation::arrive(Waiting& w) {
  const double total = timeOf(w, w.job.update ? w.job.up : w.timed_up);
  in_flight_.emplace(std::pair{w.start + total, w.id}, std::move(w.job));
}

// A dropout whose training fits in one of its windows may try this version again.
void AsyncSimulation::mayRetry(const Waiting& w, double total) {
  if (total <= clients_.devices.longestOnline(w.id)) last_version_[w.id] = w.previous;
}

bool AsyncSimulation::finishesOffline(const Waiting& w) const {
  if (!w.job.update || !clients_.devices.hasWindows() ||
      !server_.scheme().compressor().updateSizeVaries())
    return false;
  return !clients_.devices.onlineAt(w.id, w.start + timeOf(w, w.job.up));
}

// As start() drops a client whose finish it knows to fall outside its windows: it fails when it
// would have finished, uploads nothing, and may try this version again if one of its windows is
// long enough. It has trained (clientsTrained counts it, as the synchronous fleet counts a
// straggler it trained).
void AsyncSimulation::dropOut(Waiting& w) {
  mayRetry(w, timeOf(w, w.job.up));
  w.timed_up = w.job.up;
  w.job.update.reset();
  w.job.up = 0;
}

void AsyncSimulation::trainWaiting() {
  if (waiting_.empty()) return;
  if (config_.workers && config_.workers->size() > 1) return trainShared();
  const auto t0 = Steady::now();
  for (Waiting& w : waiting_) {
    if (loadState(w.id, state_) && trainAndKeep(w, state_, true)) ++trained_;
    if (finishesOffline(w)) dropOut(w);
    arrive(w);
  }
  waiting_.clear();
  window_.train_seconds += std::chrono::duration<double>(Steady::now() - t0).count();
}

// The waiting clients on several workers: the first worker sends the states of the clients others
// train, every worker trains its own, and every update (with its new state, for the first worker's
// store) goes to every worker.
void AsyncSimulation::trainShared() {
  const auto t0 = Steady::now();
  Collectives& c = *config_.workers;
  const auto me = static_cast<size_t>(c.rank());
  const std::vector<size_t> owner = placeWaiting(static_cast<size_t>(c.size()));
  const std::vector<uint8_t> states =
      std::move(allGatherBytes(c, me == 0 ? statesToShip(owner) : std::vector<uint8_t>())[0]);
  takeUpdates(owner, allGatherBytes(c, trainMine(owner, me, states)));
  waiting_.clear();
  window_.train_seconds += std::chrono::duration<double>(Steady::now() - t0).count();
}

// Each waiting client's worker: the least loaded by examples, the largest shards first (the same
// choice on every worker).
std::vector<size_t> AsyncSimulation::placeWaiting(size_t world) const {
  const size_t n = waiting_.size();
  std::vector<size_t> order(n), owner(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return waiting_[a].job.examples > waiting_[b].job.examples;
  });
  std::vector<uint64_t> load(world, 0);
  for (size_t i : order) {
    owner[i] = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[owner[i]] += waiting_[i].job.examples;
  }
  return owner;
}

// The client's stored state into `out`; false (the client fails) when it does not read back.
bool AsyncSimulation::loadState(uint64_t id, ClientState& out) {
  try {
    store_.load(id, out);
    return true;
  } catch (const IoError& e) {
    clientFails(id, e.what());
    return false;
  }
}

namespace {
// A client state between workers: its length, then its bytes (none for an empty state).
void putState(ByteWriter& w, const ClientState& st, std::vector<uint8_t>& scratch) {
  scratch.clear();
  if (st.size() != 0) st.saveTo(scratch);
  w.u64(scratch.size());
  w.bytes(scratch.data(), scratch.size());
}
void takeState(ByteReader& r, ClientState& st, uint64_t fingerprint) {
  const std::span<const uint8_t> bytes = r.view(r.u64());
  st = ClientState(fingerprint);
  if (!bytes.empty()) st.loadFrom(bytes);
}
}  // namespace

// The first worker's message: for each client another worker trains, a flag (0: its state did not
// read back) and its state.
std::vector<uint8_t> AsyncSimulation::statesToShip(const std::vector<size_t>& owner) {
  std::vector<uint8_t> out, scratch;
  ByteWriter w(out);
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (owner[i] == 0) continue;
    const bool ok = loadState(waiting_[i].id, state_);
    w.u8(ok ? 1 : 0);
    if (ok) putState(w, state_, scratch);
  }
  return out;
}

// This worker's clients trained: for each, a flag (1: an update), the update's bytes, and from a
// worker other than the first the new state. `states` is the first worker's statesToShip().
std::vector<uint8_t> AsyncSimulation::trainMine(const std::vector<size_t>& owner, size_t me,
                                                std::span<const uint8_t> states) {
  const uint64_t fingerprint = trainer_.layout().fingerprint();
  std::vector<uint8_t> out, scratch;
  ByteWriter w(out);
  ByteReader shipped(states, "the first worker's client states");
  for (size_t i = 0; i < waiting_.size(); ++i) {
    bool readable = false;
    if (owner[i] == 0) {
      if (me != 0) continue;
      readable = loadState(waiting_[i].id, state_);
    } else {  // every worker reads every entry, to reach its own
      readable = shipped.u8() == 1;
      if (readable && owner[i] == me)
        takeState(shipped, state_, fingerprint);
      else if (readable)
        shipped.view(shipped.u64());
    }
    if (owner[i] != me) continue;
    const bool ok = readable && trainAndKeep(waiting_[i], state_, me == 0);
    w.u8(ok ? 1 : 0);
    if (!ok) continue;
    const std::vector<uint8_t> u = pr::encodeUpdate(*waiting_[i].job.update);
    w.u64(u.size());
    w.bytes(u.data(), u.size());
    if (me != 0) putState(w, state_, scratch);
  }
  shipped.finish();
  return out;
}

// Every worker's trainMine(), in order: each update as decoded, on every worker (the trainer too:
// the same checks everywhere; an update that fails them fails its client on every worker, where
// the one-worker run would give it to the server, which refuses it; none is known to, since the
// compressors refuse non-finite values), and the returned states into the first worker's store
// (an IoError there, the store's disk, ends the run: the update went out).
void AsyncSimulation::takeUpdates(const std::vector<size_t>& owner,
                                  const std::vector<std::vector<uint8_t>>& got) {
  const bool first = lead();
  std::vector<ByteReader> from;
  for (size_t r = 0; r < got.size(); ++r)
    from.emplace_back(got[r], "worker " + std::to_string(r) + "'s updates");
  pr::DecodeLimits limits;
  ClientState returned(trainer_.layout().fingerprint());
  for (size_t i = 0; i < waiting_.size(); ++i) {
    Waiting& wt = waiting_[i];
    ByteReader& r = from[owner[i]];
    if (r.u8() == 1) {
      const std::span<const uint8_t> u = r.view(r.u64());
      limits.max_bytes = std::max<size_t>(limits.max_bytes, u.size());
      try {
        wt.job.update = pr::decodeUpdate(u, trainer_.layout(), nullptr, limits);
        wt.job.up = u.size();
      } catch (const InputError& e) {
        clientFails(wt.id, e.what());
        wt.job.update.reset();
        wt.job.up = 0;
      }
      const bool offline = finishesOffline(wt);  // the same on every worker
      if (owner[i] != 0) {
        if (first && !offline) {
          takeState(r, returned, trainer_.layout().fingerprint());
          store_.store(wt.id, returned);
        } else {
          r.view(r.u64());
        }
      }
      if (wt.job.update) ++trained_;
      if (offline) dropOut(wt);
    }
    arrive(wt);
  }
  for (ByteReader& r : from) r.finish();
}

double AsyncSimulation::settleFirstArrival() {
  const auto first = [&] {
    return in_flight_.empty() ? std::numeric_limits<double>::infinity()
                              : in_flight_.begin()->first.first;
  };
  for (const Waiting& w : waiting_)
    if (w.earliest <= first()) {
      trainWaiting();
      break;
    }
  return first();
}

// The first time at or after now when a client that may train on this version (idle, with data,
// not yet trained on it) is online: now or never (infinity) without windows of time, since the
// per-version draws do not change while the version does not.
double AsyncSimulation::nextStart() const {
  double next = std::numeric_limits<double>::infinity();
  const uint64_t v = server_.version();
  for (uint64_t c = 0; c < clients_.shards.size(); ++c) {
    if (busy_[c] || last_version_[c] == v || clients_.shards.examples(c) == 0) continue;
    if (!clients_.devices.hasWindows()) {
      if (online(c)) return now_;
      continue;
    }
    next = std::min(next, clients_.devices.nextOnline(c, now_));
  }
  return next;
}

// Availability: over simulated time with windows (FedScale's traces), else drawn per version.
bool AsyncSimulation::online(uint64_t client) const {
  return clients_.devices.hasWindows()
             ? clients_.devices.onlineAt(client, now_)
             : clients_.devices.available(client, server_.version(), config_.seed);
}

size_t AsyncSimulation::fill(server::AsyncIntake& in) {
  size_t started = 0;
  if (flying() >= config_.concurrency) return started;
  const uint64_t v = server_.version();
  std::vector<uint64_t> idle;
  for (uint64_t c = 0; c < clients_.shards.size(); ++c)
    if (!busy_[c] && last_version_[c] != v && clients_.shards.examples(c) > 0 && online(c))
      idle.push_back(c);
  while (flying() < config_.concurrency && !idle.empty()) {
    const auto k = static_cast<size_t>(picker_.uniform() * static_cast<double>(idle.size()));
    const size_t i = std::min(k, idle.size() - 1);
    const uint64_t id = idle[i];
    idle[i] = idle.back();
    idle.pop_back();
    startClient(id, in);
    ++started;
  }
  return started;
}

std::optional<std::pair<double, double>> AsyncSimulation::evaluate(std::span<const float> model) {
  if (!test_ || test_->size() == 0) return std::nullopt;
  std::vector<size_t> idx(test_->size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  const client::EvalResult r = trainer_.evaluate(model, client::DataView{test_, idx});
  return std::pair{r.loss, r.accuracy};
}

// The first arrival: its update goes to the engine (the server refuses it if too stale or out of
// bounds); the engine steps when K were accepted (FedBuff) or at the round's end
// (semi-synchronous).
void AsyncSimulation::deliver(server::AsyncIntake& in) {
  auto node = in_flight_.extract(in_flight_.begin());
  const uint64_t id = node.key().second;
  InFlight& job = node.mapped();
  busy_[id] = 0;
  if (!job.update) {
    in.failed(id);
    return;
  }
  try {
    const cz::UpdateView u = cz::view(*job.update);
    server::AsyncArrival a;
    a.client = id;
    a.update = &u;
    a.limits = aggregation::ClientLimits{job.examples};
    a.bytes = job.up;
    in.take(a);
    ++accepted_[id];
  } catch (const InputError&) {  // counted by the server (too stale, a bound)
  }
}

size_t AsyncSimulation::start(size_t /*n: C less those in flight*/, server::AsyncIntake& in) {
  const size_t started = fill(in);
  // A semi-synchronous round's clients all start at its start: they train now.
  if (config_.round_seconds > 0) trainWaiting();
  return started;
}

// The event clock: the first arrival (training the waiting clients when one of them might come
// first), or with windows of time in FedBuff a client that comes online before it while fewer
// than C train (the clock moves on to it, and the engine starts it).
server::AsyncEvent AsyncSimulation::next(double until, server::AsyncIntake& in) {
  if (until <= now_) {  // what is due at this instant
    if (!in_flight_.empty() && in_flight_.begin()->first.first == now_) {
      deliver(in);
      return server::AsyncEvent::kTaken;
    }
    return server::AsyncEvent::kNothing;
  }
  if (config_.round_seconds == 0 && clients_.devices.hasWindows() &&
      flying() < config_.concurrency) {
    const double next_start = nextStart();
    if (next_start < settleFirstArrival() && next_start <= until) {
      STARLING_ENFORCE(next_start > now_, "a client online now was not started");
      now_ = next_start;
      return server::AsyncEvent::kNothing;
    }
  }
  const double first = settleFirstArrival();
  if (in_flight_.empty()) {
    // Every client that could train on this version did (or none is available, or will be).
    if (until == kNever) return server::AsyncEvent::kStalled;
    now_ = until;
    return server::AsyncEvent::kNothing;
  }
  if (first > until) {
    now_ = until;
    return server::AsyncEvent::kNothing;
  }
  now_ = first;
  deliver(in);
  return server::AsyncEvent::kTaken;
}

bool AsyncSimulation::canProgress() const {
  return !in_flight_.empty() || !waiting_.empty() ||
         nextStart() < std::numeric_limits<double>::infinity();
}

void AsyncSimulation::record(server::RoundRecord& rec) {
  rec.sim_seconds = now_ - last_step_;
  rec.makespan_seconds = window_.train_seconds;
  last_step_ = now_;
  window_ = Window{};
}

// The checkpoint in two phases around the clients' states (resume()), before the step's metrics
// line.
void AsyncSimulation::stepped(const server::RoundRecord& rec) {
  if (config_.checkpoint.empty()) return;
  const std::string next = config_.checkpoint + ".next";
  writeFramed(next, kSimFile, checkpointBytes(rec.json()));
  store_.flush(server_.steps());
  renameDurable(next, config_.checkpoint);
}

void AsyncSimulation::run(const std::function<void(const server::RoundRecord&)>& progress) {
  server::AsyncEngineConfig ec;
  ec.steps = config_.steps;
  ec.concurrency = config_.concurrency;
  ec.round_seconds = config_.round_seconds;
  ec.wait_for_first_task = false;  // the event clock: every round starts at the previous step
  ec.fit = config_.fit;
  ec.eval_every = config_.eval_every;
  ec.evaluate = [this](std::span<const float> model) { return evaluate(model); };
  ec.metrics = config_.metrics_file;
  ec.lead = lead();
  server::AsyncEngine engine(server_, std::move(ec), this);
  engine.run(*this, progress);
}

}  // namespace starling::simulator
