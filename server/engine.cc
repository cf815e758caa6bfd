#include "server/engine.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "compression/registry.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/finite.h"
#include "core/framed_file.h"
#include "core/rng.h"
#include "core/shard.h"
#include "data/sampling.h"

namespace starling::server {
namespace ag = starling::aggregation;
namespace cz = starling::compression;

namespace {
// Version 2 adds the number of optimizer shards after the model: 1, then the optimizer's state
// inline (version 1's layout); more, then the states are in the workers' optimizer shard files.
// Version 8 is version 7 in the files' frame (core/framed_file.h).
constexpr FileFormat kCheckpointFile{0x4b434c53 /* "SLCK" */, "Starling checkpoint", 1, 8, 8};
// Version 2 is version 1 in the frame.
constexpr FileFormat kShardFile{0x534f4c53 /* "SLOS" */, "Starling optimizer shard file", 1, 2, 2};

// A phase's (or a secure step's) report into the round's record: `rejected` refusals, the bytes,
// the simulated seconds, and who failed.
void addPhase(RoundRecord& rec, const PhaseReport& rep, uint64_t rejected,
              std::set<uint64_t>& failed) {
  rec.updates_rejected += rejected;
  rec.uplink_bytes += rep.uplink_bytes;
  rec.downlink_bytes += rep.downlink_bytes;
  if (rep.sim_seconds) rec.sim_seconds = rec.sim_seconds.value_or(0.0) + *rep.sim_seconds;
  if (rep.makespan_seconds)
    rec.makespan_seconds = rec.makespan_seconds.value_or(0.0) + *rep.makespan_seconds;
  if (!rep.stage_seconds.empty()) {
    rec.stage_seconds.resize(kStages, 0.0);
    for (size_t i = 0; i < kStages && i < rep.stage_seconds.size(); ++i)
      rec.stage_seconds[i] += rep.stage_seconds[i];
  }
  failed.insert(rep.failed.begin(), rep.failed.end());
}

// The next phase or step goes to those whose answer was accepted.
void keepCompleted(std::vector<ClientInfo>& active, const PhaseReport& rep) {
  const std::set<uint64_t> ok(rep.completed.begin(), rep.completed.end());
  std::erase_if(active, [&](const ClientInfo& c) { return !ok.count(c.id); });
}

size_t ceilFraction(double f, size_t n) {
  return static_cast<size_t>(std::ceil(f * static_cast<double>(n) - 1e-9));
}

}  // namespace

std::vector<uint8_t> encodeTask(const PhaseTask& task, uint64_t held, uint64_t nonce) {
  if (task.header.phase != 0) return encodeTask(task, EncodedModel{}, nonce);
  return encodeTask(task, task.model.encodeFor(held, task.downlink), nonce);
}

std::vector<uint8_t> encodeTask(const PhaseTask& task, const EncodedModel& m, uint64_t nonce) {
  protocol::TaskMsg h = task.header;
  h.nonce = nonce;
  if (task.broadcast.shared) h.shared = *task.broadcast.shared;
  if (task.header.phase != 0) return protocol::encodeTask(h, {});
  h.base_version = m.base_version;
  std::vector<compression::PayloadView> views;
  views.reserve(m.tensors.size());
  for (const auto& p : m.tensors) views.push_back(compression::view(p));
  return protocol::encodeTask(h, views);
}

void SamplingConfig::validate() const {
  if (!(fraction > 0.0 && fraction <= 1.0))
    STARLING_THROW(ConfigError, "sampling.fraction must be in (0, 1], got ", fraction);
  if (min_clients == 0) STARLING_THROW(ConfigError, "sampling.min_clients must be at least 1");
  if (min_available < min_clients)
    STARLING_THROW(ConfigError, "sampling.min_available (", min_available,
                   ") must be at least sampling.min_clients (", min_clients, ")");
  if (!(overcommit >= 1.0 && overcommit <= 10.0))
    STARLING_THROW(ConfigError, "sampling.overcommit must be in [1, 10], got ", overcommit);
  if (wait_ms == 0) STARLING_THROW(ConfigError, "sampling.wait_ms must be positive");
  if (!(poisson_rate >= 0.0 && poisson_rate <= 1.0))
    STARLING_THROW(ConfigError, "sampling.poisson_rate must be in [0, 1] (0: off), got ",
                   poisson_rate);
  if (poisson_rate > 0 && overcommit != 1.0)
    STARLING_THROW(ConfigError,
                   "sampling.poisson_rate samples each client on its own: sampling.overcommit "
                   "(a fixed number sampled beyond a target) does not apply");
}

void EngineConfig::validate() const {
  if (rounds == 0 || rounds > 10'000'000)
    STARLING_THROW(ConfigError, "rounds must be in [1, 10^7], got ", rounds);
  sampling.validate();
  completion.validate();
  scheme.bounds.validate();
  if (fit.epochs == 0 || fit.epochs > 1000)
    STARLING_THROW(ConfigError, "fit.epochs must be in [1, 1000], got ", fit.epochs);
  if (fit.batch_size == 0) STARLING_THROW(ConfigError, "fit.batch_size must be positive");
  if (!(fit.lr > 0.0f && fit.lr <= 100.0f))
    STARLING_THROW(ConfigError, "fit.lr must be in (0, 100], got ", fit.lr);
  if (!(fit.prox_mu >= 0.0f && fit.prox_mu <= 1e4f))
    STARLING_THROW(ConfigError, "train.prox_mu must be in [0, 10000], got ", fit.prox_mu);
  if (static_cast<double>(fit.lr) * fit.prox_mu >= 2.0)
    STARLING_THROW(ConfigError,
                   "train.lr x train.prox_mu = ", static_cast<double>(fit.lr) * fit.prox_mu,
                   " must be below 2: the proximal term would make every client diverge");
  if (round_deadline_ms < 10)
    STARLING_THROW(ConfigError, "round.deadline_ms must be at least 10, got ", round_deadline_ms);
  if (delta_history > 64)
    STARLING_THROW(ConfigError, "downlink.history must be at most 64, got ", delta_history);
  // Declared metrics become keys of the metrics file's JSON lines: plain names, none of the fixed
  // keys.
  for (const auto& m : scheme.metrics) {
    for (char ch : m)
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '-'))
        STARLING_THROW(ConfigError, "metric name '", m,
                       "' may hold only letters, digits, '_', '.' and '-'");
    for (const char* fixed :
         {"round", "applied", "reason", "clients_selected", "clients_completed", "clients_failed",
          "updates_rejected", "uplink_bytes", "downlink_bytes", "model_version", "test_accuracy",
          "test_loss", "sim_seconds", "makespan_seconds", "dp_epsilon", "dp_clip", "wall_seconds",
          "secagg_wrong_shares", kClipIndicator})
      if (m == fixed)
        STARLING_THROW(ConfigError, "metric name '", m, "' is a key of the round record already");
    if (std::find(std::begin(kStageKeys), std::end(kStageKeys), m) != std::end(kStageKeys))
      STARLING_THROW(ConfigError, "metric name '", m, "' is a key of the round record already");
  }
  if (!(downlink_density > 0.0 && downlink_density <= 1.0))
    STARLING_THROW(ConfigError, "downlink.density must be in (0, 1], got ", downlink_density);
  if (shard_count == 0 || shard_rank >= shard_count)
    STARLING_THROW(ConfigError, "optimizer shard ", shard_rank, " of ", shard_count,
                   " does not exist");
  if (shard_count > 1 && !checkpoint.empty() && optimizer_shard_file.empty())
    STARLING_THROW(ConfigError,
                   "a sharded server step with a checkpoint needs an optimizer shard file");
  dp.validate();
  if (dp.enabled && dp.mechanism == privacy::DpMechanism::kDistributed && !secagg.enabled)
    STARLING_THROW(ConfigError,
                   "privacy.dp = distributed has each client add its noise in secure "
                   "aggregation's ring: it needs secagg.enabled (without it, use privacy.dp = "
                   "central)");
  // (Adaptive clipping under secure aggregation: with central DP each client masks whether it was
  // within the round's clip beside its update; distributed DP refuses it, dp.validate().)
  if (dp.enabled && dp.mechanism == privacy::DpMechanism::kDistributed && !scheme.metrics.empty())
    STARLING_THROW(ConfigError, "privacy.dp = distributed takes no declared metrics (",
                   scheme.metrics.front(),
                   ", ...): each client's travel in the clear beside its masked update, and the "
                   "root it protects against would read them");
  if (dp.enabled) {
    if (sampling.poisson_rate == 0)
      STARLING_THROW(
          ConfigError,
          "privacy.dp = central needs sampling.poisson_rate: its accountant assumes "
          "every client is sampled on its own with probability q (a fixed number per "
          "round, sampling.clients_per_round or sampling.fraction, is another mechanism)");
    if (scheme.scaffold)
      STARLING_THROW(ConfigError,
                     "privacy.dp = central does not take train.scaffold: the control variates "
                     "would be a second release of each client's data, unclipped and unnoised");
    const auto rule = ag::makeRule(scheme.rule);
    if (!rule->streaming() || rule->weightsByExamples() || rule->clipNorm() != dp.clip)
      STARLING_THROW(ConfigError,
                     "privacy.dp = central needs the rule fedavg with uniform weights "
                     "and clip = privacy.clip (",
                     dp.clip, "), got ", rule->spec(),
                     ": the noise is calibrated to one client moving the sum by at most the clip");
    const auto c = compression::makeCompressor(scheme.compressor);
    if (c->phases() > 1 || c->sharesFactors())
      STARLING_THROW(ConfigError, "privacy.dp = central does not take the compressor ",
                     scheme.compressor, ": ",
                     c->phases() > 1 ? "its update is formed over several phases, each clipped "
                                       "on its own, so no one clip bounds the update"
                                     : "it shares factors across rounds, so a round's release "
                                       "depends on the last");
    // The budget (and sigma from the target), refused with the numbers before round 1.
    privacy::ClientDp::resolveSigma(dp, sampling.poisson_rate, rounds);
  }
  if (secagg.enabled) {
    if (const std::string why =
            secureCompressorRefusal(*compression::makeCompressor(scheme.compressor));
        !why.empty())
      STARLING_THROW(ConfigError, why);
    if (scheme.scaffold)
      STARLING_THROW(ConfigError,
                     "secagg.enabled does not take train.scaffold: each client's control change "
                     "would travel in the clear beside its masked update");
    const auto rule = ag::makeRule(scheme.rule);
    if (!rule->streaming() || rule->weightsByExamples())
      STARLING_THROW(ConfigError, "secagg.enabled needs the rule fedavg with uniform weights, got ",
                     rule->spec(),
                     ": the server sees only the sum of the clients' updates, so it can neither "
                     "weight each by its examples nor run a robust rule over them");
    if (shard_count > 1)
      STARLING_THROW(ConfigError, "secagg.enabled does not take a sharded server step");
    // The unmasked sum of n updates clipped to C is within n C in norm and per value: it must
    // pass the bounds every partial is checked against.
    if (secagg.clip > scheme.bounds.max_update_norm || secagg.clip > scheme.bounds.max_abs_value)
      STARLING_THROW(ConfigError, "secagg.clip (", secagg.clip,
                     ") must not exceed bounds.max_norm (", scheme.bounds.max_update_norm,
                     ") nor bounds.max_abs (", scheme.bounds.max_abs_value,
                     "): the unmasked sum is checked against them");
    if (dp.enabled && secagg.clip != dp.clip)
      STARLING_THROW(ConfigError, "secagg.clip (", secagg.clip, ") must equal privacy.clip (",
                     dp.clip,
                     ") under differential privacy: the clients clip, and the noise is "
                     "calibrated to that clip");
    // The ring is checked against the most clients a round can sample when the sampling says
    // (a count); with Poisson sampling or a fraction, each round's own count is (a round whose
    // sum would not fit is not applied, with the reason). Under distributed DP with the noise.
    SecAggConfig sc = secagg;
    if (dp.enabled && dp.mechanism == privacy::DpMechanism::kDistributed)
      sc.noise = {privacy::ClientDp::resolveSigma(dp, sampling.poisson_rate, rounds),
                  privacy::ClientDp::resolveMinClients(dp, sampling.poisson_rate)};
    sc.validate(secureMaxClients(sampling, dp.enabled ? dp.population : 0), 1);
  }
}

