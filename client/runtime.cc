#include "client/runtime.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>

#include "client/algorithm.h"
#include "client/upstream_session.h"
#include "compression/registry.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"
#include "protocol/codec.h"
#include "protocol/control.h"

namespace starling::client {
namespace pr = starling::protocol;
namespace cz = starling::compression;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {
constexpr uint32_t kStateMagic = 0x4c434c53;  // "SLCL"
constexpr uint32_t kStateVersion = 1;
}  // namespace

void RuntimeConfig::validate() const {
  security.validate(/*server_side=*/false);
  limits.validate();
  if (register_retry_ms < 10) STARLING_THROW(ConfigError, "register_retry_ms must be at least 10");
  if (server_silence_ms < 100) STARLING_THROW(ConfigError, "server_silence_ms must be at least 100");
  if (clock == nullptr) STARLING_THROW(ConfigError, "the client's clock is null");
}

struct ClientRuntime::Impl {
  RuntimeConfig config;
  Trainer& trainer;
  DataView train, eval;
  std::shared_ptr<spdlog::logger> log;
  transport::ClientSocket socket;
  const ParamLayout& layout;
  std::vector<float> model;
  uint64_t held_version = 0;
  std::map<std::string, std::unique_ptr<cz::Compressor>> compressors;
  // The update last sent (or about to be), with its task's nonce: resent when the same task
  // comes again after a restart.
  uint64_t pending_nonce = 0;
  std::vector<uint8_t> pending;
  // Session state.
  UpstreamSession upstream;                 // registration, welcome, heartbeats, re-registration
  const std::atomic<bool>* stop = nullptr;  // run()'s flag, read by training
  // A Reject(Busy) for the pending update: send it again at `resend_at`, backing off.
  std::optional<Clock::time_point> resend_at;
  milliseconds busy_backoff{200};

  Impl(transport::Context& ctx, RuntimeConfig c, Trainer& t, DataView tr, DataView ev,
       std::shared_ptr<spdlog::logger> l)
      : config((c.validate(), std::move(c))),
        trainer(t),
        train(tr),
        eval(ev),
        log(l ? std::move(l) : spdlog::default_logger()),
        socket(ctx, config.server, config.security, config.limits),
        layout(t.layout()),
        model(layout.numel()),
        upstream({milliseconds(config.register_retry_ms), milliseconds(config.server_silence_ms)},
                 config.clock->now()) {}

  void send(std::span<const uint8_t> bytes, RuntimeStats& stats) {
    if (socket.send(bytes)) stats.uplink_bytes += bytes.size();
    if (config.on_sent) config.on_sent(stats);
  }

  void registerNow(RuntimeStats& stats) {
    pr::RegisterMsg m;
    m.client_id = config.client_id;
    m.role = pr::Role::kClient;
    m.layout_fingerprint = layout.fingerprint();
    m.num_examples = train.size();
    m.eval_examples = eval.size();
    m.model_version = held_version;
    m.capabilities = {"fp16", "delta", "downlink-qsgd", "downlink-stc"};
    send(pr::encode(m), stats);
    upstream.registerSent(config.clock->now());
    ++stats.registrations;
  }

  void saveState(const ClientState& state) {
    if (config.state_file.empty()) return;
    std::vector<uint8_t> out, blob;
    state.saveTo(blob);
    ByteWriter w(out);
    w.u32(kStateMagic);
    w.u32(kStateVersion);
    w.u64(config.client_id);
    w.u64(pending_nonce);
    w.u64(pending.size());
    w.bytes(pending.data(), pending.size());
    w.u64(blob.size());
    w.bytes(blob.data(), blob.size());
    writeFileAtomic(config.state_file, out, 0600);
  }

  void loadState(ClientState& state) {
    if (config.state_file.empty() || !std::filesystem::exists(config.state_file)) return;
    const std::vector<uint8_t> bytes = readFile(config.state_file, uint64_t{16} << 30);
    ByteReader r(bytes, "client state " + config.state_file);
    if (r.u32() != kStateMagic) r.fail("not a Starling client state file");
    if (const uint32_t v = r.u32(); v != kStateVersion) r.fail("state format version ", v);
    if (const uint64_t id = r.u64(); id != config.client_id) r.fail("the state of client ", id, ", this is client ", config.client_id);
    pending_nonce = r.u64();
    const uint64_t n = r.u64();
    if (n > r.remaining()) r.fail("truncated pending update");
    const auto p = r.view(n);
    pending.assign(p.begin(), p.end());
    const uint64_t m = r.u64();
    if (m > r.remaining()) r.fail("truncated state");
    ClientState loaded(layout.fingerprint());
    loaded.loadFrom(r.view(m));
    r.finish();
    state = std::move(loaded);
    double sq = 0.0;
    if (const auto* res = state.find<cz::ResidualState>(cz::kResidualComponent))
      for (float x : res->values) sq += static_cast<double>(x) * x;
    log->info("client {}: state restored from {} ({} bytes, residual norm {:.9g}{})", config.client_id,
              config.state_file, bytes.size(), std::sqrt(sq), pending.empty() ? "" : ", with an update awaiting its task");
  }

