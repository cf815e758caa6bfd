#include "client/runtime.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>

#include "client/algorithm.h"
#include "client/secure_party.h"
#include "client/upstream_link.h"
#include "compression/registry.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/framed_file.h"
#include "protocol/codec.h"
#include "protocol/control.h"

namespace starling::client {
namespace pr = starling::protocol;
namespace cz = starling::compression;
using std::chrono::milliseconds;

namespace {
// The client's state file; version 2 is version 1 in the files' frame (core/framed_file.h).
constexpr FileFormat kStateFile{0x4c434c53 /* "SLCL" */, "Starling client state file", 1, 2, 2};
}  // namespace

void RuntimeConfig::validate() const {
  security.validate(/*server_side=*/false);
  limits.validate();
  if (register_retry_ms < 10) STARLING_THROW(ConfigError, "register_retry_ms must be at least 10");
  if (server_silence_ms < 100)
    STARLING_THROW(ConfigError, "net.server_silence_ms must be at least 100, got ",
                   server_silence_ms);
  if (clock == nullptr) STARLING_THROW(ConfigError, "the client's clock is null");
  secagg_trust.validate(client_id);
  if (!state_file.empty()) {
    // Found before the first fit, not after it (the training would be lost with the write).
    const std::filesystem::path dir = std::filesystem::path(state_file).parent_path();
    std::error_code ec;
    if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
      STARLING_THROW(ConfigError, "state_file '", state_file, "': its folder '", dir.string(),
                     "' does not exist (create it first)");
    if (std::filesystem::is_directory(state_file, ec))
      STARLING_THROW(ConfigError, "state_file '", state_file,
                     "' is a folder; name a file in it (e.g. ", state_file, "/client.state)");
  }
}

struct ClientRuntime::Impl {
  RuntimeConfig config;
  Trainer& trainer;
  DataView train, eval;
  std::shared_ptr<spdlog::logger> log;
  const ParamLayout& layout;
  std::vector<float> model;
  uint64_t held_version = 0;
  std::map<std::string, std::unique_ptr<cz::Compressor>> compressors;
  // The update last sent (or about to be) is the link's lastAnswer(), with its task's nonce here:
  // sent again when the same task comes again after a restart.
  uint64_t pending_nonce = 0;
  uint64_t resent_same = 0;                 // updates sent again for the same task
  RuntimeStats* live = nullptr;             // the runtime's statistics, updated as messages go
  const std::atomic<bool>* stop = nullptr;  // run()'s flag, read by training
  UpstreamLink link;                        // the server above: session, heartbeats, reading
  // Secure aggregation: this client's side (made at its first setup), and the shares the server
  // sent for the round's masked input (bytes, checked again when they are used).
  std::optional<SecureParty> party;
  std::vector<uint8_t> shares;
  uint64_t shares_round = 0;

  Impl(transport::Context& ctx, RuntimeConfig c, Trainer& t, DataView tr, DataView ev,
       std::shared_ptr<spdlog::logger> l, RuntimeStats& st)
      : config((c.validate(), std::move(c))),
        trainer(t),
        train(tr),
        eval(ev),
        log(l ? std::move(l) : spdlog::default_logger()),
        layout(t.layout()),
        model(layout.numel()),
        live(&st),
        link(
            ctx, linkConfig(config), [this] { return registration(); },
            [this](uint64_t session) {
              return pr::encode(pr::HeartbeatMsg{config.client_id, session, live->last_round});
            },
            log, [this] { sent(); }) {}

  static UpstreamLinkConfig linkConfig(const RuntimeConfig& c) {
    UpstreamLinkConfig u;
    u.endpoint = c.server;
    u.security = c.security;
    u.limits = c.limits;
    u.name = "client " + std::to_string(c.client_id);
    u.register_retry_ms = c.register_retry_ms;
    u.silence_ms = c.server_silence_ms;
    u.clock = c.clock;
    u.id = c.client_id;
    return u;
  }

  std::optional<std::vector<uint8_t>> registration() {
    pr::RegisterMsg m;
    m.client_id = config.client_id;
    m.role = pr::Role::kClient;
    m.layout_fingerprint = layout.fingerprint();
    m.num_examples = train.size();
    m.eval_examples = eval.size();
    m.model_version = held_version;
    m.capabilities = {"fp16", "delta", "downlink-qsgd", "downlink-stc", "downlink-blockq"};
    return pr::encode(m);
  }