aggregation::RoundSchemeOptions withClipIndicator(const EngineConfig& c) {
  aggregation::RoundSchemeOptions o = c.scheme;
  if (c.dp.enabled && c.dp.adaptive_clip) o.clip_indicator = kClipIndicator;
  return o;
}

uint64_t secureMaxClients(const SamplingConfig& s, uint64_t population) {
  if (s.poisson_rate == 0 && s.clients_per_round > 0)
    return static_cast<uint64_t>(
        std::ceil(static_cast<double>(s.clients_per_round) * s.overcommit));
  // Poisson sampling of a known population (under DP): its expected count and seven of its
  // standard deviations, which a round passes with probability below 10^-11.
  if (s.poisson_rate > 0 && population > 0) {
    const double mean = s.poisson_rate * static_cast<double>(population);
    return std::min(population, static_cast<uint64_t>(std::ceil(mean + 7 * std::sqrt(mean) + 1)));
  }
  return 1;
}

std::string secureCompressorRefusal(const cz::Compressor& c) {
  const std::string why = c.secureRefusal();
  if (why.empty()) return why;
  return "secagg.enabled takes a compressor whose values sum alike for every client (none, "
         "randblock, randk:positions=shared, acpsgd, powersgd), not " +
         c.spec() + ": " + why;
}

namespace {
// The most values one client's masked input carries in each phase of `round`: a factor's side
// alternates from round to round (acpsgd) or from phase to phase (powersgd), so each phase's
// largest with either side shared.
std::vector<uint64_t> securePhaseDims(const cz::Compressor& c, const ParamLayout& layout,
                                      uint64_t run_seed, uint64_t round) {
  if (!c.sharesFactors())
    return {c.secureSize(layout, cz::RoundContext{run_seed, round, 0, 0, nullptr})};
  cz::SharedFactors s = c.initialShared(layout, run_seed);
  std::vector<uint64_t> dims(c.phases(), 0);
  for (uint32_t phase = 0; phase < c.phases(); ++phase)
    for (const auto side : {cz::SharedFactors::Side::kQ, cz::SharedFactors::Side::kP}) {
      s.fixed = side;
      dims[phase] = std::max<uint64_t>(
          dims[phase], c.secureSize(layout, cz::RoundContext{run_seed, round, phase, 0, &s}));
    }
  return dims;
}
}  // namespace