  // Runs `work` on a second thread while this one keeps heartbeating.
  template <class F>
  auto withHeartbeats(F&& work, RuntimeStats& stats) {
    auto fut = std::async(std::launch::async, std::forward<F>(work));
    while (fut.wait_for(milliseconds(20)) != std::future_status::ready) heartbeatIfDue(stats);
    return fut.get();
  }

  void heartbeatIfDue(RuntimeStats& stats) {
    const auto now = config.clock->now();
    if (!upstream.heartbeatDue(now)) return;
    ++stats.heartbeats;
    send(pr::encode(pr::HeartbeatMsg{config.client_id, upstream.session(), stats.last_round}),
         stats);
    log->debug("client {}: heartbeat sent", config.client_id);
    upstream.heartbeatSent(now);
  }

  // A server names the compressor in each task; a few are kept (a hostile server cannot grow
  // this without bound), and a spec this build does not know is refused input.
  const cz::Compressor& compressor(const std::string& spec) {
    auto it = compressors.find(spec);
    if (it == compressors.end()) {
      std::unique_ptr<cz::Compressor> c;
      try {
        c = cz::makeCompressor(spec);
      } catch (const ConfigError& e) {
        failInput(Errc::kMissingField, "the task's compressor: ", e.what());
      }
      if (compressors.size() >= 4) compressors.clear();
      it = compressors.emplace(spec, std::move(c)).first;
    }
    return *it->second;
  }

