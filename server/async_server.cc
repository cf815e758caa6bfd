#include "server/async_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/finite.h"
#include "core/framed_file.h"

namespace starling::server {

AsyncServer::AsyncServer(std::shared_ptr<const ParamLayout> layout, AsyncServerConfig config,
                         std::vector<float> initial)
    : config_(std::move(config)),
      scheme_(layout, config_.scheme),
      optimizer_(aggregation::makeServerOptimizer(config_.server_opt, layout->numel())),
      model_(ModelStore::forDownlink(layout, config_.downlink, config_.history, config_.density)),
      buffer_(scheme_, config_.async, 1),
      layout_(layout) {
  STARLING_CHECK_ARG(initial.size() == layout->numel(), "initial model of ", initial.size(),
                     " values, the layout has ", layout->numel());
  model_.set(std::move(initial), 1);
}

void AsyncServer::add(const compression::UpdateView& u, const aggregation::ClientLimits& limits) {
  buffer_.add(u, limits);
  noteStaleness(u.header.round, 1);
}

void AsyncServer::addPartial(const compression::PartialView& p, uint64_t source) {
  buffer_.addPartial(p, source);
  noteStaleness(p.header.round, p.header.count);
}

// `count` updates from version v were buffered (the buffer checked 1 <= v <= version).
void AsyncServer::noteStaleness(uint64_t v, uint64_t count) {
  const uint64_t tau = version() - v;
  staleness_sum_ += static_cast<double>(tau) * static_cast<double>(count);
  staleness_max_ = std::max(staleness_max_, tau);
}

RoundRecord AsyncServer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  RoundRecord rec;
  rec.round = ++steps_;
  const uint64_t count = buffer_.size();
  aggregation::RoundResult result = buffer_.take();  // InvalidArgument when empty
  rec.clients_completed = result.count;
  rec.updates_rejected = result.rejected;
  if (auto it = result.metrics.find("train_loss"); it != result.metrics.end())
    rec.train_loss = it->second;
  for (const auto& [name, value] : result.metrics)
    if (name != "train_loss") rec.metrics[name] = value;
  rec.metrics["staleness_mean"] = count ? staleness_sum_ / static_cast<double>(count) : 0.0;
  rec.metrics["staleness_max"] = static_cast<double>(staleness_max_);
  staleness_sum_ = 0.0;
  staleness_max_ = 0;
  std::vector<float> next(model_.server().begin(), model_.server().end());
  try {
    optimizer_->step(next, result.delta);
  } catch (const InvalidArgument& e) {  // a non-finite delta: the model is untouched
    rec.reason = e.what();
  }
  if (rec.reason.empty() && !allFinite(next))
    rec.reason = "the server optimizer's step made the model non-finite; the step is not applied";
  if (rec.reason.empty()) {
    model_.set(std::move(next), model_.version() + 1);
    buffer_.advance();
    rec.applied = true;
  } else {
    buffer_.discardTaken();  // those clients may train on this version again
  }
  rec.model_version = model_.version();
  rec.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rec;
}

RoundRecord AsyncServer::skip(const std::string& reason) {
  RoundRecord rec;
  rec.round = ++steps_;
  rec.reason = reason;
  rec.updates_rejected = buffer_.takeRejected();
  rec.model_version = model_.version();
  return rec;
}

namespace {
constexpr uint32_t kAsyncMagic = 0x41434c53;  // "SLCA"
// 2: the buffer lists the updates each sender brought (edge aggregators' partials); 3: the
// downlink's refreshes (ModelStore::saveRefreshes) before the buffer. 1 and 2 are read.
constexpr uint32_t kAsyncFormat = 3;
// The buffer's own format in a checkpoint of `format`.
uint32_t bufferFormat(uint32_t format) {
  static_assert(aggregation::AsyncBuffer::kFormat == 2, "a new buffer format: map it here");
  return std::min(format, aggregation::AsyncBuffer::kFormat);
}
}  // namespace

// The checkpoint file: the server's state (save()) in the files' frame (core/framed_file.h); an
// older file is the state alone.
constexpr FileFormat kAsyncFile{0x46434c53 /* "SLCF" */, "checkpoint of asynchronous rounds", 1, 1,
                                1};

void AsyncServer::saveCheckpoint(const std::string& path) const {
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  save(w);
  writeFramed(path, kAsyncFile, bytes);
}