uint64_t secureDim(const cz::Compressor& c, const ParamLayout& layout, uint64_t run_seed,
                   uint64_t round) {
  const std::vector<uint64_t> dims = securePhaseDims(c, layout, run_seed, round);
  return *std::max_element(dims.begin(), dims.end());
}

PhaseReport Fleet::exchange(SecureStage, SecureSteps&, std::span<const ClientInfo>, uint32_t) {
  STARLING_THROW(ConfigError, "this fleet cannot run secure aggregation (secagg.enabled)");
}

std::map<uint64_t, std::vector<uint64_t>> Fleet::secureRoster(
    std::span<const ClientInfo> aggregators, uint64_t, uint32_t, PhaseReport& report) {
  for (const auto& a : aggregators) report.failed.push_back(a.id);
  return {};
}

protocol::TaskMsg fitTaskHeader(const aggregation::RoundScheme& scheme, uint64_t round,
                                uint64_t version, const protocol::FitSettings& fit,
                                uint32_t deadline_ms) {
  protocol::TaskMsg h;
  h.kind = protocol::TaskKind::kFit;
  h.round = round;
  h.run_seed = scheme.options().run_seed;
  h.compressor = scheme.compressor().spec();
  h.model_version = version;
  h.fit = fit;
  h.deadline_ms = deadline_ms;
  h.metrics = scheme.options().metrics;
  return h;
}

RoundEngine::RoundEngine(std::shared_ptr<const ParamLayout> layout, EngineConfig config,
                         std::vector<float> initial)
    : layout_(std::move(layout)),
      config_((config.validate(), std::move(config))),
      recorder_(RecorderConfig{config_.metrics, config_.write_files, config_.eval_every,
                               /*eval_applied_only=*/true}),
      scheme_(layout_, withClipIndicator(config_)),
      model_(ModelStore::forDownlink(layout_, config_.downlink, config_.delta_history,
                                     config_.downlink_density)),
      carry_(scheme_.initialCarry()) {
  STARLING_CHECK_ARG(initial.size() == layout_->numel(), "initial model of ", initial.size(),
                     " values, the layout has ", layout_->numel());
  std::tie(shard_begin_, shard_end_) =
      shardRange(layout_->numel(), static_cast<int>(config_.shard_rank),
                 static_cast<int>(config_.shard_count));
  optimizer_ = ag::makeServerOptimizer(config_.server_opt, shard_end_ - shard_begin_);
  model_.set(std::move(initial), 1);
  if (config_.scheme.scaffold) control_.assign(layout_->numel(), 0.0f);
  // Each phase a secure sum of something: two-phase PowerSGD's phase Q masks the factored
  // tensors' Q alone, none for a model with no tensor to factor.
  const std::vector<uint64_t> phase_dims =
      config_.secagg.enabled
          ? securePhaseDims(scheme_.compressor(), *layout_, config_.scheme.run_seed, 1)
          : std::vector<uint64_t>{0};
  for (size_t phase = 0; config_.secagg.enabled && phase < phase_dims.size(); ++phase)
    if (phase_dims[phase] == 0)
      STARLING_THROW(ConfigError, "secagg.enabled with ", scheme_.compressor().spec(), ": phase ",
                     phase,
                     " of this model masks nothing (no tensor large enough to factor); use "
                     "compression.compressor = none");
  const uint64_t secure_dim = *std::max_element(phase_dims.begin(), phase_dims.end());
  // Adaptive clipping under secure aggregation: the clients clip, and the unmasked sum of n
  // updates must pass n times the bounds, so the clip grows no further than they allow.
  if (config_.secagg.enabled && config_.dp.enabled && config_.dp.adaptive_clip)
    config_.dp.max_clip =
        std::min(config_.scheme.bounds.max_update_norm, config_.scheme.bounds.max_abs_value);
  if (config_.dp.enabled) {
    // Distributed DP's accountant bounds tau over the noised sum's values: the shared support's
    // (which is the same every round: the support's size does not depend on the round).
    if (config_.dp.mechanism == privacy::DpMechanism::kDistributed) config_.dp.dim = secure_dim;
    dp_ = std::make_unique<privacy::ClientDp>(config_.dp, config_.sampling.poisson_rate,
                                              config_.rounds, config_.scheme.run_seed);
    if (dp_->distributed()) config_.secagg.noise = {dp_->noiseMultiplier(), dp_->minClients()};
  }
  if (config_.secagg.enabled)  // the ring for the most clients a round samples, when known
    config_.secagg.validate(
        secureMaxClients(config_.sampling, config_.dp.enabled ? config_.dp.population : 0),
        secure_dim);
  if (!config_.checkpoint.empty() && std::filesystem::exists(config_.checkpoint)) {
    loadCheckpoint();
    resumed_ = true;
  }
}

RoundEngine::~RoundEngine() = default;

void RoundEngine::saveCheckpoint() const {
  if (config_.checkpoint.empty() || !config_.write_files) return;
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  w.u64(layout_->fingerprint());
  w.u64(next_round_);
  w.u64(model_.version());
  w.floats(model_.server());
  w.u32(config_.shard_count);
  if (config_.shard_count == 1) optimizer_->saveState(w);
  carry_.save(w);
  w.u64(fleet_state_.size());
  if (!fleet_state_.empty()) w.bytes(fleet_state_.data(), fleet_state_.size());
  // Format 3: the broadcast model of a lossy downlink (count 0 otherwise).
  w.floats(model_.lossy() ? model_.current() : std::span<const float>());
  // Format 4: SCAFFOLD's server control variate (count 0 without SCAFFOLD).
  w.floats(control_);
  // Format 5: SCAFFOLD's acknowledgements, (id, round) pairs in id order.
  std::vector<std::pair<uint64_t, uint64_t>> acks(control_acks_.begin(), control_acks_.end());
  std::sort(acks.begin(), acks.end());
  w.u64(acks.size());
  for (const auto& [id, round] : acks) {
    w.u64(id);
    w.u64(round);
  }
  // Format 6: the quantised or stc downlink's refreshes (ModelStore::saveRefreshes; 0 bytes for
  // the other downlinks).
  model_.writeRefreshes(w);
  // Format 7: DP's accounting, (q, sigma, delta) of every round so far (a flag 0 without, 1
  // central, 2 distributed).
  // Bit 4: adaptive clipping, the next round's clip after them.
  const bool adaptive = dp_ && dp_->config().adaptive_clip;
  w.u8(static_cast<uint8_t>((dp_ ? (dp_->distributed() ? 2 : 1) : 0) | (adaptive ? 4 : 0)));
  if (dp_) {
    w.f64(dp_->q());
    w.f64(dp_->noiseMultiplier());
    w.f64(dp_->config().delta);
  }
  if (adaptive) w.f64(dp_->clip());
  writeFramed(config_.checkpoint, kCheckpointFile, bytes);
}

// The optimizer shard file, framed: model fingerprint, shard rank and count, then one or two
// entries (next round, optimizer state), the newest last.
void RoundEngine::saveOptimizerShard() {
  if (config_.shard_count == 1 || config_.checkpoint.empty()) return;
  std::vector<uint8_t> entry;
  {
    ByteWriter e(entry);
    e.u64(next_round_);
    optimizer_->saveState(e);
  }
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  w.u64(layout_->fingerprint());
  w.u32(config_.shard_rank);
  w.u32(config_.shard_count);
  w.u32(previous_shard_entry_.empty() ? 1 : 2);
  if (!previous_shard_entry_.empty())
    w.bytes(previous_shard_entry_.data(), previous_shard_entry_.size());
  w.bytes(entry.data(), entry.size());
  writeFramed(config_.optimizer_shard_file, kShardFile, bytes);
  previous_shard_entry_ = std::move(entry);
}

