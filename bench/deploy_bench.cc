// starling-deploy-bench: the deployment's figures, each against a raw ZeroMQ transfer of the same
// bytes measured in the same run with the same security. docs/performance.md, section
// "Deployment", records them with the commands.
//
//   ingest/fleet/<sec>/<kind>/<N>c   one phase of the real ZmqFleet::runPhase (root, streaming
//                                    fedavg into a PhaseAggregator) with N client DEALERs
//                                    (transport::ClientSocket) in one thread of this process, each
//                                    answering its Task with a pre-encoded Update of a 1M-parameter
//                                    model (one 1000x1000 tensor) carrying that task's nonce. The
//                                    task is a delta against the version the clients hold and
//                                    carries no model values, so the phase is the uplink.
//   ingest/raw/<sec>/<kind>/<N>c     the reference: N plain DEALERs and a bare ROUTER (same
//                                    libzmq, same CURVE or none); the ROUTER sends each DEALER a
//                                    frame of the task's size, each DEALER answers with one frame
//                                    of the encoded update's size, the ROUTER only receives.
//   ingest/fleet-scraped/curve/<kind>/<N>c
//                                    ingest/fleet with the operator's metrics on (FleetMetrics on
//                                    the fleet's observer, a StatusServer on 127.0.0.1) and a
//                                    thread scraping /metrics and the status page's
//                                    /status.json every 100 ms (ten times the once a second of
//                                    issue 41's target) throughout; its counters give the
//                                    scrapes' latency.
//   round/engine/<sec>/<kind>/<N>c   one whole RoundEngine::runRound over the ZmqFleet: dense
//                                    downlink of the 1M model (the task the clients decode and
//                                    apply), the pre-encoded update up, aggregation, optimizer
//                                    step.
//   round/raw/<sec>/<kind>/<N>c      the reference: the same bytes down (a frame of the task's
//                                    size) and up (a frame of the update's size) over raw ZeroMQ.
//   ingest|round/raw1m/...           the same raw transfers with every message cut into frames of
//                                    1 MiB (Starling's chunk size; no headers, no reassembly copy):
//                                    under CURVE, libzmq moves 1 MiB frames much faster than 4 MB
//                                    ones (see docs/performance.md), so this is the stricter
//                                    reference.
//
//   <sec> is curve (the default deployment: CurveZMQ, the ZAP allow-list on the fleet) or insecure;
//   <kind> is dense (4 MB of f32 per update) or topk1pct (10,000 indices and values).
//
// Both sides use the same client loop: one thread sweeps its sockets with non-blocking receives and
// sleeps (50 us, doubling up to 1 ms) after a sweep that found nothing. Server and clients each get
// their own ZeroMQ context with one I/O thread, as two processes would.
//
// Memory (not a Google Benchmark case; a process per measurement so that the peak is its own):
//   --memory_out=FILE       runs `--memory_one=10` and `--memory_one=1000` as child processes and
//                           writes their figures and bytes per registered client as JSON.
//   --memory_one=N          the server side in this process (ZmqFleet, N registered clients, one
//                           CURVE phase of dense updates from all N), the N clients in a forked
//                           child; prints VmRSS before and after registration and VmHWM after the
//                           phase, as one JSON object.
//   --memory_task=dense     with either: each task carries the whole model (4 MB, a first round's
//                           dense downlink) instead of an empty delta.
//
// The status page (not a Google Benchmark case either; bench/status_page_load.py drives it):
//   --serve_status=N        a root's status page with N registered clients and three recorded
//                           rounds, served until stdin closes (its URL the first line out).
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "aggregation/round_scheme.h"
#include "bench/ratios.h"
#include "compression/compressor.h"
#include "ops/status_server.h"
#include "protocol/codec.h"
#include "protocol/control.h"
#include "server/engine.h"
#include "server/fleet_metrics.h"
#include "server/model_store.h"
#include "server/zmq_fleet.h"
#include "transport/context.h"
#include "transport/keys.h"
#include "transport/socket.h"
// Last: <resolv.h>, which cpp-httplib includes, defines a macro `_res` that Eigen uses as a name.
#include <httplib.h>

namespace {

namespace cz = starling::compression;
namespace pr = starling::protocol;
namespace tr = starling::transport;
namespace sv = starling::server;
namespace ops = starling::ops;
namespace ag = starling::aggregation;
using starling::ParamLayout;
using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock
using namespace std::chrono_literals;

constexpr size_t kRows = 1000, kCols = 1000;  // a 1M-parameter model, one tensor
constexpr uint64_t kExamples = 100;           // each bench client registers and claims this many
// Placeholders encoded into the update template and patched per answer (their high halves keep
// them clear of any top-k index; each must occur exactly once in the buffer, which is checked).
constexpr uint64_t kSentClient = 0xC11E57A5C11E57A5ull, kSentRound = 0x20A5D20A5D20A5D1ull,
                   kSentNonce = 0x0DCE0DCE0DCE0DCEull;

std::shared_ptr<const ParamLayout> layout1M() {
  auto l = std::make_shared<ParamLayout>();
  l->add("w", {static_cast<int64_t>(kRows), static_cast<int64_t>(kCols)});
  return l;
}

enum class Kind { kDense, kTopK };
const char* kindName(Kind k) { return k == Kind::kDense ? "dense" : "topk1pct"; }
std::string compressorOf(Kind k) { return k == Kind::kDense ? "none" : "topk:density=0.01"; }

std::shared_ptr<spdlog::logger> quietLogger() {
  auto log = std::make_shared<spdlog::logger>("deploy-bench");  // no sinks
  log->set_level(spdlog::level::off);
  return log;
}

// ------------------------------------------------------------------ the update each client sends

struct Answer {
  std::vector<uint8_t> bytes;
  size_t at_client = 0, at_round = 0, at_nonce = 0;