  // The link's counters into the runtime's statistics.
  void sync() {
    const UpstreamStats& u = link.stats();
    live->registrations = u.registrations;
    live->heartbeats = u.heartbeats;
    live->rejects = u.rejects;
    live->uplink_bytes = u.uplink_bytes;
    live->downlink_bytes = u.downlink_bytes;
    live->resent = resent_same + u.resent_after_busy;
  }
  // After each message sent: the statistics, then the owner's callback.
  void sent() {
    sync();
    if (config.on_sent) config.on_sent(*live);
  }

  void saveState(const ClientState& state) {
    if (config.state_file.empty()) return;
    std::vector<uint8_t> out, blob;
    state.saveTo(blob);
    ByteWriter w(out);
    w.u64(config.client_id);
    const std::vector<uint8_t>& pending = link.lastAnswer();
    w.u64(pending_nonce);
    w.u64(pending.size());
    w.bytes(pending.data(), pending.size());
    w.u64(blob.size());
    w.bytes(blob.data(), blob.size());
    writeFramed(config.state_file, kStateFile, out, 0600);
  }

  void loadState(ClientState& state) {
    if (config.state_file.empty() || !std::filesystem::exists(config.state_file)) return;
    const std::vector<uint8_t> bytes = readFile(config.state_file, uint64_t{16} << 30);
    const std::string what = "client state " + config.state_file;
    ByteReader r(unframe(kStateFile, bytes, what).payload, what);
    if (const uint64_t id = r.u64(); id != config.client_id)
      r.fail("the state of client ", id, ", this is client ", config.client_id);
    pending_nonce = r.u64();
    const uint64_t n = r.u64();
    if (n > r.remaining()) r.fail("truncated pending update");
    const auto p = r.view(n);
    link.restoreAnswer(std::vector<uint8_t>(p.begin(), p.end()));
    const uint64_t m = r.u64();
    if (m > r.remaining()) r.fail("truncated state");
    ClientState loaded(layout.fingerprint());
    loaded.loadFrom(r.view(m));
    r.finish();
    state = std::move(loaded);
    double sq = 0.0;
    if (const auto* res = state.find<cz::ResidualState>(cz::kResidualComponent))
      for (float x : res->values) sq += static_cast<double>(x) * x;
    log->info("client {}: state restored from {} ({} bytes, residual norm {:.9g}{})",
              config.client_id, config.state_file, bytes.size(), std::sqrt(sq),
              link.lastAnswer().empty() ? "" : ", with an update awaiting its task");
  }