void RoundEngine::loadOptimizerShard(uint64_t next_round) {
  const std::string& path = config_.optimizer_shard_file;
  if (!std::filesystem::exists(path))
    STARLING_THROW(IoError, "the checkpoint ", config_.checkpoint,
                   " has its server optimizer in shards, and shard ", config_.shard_rank,
                   "'s file ", path, " is missing");
  const std::vector<uint8_t> file = readFile(path, uint64_t{64} << 30);
  const std::string what = "optimizer shard file " + path;
  const std::span<const uint8_t> bytes = unframe(kShardFile, file, what).payload;
  ByteReader r(bytes, what);
  if (r.u64() != layout_->fingerprint())
    r.fail("the shard is of another model (layout fingerprint differs)");
  const uint32_t rank = r.u32(), count = r.u32();
  if (rank != config_.shard_rank || count != config_.shard_count)
    r.fail("it is shard ", rank, " of ", count, ", this worker steps shard ", config_.shard_rank,
           " of ", config_.shard_count);
  const uint32_t entries = r.u32();
  if (entries == 0 || entries > 2) r.fail(entries, " entries (1 or 2 expected)");
  std::vector<uint64_t> rounds;
  for (uint32_t i = 0; i < entries; ++i) {
    const size_t begin = r.position();
    const uint64_t next = r.u64();
    auto opt = ag::makeServerOptimizer(config_.server_opt, shard_end_ - shard_begin_);
    opt->loadState(r);
    rounds.push_back(next);
    if (next == next_round) {
      optimizer_ = std::move(opt);
      previous_shard_entry_.assign(bytes.begin() + static_cast<std::ptrdiff_t>(begin),
                                   bytes.begin() + static_cast<std::ptrdiff_t>(r.position()));
    }
  }
  r.finish();
  if (std::find(rounds.begin(), rounds.end(), next_round) == rounds.end())
    r.fail("it holds the optimizer before round ", rounds.back(),
           (rounds.size() == 2 ? " and before round " : ""),
           (rounds.size() == 2 ? std::to_string(rounds.front()) : std::string()),
           ", the checkpoint resumes at round ", next_round);
}

void RoundEngine::loadCheckpoint() {
  const std::vector<uint8_t> file = readFile(config_.checkpoint, uint64_t{64} << 30);
  const std::string what = "checkpoint " + config_.checkpoint;
  // The asynchronous root's (server/async_root.cc, async_server.cc) and simulator's
  // (simulator/async_sim.cc).
  for (uint32_t magic : {0x41434c53u, 0x46434c53u, 0x4d495341u})
    if (hasMagic(file, magic))
      STARLING_THROW(IoError, what,
                     ": a checkpoint of asynchronous rounds: it resumes only with the round.mode "
                     "(async or semisync) that wrote it");
  const Unframed u = unframe(kCheckpointFile, file, what);
  ByteReader r(u.payload, what);
  const uint32_t format = u.version;
  if (r.u64() != layout_->fingerprint())
    r.fail("the checkpoint is of another model (layout fingerprint differs)");
  const uint64_t next = r.u64();
  const uint64_t version = r.u64();
  std::vector<float> model;
  r.floats(model);
  if (model.size() != layout_->numel())
    r.fail("model of ", model.size(), " values, the layout has ", layout_->numel());
  for (float x : model)
    if (!std::isfinite(x)) r.fail("the model holds a non-finite value");
  const uint32_t shards = format == 1 ? 1 : r.u32();
  if (shards != config_.shard_count)
    r.fail("its server optimizer is in ", shards, " shard(s), this run steps it in ",
           config_.shard_count, " (resume with as many workers and the same sharded-step setting)");
  std::unique_ptr<ag::ServerOptimizer> opt;
  if (shards == 1) {
    opt = ag::makeServerOptimizer(config_.server_opt, layout_->numel());
    opt->loadState(r);
  }
  ag::RoundCarry carry = ag::RoundCarry::load(r, *layout_);
  std::vector<uint8_t> fleet_state;
  if (format >= 2) {
    const uint64_t n = r.u64();
    const auto v = r.view(static_cast<size_t>(std::min<uint64_t>(n, u.payload.size())));
    if (v.size() != n) r.fail("fleet state of ", n, " bytes is truncated");
    fleet_state.assign(v.begin(), v.end());
  }
  std::vector<float> broadcast;
  if (format >= 3) r.floats(broadcast);
  std::vector<float> control;
  if (format >= 4) r.floats(control);
  ControlAcks acks;
  if (format >= 5) {
    const uint64_t n = r.u64();
    if (n > r.remaining() / 16)
      r.fail("claims ", n, " SCAFFOLD acknowledgements, only ", r.remaining(), " bytes left");
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t id = r.u64(), round = r.u64();
      if (round == 0 || round >= next)
        r.fail("a SCAFFOLD acknowledgement of round ", round, ", the checkpoint resumes at ", next);
      if (!acks.emplace(id, round).second) r.fail("two SCAFFOLD acknowledgements for client ", id);
    }
    if (control.empty() && n != 0)
      r.fail("SCAFFOLD acknowledgements without a SCAFFOLD control variate");
  }
  const std::vector<uint8_t> refreshes =
      format >= 6 ? ModelStore::readRefreshes(r) : std::vector<uint8_t>();
  std::optional<std::array<double, 3>> accounted;  // its rounds' (q, sigma, delta)
  uint8_t flag = 0;                                // 1: central DP, 2: distributed
  std::optional<double> adaptive_clip;             // the next round's, under adaptive clipping
  if (format >= 7) {
    flag = r.u8();
    // 0, 1, 2 (none, central, distributed), 5 (central with adaptive clipping).
    if (flag > 2 && flag != 5) r.fail("the DP flag is ", static_cast<int>(flag));
    if (flag & 3) accounted = std::array<double, 3>{r.f64(), r.f64(), r.f64()};
    if (flag & 4) {
      adaptive_clip = r.f64();
      if (!(std::isfinite(*adaptive_clip) && *adaptive_clip > 0))
        r.fail("adaptive clipping's clip is ", *adaptive_clip);
    }
    flag &= 3;
  }
  r.finish();
  // Epsilon in the records assumes every round so far ran with this run's (q, sigma, delta).
  if (dp_ && !accounted && next > 1)
    r.fail("its ", next - 1,
           " rounds ran without central DP (or were written by a build before format 7, which "
           "kept no DP accounting): this run's epsilon would not count them; start a new run, or "
           "resume without privacy.dp");
  if (!dp_ && accounted)
    r.fail("its rounds ran under ", flag == 2 ? "distributed" : "central",
           " DP: resume with the same privacy.* settings (a resume without them would release "
           "models without noise)");
  if (dp_ && accounted && (flag == 2) != dp_->distributed())
    r.fail("its rounds ran under ", flag == 2 ? "distributed" : "central",
           " DP: resume with the same privacy.dp (the two are accounted differently)");
  if (dp_ && accounted) {
    const std::array<double, 3> now{dp_->q(), dp_->noiseMultiplier(), dp_->config().delta};
    // A noise multiplier derived from a target comes out of a bisection on libm's functions: on
    // another machine it may differ in its last bits, which is not another setting.
    const double a = (*accounted)[1], b = now[1];
    const bool same_sigma = config_.dp.noise_multiplier > 0
                                ? a == b
                                : std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b));
    if ((*accounted)[0] != now[0] || !same_sigma || (*accounted)[2] != now[2])
      r.fail("its rounds were accounted at sampling rate ", (*accounted)[0], ", noise multiplier ",
             (*accounted)[1], " and delta ", (*accounted)[2], ", this run's are ", now[0], ", ",
             now[1], " and ", now[2],
             ": resume with the same sampling.poisson_rate, privacy.* and train.rounds (a "
             "noise multiplier derived from a target depends on the rounds)");
  }
  if (dp_ && dp_->config().adaptive_clip != adaptive_clip.has_value())
    r.fail(adaptive_clip
               ? "its rounds adapted their clip (privacy.adaptive_clip): resume with it"
               : "its rounds ran with a fixed clip: resume without privacy.adaptive_clip");
  if (dp_ && adaptive_clip) dp_->setClip(*adaptive_clip);  // where the last round left it
  if (control.size() != control_.size()) {
    if (format < 4)
      r.fail("it was written by an older build (format ", format,
             "), which kept no SCAFFOLD "
             "control variate in the engine: a SCAFFOLD run cannot resume from it; start again");
    r.fail(control.empty() ? "it has no SCAFFOLD control variate and this run is SCAFFOLD"
                           : "it has a SCAFFOLD control variate and this run is not SCAFFOLD",
           ": resume with the same train.scaffold");
  }
  for (float x : control)
    if (!std::isfinite(x)) r.fail("its SCAFFOLD control variate holds a non-finite value");
  if (!broadcast.empty() && (!model_.lossy() || broadcast.size() != model.size()))
    r.fail("it holds a broadcast model of ", broadcast.size(), " values for a ",
           model_.lossy() ? "lossy" : "lossless", " downlink of a ", model.size(), "-value model");
  for (float x : broadcast)
    if (!std::isfinite(x)) r.fail("the broadcast model holds a non-finite value");
  try {
    scheme_.checkCarry(carry);
  } catch (const InvalidArgument& e) {
    r.fail("the checkpoint's round carry does not fit this compressor: ", e.what());
  }
  if (next == 0 || version == 0)
    r.fail("round ", next, " / model version ", version, " out of range");
  // The store as it resumes, checked whole before anything of the engine changes.
  ModelStore store = model_;
  store.reset(std::move(model), version, std::move(broadcast));
  store.loadRefreshes(refreshes, "checkpoint " + config_.checkpoint + ", its downlink refreshes");
  next_round_ = next;
  model_ = std::move(store);
  if (opt)
    optimizer_ = std::move(opt);
  else
    loadOptimizerShard(next);
  carry_ = std::move(carry);
  control_ = std::move(control);
  control_acks_ = std::move(acks);
  fleet_state_ = std::move(fleet_state);
  fleet_state_pending_ = true;
}