  void patch(uint64_t client, uint64_t round, uint64_t nonce) {
    std::memcpy(bytes.data() + at_client, &client, 8);
    std::memcpy(bytes.data() + at_round, &round, 8);
    std::memcpy(bytes.data() + at_nonce, &nonce, 8);
  }
};

size_t findOnce(const std::vector<uint8_t>& b, uint64_t v) {
  size_t at = SIZE_MAX, n = 0;
  for (size_t i = 0; i + 8 <= b.size(); ++i)
    if (std::memcmp(b.data() + i, &v, 8) == 0) at = i, ++n;
  if (n != 1)
    throw std::runtime_error("placeholder found " + std::to_string(n) + " times in the update");
  return at;
}

Answer makeAnswer(const ParamLayout& layout, Kind kind) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.01f);
  cz::Update u;
  u.header = {layout.fingerprint(), kSentRound, 0, kSentClient, kExamples, kSentNonce};
  if (kind == Kind::kDense) {
    cz::DenseF32 d;
    d.values.resize(layout.numel());
    for (auto& x : d.values) x = nd(rng);
    u.tensors.push_back(std::move(d));
  } else {
    cz::Sparse s;
    const size_t k = cz::countForDensity(0.01, layout.numel());
    const size_t stride = layout.numel() / k;
    for (size_t i = 0; i < k; ++i) {
      s.indices.push_back(static_cast<uint32_t>(i * stride + rng() % stride));
      s.values.push_back(nd(rng));
    }
    u.tensors.push_back(std::move(s));
  }
  Answer a;
  a.bytes = pr::encodeUpdate(u);
  a.at_client = findOnce(a.bytes, kSentClient);
  a.at_round = findOnce(a.bytes, kSentRound);
  a.at_nonce = findOnce(a.bytes, kSentNonce);
  return a;
}

// ------------------------------------------------------------------ Starling's clients

// The client threads sweep their sockets with non-blocking receives (ClientSocket exposes no
// pollable handle). After a sweep that found nothing they sleep, 50 us doubling up to 1 ms, so
// that an idle client thread does not take a core from the server on this 2-core machine.
struct IdleBackoff {
  std::chrono::microseconds wait{50};
  void after(bool active) {
    if (active) {
      wait = std::chrono::microseconds(50);
      return;
    }
    std::this_thread::sleep_for(wait);
    wait = std::min<std::chrono::microseconds>(2 * wait, std::chrono::microseconds(1000));
  }
};

struct Keys {
  tr::CurveKeyPair server;
  std::vector<tr::CurveKeyPair> clients;  // client i has id i + 1
  std::shared_ptr<tr::AllowList> allow;
};

Keys makeKeys(size_t n) {
  Keys k;
  k.server = tr::generateKeyPair();
  k.allow = std::make_shared<tr::AllowList>();
  for (size_t i = 0; i < n; ++i) {
    k.clients.push_back(tr::generateKeyPair());
    k.allow->add(i + 1, k.clients.back().public_key, "bench client " + std::to_string(i + 1));
  }
  return k;
}

struct FarmConfig {
  std::string endpoint;
  bool insecure = false;
  const Keys* keys = nullptr;
  size_t clients = 0;
  Kind kind = Kind::kDense;
  uint64_t model_version = 0;  // registered: what the client holds (the delta downlink's base)
  bool exit_on_shutdown = false;
};

