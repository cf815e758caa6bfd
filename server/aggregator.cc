#include "server/aggregator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>

#include "client/upstream_link.h"
#include "core/error.h"
#include "protocol/control.h"
#include "protocol/secagg_wire.h"
#include "server/run_recorder.h"
#include "server/secure_relay.h"

namespace starling::server {
namespace ag = starling::aggregation;
namespace pr = starling::protocol;
namespace cz = starling::compression;
using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock
using std::chrono::milliseconds;

void AggregatorConfig::validate() const {
  if (upstream.empty())
    STARLING_THROW(ConfigError, "an aggregator needs an upstream endpoint (--server.upstream)");
  security.validate(/*server_side=*/false);
  limits.validate();
  if (clock == nullptr) STARLING_THROW(ConfigError, "the aggregator's clock is null");
  if (upstream_silence_ms < 100)
    STARLING_THROW(ConfigError, "net.server_silence_ms must be at least 100, got ",
                   upstream_silence_ms);
  bounds.validate();
  if (!(resparsify_density >= 0.0 && resparsify_density <= 1.0))
    STARLING_THROW(ConfigError, "aggregator.resparsify_density must be in [0, 1], got ",
                   resparsify_density);
  if (min_clients == 0) STARLING_THROW(ConfigError, "aggregator.min_clients must be at least 1");
  if (!(deadline_share > 0.0 && deadline_share < 1.0))
    STARLING_THROW(ConfigError, "aggregator.deadline_share must be in (0, 1), got ",
                   deadline_share);
}

struct EdgeAggregator::Impl {
  AggregatorConfig config;
  ZmqFleet& fleet;
  std::shared_ptr<const ParamLayout> layout;
  std::shared_ptr<spdlog::logger> log;
  std::map<std::string, std::unique_ptr<ag::RoundScheme>> schemes;
  std::unique_ptr<ModelStore> model;
  std::vector<float> held;  // the model as received from upstream
  uint64_t held_version = 0;
  std::unique_ptr<ag::PhaseAggregator> previous;  // this point's aggregator of the phase before
  uint64_t previous_round = 0;
  bool previous_scaffold = false;  // the current round's phase 0 carried SCAFFOLD's control
  // SCAFFOLD's acknowledgements, relayed: the clients whose control changes went into the last
  // phase-0 partial sent up (of round `partial_round`) are acknowledged for that round when the
  // upstream acknowledges it to this aggregator; `client_acks` goes down in their tasks.
  ControlAcks client_acks;
  uint64_t partial_round = 0;
  std::vector<uint64_t> partial_clients;
  std::vector<float> residual;  // what re-sparsification dropped, sent in later rounds
  uint64_t answered_nonce = 0;  // the upstream task the link's lastAnswer() answers
  uint64_t partials = 0;
  MetricsLog records{config.metrics_file};
  uint64_t registered_examples = 0, registered_eval = 0;  // as last registered upstream
  std::chrono::steady_clock::time_point subtree_told{};   // its clients, last told upstream
  // Secure aggregation relayed for the root (server/secure_relay.h): the round's state between
  // its steps.
  SecureRelay relay;
  // The connection upstream, a client's (client/upstream_link.h): session, heartbeats, reading
  // while a phase is relayed, the Busy back-off.
  client::UpstreamLink up;