ClientPool::ClientPool(std::vector<ClientInfo> list) : list_(std::move(list)) {
  std::sort(list_.begin(), list_.end(),
            [](const ClientInfo& a, const ClientInfo& b) { return a.id < b.id; });
}

ClientPool ClientPool::generated(uint64_t n, Make make) {
  STARLING_CHECK_ARG(make != nullptr, "a generated pool needs a function that makes its clients");
  ClientPool p;
  p.generated_ = true;
  p.n_ = n;
  p.make_ = std::move(make);
  return p;
}

ClientPool ClientPool::generated(std::vector<uint32_t> ids, Make make) {
  STARLING_CHECK_ARG(std::is_sorted(ids.begin(), ids.end()) &&
                         std::adjacent_find(ids.begin(), ids.end()) == ids.end(),
                     "a generated pool's ids ascend");
  ClientPool p = generated(ids.size(), std::move(make));
  p.ids_ = std::make_shared<const std::vector<uint32_t>>(std::move(ids));
  return p;
}

ClientInfo ClientPool::operator[](size_t i) const {
  STARLING_CHECK_ARG(i < size(), "client ", i, " of a pool of ", size());
  if (!generated_) return list_[i];
  return make_(ids_ ? uint64_t{(*ids_)[i]} : uint64_t{i});
}

ClientPool ClientPool::filtered(bool (*keep)(const ClientInfo&)) const {
  if (generated_) return *this;  // a generated pool's are clients with evaluation examples
  std::vector<ClientInfo> out;
  for (const ClientInfo& c : list_)
    if (keep(c)) out.push_back(c);
  return ClientPool(std::move(out));
}

ClientPool ClientPool::clients() const {
  return filtered([](const ClientInfo& c) { return c.role == protocol::Role::kClient; });
}

ClientPool ClientPool::evaluators() const {
  return filtered([](const ClientInfo& c) { return c.eval_examples > 0; });
}

std::vector<ClientInfo> ClientPool::list() const {
  if (!generated_) return list_;
  std::vector<ClientInfo> out;
  out.reserve(size());
  for (const ClientInfo c : *this) out.push_back(c);
  return out;
}

namespace {
// The pool's positions 0..n-1 shuffled as data::shuffleInPlace shuffles n elements (the same
// draws, the same permutation), the first `chosen` kept: the clients a shuffle of the pool itself
// would put first, without copying a client. I is uint32_t below 2^32 clients.
template <class I>
std::vector<ClientInfo> firstOfShuffle(const ClientPool& pool, size_t chosen, RngStream& rng) {
  std::vector<I> order(pool.size());
  std::iota(order.begin(), order.end(), I{0});
  data::shuffleInPlace(std::span<I>(order), rng);
  order.resize(chosen);
  std::sort(order.begin(), order.end());  // the pool ascends by id
  std::vector<ClientInfo> out;
  out.reserve(chosen);
  for (I i : order) out.push_back(pool[i]);
  return out;
}
}  // namespace

std::vector<ClientInfo> sampleClients(const ClientPool& pool, const SamplingConfig& s,
                                      uint64_t run_seed, const privacy::Key32& poisson_key,
                                      uint64_t round, size_t* target) {
  const size_t n = pool.size();
  if (s.poisson_rate > 0) {
    // Poisson sampling: each client on a draw of its own, a function of its id and the round.
    std::vector<ClientInfo> out;
    for (const ClientInfo c : pool)
      if (poissonSampled(poisson_key, round, c.id, s.poisson_rate)) out.push_back(c);
    *target = out.size();
    return out;
  }
  const size_t wanted = s.clients_per_round > 0 ? s.clients_per_round : ceilFraction(s.fraction, n);
  *target = std::min(n, std::max(s.min_clients, wanted));
  const size_t chosen = std::min(n, ceilFraction(s.overcommit, *target));
  // Sampling is a pure function of (seed, round): the round number is the RNG position.
  RngStream rng(StreamKey{run_seed, round, kAnyClient, StreamPurpose::kClientSampling, 0});
  return n <= UINT32_MAX ? firstOfShuffle<uint32_t>(pool, chosen, rng)
                         : firstOfShuffle<uint64_t>(pool, chosen, rng);
}

bool poissonSampled(const privacy::Key32& poisson_key, uint64_t round, uint64_t id, double rate) {
  return privacy::keyedUniform(poisson_key, round, privacy::MaskStream::kSampling, id) < rate;
}