  // Runs `work` on a second thread while this one keeps the link alive: heartbeats go out and the
  // server's messages are read (those for later are kept), so a long fit is never taken for a
  // silent server. A refusal for good (UpstreamRefused) waits for the work, then ends run().
  template <class F>
  auto withHeartbeats(F&& work) {
    auto fut = std::async(std::launch::async, std::forward<F>(work));
    std::exception_ptr refused;
    while (fut.wait_for(milliseconds(5)) != std::future_status::ready) {
      if (refused) continue;
      try {
        link.upkeep();
      } catch (const UpstreamRefused&) {
        refused = std::current_exception();
      }
    }
    if (refused) std::rethrow_exception(refused);
    return fut.get();
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

  // Secure aggregation's steps other than the masked input (client/secure_party.h): each answered
  // at once; the shares for the masked input are kept for the round's secure fit task.
  void onSecure(pr::MessageKind kind, std::span<const uint8_t> bytes) {
    if (kind == pr::MessageKind::kSecAggSetup) {
      if (!party) party.emplace(config.client_id, config.secagg_trust);
      std::vector<uint8_t> keys = party->setup(bytes);
      shares.clear();
      shares_round = 0;
      log->info("client {}: round {}: secure aggregation with {} neighbours, threshold {}{}",
                config.client_id, party->round(), party->params().neighbours,
                party->params().threshold,
                party->params().signed_keys ? ", keys signed and certified" : "");
      link.send(keys);
      return;
    }
    if (!party)
      failInput(Errc::kUnexpectedMessage, "a secure-aggregation ", pr::kindName(kind),
                " before any setup");
    switch (kind) {
      case pr::MessageKind::kSecAggAdverts:
        link.send(party->shareKeys(bytes));
        return;
      case pr::MessageKind::kSecAggShares: {
        const pr::SecAggSharesMsg m = pr::decodeSecAggShares(bytes);
        if (m.client != config.client_id || m.round != party->round())
          failInput(Errc::kWrongSender, "shares for client ", m.client, " of round ", m.round);
        shares.assign(bytes.begin(), bytes.end());
        shares_round = m.round;
        return;
      }
      case pr::MessageKind::kSecAggSurvivors:
        link.send(party->signSurvivors(bytes));
        return;
      case pr::MessageKind::kSecAggUnmask:
        link.send(party->unmask(bytes));
        return;
      default:
        failInput(Errc::kUnexpectedMessage, "a server may not send ", pr::kindName(kind));
    }
  }

  void onTask(std::span<const uint8_t> bytes, ClientState& state, RuntimeStats& stats) {
    pr::TaskMsg t =
        pr::decodeTask(bytes, layout, pr::ControlLimits{config.limits.max_message_bytes});
    ++stats.tasks;
    stats.last_round = t.round;
    if (t.kind == pr::TaskKind::kFit && t.nonce == pending_nonce && !link.lastAnswer().empty()) {
      log->info("client {}: round {} phase {} again; resending the update it already made",
                config.client_id, t.round, t.phase);
      ++resent_same;
      link.resendAnswer();
      return;
    }
    if (!t.model.empty()) {
      if (t.base_version != 0 && t.base_version != held_version) {
        // The server thinks we hold another version (we restarted, or dropped a task): tell it.
        log->warn(
            "client {}: a model delta against version {}, but this client holds {}; registering "
            "again",
            config.client_id, t.base_version, held_version);
        link.registerNow();
        return;
      }
      pr::applyModel(layout, held_version, t.base_version, t.model, model);
      held_version = t.model_version;
    }
    if (t.kind == pr::TaskKind::kEvaluate) {
      const DataView& data = eval.size() ? eval : train;
      const EvalResult e = withHeartbeats([&] { return trainer.evaluate(model, data); });
      ++stats.evaluations_sent;
      link.send(pr::encode(pr::EvaluationMsg{config.client_id, t.round, t.nonce, e.num_examples,
                                             e.loss, e.accuracy}));
      return;
    }
    if (t.secure && (!party || shares_round != t.round || party->round() != t.round))
      failInput(Errc::kUnexpectedMessage, "a secure task of round ", t.round,
                " without that round's shares; nothing trained or sent");
    if (t.secure && party->phase() != t.phase)
      failInput(Errc::kRoundMismatch, "a secure task of round ", t.round, " phase ", t.phase,
                ", and the shares are of phase ", party->phase(), "; nothing trained or sent");
    if (!t.secure && t.kind == pr::TaskKind::kFit && config.secagg_trust.require_signed)
      failInput(Errc::kUnsignedRound, "a fit task in the clear for round ", t.round,
                ", which this client refuses (secagg.threat = malicious-server: its update leaves "
                "it masked or not at all); nothing trained or sent");
    if (!t.secure && t.kind == pr::TaskKind::kFit && config.secagg_trust.min_noise > 0)
      failInput(Errc::kTooLittleNoise, "a fit task in the clear for round ", t.round,
                ", which this client refuses (secagg.min_noise: its update leaves it with its "
                "noise, masked, or not at all); nothing trained or sent");
    if (!t.secure && party && party->round() == t.round && t.kind == pr::TaskKind::kFit)
      failInput(Errc::kUnexpectedMessage, "a fit task in the clear for round ", t.round,
                ", which runs secure aggregation; nothing trained or sent");
    log->info("client {}: round {} phase {}: training on {} examples", config.client_id, t.round,
              t.phase, train.size());
    const cz::Compressor& comp = compressor(t.compressor);
    // SIGTERM ends training within a batch; nothing is sent or saved.
    const FitConfig fit = fitConfig(t.fit, stop);
    fit.check();
    auto shared = std::make_shared<const cz::SharedFactors>(std::move(t.shared));
    const cz::PhaseBroadcast b{t.run_seed, t.round, t.phase,
                               shared->factors.empty() ? nullptr : shared};
    ClientAlgorithm algorithm(comp, trainer, fit);
    // SCAFFOLD when the task carries the server's c: the control change travels with the update,
    // and c_i+ waits in the state for the server's acknowledgement of this round.
    const std::optional<uint64_t> ack = t.control.empty() ? std::nullopt : t.control_ack;
    const TurnRequest turn{b, model, t.metrics, t.nonce, t.control, ack};
    PhaseResult res =
        withHeartbeats([&] { return algorithm.takeTurn(turn, config.client_id, train, state); });
    if (res.control_dropped != 0)
      log->info(
          "client {}: round {}'s SCAFFOLD control change was not counted by the server "
          "(acknowledged: round {}); dropped",
          config.client_id, res.control_dropped, t.control_ack.value_or(0));
    std::vector<uint8_t> update;
    if (t.secure) {
      // Secure aggregation: the update, clipped and masked with the shares sent before the task,
      // is all that leaves (never the update in the clear).
      // On the training thread, heartbeats going on: masking a large model takes seconds on a
      // busy device, which the server must not take for silence.
      update = withHeartbeats([&] {
        const std::vector<float> x =
            secureInput(layout, comp, b.context(config.client_id), res.update.tensors);
        if (config.secagg_rounding) {
          const privacy::Key32 key = config.secagg_rounding(t.round, t.phase);
          return party->mask(shares, x, res.update.metrics, &key);
        }
        return party->mask(shares, x, res.update.metrics);
      });
    } else {
      update = pr::encodeUpdate(res.update);
    }
    link.restoreAnswer(std::move(update));
    pending_nonce = t.nonce;
    saveState(state);  // before sending: a crash now resends this update, never retrains
    ++stats.updates_sent;
    stats.update_bytes += link.lastAnswer().size();
    link.resendAnswer();
  }
};

ClientRuntime::ClientRuntime(transport::Context& ctx, RuntimeConfig config, Trainer& trainer,
                             DataView train, DataView eval, std::shared_ptr<spdlog::logger> log)
    : impl_(std::make_unique<Impl>(ctx, std::move(config), trainer, train, eval, std::move(log),
                                   stats_)),
      state_(trainer.layout().fingerprint()) {
  impl_->loadState(state_);
}

ClientRuntime::~ClientRuntime() = default;

bool ClientRuntime::run(const std::atomic<bool>& stop) {
  Impl& s = *impl_;
  s.stop = &stop;
  struct Sync {  // the statistics as the link left them, however run() ends
    Impl& s;
    ~Sync() { s.sync(); }
  } sync{s};
  s.link.registerNow();
  while (!stop.load()) {
    s.link.upkeep();
    std::optional<transport::Received> r = s.link.next(milliseconds(50));
    s.sync();
    if (!r) continue;
    const auto kind = pr::peekKind(r->bytes());
    try {
      switch (*kind) {  // the link returns only a task, a shutdown or a refusal
        case pr::MessageKind::kTask:
          s.onTask(r->bytes(), state_, stats_);
          break;
        case pr::MessageKind::kSecAggSetup:
        case pr::MessageKind::kSecAggAdverts:
        case pr::MessageKind::kSecAggShares:
        case pr::MessageKind::kSecAggSurvivors:
        case pr::MessageKind::kSecAggUnmask:
          s.onSecure(*kind, r->bytes());
          break;
        case pr::MessageKind::kReject:
          s.log->warn("client {}: the server refused a message: {}", s.config.client_id,
                      pr::decodeReject(r->bytes()).message);
          break;
        case pr::MessageKind::kShutdown: {
          const auto f = pr::decodeShutdown(r->bytes());
          s.log->info("client {}: the server ended the federation: {}", s.config.client_id,
                      f.reason);
          return true;
        }
        default:
          break;
      }
    } catch (const TrainingStopped& e) {
      // The state is as it was before the task (it is saved only with a finished update): the
      // task runs again when the client and the server are back.
      s.log->info("client {}: stopped during its task, nothing sent: {}", s.config.client_id,
                  e.what());
      return false;
    } catch (const InputError& e) {
      s.log->warn("client {}: ignored a message from the server: {}", s.config.client_id, e.what());
      // A task or secure step it refuses: the server is told, with the code, so that it does not
      // wait for an answer that will not come (a floor of its own, a step of a round it has no
      // side of after a restart).
      if (*kind == pr::MessageKind::kTask || *kind == pr::MessageKind::kSecAggSetup ||
          *kind == pr::MessageKind::kSecAggAdverts || *kind == pr::MessageKind::kSecAggShares ||
          *kind == pr::MessageKind::kSecAggSurvivors || *kind == pr::MessageKind::kSecAggUnmask)
        s.link.send(
            pr::encode(pr::RejectMsg{pr::RejectKind::kRefused, static_cast<uint32_t>(e.code()), 0,
                                     0, std::string(e.what()).substr(0, 1000)}));
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