  Impl(transport::Context& ctx, AggregatorConfig c, ZmqFleet& f,
       std::shared_ptr<const ParamLayout> l, std::shared_ptr<spdlog::logger> lg)
      : config((c.validate(), std::move(c))),
        fleet(f),
        layout(std::move(l)),
        log(lg ? std::move(lg) : spdlog::default_logger()),
        held(layout->numel()),
        relay(config.id, pr::SecAggLimits{config.limits.max_message_bytes}),
        up(
            ctx, linkConfig(config), [this] { return registration(); },
            [this](uint64_t session) {
              pr::HeartbeatMsg h{config.id, session, previous_round};
              // Its clients, for the root's status page: at most every 2 s (a heartbeat of
              // 10,000 clients is about 400 KB).
              const auto now = config.clock->now();
              if (now - subtree_told >= std::chrono::seconds(2)) {
                subtree_told = now;
                h.subtree = fleet.subtree();
              }
              return pr::encode(h);
            },
            log) {
    // A path it cannot write is refused at start, not found at the first phase.
    if (!config.metrics_file.empty() && !std::ofstream(config.metrics_file, std::ios::app))
      STARLING_THROW(ConfigError, "aggregator.metrics: cannot append to '", config.metrics_file,
                     "'");
  }

  static client::UpstreamLinkConfig linkConfig(const AggregatorConfig& c) {
    client::UpstreamLinkConfig u;
    u.endpoint = c.upstream;
    u.security = c.security;
    u.limits = c.limits;
    u.name = "aggregator " + std::to_string(c.id);
    u.register_retry_ms = c.register_retry_ms;
    u.silence_ms = c.upstream_silence_ms;
    u.clock = c.clock;
    u.id = c.id;
    return u;
  }

  // The Register upstream, with the subtree's totals; nothing to offer before enough clients
  // registered (the link asks again at its retry interval).
  std::optional<std::vector<uint8_t>> registration() {
    pr::RegisterMsg m;
    m.client_id = config.id;
    m.role = pr::Role::kAggregator;
    m.layout_fingerprint = layout->fingerprint();
    m.num_examples = fleet.totalExamples();
    m.eval_examples = fleet.totalEvalExamples();
    m.model_version = held_version;
    registered_examples = m.num_examples;
    registered_eval = m.eval_examples;
    if (m.num_examples == 0 || fleet.available().size() < config.min_clients) return std::nullopt;
    return pr::encode(m);
  }

  // Upstream upkeep, on every turn of the fleet's loops (a relayed phase's too) and of run():
  // heartbeats, registrations, and reading what upstream sent (a task for later is kept).
  void upkeep() {
    // Registered with other totals than the subtree has now: register them.
    if (up.session().registered() && (fleet.totalExamples() != registered_examples ||
                                      fleet.totalEvalExamples() != registered_eval))
      up.registerNow();
    up.upkeep();
  }

  // Upstream names the compressor in each task; a few schemes are kept (their memory grows with
  // the model), and a spec this build does not know is refused input.
  // SCAFFOLD comes from upstream too: a phase-0 task that carries the server's control variate
  // starts a SCAFFOLD round, whose updates (and this partial) carry control changes.
  ag::RoundScheme& scheme(const std::string& compressor, bool scaffold) {
    const std::string key = compressor + (scaffold ? "|scaffold" : "");
    auto it = schemes.find(key);
    if (it == schemes.end()) {
      ag::RoundSchemeOptions o;
      o.compressor = compressor;
      o.scaffold = scaffold;
      o.rule = config.rule;
      o.bounds = config.bounds;
      o.metrics = config.metrics;
      std::unique_ptr<ag::RoundScheme> s;
      try {
        s = std::make_unique<ag::RoundScheme>(layout, o);
      } catch (const ConfigError& e) {
        failInput(Errc::kMissingField, "the task's compressor: ", e.what());
      }
      if (schemes.size() >= 4) {
        previous.reset();  // refers to a scheme about to go
        schemes.clear();
      }
      it = schemes.emplace(key, std::move(s)).first;
    }
    return *it->second;
  }