// N Starling clients (transport::ClientSocket) owned by one thread: register, then answer every
// Task with the pre-encoded update patched with the task's round and nonce (after decoding the
// task and applying its model, as a client does).
class Farm {
 public:
  explicit Farm(FarmConfig c) : cfg_(std::move(c)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Farm() { stopAndJoin(); }
  void stopAndJoin() {
    stop_ = true;
    join();
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  bool waitWelcomed(std::chrono::milliseconds timeout) const {
    const auto until = Steady::now() + timeout;
    while (welcomed_.load() < cfg_.clients && !failed_.load()) {
      if (Steady::now() > until) return false;
      std::this_thread::sleep_for(5ms);
    }
    return !failed_.load();
  }
  uint64_t rejects() const { return rejects_.load(); }
  std::string error() const { return failed_.load() ? error_ : std::string(); }

  void run() {
    try {
      loop();
    } catch (const std::exception& e) {
      error_ = e.what();
      failed_ = true;
    }
  }

 private:
  void loop() {
    const auto layout = layout1M();
    Answer answer = makeAnswer(*layout, cfg_.kind);
    std::vector<float> model(layout->numel());  // one scratch model for all clients (bench memory)
    // libzmq's default limit is 1023 sockets per context: one context per 250 clients.
    std::vector<std::unique_ptr<tr::Context>> ctxs;
    std::vector<std::unique_ptr<tr::ClientSocket>> socks;
    for (size_t i = 0; i < cfg_.clients; ++i) {
      if (i % 250 == 0) ctxs.push_back(std::make_unique<tr::Context>(1));
      tr::SecurityConfig sec;
      sec.insecure = cfg_.insecure;
      if (!cfg_.insecure) {
        sec.own = cfg_.keys->clients[i];
        sec.server_public_key = cfg_.keys->server.public_key;
      }
      socks.push_back(std::make_unique<tr::ClientSocket>(*ctxs.back(), cfg_.endpoint, sec));
      pr::RegisterMsg r;
      r.client_id = i + 1;
      r.layout_fingerprint = layout->fingerprint();
      r.num_examples = kExamples;
      r.model_version = cfg_.model_version;
      socks.back()->send(pr::encode(r));
    }
    std::vector<uint64_t> held(cfg_.clients, cfg_.model_version);
    size_t shut = 0;
    IdleBackoff idle;
    while (!stop_ && !(cfg_.exit_on_shutdown && shut == cfg_.clients)) {
      bool any = false;
      for (size_t i = 0; i < socks.size(); ++i) {
        while (auto r = socks[i]->receive(0ms)) {
          any = true;
          if (!r->ok()) continue;
          const auto kind = pr::peekKind(r->bytes());
          if (!kind) continue;
          switch (*kind) {
            case pr::MessageKind::kWelcome:
              ++welcomed_;
              break;
            case pr::MessageKind::kTask: {
              const pr::TaskMsg t = pr::decodeTask(r->bytes(), *layout);
              if (!t.model.empty()) {
                pr::applyModel(*layout, held[i], t.base_version, t.model, model);
                held[i] = t.model_version;
              }
              answer.patch(i + 1, t.round, t.nonce);
              socks[i]->send(answer.bytes);
              break;
            }
            case pr::MessageKind::kReject:
              ++rejects_;
              break;
            case pr::MessageKind::kShutdown:
              ++shut;
              break;
            default:
              break;
          }
        }
      }
      idle.after(any);
    }
    socks.clear();
  }

  FarmConfig cfg_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, failed_{false};
  std::atomic<size_t> welcomed_{0};
  std::atomic<uint64_t> rejects_{0};
  std::string error_;
};

sv::FleetConfig fleetConfig(bool insecure, const Keys& keys) {
  sv::FleetConfig fc;
  fc.bind = "tcp://127.0.0.1:*";
  fc.security.insecure = insecure;
  if (!insecure) {
    fc.security.own = keys.server;
    fc.security.allow = keys.allow;
  }
  // No client heartbeats in the bench: never count a client silent between iterations.
  fc.silence_ms = 3'600'000;
  return fc;
}

// ------------------------------------------------------------------ raw ZeroMQ reference

void setCurve(zmq::socket_t& s, bool server, const Keys& keys, size_t client) {
  if (server) {
    s.set(zmq::sockopt::curve_server, true);
    s.set(zmq::sockopt::curve_publickey, keys.server.public_key);
    s.set(zmq::sockopt::curve_secretkey, keys.server.secret_key);
  } else {
    s.set(zmq::sockopt::curve_serverkey, keys.server.public_key);
    s.set(zmq::sockopt::curve_publickey, keys.clients[client].public_key);
    s.set(zmq::sockopt::curve_secretkey, keys.clients[client].secret_key);
  }
}

// N plain DEALERs in one thread: say hello once, then answer every `down_bytes` received with
// `answer_bytes`, sent as frames of at most `frame_bytes`.
class RawFarm {
 public:
  RawFarm(std::string endpoint, bool insecure, const Keys& keys, size_t n, size_t down_bytes,
          size_t answer_bytes, size_t frame_bytes)
      : ctx_(1), answer_(answer_bytes, 0x5a) {
    for (size_t i = 0; i < n; ++i) {
      socks_.emplace_back(ctx_, zmq::socket_type::dealer);
      socks_.back().set(zmq::sockopt::linger, 0);
      if (!insecure) setCurve(socks_.back(), false, keys, i);
      socks_.back().connect(endpoint);
    }
    thread_ = std::thread([this, n, down_bytes, frame_bytes] {
      std::vector<size_t> got(n, 0);
      for (auto& s : socks_) s.send(zmq::str_buffer("hello"), zmq::send_flags::none);
      IdleBackoff idle;
      while (!stop_) {
        bool any = false;
        for (size_t i = 0; i < n; ++i) {
          zmq::message_t m;
          while (socks_[i].recv(m, zmq::recv_flags::dontwait)) {
            any = true;
            got[i] += m.size();
            if (got[i] < down_bytes) continue;
            got[i] -= down_bytes;
            // Copies, as ClientSocket::send does.
            for (size_t at = 0; at < answer_.size(); at += frame_bytes)
              socks_[i].send(
                  zmq::buffer(answer_.data() + at, std::min(frame_bytes, answer_.size() - at)),
                  zmq::send_flags::none);
          }
        }
        idle.after(any);
      }
      socks_.clear();
    });
  }
  ~RawFarm() {
    stop_ = true;
    thread_.join();
  }

 private:
  zmq::context_t ctx_;
  std::vector<uint8_t> answer_;
  std::vector<zmq::socket_t> socks_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct RawServer {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::router};
  std::vector<std::string> peers;
  RawServer(bool insecure, const Keys& keys) {
    sock.set(zmq::sockopt::linger, 0);
    if (!insecure) setCurve(sock, true, keys, 0);
    sock.bind("tcp://127.0.0.1:*");
  }
  std::string endpoint() { return sock.get(zmq::sockopt::last_endpoint); }
  void waitHellos(size_t n) {
    while (peers.size() < n) {
      zmq::message_t id, body;
      (void)sock.recv(id);
      (void)sock.recv(body);
      peers.push_back(id.to_string());
    }
  }
  // One exchange: `down` to every peer (in frames of at most `frame` bytes), then receive until
  // every peer's answer of `up` bytes is in.
  size_t exchange(const std::vector<uint8_t>& down, size_t up, size_t frame) {
    for (const auto& p : peers)
      for (size_t at = 0; at < down.size(); at += frame) {
        sock.send(zmq::buffer(p), zmq::send_flags::sndmore);
        sock.send(zmq::buffer(down.data() + at, std::min(frame, down.size() - at)),
                  zmq::send_flags::none);
      }
    size_t bytes = 0;
    while (bytes < up * peers.size()) {
      zmq::message_t id, body;
      (void)sock.recv(id);
      (void)sock.recv(body);
      bytes += body.size();
    }
    return bytes;
  }
};

// ------------------------------------------------------------------ the benchmarks

size_t g_clients = 100;

std::string caseName(const char* what, bool insecure, Kind kind, size_t n) {
  return std::string(what) + "/" + (insecure ? "insecure" : "curve") + "/" + kindName(kind) + "/" +
         std::to_string(n) + "c";
}

// The encoded sizes the raw reference moves: the task each client gets and the update it sends.
size_t taskBytes(const sv::ModelStore& store, uint64_t held, sv::Downlink d,
                 const std::string& compressor) {
  pr::TaskMsg h;
  h.round = 1;
  h.nonce = 1;
  h.compressor = compressor;
  h.model_version = store.version();
  h.deadline_ms = 60000;
  h.metrics = {"train_loss"};
  const cz::PhaseBroadcast b{0, 1, 0, nullptr};
  return sv::encodeTask(sv::PhaseTask{b, h, store, d}, held).size();
}

// Scrapes `url`/metrics every `every` until stopped, recording each scrape's latency.
class Scraper {
 public:
  Scraper(int port, std::chrono::milliseconds every)
      : thread_([this, port, every] {
          httplib::Client c("127.0.0.1", port);
          c.set_keep_alive(true);
          while (!stop_.load()) {
            const auto t0 = std::chrono::steady_clock::now();
            auto r = c.Get("/metrics");
            const auto t1 = std::chrono::steady_clock::now();
            const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
            if (r && r->status == 200) {
              ++scrapes_;
              bytes_ = r->body.size();
              total_ms_ += ms;
              max_ms_ = std::max(max_ms_.load(), ms);
            } else {
              ++failed_;
            }
            // And the status page's JSON, as an open page asks for it (every 2 s; here as often
            // as /metrics).
            auto j = c.Get("/status.json");
            const double jms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1)
                    .count();
            if (j && j->status == 200) {
              ++json_scrapes_;
              json_bytes_ = j->body.size();
              json_total_ms_ += jms;
              json_max_ms_ = std::max(json_max_ms_.load(), jms);
            } else {
              ++failed_;
            }
            std::this_thread::sleep_until(t0 + every);
          }
        }) {}
  ~Scraper() {
    stop_ = true;
    thread_.join();
  }
  void report(benchmark::State& st) const {
    st.counters["scrapes"] = static_cast<double>(scrapes_.load());
    st.counters["scrapes_failed"] = static_cast<double>(failed_.load());
    st.counters["scrape_ms_mean"] = scrapes_ ? total_ms_.load() / scrapes_.load() : 0.0;
    st.counters["scrape_ms_max"] = max_ms_.load();
    st.counters["metrics_bytes"] = static_cast<double>(bytes_.load());
    st.counters["json_ms_mean"] =
        json_scrapes_ ? json_total_ms_.load() / json_scrapes_.load() : 0.0;
    st.counters["json_ms_max"] = json_max_ms_.load();
    st.counters["json_bytes"] = static_cast<double>(json_bytes_.load());
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> scrapes_{0}, failed_{0}, bytes_{0}, json_scrapes_{0}, json_bytes_{0};
  std::atomic<double> total_ms_{0}, max_ms_{0}, json_total_ms_{0}, json_max_ms_{0};
  std::thread thread_;
};

void ingestFleet(benchmark::State& st, bool insecure, Kind kind, bool scraped = false) {
  const size_t n = g_clients;
  const auto layout = layout1M();
  const Keys keys = makeKeys(n);
  // The operator's metrics, when scraped: declared before the fleet, which holds the observer.
  std::unique_ptr<sv::FleetMetrics> metrics;
  std::unique_ptr<ops::StatusServer> status;
  std::unique_ptr<Scraper> scraper;
  tr::Context ctx(1);
  sv::ZmqFleet fleet(ctx, fleetConfig(insecure, keys), layout, quietLogger());
  if (scraped) {
    auto registry = std::make_shared<ops::Registry>();
    metrics = std::make_unique<sv::FleetMetrics>(registry, "root", "bench", "0");
    fleet.setObserver([m = metrics.get()](const sv::ZmqFleet& f) { m->observe(f); });
    ops::StatusConfig sc;
    sc.listen = "127.0.0.1:0";
    status = std::make_unique<ops::StatusServer>(sc, registry, "bench", nullptr,
                                                 [m = metrics.get()] { return m->statusJson(); });
    scraper = std::make_unique<Scraper>(status->port(), std::chrono::milliseconds(100));
  }
  ag::RoundSchemeOptions so;
  so.compressor = compressorOf(kind);
  ag::RoundScheme scheme(layout, so);
  // Versions 1 and 2 hold the same values and the clients hold 1: the delta task carries nothing.
  sv::ModelStore store(layout, 2);
  store.set(std::vector<float>(layout->numel(), 0.0f), 1);
  store.set(std::vector<float>(layout->numel(), 0.0f), 2);
  Farm farm({fleet.endpoint(), insecure, &keys, n, kind, 1, false});
  const auto clients = fleet.waitForClients(n, 60s).list();
  if (clients.size() != n || !farm.waitWelcomed(60s)) {
    st.SkipWithError(("registration failed: " + farm.error()).c_str());
    return;
  }
  const size_t update_bytes = makeAnswer(*layout, kind).bytes.size();
  size_t accepted = 0;
  uint64_t version = store.version();
  for (auto _ : st) {
    // The fleet takes a client that got a task to hold that version: publish an equal next version
    // so that every phase's task is again an empty delta (not timed).
    st.PauseTiming();
    store.set(std::vector<float>(layout->numel(), 0.0f), ++version);
    st.ResumeTiming();
    auto round = scheme.begin(1, scheme.initialCarry());
    pr::TaskMsg h;
    h.round = 1;
    h.compressor = scheme.compressor().spec();
    h.model_version = store.version();
    h.deadline_ms = 60000;
    const sv::PhaseTask task{round->broadcast(), h, store, sv::Downlink::kDelta};
    const sv::PhaseReport rep = fleet.runPhase(task, clients, n, round->current());
    accepted += round->current().accepted();
    if (rep.completed.size() != n) {
      st.SkipWithError(("phase incomplete: " + std::to_string(rep.completed.size()) + " of " +
                        std::to_string(n) + ", refused " + std::to_string(fleet.refusedTotal()) +
                        " " + farm.error())
                           .c_str());
      break;
    }
  }
  st.SetItemsProcessed(static_cast<int64_t>(accepted));
  st.SetBytesProcessed(static_cast<int64_t>(accepted * update_bytes));
  st.counters["update_bytes"] = static_cast<double>(update_bytes);
  st.counters["clients"] = static_cast<double>(n);
  st.counters["refused"] = static_cast<double>(fleet.refusedTotal());
  if (scraper) scraper->report(st);
}

void rawExchange(benchmark::State& st, bool insecure, size_t down_bytes, size_t up_bytes,
                 size_t frame_bytes) {
  const size_t n = g_clients;
  const Keys keys = makeKeys(n);
  RawServer server(insecure, keys);
  RawFarm farm(server.endpoint(), insecure, keys, n, down_bytes, up_bytes, frame_bytes);
  server.waitHellos(n);
  const std::vector<uint8_t> down(down_bytes, 0xa5);
  size_t received = 0;
  for (auto _ : st) received += server.exchange(down, up_bytes, frame_bytes);
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations() * n));
  st.SetBytesProcessed(static_cast<int64_t>(received));
  st.counters["update_bytes"] = static_cast<double>(up_bytes);
  st.counters["task_bytes"] = static_cast<double>(down_bytes);
  st.counters["clients"] = static_cast<double>(n);
}