std::vector<ClientInfo> RoundEngine::sample(const ClientPool& available, uint64_t round,
                                            size_t* target) const {
  const privacy::Key32 key =
      dp_ ? dp_->samplingKey()
          : privacy::publicKey("starling poisson sampling", config_.scheme.run_seed, 0);
  return sampleClients(available, config_.sampling, config_.scheme.run_seed, key, round, target);
}

RoundRecord RoundEngine::runRound(Fleet& fleet) {
  recorder_.begin();
  RoundRecord rec;
  rec.round = next_round_;
  rec.model_version = model_.version();
  // Every round counts for central DP, whatever becomes of it.
  if (dp_) rec.dp_epsilon = dp_->epsilon(rec.round);
  bool persisted = false;
  // The round is over: its state made durable (once), then its metrics line (recorder_).
  auto persist = [&] {
    if (persisted) return;
    persisted = true;
    ++next_round_;
    FleetWorkers* workers = fleet.workers();
    fleet_state_ = workers ? workers->saveState() : std::vector<uint8_t>{};
    saveOptimizerShard();
    if (workers) workers->checkpoint();
    saveCheckpoint();
  };
  auto finishRecord = [&] {
    recorder_.close(rec, persist);
    return rec;
  };

  if (!fleet_checked_) {
    const uint32_t shards = fleet.workers() ? fleet.workers()->stepShards() : 1;
    if (shards != config_.shard_count)
      STARLING_THROW(ConfigError, "the engine steps the server optimizer in ", config_.shard_count,
                     " shard(s) and its fleet reduces and gathers ", shards);
    fleet_checked_ = true;
  }
  if (fleet_state_pending_) {
    // A fleet without workers keeps no state of its own: a simulator's state in the checkpoint
    // means nothing to it.
    if (fleet.workers()) fleet.workers()->restoreState(fleet_state_);
    fleet_state_pending_ = false;
  }
  const auto& s = config_.sampling;
  const ClientPool available =
      fleet.waitForClients(s.min_available, std::chrono::milliseconds(s.wait_ms), rec.round);
  if (available.size() < s.min_available) {
    rec.reason = "only " + std::to_string(available.size()) + " clients available, " +
                 std::to_string(s.min_available) + " needed";
    return finishRecord();
  }
  size_t target = 0;
  std::vector<ClientInfo> active;
  if (dp_) {
    // DP samples clients only: an edge aggregator's partial holds updates the root cannot clip.
    // Under secure aggregation every edge aggregator takes part: it tells the round its clients,
    // each of which is kept on its own Poisson draw (secureSum), as the root's own are here.
    active = sample(available.clients(), rec.round, &target);
    if (config_.secagg.enabled) {
      for (const ClientInfo c : available)
        if (c.role == protocol::Role::kAggregator) active.push_back(c);
      std::sort(active.begin(), active.end(),
                [](const ClientInfo& a, const ClientInfo& b) { return a.id < b.id; });
    }
  } else {
    active = sample(available, rec.round, &target);
  }
  rec.clients_selected = active.size();
  if (active.empty()) {
    rec.reason = "Poisson sampling (rate " + std::to_string(config_.sampling.poisson_rate) +
                 ") chose none of the " + std::to_string(available.size()) + " available clients";
    return finishRecord();
  }

  protocol::TaskMsg header =
      fitTaskHeader(scheme_, rec.round, model_.version(), config_.fit, config_.round_deadline_ms);

  auto round = scheme_.begin(rec.round, carry_);
  if (dp_ && dp_->config().adaptive_clip) {
    round->setClip(dp_->clip());
    rec.dp_clip = dp_->clip();
  }
  std::set<uint64_t> failed;
  std::vector<uint64_t>
      counted;  // phase 0's accepted clients: their control changes are in the sum
  // Secure aggregation: each phase a secure sum of its own (two-phase powersgd's P, then its Q
  // against P-hat), the later phases among the clients whose input is in the phase before's sum.
  std::optional<SecureSum> secure;  // the last phase's
  while (config_.secagg.enabled) {
    header.phase = round->phase();
    // A later phase trains nothing: its clients report no metric (an edge aggregator requires
    // every declared one of each masked input).
    protocol::TaskMsg h = header;
    if (header.phase > 0) h.metrics.clear();
    const PhaseTask task{round->broadcast(), h, model_, config_.downlink};
    secure = secureSum(fleet, task, active, target, round->current(), rec, failed,
                       secure ? &secure->in_sum : nullptr);
    if (!secure) {
      rec.clients_failed = failed.size();
      if (header.phase > 0)
        rec.reason = "phase " + std::to_string(header.phase) + ": " + rec.reason;
      return finishRecord();
    }
    if (round->lastPhase()) break;
    round->nextPhase();
    // The next phase's participants: the edge aggregators still here, and the root's own
    // clients whose input is in this phase's sum.
    std::erase_if(active, [&](const ClientInfo& c) {
      return c.role != protocol::Role::kAggregator && !secure->in_sum.count(c.id);
    });
  }
  for (; !config_.secagg.enabled;) {
    header.phase = round->phase();
    if (header.phase == 0)
      header.control = control_;  // SCAFFOLD's c, phase 0 only
    else
      header.control.clear();
    const PhaseTask task{round->broadcast(), header, model_, config_.downlink,
                         control_.empty() ? nullptr : &control_acks_};
    const size_t want = round->phase() == 0 ? target : active.size();
    PhaseReport rep = fleet.runPhase(task, active, want, round->current());
    addPhase(rec, rep, std::max(rep.refused, round->current().rejected()), failed);
    if (dp_ && !round->current().sources().empty()) {
      rec.clients_failed = failed.size();
      rec.clients_completed = round->current().count();
      rec.reason =
          "central DP: a partial aggregate was merged (from an edge aggregator), whose updates "
          "the root cannot clip; the round is not applied";
      return finishRecord();
    }
    if (header.phase == 0) counted = rep.completed;
    if (round->lastPhase() || rep.completed.empty()) break;
    round->nextPhase();
    keepCompleted(active, rep);
  }
  rec.clients_failed = failed.size();
  header.control.clear();
  updateControl(round->phaseAt(0).partial(), available.size(), rec.round, counted);

  ag::RoundResult result;
  try {
    result = round->finish();
  } catch (const InvalidArgument& e) {
    rec.reason = e.what();
    return finishRecord();
  }
  rec.clients_completed = result.count;
  if (auto it = result.metrics.find("train_loss"); it != result.metrics.end())
    rec.train_loss = it->second;
  for (const auto& [name, value] : result.metrics)
    if (name != "train_loss" && name != kClipIndicator) rec.metrics[name] = value;
  const ag::RoundDecision d = ag::decideRound(
      config_.completion, result.count,
      rec.clients_selected - std::min<uint64_t>(result.count, rec.clients_selected));
  if (!d.apply) {
    rec.reason = d.reason;
    return finishRecord();
  }
  if (dp_) dp_->privatize(result.delta, result.total_weight, dp_->expectedWeight(), rec.round);
  std::vector<float> next(model_.server().begin(), model_.server().end());
  const size_t shard_n = shard_end_ - shard_begin_;
  optimizer_->step(std::span<float>(next).subspan(shard_begin_, shard_n),
                   std::span<const float>(result.delta).subspan(shard_begin_, shard_n));
  if (config_.shard_count > 1)
    fleet.workers()->gatherModel(next);  // checked: the fleet has shard_count workers
  // The step is checked on the gathered model, so every worker of a sharded step decides alike.
  if (!allFinite(next)) {
    rec.reason = "the server optimizer's step made the model non-finite; the round is not applied";
    return finishRecord();
  }
  if (dp_ && dp_->config().adaptive_clip) {
    // The count of updates within this round's clip: the indicator's mean over the round's
    // updates (each weighs 1), released with its noise only, after an applied round.
    // (Under secure aggregation the count came in the unmasked sum: secureSum.)
    const auto it = result.metrics.find(kClipIndicator);
    const double within = secure && secure->within ? *secure->within
                          : it == result.metrics.end()
                              ? 0.0
                              : it->second * static_cast<double>(result.count);
    dp_->adaptClip(std::round(within), static_cast<double>(result.count), rec.round);
  }
  model_.set(std::move(next), model_.version() + 1);
  carry_ = std::move(result.next);
  rec.applied = true;
  rec.model_version = model_.version();

  if (recorder_.evaluationDue(rec)) {
    // Under central DP the round is durable before its model leaves for evaluation: a crash
    // during it cannot make the round run again with another sample and other noise.
    if (dp_) persist();
    try {
      const ClientPool evaluators =
          fleet.waitForClients(1, std::chrono::milliseconds(0), rec.round).evaluators();
      if (!evaluators.empty()) {
        protocol::TaskMsg eh = header;
        eh.kind = protocol::TaskKind::kEvaluate;
        eh.phase = 0;
        eh.model_version = model_.version();
        const compression::PhaseBroadcast none{config_.scheme.run_seed, rec.round, 0, nullptr};
        const EvalReport ev =
            fleet.evaluate(PhaseTask{none, eh, model_, config_.downlink}, evaluators);
        rec.downlink_bytes += ev.downlink_bytes;
        rec.uplink_bytes += ev.uplink_bytes;
        if (ev.examples > 0) {
          rec.test_accuracy = ev.accuracy;
          rec.test_loss = ev.loss;
        }
      }
    } catch (const Stopped&) {
      // The round was applied: record it (without test metrics) before stopping, so that the
      // checkpoint keeps it and a restart does not run it again.
      finishRecord();
      throw;
    } catch (...) {
      // Under central DP the round is already checkpointed and will not run again: its line too.
      if (persisted) finishRecord();
      throw;
    }
  }
  return finishRecord();
}