  void onTask(std::span<const uint8_t> bytes) {
    pr::TaskMsg t =
        pr::decodeTask(bytes, *layout, pr::ControlLimits{config.limits.max_message_bytes});
    // The task this aggregator answered last, sent again (the upstream resends a pending task
    // when a registration of ours, a retry, crossed it): its partial goes up again instead of the
    // phase running again, which would cost a whole deadline and make this aggregator miss the
    // next round.
    if (t.nonce != 0 && t.nonce == answered_nonce) {
      log->info("round {} phase {}: the same task again; its partial sent again", t.round, t.phase);
      up.resendAnswer();
      return;
    }
    if (!t.model.empty()) {
      pr::applyModel(*layout, held_version, t.base_version, t.model, held);
      held_version = t.model_version;
      if (!model || model->version() >= held_version)
        model = std::make_unique<ModelStore>(  // relays the broadcast model as it is: topk is a
                                               // delta here
            layout,
            config.downlink == Downlink::kDelta || config.downlink == Downlink::kTopK ? 4 : 0);
      model->set(held, held_version);
    }
    if (!model) failInput(Errc::kMissingField, "a phase-", t.phase, " task before any model");
    if (t.kind == pr::TaskKind::kEvaluate) {
      evaluate(t);
      return;
    }
    // A later phase belongs to the round its phase 0 began (with or without SCAFFOLD).
    const bool scaffold = t.phase == 0 ? !t.control.empty() : previous_scaffold;
    ag::RoundScheme& s = scheme(t.compressor, scaffold);
    auto shared = t.shared.factors.empty()
                      ? nullptr
                      : std::make_shared<const cz::SharedFactors>(std::move(t.shared));
    const cz::PhaseBroadcast b{t.run_seed, t.round, t.phase, shared};
    const bool continues = t.phase > 0 && previous && previous_round == t.round &&
                           previous->broadcast().phase + 1 == t.phase;
    auto agg = s.phaseAggregator(b, continues ? previous.get() : nullptr);
    if (t.phase == 0 && scaffold) acknowledge(t.control_ack, t.round);
    std::vector<ClientInfo> participants;
    for (const ClientInfo& c : fleet.available())
      if (t.phase == 0 || (continues && previous->hasClient(c.id))) participants.push_back(c);
    if (t.secure) {
      secureTask(t, b, *agg);
      return;
    }
    pr::TaskMsg header = t;
    header.model.clear();
    header.deadline_ms = static_cast<uint32_t>(t.deadline_ms * config.deadline_share);
    log->info("round {} phase {}: relaying to {} clients", t.round, t.phase, participants.size());
    const PhaseReport rep =
        fleet.runPhase(PhaseTask{b, header, *model, config.downlink, &client_acks}, participants,
                       participants.size(), *agg);
    record(t, false, participants.size(), agg->count(), rep.failed.size(), agg->rejected());
    if (agg->count() == 0) {
      log->warn("round {} phase {}: no update from the subtree; nothing sent up", t.round, t.phase);
    } else {
      cz::PartialMessage p = config.resparsify_density > 0
                                 ? agg->partial().exportSparse(config.resparsify_density, residual)
                                 : agg->partial().exportDense();
      p.header.nonce = t.nonce;
      answered_nonce = t.nonce;
      up.answer(pr::encodePartial(p));
      ++partials;
      if (t.phase == 0 && scaffold) {
        partial_round = t.round;
        partial_clients = rep.completed;
      }
      log->info("round {} phase {}: sent the partial of {} updates ({} failed, {} refused)",
                t.round, t.phase, agg->count(), rep.failed.size(), agg->rejected());
    }
    previous = std::move(agg);
    previous_round = t.round;
    previous_scaffold = scaffold;
  }

  // Its clients that take part in the relay's step: available now, and sent a message of it.
  std::vector<ClientInfo> relayParticipants() const {
    std::vector<ClientInfo> out;
    for (const ClientInfo& c : fleet.available())
      if (c.role == pr::Role::kClient && relay.inStep(relay.stage(), c.id)) out.push_back(c);
    return out;
  }