void roundEngine(benchmark::State& st, bool insecure, Kind kind) {
  const size_t n = g_clients;
  const auto layout = layout1M();
  const Keys keys = makeKeys(n);
  tr::Context ctx(1);
  sv::ZmqFleet fleet(ctx, fleetConfig(insecure, keys), layout, quietLogger());
  sv::EngineConfig ec;
  ec.rounds = 1'000'000;
  ec.scheme.compressor = compressorOf(kind);
  ec.sampling.min_clients = n;
  ec.sampling.min_available = n;
  ec.round_deadline_ms = 60000;
  ec.downlink = sv::Downlink::kDense;
  sv::RoundEngine engine(layout, ec, std::vector<float>(layout->numel(), 0.0f));
  Farm farm({fleet.endpoint(), insecure, &keys, n, kind, 0, false});
  if (fleet.waitForClients(n, 60s).size() != n || !farm.waitWelcomed(60s)) {
    st.SkipWithError(("registration failed: " + farm.error()).c_str());
    return;
  }
  uint64_t up = 0, down = 0, rounds = 0;
  for (auto _ : st) {
    const sv::RoundRecord rec = engine.runRound(fleet);
    if (!rec.applied || rec.clients_completed != n) {
      st.SkipWithError(("round not applied: " + rec.json()).c_str());
      break;
    }
    up += rec.uplink_bytes;
    down += rec.downlink_bytes;
    ++rounds;
  }
  st.SetBytesProcessed(static_cast<int64_t>(up + down));
  if (rounds) {
    st.counters["uplink_bytes_per_round"] = static_cast<double>(up / rounds);
    st.counters["downlink_bytes_per_round"] = static_cast<double>(down / rounds);
  }
  st.counters["clients"] = static_cast<double>(n);
}