// Secure aggregation's steps for the sampled clients (server/secure_round.h), then the
// survivors' sum merged into `agg` as one partial of uniform weights (the bound n C checked).
// Nullopt, with rec.reason, when the round has no sum to apply.
std::optional<RoundEngine::SecureSum> RoundEngine::secureSum(
    Fleet& fleet, const PhaseTask& plain, std::vector<ClientInfo>& active, size_t target,
    ag::PhaseAggregator& agg, RoundRecord& rec, std::set<uint64_t>& failed,
    const std::set<uint64_t>* only) {
  // Failures are the round's clients' (below); a step's report says which peers failed it, an
  // edge aggregator among them.
  std::set<uint64_t> peers_failed;
  const auto account = [&](const PhaseReport& rep) {
    addPhase(rec, rep, rep.refused, peers_failed);
    keepCompleted(active, rep);
  };
  // The round's clients: those sampled, and those the sampled edge aggregators bring. A client
  // two aggregators name, or one of the root's own, is left out of every aggregator's.
  std::set<uint64_t> ids;
  std::vector<ClientInfo> aggregators;
  for (const auto& c : active) {
    if (c.role == protocol::Role::kAggregator)
      aggregators.push_back(c);
    else if (!only || only->count(c.id))
      ids.insert(c.id);
  }
  const auto outside = [&](uint64_t c) { return only && !only->count(c); };
  std::map<uint64_t, std::vector<uint64_t>> relayed;
  if (!aggregators.empty()) {
    // The roster is answered at once (no client is asked): a quarter of the deadline.
    PhaseReport roster;
    relayed = fleet.secureRoster(aggregators, rec.round, config_.round_deadline_ms / 4, roster);
    addPhase(rec, roster, roster.refused, peers_failed);
    std::map<uint64_t, int> named;
    for (const auto& [peer, cs] : relayed)
      for (uint64_t c : cs) ++named[c];
    // Under DP an aggregator's client is in the round on its own Poisson draw, the draw a client
    // of the root's has: sampled alike wherever it connects (a client the root sampled itself is
    // left out of the aggregator's list below).
    const auto unsampled = [&](uint64_t c) {
      return dp_ &&
             !poissonSampled(dp_->samplingKey(), rec.round, c, config_.sampling.poisson_rate);
    };
    for (auto& [peer, cs] : relayed) {
      std::erase_if(cs, [&](uint64_t c) {
        return named[c] > 1 || ids.count(c) || unsampled(c) || outside(c);
      });
      for (uint64_t c : cs) ids.insert(c);
    }
    std::erase_if(relayed, [](const auto& r) { return r.second.empty(); });
    std::erase_if(active, [&](const ClientInfo& c) {
      return c.role == protocol::Role::kAggregator && !relayed.count(c.id);
    });
  }
  if (!only) rec.clients_selected = ids.size();
  // What each client masks: its update on the round's shared support, or a low-rank factor.
  const cz::RoundContext context = plain.broadcast.context(0);
  std::unique_ptr<SecureRound> sr;
  try {
    if (ids.size() < 3)
      STARLING_THROW(InvalidArgument,
                     "secure aggregation needs at least 3 clients a round (with "
                     "2, each would learn the other's update from the sum), got ",
                     ids.size());
    if (dp_ && dp_->distributed() && ids.size() < dp_->minClients())
      STARLING_THROW(InvalidArgument, "distributed DP: ", ids.size(),
                     " clients sampled, and a sum needs the noise of privacy.min_clients = ",
                     dp_->minClients());
    const std::vector<uint64_t> all(ids.begin(), ids.end());
    // Adaptive clipping: the round's clip, and one more value, the count within it.
    SecAggConfig sc = config_.secagg;
    const bool count = dp_ && dp_->config().adaptive_clip;
    if (count) sc.clip = dp_->clip();
    privacy::SecAggParams params =
        sc.paramsFor(config_.scheme.run_seed, rec.round, all.size(),
                     scheme_.compressor().secureSize(*layout_, context) + (count ? 1 : 0));
    params.phase = plain.header.phase;
    params.clip_count = count;
    sr = std::make_unique<SecureRound>(
        std::move(params), all,
        SecureMetricRules{config_.scheme.metrics, config_.scheme.bounds.max_metric_abs},
        protocol::SecAggLimits{}, std::move(relayed),
        config_.secagg.authority ? &*config_.secagg.authority : nullptr);
  } catch (const Error& e) {  // too few clients, or a ring their sum does not fit
    rec.reason = e.what();
    failed.insert(peers_failed.begin(), peers_failed.end());
    return std::nullopt;
  }
  // Outside the refusals above: a collective's failure stops every worker, not this one's round.
  if (FleetWorkers* workers = fleet.workers()) sr->setNonce(workers->agreeNonce(sr->nonce()));
  for (const SecureStage stage : {SecureStage::kAdvertise, SecureStage::kShareKeys}) {
    account(fleet.exchange(stage, *sr, active, config_.round_deadline_ms));
    if (active.empty()) break;
  }
  if (!active.empty()) {
    PhaseTask task = plain;
    task.secure = sr.get();
    task.header.secure = true;
    // An edge aggregator's subtree answers as one: with one, every peer is waited for; so is
    // every client of a later phase (as in the clear).
    const size_t want =
        aggregators.empty() && !only ? std::min(target, active.size()) : active.size();
    account(fleet.runPhase(task, active, want, agg));
  }
  // A later phase's sum must hold the input of every client in the phase before's (`only`): with
  // one missing, the two sums differ by that client's update seen through the shared factors
  // (two-phase PowerSGD: P-hat^T M_u Q, r x r values of client u's alone). Nothing of such a phase
  // is unmasked, and the round is not applied (honest clients of a signed round refuse to sign a
  // later phase's survivors list that names anyone absent, client/secure_party.h).
  if (only) {
    const std::set<uint64_t>& masked = sr->answered(SecureStage::kMaskedInput);
    if (masked.size() != only->size()) {
      for (uint64_t id : *only)
        if (!masked.count(id)) failed.insert(id);
      rec.reason = "secure aggregation: " + std::to_string(only->size() - masked.size()) +
                   " of the " + std::to_string(only->size()) +
                   " clients in the phase before's sum sent no masked input of this phase, and a "
                   "sum of the others would reveal the difference (docs/privacy.md): nothing of it "
                   "is unmasked";
      return std::nullopt;
    }
  }
  // Distributed DP: a sum with fewer clients' noise than the accountant assumes is never
  // unmasked (the server would see it with too little noise): the round stops before the unmask.
  // The unmasked sum holds exactly these masked inputs (SecAggServer::finish: its survivors are
  // the masked inputs; a client lost later is unmasked by its neighbours), so this one check
  // bounds every released sum.
  if (dp_ && dp_->distributed()) {
    const std::set<uint64_t> masked = sr->answered(SecureStage::kMaskedInput);
    if (masked.size() < dp_->minClients()) {
      for (uint64_t id : ids)
        if (!masked.count(id)) failed.insert(id);
      rec.reason = "distributed DP: " + std::to_string(masked.size()) +
                   " masked inputs arrived, and a sum needs the noise of privacy.min_clients = " +
                   std::to_string(dp_->minClients()) + ": nothing is unmasked";
      return std::nullopt;
    }
  }
  if (dp_ && dp_->distributed()) markRoundSpent();
  for (const SecureStage stage : {SecureStage::kSurvivors, SecureStage::kUnmask}) {
    if (active.empty()) break;
    if (runsStage(sr->params(), stage))
      account(fleet.exchange(stage, *sr, active, config_.round_deadline_ms));
  }
  SecureRound::Outcome out = sr->finish();
  // The failed: the round's clients whose input is not in the sum (a client lost after its
  // masked input is in it, unmasked by its neighbours: not failed), or, with no sum, whose input
  // never arrived.
  const std::set<uint64_t> in = out.ok
                                    ? std::set<uint64_t>(out.survivors.begin(), out.survivors.end())
                                    : sr->answered(SecureStage::kMaskedInput);
  for (uint64_t id : ids)
    if (!in.count(id)) failed.insert(id);
  if (!out.ok) {
    rec.reason = out.reason;
    return std::nullopt;
  }
  SecureSum result{std::set<uint64_t>(out.survivors.begin(), out.survivors.end()), std::nullopt};
  if (sr->params().clip_count) {
    // The count of updates within the clip: an integer times the clip, rounded in the ring and to
    // a float (far below half the clip for any count), clamped to [0, n]. An honest client masks
    // the clip or 0; a lying one can move the count anywhere in that range (as it can move the
    // update's sum within n C), which cannot raise an honest client's effect on it above one.
    const double count = std::round(static_cast<double>(out.sum.back()) / sr->params().ring.clip);
    result.within = std::isfinite(count)
                        ? std::clamp(count, 0.0, static_cast<double>(out.survivors.size()))
                        : 0.0;
    out.sum.pop_back();
  }
  // Revealed shares that were wrong, decoded around: who revealed them (or dealt them).
  for (uint64_t liar : out.liars)
    if (std::find(rec.secagg_wrong_shares.begin(), rec.secagg_wrong_shares.end(), liar) ==
        rec.secagg_wrong_shares.end())
      rec.secagg_wrong_shares.push_back(liar);
  cz::PartialMessage pm;
  pm.header = {layout_->fingerprint(),
               rec.round,
               plain.header.phase,
               agg.partial().layout().sharedTag(),
               out.survivors.size(),
               static_cast<double>(out.survivors.size()),
               0};
  // The sum as the round's payloads: dense on the shared support, or the phase's factor sums.
  pm.tensors = scheme_.compressor().securePayloads(*layout_, context, out.sum);
  for (const auto& [name, v] : out.metrics)
    if (std::find(config_.scheme.metrics.begin(), config_.scheme.metrics.end(), name) !=
        config_.scheme.metrics.end())
      pm.metrics.push_back(cz::MetricSum{name, v.first, v.second});
  try {
    agg.merge(cz::view(pm), kSecureSource);
  } catch (const InputError& e) {
    ++rec.updates_rejected;
    rec.reason = std::string("secure aggregation: the unmasked sum was refused: ") + e.what();
    return std::nullopt;
  }
  return result;
}