  // Secure aggregation relayed (one level: its clients are clients): the root's roster question
  // is answered with the clients available now; a step's messages go to those clients and their
  // answers back up in one relay; the shares of the masked-input step wait for the secure task.
  void onRelay(std::span<const uint8_t> bytes) {
    const pr::SecAggRelayMsg m =
        pr::decodeSecAggRelay(bytes, pr::SecAggLimits{config.limits.max_message_bytes});
    if (m.stage == pr::RelayStage::kRoster) {
      pr::SecAggRelayMsg a{config.id, m.round, m.nonce, pr::RelayStage::kRoster, 0, {}, {}};
      std::vector<uint64_t> ids;
      for (const ClientInfo& c : fleet.available())
        if (c.role == pr::Role::kClient) ids.push_back(c.id);
      std::sort(ids.begin(), ids.end());
      for (uint64_t id : ids) a.items.push_back({id, {}});
      log->info("round {}: brings {} clients to secure aggregation", m.round, ids.size());
      up.send(pr::encode(a));
      return;
    }
    relay.take(m);
    if (relay.stage() == SecureStage::kMaskedInput) return;  // the secure task follows
    const std::vector<ClientInfo> participants = relayParticipants();
    const PhaseReport rep =
        fleet.exchange(relay.stage(), relay, participants,
                       static_cast<uint32_t>(m.deadline_ms * config.deadline_share));
    log->info("round {}: secure aggregation's {} step relayed for {} of {} clients", m.round,
              stageName(relay.stage()), rep.completed.size(), relay.clients().size());
    up.send(relay.answerUp());
  }

  // Its line in aggregator.metrics (AggregatorConfig::metrics_file) for a phase it relayed:
  // `updates` went up (none: nothing was sent). Written before the answer is handed to the link,
  // so that a line precedes every answer the upstream can have counted.
  void record(const pr::TaskMsg& t, bool secure, size_t relayed, size_t updates, size_t failed,
              size_t refused) {
    if (config.metrics_file.empty()) return;
    const std::string line = fmt::format(
        R"({{"aggregator":{},"round":{},"phase":{},"secure":{},"relayed":{},)"
        R"("updates":{},"failed":{},"refused":{},"sent":{}}})",
        config.id, t.round, t.phase, secure, relayed, updates, failed, refused, updates > 0);
    try {
      records.appendLine(line);
    } catch (const IoError& e) {
      log->warn("round {} phase {}: {}", t.round, t.phase, e.what());
    }
  }

  // The masked-input step relayed: its clients train and mask (their shares sent before the
  // task), and their masked inputs' ring sum goes up, as the task's answer.
  void secureTask(const pr::TaskMsg& t, const cz::PhaseBroadcast& b, ag::PhaseAggregator& agg) {
    if (relay.stage() != SecureStage::kMaskedInput || relay.round() != t.round)
      failInput(Errc::kUnexpectedMessage, "a secure task of round ", t.round,
                " without that round's shares");
    relay.setMetricRules(SecureMetricRules{t.metrics, config.bounds.max_metric_abs});
    const std::vector<ClientInfo> participants = relayParticipants();
    pr::TaskMsg header = t;
    header.model.clear();
    header.deadline_ms = static_cast<uint32_t>(t.deadline_ms * config.deadline_share);
    PhaseTask task{b, header, *model, config.downlink};
    task.secure = &relay;
    log->info("round {}: secure aggregation's masked inputs relayed from {} clients", t.round,
              participants.size());
    const PhaseReport rep = fleet.runPhase(task, participants, participants.size(), agg);
    const auto sum = relay.maskedUp();
    record(t, true, participants.size(), sum ? relay.masked().size() : 0, rep.failed.size(), 0);
    if (!sum) {
      log->warn("round {}: no masked input from the subtree; nothing sent up", t.round);
      return;
    }
    answered_nonce = t.nonce;
    up.answer(*sum);
    ++partials;
    log->info("round {}: sent the ring sum of {} masked inputs", t.round, relay.masked().size());
  }