constexpr size_t kChunk = size_t{1} << 20;  // TransportLimits::chunk_bytes' default

void registerAll(int iterations) {
  const auto layout = layout1M();
  sv::ModelStore delta(layout, 2), dense(layout, 0);
  delta.set(std::vector<float>(layout->numel(), 0.0f), 1);
  delta.set(std::vector<float>(layout->numel(), 0.0f), 2);
  dense.set(std::vector<float>(layout->numel(), 0.0f), 1);
  for (Kind kind : {Kind::kDense, Kind::kTopK}) {
    const size_t up = makeAnswer(*layout, kind).bytes.size();
    const size_t small_task = taskBytes(delta, 1, sv::Downlink::kDelta, compressorOf(kind));
    const size_t model_task = taskBytes(dense, 0, sv::Downlink::kDense, compressorOf(kind));
    const int iters = kind == Kind::kDense ? iterations : 4 * iterations;
    for (bool insecure : {false, true}) {
      const size_t n = g_clients;
      auto reg = [&](const std::string& name, auto fn) {
        benchmark::RegisterBenchmark(name.c_str(), fn)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond)
            ->Iterations(iters);
      };
      reg(caseName("ingest/fleet", insecure, kind, n),
          [=](benchmark::State& st) { ingestFleet(st, insecure, kind); });
      reg(caseName("ingest/raw", insecure, kind, n),
          [=](benchmark::State& st) { rawExchange(st, insecure, small_task, up, SIZE_MAX); });
      if (kind == Kind::kDense)  // the same bytes in frames of Starling's chunk size (1 MiB)
        reg(caseName("ingest/raw1m", insecure, kind, n),
            [=](benchmark::State& st) { rawExchange(st, insecure, small_task, up, kChunk); });
      if (!insecure) {
        reg(caseName("ingest/fleet-scraped", insecure, kind, n),
            [=](benchmark::State& st) { ingestFleet(st, insecure, kind, true); });
        reg(caseName("round/engine", insecure, kind, n),
            [=](benchmark::State& st) { roundEngine(st, insecure, kind); });
        reg(caseName("round/raw", insecure, kind, n),
            [=](benchmark::State& st) { rawExchange(st, insecure, model_task, up, SIZE_MAX); });
        reg(caseName("round/raw1m", insecure, kind, n),
            [=](benchmark::State& st) { rawExchange(st, insecure, model_task, up, kChunk); });
      }
    }
  }
}