  void onTask(std::span<const uint8_t> bytes, ClientState& state, RuntimeStats& stats) {
    pr::TaskMsg t = pr::decodeTask(bytes, layout, pr::ControlLimits{config.limits.max_message_bytes});
    ++stats.tasks;
    stats.last_round = t.round;
    if (t.kind == pr::TaskKind::kFit && t.nonce == pending_nonce && !pending.empty()) {
      log->info("client {}: round {} phase {} again; resending the update it already made", config.client_id, t.round,
                t.phase);
      send(pending, stats);
      ++stats.resent;
      return;
    }
    if (!t.model.empty()) {
      if (t.base_version != 0 && t.base_version != held_version) {
        // The server thinks we hold another version (we restarted, or dropped a task): tell it.
        log->warn("client {}: a model delta against version {}, but this client holds {}; registering again",
                  config.client_id, t.base_version, held_version);
        registerNow(stats);
        return;
      }
      pr::applyModel(layout, held_version, t.base_version, t.model, model);
      held_version = t.model_version;
    }
    if (t.kind == pr::TaskKind::kEvaluate) {
      const DataView& data = eval.size() ? eval : train;
      const EvalResult e = withHeartbeats([&] { return trainer.evaluate(model, data); }, stats);
      send(pr::encode(pr::EvaluationMsg{config.client_id, t.round, t.nonce, e.num_examples, e.loss, e.accuracy}), stats);
      ++stats.evaluations_sent;
      return;
    }
    log->info("client {}: round {} phase {}: training on {} examples", config.client_id, t.round, t.phase, train.size());
    if (config.delay_ms)
      withHeartbeats(
          [&] {
            // A slow device's delay, cut short by a stop like training.
            const auto until = config.clock->now() + milliseconds(config.delay_ms);
            while (config.clock->now() < until) {
              if (stop && stop->load()) throw TrainingStopped("client: stopped while delaying");
              std::this_thread::sleep_for(milliseconds(10));
            }
          },
          stats);
    const cz::Compressor& comp = compressor(t.compressor);
    FitConfig fit{.epochs = t.fit.epochs, .batch_size = t.fit.batch_size, .lr = t.fit.lr};
    fit.prox_mu = t.fit.prox_mu;
    fit.stop = stop;  // SIGTERM ends training within a batch; nothing is sent or saved
    fit.check();
    auto shared = std::make_shared<const cz::SharedFactors>(std::move(t.shared));
    const cz::PhaseBroadcast b{t.run_seed, t.round, t.phase, shared->factors.empty() ? nullptr : shared};
    ClientAlgorithm algorithm(comp, trainer, fit);
    // SCAFFOLD when the task carries the server's c: the control change travels with the update,
    // and c_i+ waits in the state for the server's acknowledgement of this round.
    const std::optional<uint64_t> ack = t.control.empty() ? std::nullopt : t.control_ack;
    PhaseResult res = withHeartbeats(
        [&] {
          return algorithm.runPhase(b, config.client_id, model, train, state, t.control, ack);
        },
        stats);
    if (res.control_dropped != 0)
      log->info(
          "client {}: round {}'s SCAFFOLD control change was not counted by the server "
          "(acknowledged: round {}); dropped",
          config.client_id, res.control_dropped, t.control_ack.value_or(0));
    res.update.control = std::move(res.control_delta);
    res.update.header.nonce = t.nonce;
    // Keep only the metrics the server aggregates.
    std::erase_if(res.update.metrics, [&](const Metric& m) {
      return std::find(t.metrics.begin(), t.metrics.end(), m.name) == t.metrics.end();
    });
    pending = pr::encodeUpdate(res.update);
    pending_nonce = t.nonce;
    saveState(state);  // before sending: a crash now resends this update, never retrains
    send(pending, stats);
    ++stats.updates_sent;
    stats.update_bytes += pending.size();
  }
};

ClientRuntime::ClientRuntime(transport::Context& ctx, RuntimeConfig config, Trainer& trainer, DataView train,
                             DataView eval, std::shared_ptr<spdlog::logger> log)
    : impl_(std::make_unique<Impl>(ctx, std::move(config), trainer, train, eval, std::move(log))),
      state_(trainer.layout().fingerprint()) {
  impl_->loadState(state_);
}

ClientRuntime::~ClientRuntime() = default;

bool ClientRuntime::run(const std::atomic<bool>& stop) {
  Impl& s = *impl_;
  s.stop = &stop;
  s.registerNow(stats_);
  while (!stop.load()) {
    const UpstreamSession::Due due = s.upstream.tick(s.config.clock->now());
    if (due.silent)
      s.log->warn("client {}: the server has been silent for {} ms; registering again", s.config.client_id,
                  s.config.server_silence_ms);
    if (due.register_now) s.registerNow(stats_);
    if (due.heartbeat) s.heartbeatIfDue(stats_);
    if (s.resend_at && s.config.clock->now() >= *s.resend_at) {
      s.resend_at.reset();
      s.send(s.pending, stats_);
      ++stats_.resent;
    }
    auto r = s.socket.receive(milliseconds(50));
    if (!r) continue;
    if (r->error) {
      s.log->warn("client {}: {}", s.config.client_id, r->error->what());
      continue;
    }
    s.upstream.heard(s.config.clock->now());
    stats_.downlink_bytes += r->bytes().size();
    const auto kind = pr::peekKind(r->bytes());
    if (kind != pr::MessageKind::kReject) s.busy_backoff = milliseconds(200);
    try {
      if (!kind) failInput(Errc::kMalformed, "not a Starling message");
      switch (*kind) {
        case pr::MessageKind::kWelcome: {
          const auto w = pr::decodeWelcome(r->bytes());
          if (w.client_id != s.config.client_id) failInput(Errc::kWrongSender, "a welcome for client ", w.client_id);
          // Registrations queued during an outage come back as several welcomes: log the first.
          if (s.upstream.onWelcome(w.session, w.heartbeat_ms))
            s.log->info("client {}: registered (session {:x})", s.config.client_id, w.session);
          break;
        }
        case pr::MessageKind::kHeartbeat: {
          const auto h = pr::decodeHeartbeat(r->bytes());
          if (s.upstream.onServerHeartbeat(h.session)) {
            s.log->warn("client {}: the server restarted; registering again", s.config.client_id);
            s.registerNow(stats_);
          }
          break;
        }
        case pr::MessageKind::kTask: s.onTask(r->bytes(), state_, stats_); break;
        case pr::MessageKind::kReject: {
          const auto j = pr::decodeReject(r->bytes());
          ++stats_.rejects;
          if (j.kind == pr::RejectKind::kNotRegistered) {
            // After a root restart every heartbeat queued during the outage draws one (issue 20:
            // 7 to 9 registrations, each bringing the task and the update again): one
            // registration in flight answers them all.
            if (s.upstream.onNotRegistered(s.config.clock->now())) s.registerNow(stats_);
          } else if (j.kind == pr::RejectKind::kBusy) {
            // Nothing was wrong with the upload: send it again after a randomized backoff.
            if (!s.pending.empty() && !s.resend_at) {
              const auto wait = s.busy_backoff + milliseconds(std::rand() % (s.busy_backoff.count() + 1));
              s.resend_at = s.config.clock->now() + wait;
              s.busy_backoff = std::min(s.busy_backoff * 2, milliseconds(5000));
              s.log->info("client {}: the server is busy; sending the update again in {} ms", s.config.client_id,
                          wait.count());
            }
          } else {
            s.log->warn("client {}: the server refused a message: {}", s.config.client_id, j.message);
          }
          break;
        }
        case pr::MessageKind::kShutdown: {
          const auto f = pr::decodeShutdown(r->bytes());
          s.log->info("client {}: the server ended the federation: {}", s.config.client_id, f.reason);
          return true;
        }
        default: failInput(Errc::kUnexpectedMessage, "a server may not send ", pr::kindName(*kind));
      }
    } catch (const TrainingStopped& e) {
      // The state is as it was before the task (it is saved only with a finished update): the
      // task runs again when the client and the server are back.
      s.log->info("client {}: stopped during its task, nothing sent: {}", s.config.client_id,
                  e.what());
      return false;
    } catch (const InputError& e) {
      s.log->warn("client {}: ignored a message from the server: {}", s.config.client_id, e.what());
    } catch (const DivergenceError& e) {
      s.log->error("client {}: training diverged, task dropped: {}", s.config.client_id, e.what());
    } catch (const InvalidArgument& e) {
      s.log->error("client {}: task dropped: {}", s.config.client_id, e.what());
    } catch (const ConfigError& e) {
      s.log->error("client {}: task dropped: {}", s.config.client_id, e.what());
    }
  }
  return false;
}

}  // namespace starling::client