void AsyncServer::loadCheckpoint(const std::string& path) {
  const std::vector<uint8_t> file = readFile(path, uint64_t{64} << 30);
  const std::string what = "checkpoint " + path;
  if (hasMagic(file, kAsyncMagic)) {
    load(file, what);  // formats 1 to 3, before the frame
    return;
  }
  if (hasMagic(file, 0x4b434c53))  // "SLCK": the round engine's (server/engine.cc)
    STARLING_THROW(IoError, what,
                   ": not a checkpoint of asynchronous rounds: a synchronous run's checkpoint "
                   "resumes only with round.mode = sync");
  if (hasMagic(file, 0x4d495341))  // "ASIM": simulator/async_sim.cc
    STARLING_THROW(IoError, what,
                   ": a simulation's checkpoint of asynchronous rounds: it resumes only in "
                   "starling-sim");
  load(unframe(kAsyncFile, file, what).payload, what);
}

void AsyncServer::save(ByteWriter& w) const {
  w.u32(kAsyncMagic);
  w.u32(kAsyncFormat);
  w.u64(layout_->fingerprint());
  w.str(scheme_.compressor().spec());
  w.str(config_.scheme.rule);
  w.str(config_.server_opt);
  w.str(config_.async.staleness);
  w.u64(config_.async.max_staleness);
  w.u64(steps_);
  w.u64(model_.version());
  w.floats(model_.server());
  w.floats(model_.lossy() ? model_.current() : std::span<const float>());
  optimizer_->saveState(w);
  w.f64(staleness_sum_);
  w.u64(staleness_max_);
  model_.writeRefreshes(w);
  buffer_.save(w);
}

void AsyncServer::load(std::span<const uint8_t> bytes, const std::string& what) {
  ByteReader r(bytes, what);
  if (r.u32() != kAsyncMagic)
    r.fail(
        "not a checkpoint of asynchronous rounds (a synchronous run's checkpoint resumes only "
        "with round.mode = sync)");
  const uint32_t format = r.u32();
  if (format < 1 || format > kAsyncFormat)
    r.fail("format version ", format, " is not 1 to ", kAsyncFormat);
  if (r.u64() != layout_->fingerprint())
    r.fail("the checkpoint is of another model (layout fingerprint differs)");
  const auto same = [&](const std::string& saved, const std::string& now, const char* key) {
    if (saved != now)
      r.fail("it was written with ", key, " = '", saved, "', this run has '", now, "'");
  };
  same(r.str(4096), scheme_.compressor().spec(), "compression.compressor");
  same(r.str(4096), config_.scheme.rule, "aggregation.rule");
  same(r.str(4096), config_.server_opt, "aggregation.server_opt");
  same(r.str(4096), config_.async.staleness, "async.staleness");
  if (const uint64_t b = r.u64(); b != config_.async.max_staleness)
    r.fail("it was written with async.max_staleness = ", b, ", this run has ",
           config_.async.max_staleness);
  const uint64_t steps = r.u64(), version = r.u64();
  std::vector<float> model, broadcast;
  r.floats(model);
  r.floats(broadcast);
  if (model.size() != layout_->numel())
    r.fail("model of ", model.size(), " values, the layout has ", layout_->numel());
  if (!allFinite(model)) r.fail("the model holds a non-finite value");
  if (model_.lossy() ? broadcast.size() != model.size() : !broadcast.empty())
    r.fail("it holds a broadcast model of ", broadcast.size(), " values for a ",
           model_.lossy() ? "lossy" : "lossless", " downlink (resume with the same downlink.mode)");
  if (!allFinite(broadcast)) r.fail("the broadcast model holds a non-finite value");
  auto optimizer = aggregation::makeServerOptimizer(config_.server_opt, layout_->numel());
  optimizer->loadState(r);
  const double staleness_sum = r.f64();
  const uint64_t staleness_max = r.u64();
  if (!(std::isfinite(staleness_sum) && staleness_sum >= 0.0))
    r.fail("the buffered updates' staleness sums to ", staleness_sum);
  const std::vector<uint8_t> refreshes =
      format >= 3 ? ModelStore::readRefreshes(r) : std::vector<uint8_t>();
  aggregation::AsyncBuffer buffer(scheme_, config_.async, 1);
  const size_t buffer_at = r.position();
  buffer.load(r, bufferFormat(format));
  r.finish();
  if (version == 0 || buffer.version() != version)
    r.fail("the model is version ", version, ", its buffer counts from version ", buffer.version());
  if (steps + 1 < version) r.fail(steps, " steps cannot have made model version ", version);
  ModelStore store = model_;  // checked whole before anything of the server changes
  store.reset(std::move(model), version, std::move(broadcast));
  store.loadRefreshes(refreshes, what + ", its downlink refreshes");
  model_ = std::move(store);
  optimizer_ = std::move(optimizer);
  // The checked buffer's bytes again, into the member (a buffer refers to its scheme: it is
  // loaded in place, not assigned).
  ByteReader again(bytes.subspan(buffer_at), what);
  buffer_.load(again, bufferFormat(format));
  steps_ = steps;
  staleness_sum_ = staleness_sum;
  staleness_max_ = staleness_max;
}

}  // namespace starling::server