  // The upstream counted this aggregator's control changes of round `acked` (TaskMsg::control_ack):
  // when that is the round of its last phase-0 partial, every client in that partial had its change
  // counted. Any other round: the partial was not counted, and its clients, left unacknowledged,
  // drop their c_i+. A task of the partial's own round again (a resend, or a restarted root running
  // the round anew) says nothing yet: that round has not closed. An upstream older than the
  // acknowledgement (nullopt) counted what it got, as clients then assumed.
  void acknowledge(std::optional<uint64_t> acked, uint64_t task_round) {
    if (task_round <= partial_round) return;
    if (partial_round != 0 && acked.value_or(partial_round) == partial_round)
      for (uint64_t id : partial_clients) client_acks[id] = partial_round;
    partial_round = 0;
    partial_clients.clear();
  }

  // Federated evaluation of the subtree: relayed down, answered up as one examples-weighted mean.
  void evaluate(const pr::TaskMsg& t) {
    std::vector<ClientInfo> participants;
    for (const ClientInfo& c : fleet.available())
      if (c.eval_examples > 0) participants.push_back(c);
    pr::TaskMsg header = t;
    header.model.clear();
    header.deadline_ms = static_cast<uint32_t>(t.deadline_ms * config.deadline_share);
    const cz::PhaseBroadcast none{t.run_seed, t.round, 0, nullptr};
    const EvalReport ev =
        fleet.evaluate(PhaseTask{none, header, *model, config.downlink}, participants);
    if (ev.examples == 0) return;
    up.send(pr::encode(
        pr::EvaluationMsg{config.id, t.round, t.nonce, ev.examples, ev.loss, ev.accuracy}));
  }

  // A message from upstream for this aggregator (the link handled the session's): true on Shutdown.
  bool handleUp(const transport::Received& r) {
    const auto kind = pr::peekKind(r.bytes());
    try {
      switch (*kind) {  // the link returns only a task, a shutdown or a refusal
        case pr::MessageKind::kTask:
          onTask(r.bytes());
          break;
        case pr::MessageKind::kSecAggRelay:
          onRelay(r.bytes());
          break;
        case pr::MessageKind::kReject:
          log->warn("upstream refused a message: {}", pr::decodeReject(r.bytes()).message);
          break;
        case pr::MessageKind::kShutdown: {
          const auto f = pr::decodeShutdown(r.bytes());
          fleet.finish(f.reason);
          return true;
        }
        default:
          break;
      }
    } catch (const InputError& e) {
      log->warn("ignored a message from upstream: {}", e.what());
    } catch (const InvalidArgument& e) {
      log->error("task dropped: {}", e.what());
    } catch (const ConfigError& e) {
      log->error("task dropped: {}", e.what());
    }
    return false;
  }
};

EdgeAggregator::EdgeAggregator(transport::Context& ctx, AggregatorConfig config, ZmqFleet& fleet,
                               std::shared_ptr<const ParamLayout> layout,
                               std::shared_ptr<spdlog::logger> log)
    : impl_(std::make_unique<Impl>(ctx, std::move(config), fleet, std::move(layout),
                                   std::move(log))) {
  fleet.setIdleHook([this] { impl_->upkeep(); });
}

EdgeAggregator::~EdgeAggregator() { impl_->fleet.setIdleHook({}); }

uint64_t EdgeAggregator::partialsSent() const { return impl_->partials; }
const client::UpstreamStats& EdgeAggregator::upstreamStats() const { return impl_->up.stats(); }

bool EdgeAggregator::run(const std::atomic<bool>& stop) {
  Impl& s = *impl_;
  try {
    while (!stop.load()) {
      s.fleet.service(milliseconds(20));  // clients' registrations and heartbeats (calls upkeep)
      while (auto r = s.up.next(milliseconds(0)))
        if (s.handleUp(*r)) return true;
    }
  } catch (const Stopped&) {
    // The fleet was told to stop (its stop flag) in the middle of a relayed phase: the partial is
    // not sent; the root gets it from nobody, as if this aggregator had been killed.
  }
  return false;
}

}  // namespace starling::server