// ------------------------------------------------------------------ memory

long statusKb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t len = std::strlen(field);
  while (std::getline(f, line))
    if (line.compare(0, len, field) == 0 && line[len] == ':')
      return std::stol(line.substr(len + 1));
  return -1;
}

int memoryOne(size_t n, bool dense_task) {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  const rlim_t soft_before = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;  // ~2 fds per DEALER in the client process, 1 per connection here
  setrlimit(RLIMIT_NOFILE, &rl);
  const Keys keys = makeKeys(n);
  const auto layout = layout1M();
  // The server's socket first (its port), then the clients in a child that shares nothing of it.
  int port_pipe[2];
  if (pipe(port_pipe) != 0) return 2;
  const pid_t child = fork();
  if (child == 0) {
    close(port_pipe[1]);
    char buf[256] = {};
    size_t got = 0;
    while (got < sizeof buf - 1) {
      const ssize_t r = read(port_pipe[0], buf + got, sizeof buf - 1 - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    Farm farm({std::string(buf, got), false, &keys, n, Kind::kDense, dense_task ? 0u : 1u, true});
    farm.join();  // returns once every client got its Shutdown (or fails)
    _exit(farm.error().empty() ? 0 : 3);
  }
  close(port_pipe[0]);
  const long rss_start = statusKb("VmRSS");
  long rss_registered = -1, hwm_phase = -1;
  size_t completed = 0;
  uint64_t refused = 0, refused_too_large = 0;
  double phase_s = 0;
  std::string refused_codes;
  {
    tr::Context ctx(1);
    sv::ZmqFleet fleet(ctx, fleetConfig(false, keys), layout, quietLogger());
    const std::string ep = fleet.endpoint();
    if (write(port_pipe[1], ep.data(), ep.size()) != static_cast<ssize_t>(ep.size())) return 2;
    close(port_pipe[1]);
    ag::RoundSchemeOptions so;
    ag::RoundScheme scheme(layout, so);
    // As in ingest/fleet: versions 1 and 2 are equal, so a client holding 1 gets an empty delta.
    sv::ModelStore store(layout, 2);
    store.set(std::vector<float>(layout->numel(), 0.0f), 1);
    store.set(std::vector<float>(layout->numel(), 0.0f), 2);
    const auto clients = fleet.waitForClients(n, 120s).list();
    fleet.service(500ms);  // the last Welcomes out
    rss_registered = statusKb("VmRSS");
    auto round = scheme.begin(1, scheme.initialCarry());
    pr::TaskMsg h;
    h.round = 1;
    h.compressor = scheme.compressor().spec();
    h.model_version = store.version();
    h.deadline_ms = 60000;
    // dense_task: the clients hold nothing and each task carries the whole model (4 MB), as in a
    // first round; else the task is an empty delta and the phase is the uplink alone.
    const sv::PhaseTask task{round->broadcast(), h, store, sv::Downlink::kDelta};
    const auto t0 = Steady::now();
    const auto rep = fleet.runPhase(task, clients, clients.size(), round->current());
    phase_s = std::chrono::duration<double>(Steady::now() - t0).count();
    completed = rep.completed.size();
    refused = fleet.refusedTotal();
    refused_too_large = fleet.refused(starling::Errc::kTooLarge);
    for (size_t c = 0; c <= static_cast<size_t>(starling::kLastErrc); ++c)
      if (fleet.refused(static_cast<starling::Errc>(c)))
        refused_codes += (refused_codes.empty() ? "" : ",") +
                         std::string(starling::errcName(static_cast<starling::Errc>(c))) + ":" +
                         std::to_string(fleet.refused(static_cast<starling::Errc>(c)));
    hwm_phase = statusKb("VmHWM");
    fleet.finish("bench done");
    fleet.service(1000ms);
  }
  int status = 0;
  for (int i = 0; i < 100 && waitpid(child, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(100ms);
  if (waitpid(child, &status, WNOHANG) == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  std::cout << "{\"clients\": " << n << ", \"task\": \""
            << (dense_task ? "dense model" : "empty delta") << "\", \"completed\": " << completed
            << ", \"refused\": " << refused << ", \"refused_too_large\": " << refused_too_large
            << ", \"refused_codes\": \"" << refused_codes << "\""
            << ", \"phase_seconds\": " << phase_s << ", \"rss_start_kb\": " << rss_start
            << ", \"rss_registered_kb\": " << rss_registered
            << ", \"hwm_after_phase_kb\": " << hwm_phase
            << ", \"nofile_soft_before\": " << soft_before << ", \"nofile_used\": " << rl.rlim_cur
            << "}" << std::endl;
  return completed == n ? 0 : 1;
}

// --serve_status=N: a root's status page with N registered clients (0: none) that answered three
// phases, and three rounds recorded (accuracy, loss, bytes), served on 127.0.0.1 until stdin
// closes; the first line on stdout is its URL. bench/status_page_load.py times the page in
// Chromium against the same page of an empty federation.
int serveStatus(size_t n) {
  const auto layout = layout1M();
  const Keys keys = makeKeys(std::max<size_t>(n, 1));
  auto registry = std::make_shared<ops::Registry>();
  sv::FleetMetrics metrics(registry, "root", "bench 1000x1000", "0");
  std::unique_ptr<ops::StatusServer> status;
  tr::Context ctx(1);
  sv::ZmqFleet fleet(ctx, fleetConfig(false, keys), layout, quietLogger());
  fleet.setObserver([&metrics](const sv::ZmqFleet& f) { metrics.observe(f); });
  ops::StatusConfig sc;
  sc.listen = "127.0.0.1:0";
  sc.threads = 4;
  status = std::make_unique<ops::StatusServer>(sc, registry, "bench", nullptr,
                                               [&metrics] { return metrics.statusJson(); });
  std::unique_ptr<Farm> farm;
  std::vector<sv::ClientInfo> clients;
  if (n > 0) {
    farm = std::make_unique<Farm>(FarmConfig{fleet.endpoint(), false, &keys, n, Kind::kTopK, 1});
    clients = fleet.waitForClients(n, 120s).list();
    if (clients.size() != n || !farm->waitWelcomed(120s)) {
      std::cerr << "registration failed: " << farm->error() << "\n";
      return 1;
    }
  }
  ag::RoundSchemeOptions so;
  so.compressor = compressorOf(Kind::kTopK);
  ag::RoundScheme scheme(layout, so);
  sv::ModelStore store(layout, 2);
  store.set(std::vector<float>(layout->numel(), 0.0f), 1);
  constexpr int kRounds = 3;
  metrics.setPlannedRounds(kRounds + 1);
  for (int r = 1; r <= kRounds; ++r) {
    store.set(std::vector<float>(layout->numel(), 0.0f), static_cast<uint64_t>(r) + 1);
    sv::RoundRecord rec;
    rec.round = static_cast<uint64_t>(r);
    rec.applied = true;
    rec.model_version = static_cast<uint64_t>(r);
    if (n > 0) {
      metrics.roundStarted(rec.round);
      auto round = scheme.begin(rec.round, scheme.initialCarry());
      pr::TaskMsg h;
      h.round = rec.round;
      h.compressor = scheme.compressor().spec();
      h.model_version = store.version();
      h.deadline_ms = 60000;
      const sv::PhaseTask task{round->broadcast(), h, store, sv::Downlink::kDelta};
      const sv::PhaseReport rep = fleet.runPhase(task, clients, n, round->current());
      rec.clients_selected = n;
      rec.clients_completed = rep.completed.size();
      rec.uplink_bytes = rep.uplink_bytes;
      rec.downlink_bytes = rep.downlink_bytes;
    }
    rec.test_accuracy = 0.5 + 0.1 * r;
    rec.test_loss = 1.0 / r;
    rec.train_loss = 1.2 / r;
    metrics.roundRecorded(rec);
  }
  metrics.roundStarted(kRounds + 1);
  std::cout << status->url() << std::endl;
  std::atomic<bool> stop{false};
  std::thread stdin_watch([&stop] {
    while (std::cin.get() != EOF) {
    }
    stop = true;
  });
  fleet.setStopFlag(&stop);
  try {
    for (;;) fleet.service(1000ms);  // heartbeats answered, the observer fed
  } catch (const sv::Stopped&) {
  }
  stdin_watch.join();
  return 0;
}

long jsonField(const std::string& js, const std::string& key) {
  const auto at = js.find("\"" + key + "\": ");
  return at == std::string::npos ? -1 : std::stol(js.substr(at + key.size() + 4));
}

int memoryOut(const std::string& out, bool dense_task) {
  std::map<size_t, std::string> res;
  for (size_t n : {size_t{10}, size_t{1000}}) {
    const std::string cmd = "/proc/" + std::to_string(getpid()) +
                            "/exe --memory_one=" + std::to_string(n) +
                            (dense_task ? " --memory_task=dense" : "");
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return 1;
    std::string line;
    char buf[512];
    while (fgets(buf, sizeof buf, p)) line += buf;
    const int rc = pclose(p);
    if (line.empty()) {
      std::cerr << "memory run with " << n << " clients failed (" << rc << "): " << line << "\n";
      return 1;
    }
    while (!line.empty() && line.back() == '\n') line.pop_back();
    if (rc != 0)
      std::cerr << "(not every client's update was accepted: see completed and refused)\n";
    std::cerr << line << "\n";
    res[n] = line;
  }
  const double model_bytes = kRows * kCols * 4.0;
  const double reg =
      (jsonField(res[1000], "rss_registered_kb") - jsonField(res[10], "rss_registered_kb")) *
      1024.0 / 990;
  const double hwm =
      (jsonField(res[1000], "hwm_after_phase_kb") - jsonField(res[10], "hwm_after_phase_kb")) *
      1024.0 / 990;
  std::ostringstream js;
  js << "{\n  \"task\": \"" << (dense_task ? "dense model (4 MB) to every client" : "empty delta")
     << "\",\n  \"runs\": [" << res[10] << ",\n           " << res[1000] << "],\n"
     << "  \"bytes_per_registered_client\": " << reg << ",\n"
     << "  \"peak_bytes_per_client_with_a_dense_phase\": " << hwm << ",\n"
     << "  \"model_bytes\": " << model_bytes << ",\n"
     << "  \"peak_per_client_over_model\": " << hwm / model_bytes << "\n}\n";
  std::cerr << js.str();
  std::ofstream f(out);
  f << js.str();
  return f ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  starling::bench::CommandLine cl;
  int iterations = 5;
  size_t memory_one = 0;
  std::string memory_out;
  bool dense_task = false;
  long serve_status = -1;
  const bool ok = starling::bench::initBenchmarks(argc, argv, cl, [&](const std::string& a) {
    if (a.rfind("--clients=", 0) == 0)
      g_clients = std::stoul(a.substr(10));
    else if (a.rfind("--deploy_iterations=", 0) == 0)
      iterations = std::stoi(a.substr(20));
    else if (a.rfind("--memory_one=", 0) == 0)
      memory_one = std::stoul(a.substr(13));
    else if (a.rfind("--memory_out=", 0) == 0)
      memory_out = a.substr(13);
    else if (a == "--memory_task=dense")
      dense_task = true;
    else if (a.rfind("--serve_status=", 0) == 0)
      serve_status = std::stol(a.substr(15));
    else
      return false;
    return true;
  });
  if (serve_status >= 0) return serveStatus(static_cast<size_t>(serve_status));
  if (memory_one) return memoryOne(memory_one, dense_task);
  if (!memory_out.empty()) return memoryOut(memory_out, dense_task);
  if (!ok) return 1;
  registerAll(iterations);
  const auto rec_ptr = starling::bench::runBenchmarks(cl.json);
  const starling::bench::Recorder& rec = *rec_ptr;

  std::vector<starling::bench::Ratio> ratios;
  const std::string c = std::to_string(g_clients) + "c";
  for (const char* kind : {"dense", "topk1pct"}) {
    for (const char* sec : {"curve", "insecure"}) {
      const std::string s = std::string(sec) + "/" + kind + "/" + c;
      ratios.push_back(
          {"ingest_speed_vs_raw_zmq/" + s, "ingest/raw/" + s, "ingest/fleet/" + s, ">= 0.7"});
      ratios.push_back({"ingest_speed_vs_raw_zmq_1MiB_frames/" + s, "ingest/raw1m/" + s,
                        "ingest/fleet/" + s, ">= 0.7, against the same bytes in 1 MiB frames"});
    }
    const std::string s = std::string("curve/") + kind + "/" + c;
    ratios.push_back({"ingest_speed_scraped_every_100ms/" + s, "ingest/fleet/" + s,
                      "ingest/fleet-scraped/" + s,
                      ">= 0.98: /metrics scraped 10x more often than issue 41's once a second"});
    ratios.push_back({"round_time_over_raw_transfers/" + s, "round/engine/" + s, "round/raw/" + s,
                      "no target: round overhead = value - 1"});
    ratios.push_back({"round_time_over_raw_transfers_1MiB_frames/" + s, "round/engine/" + s,
                      "round/raw1m/" + s, "no target: round overhead = value - 1"});
  }
  if (!starling::bench::reportRatios(rec, ratios, cl.ratios_out)) return 1;
  benchmark::Shutdown();
  return 0;
}