void RoundEngine::markRoundSpent() {
  // The last round's state with the next round past this one: a restart from it counts this round
  // (epsilon is by round number) and does not run it again. The round's end overwrites it.
  ++next_round_;
  try {
    saveCheckpoint();
  } catch (...) {
    --next_round_;
    throw;
  }
  --next_round_;
}

// SCAFFOLD, option II: c += (1/N) sum over the clients whose update was accepted of
// (c_i+ - c_i), with N at least their count. Applied whether or not the round's model step is,
// and those clients acknowledged: their next task tells them to commit this round's c_i+. A
// client whose update was refused (late, over a bound) or lost to a stop of the root is not, and
// drops its c_i+, so c stays the mean of every c_i (docs/protocol.md). The round's bounds keep
// each change finite and bounded; a sum that would still make c non-finite leaves c as it was,
// and acknowledges no one.
void RoundEngine::updateControl(const ag::PartialAggregate& phase0, size_t available,
                                uint64_t round, const std::vector<uint64_t>& counted) {
  const std::span<const float> sum = phase0.controlSum();
  if (control_.empty() || sum.empty() || phase0.count() == 0) return;
  const uint64_t n = config_.scaffold_population ? config_.scaffold_population : available;
  const double inv = 1.0 / static_cast<double>(std::max<uint64_t>(n, phase0.count()));
  std::vector<float> next(control_.size());
  for (size_t i = 0; i < next.size(); ++i)
    next[i] = static_cast<float>(control_[i] + static_cast<double>(sum[i]) * inv);
  if (!allFinite(next)) return;
  control_ = std::move(next);
  for (uint64_t id : counted) control_acks_[id] = round;
}

void RoundEngine::run(Fleet& fleet, const std::function<void(const RoundRecord&)>& progress) {
  {
    const RunRecorder::Reporting reporting = recorder_.reportTo(progress);
    while (!done()) runRound(fleet);
  }
  fleet.finish("all " + std::to_string(config_.rounds) + " rounds done");
}

}  // namespace starling::server
