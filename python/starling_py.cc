// The `starling._starling` extension module: the deployed client runtime (client/runtime.h: the
// protocol, compressors, error feedback, CURVE, state file) driven by a Python object's fit() and
// evaluate(), in the shape of Flower's NumPyClient. python/starling/__init__.py is the public
// API and docs/python.md its guide; this file only crosses the language boundary.
//
// Threading: Client.run() starts the runtime on a thread of its own and serves, on the calling
// thread, the Python calls the runtime's training thread hands it (PythonThread): fit() and
// evaluate() run on the thread that called run(), with the GIL, while the runtime's own thread
// keeps the heartbeats flowing. Between calls run() waits with the GIL released, taking it every
// 50 ms to let Python handle signals, so Ctrl-C raises KeyboardInterrupt inside a long fit() or
// while waiting, and stops the client. Whatever goes wrong on the Python side (an exception in
// fit(), a result of the wrong shape, dtype or a non-finite value) stops the runtime before the
// update is encoded, and run() raises it: nothing is sent for that task.
#include <pthread.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "aggregation/bounds.h"
#include "client/runtime.h"
#include "client/trainer.h"
#include "client/upstream_link.h"
#include "core/error.h"
#include "data/idx.h"
#include "data/partition.h"
#include "protocol/control.h"
#include "transport/context.h"
#include "transport/keys.h"

namespace py = pybind11;
using namespace starling;

namespace {

using Shape = std::vector<int64_t>;
using LayoutList = std::vector<std::pair<std::string, Shape>>;

ParamLayout makeLayout(const LayoutList& tensors) {
  if (tensors.empty())
    throw py::value_error("the layout is empty: give the model's tensors as (name, shape) pairs");
  ParamLayout layout;
  for (const auto& [name, shape] : tensors) layout.add(name, shape);
  return layout;
}

LayoutList layoutList(const ParamLayout& layout) {
  LayoutList out;
  for (const TensorSpec& t : layout.tensors()) out.emplace_back(t.name, t.shape);
  return out;
}

std::string shapeText(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// The thread in Client::run (the caller's): the runtime's training thread hands it the Python
// calls and waits for their results (exceptions included).
class PythonThread {
 public:
  // On the training thread: runs `f` on the Python thread (which holds the GIL while it runs)
  // and returns what it returned, or throws what it threw.
  template <class F>
  std::invoke_result_t<F> call(F&& f) {
    std::packaged_task<std::invoke_result_t<F>()> task(std::forward<F>(f));
    auto result = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = [&task] { task(); };
    }
    ready_.notify_one();
    return result.get();
  }

  // On the Python thread, without the GIL: waits up to `wait` for a call and runs it with the GIL.
  void serve(std::chrono::milliseconds wait) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait_for(lock, wait, [this] { return static_cast<bool>(job_); });
      job = std::move(job_);
      job_ = nullptr;
    }
    if (job) {
      py::gil_scoped_acquire gil;
      job();
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::function<void()> job_;
};

// The learning rate (and prox_mu) travel as float32s (docs/protocol.md): 0.05 arrives as
// 0.05000000074... Given to Python as the shortest decimal that is the same float32 (0.05), which
// is what the user wrote and what a float32 optimizer rounds it to again.
double shortestFloat(double v) {
  const auto f = static_cast<float>(v);
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f) return std::strtod(buf, nullptr);
  }
  return static_cast<double>(f);
}

// A Trainer whose fit() and evaluate() are a Python object's (client/trainer.h's contract, with
// the data held by the Python side: the DataViews only carry the example counts).
class PyTrainer final : public client::Trainer {
 public:
  PyTrainer(py::object client, ParamLayout layout, PythonThread& python)
      : client_(std::move(client)), layout_(std::move(layout)), python_(python) {}

  std::string name() const override { return "python"; }
  std::string spec() const override { return "python"; }
  const ParamLayout& layout() const override { return layout_; }
  size_t features() const override { return 0; }
  uint32_t classes() const override { return 0; }
  void initParameters(std::span<float>, uint64_t) const override {
    STARLING_THROW(InvalidArgument, "a Python client's parameters come from the server");
  }

  client::FitResult fit(std::span<float> params, const client::DataView& data,
                        const client::FitConfig& cfg, RngStream& rng) override {
    if (cfg.stop && cfg.stop->load()) throw client::TrainingStopped("the client is stopping");
    const uint64_t seed = rng.next();
    client::FitResult fitted = guarded([&] {
      if (!cfg.correction.empty())
        throw py::value_error(
            "this federation runs SCAFFOLD (train.scaffold = true), which a Python client does not "
            "support");
      py::dict config;
      config["round"] = round();
      config["epochs"] = cfg.epochs;
      config["batch_size"] = cfg.batch_size;
      config["lr"] = shortestFloat(cfg.lr);
      config["prox_mu"] = shortestFloat(cfg.prox_mu);
      config["seed"] = seed;
      py::object out = client_.attr("fit")(arrays(params), config);
      const py::tuple t = result(out, "fit", "(parameters, num_examples, metrics)");
      // Every check before the first value is copied: a refused result leaves params as they were.
      std::vector<py::array_t<float, py::array::c_style>> checked = checkParameters(t[0]);
      client::FitResult r;
      r.num_examples = checkCount(t[1], "fit", "num_examples", data.size());
      r.metrics = checkMetrics(t[2], "fit");
      for (size_t i = 0; i < checked.size(); ++i) {
        const std::span<float> dst = layout_.slice(params, i);
        std::copy_n(checked[i].data(), dst.size(), dst.begin());
      }
      return r;
    });
    // stop() during fit(): the trained model is dropped, nothing is sent.
    if (stop && stop->load())
      throw client::TrainingStopped("stopped during fit(); its update is not sent");
    return fitted;
  }

  client::EvalResult evaluate(std::span<const float> params,
                              const client::DataView& data) override {
    return guarded([&] {
      py::dict config;
      config["round"] = round();
      py::object out = client_.attr("evaluate")(arrays(params), config);
      const py::tuple t = result(out, "evaluate", "(loss, num_examples, metrics)");
      client::EvalResult r;
      r.loss = checkNumber(t[0], "evaluate", "loss");
      if (r.loss < 0)
        throw py::value_error("evaluate() returned a negative loss: " + std::to_string(r.loss));
      if (r.loss > protocol::ControlLimits{}.max_eval_loss)
        throw py::value_error("evaluate() returned a loss of " + std::to_string(r.loss) +
                              ", above the bound the server enforces (" +
                              std::to_string(protocol::ControlLimits{}.max_eval_loss) + ")");
      r.num_examples = checkCount(t[1], "evaluate", "num_examples", data.size());
      bool has_accuracy = false;
      for (const Metric& m : checkMetrics(t[2], "evaluate"))
        if (m.name == "accuracy") r.accuracy = m.value, has_accuracy = true;
      if (!has_accuracy)
        throw py::value_error("evaluate() must report metrics['accuracy'] (in [0, 1])");
      if (!(r.accuracy >= 0 && r.accuracy <= 1))
        throw py::value_error("evaluate() returned metrics['accuracy'] = " +
                              std::to_string(r.accuracy) + ", outside [0, 1]");
      return r;
    });
  }

  // Set by Client::run: the flag that stops the runtime, and its statistics, whose last_round
  // (written before training starts, never during) is the round of the task at hand.
  std::atomic<bool>* stop = nullptr;
  const client::RuntimeStats* stats = nullptr;
  // The Python error that stopped the runtime (raised again by Client::run).
  std::optional<py::error_already_set> error;

 private:
  // Runs `f` on the Python thread; a Python error (the user's, a check's, KeyboardInterrupt) is
  // kept for run() to raise, and the runtime is told to stop without sending anything.
  template <class F>
  std::invoke_result_t<F> guarded(F&& f) {
    return python_.call([&]() -> std::invoke_result_t<F> {
      try {
        return f();
      } catch (py::error_already_set& e) {
        error.emplace(std::move(e));
      } catch (py::builtin_exception& e) {
        e.set_error();
        error.emplace();
      }
      if (stop) stop->store(true);
      throw client::TrainingStopped("the Python client raised an exception; nothing was sent");
    });
  }

  uint64_t round() const { return stats ? stats->last_round : 0; }

  py::list arrays(std::span<const float> params) const {
    py::list out;
    for (size_t i = 0; i < layout_.size(); ++i) {
      const TensorSpec& t = layout_[i];
      py::array_t<float> a(t.shape);
      const std::span<const float> src = layout_.slice(params, i);
      std::copy(src.begin(), src.end(), a.mutable_data());
      out.append(std::move(a));
    }
    return out;
  }

  static py::tuple result(const py::object& out, const char* what, const char* form) {
    if (!py::isinstance<py::tuple>(out) && !py::isinstance<py::list>(out))
      throw py::type_error(std::string(what) + "() must return a tuple " + form + ", not " +
                           std::string(py::str(py::type::of(out).attr("__name__"))));
    py::tuple t = py::tuple(out);
    if (t.size() != 3)
      throw py::value_error(std::string(what) + "() must return 3 values " + form + ", not " +
                            std::to_string(t.size()));
    return t;
  }

  std::vector<py::array_t<float, py::array::c_style>> checkParameters(py::handle h) const {
    if (!py::isinstance<py::list>(h) && !py::isinstance<py::tuple>(h))
      throw py::type_error("fit() must return the parameters as a list of numpy arrays");
    const py::sequence seq = py::reinterpret_borrow<py::sequence>(h);
    if (seq.size() != layout_.size())
      throw py::value_error("fit() returned " + std::to_string(seq.size()) +
                            " arrays; the model has " + std::to_string(layout_.size()) +
                            " tensors");
    std::vector<py::array_t<float, py::array::c_style>> out;
    for (size_t i = 0; i < layout_.size(); ++i) {
      const TensorSpec& t = layout_[i];
      const std::string which =
          "fit() returned parameter " + std::to_string(i) + " ('" + t.name + "')";
      py::handle item = seq[i];
      if (!py::isinstance<py::array>(item) ||
          py::isinstance(item, py::module_::import("numpy.ma").attr("MaskedArray")))
        throw py::type_error(which + " as " +
                             std::string(py::str(py::type::of(item).attr("__name__"))) +
                             ", not a plain numpy array");
      const py::array a = py::reinterpret_borrow<py::array>(item);
      if (!a.dtype().is(py::dtype::of<float>()))
        throw py::type_error(which + " of dtype " + std::string(py::str(a.dtype())) +
                             "; the model is float32 (use .astype(numpy.float32))");
      const Shape shape(a.shape(), a.shape() + a.ndim());
      if (shape != t.shape)
        throw py::value_error(which + " of shape " + shapeText(shape) + "; the layout says " +
                              shapeText(t.shape));
      auto c =
          py::array_t<float, py::array::c_style>::ensure(a);  // a contiguous copy if it was not
      const float* v = c.data();
      for (size_t j = 0; j < t.numel; ++j)
        if (!std::isfinite(v[j]))
          throw py::value_error(which + " holding a non-finite value (" + std::to_string(v[j]) +
                                " at flat index " + std::to_string(j) + ")");
      out.push_back(std::move(c));
    }
    return out;
  }

  static double checkNumber(py::handle h, const char* what, const char* name) {
    if (isBool(h) || py::isinstance<py::array>(h) || !py::hasattr(h, "__float__"))
      throw py::type_error(std::string(what) + "() returned " + name + " that is not a number");
    const double v = py::cast<double>(py::float_(py::reinterpret_borrow<py::object>(h)));
    if (!std::isfinite(v))
      throw py::value_error(std::string(what) + "() returned a non-finite " + name);
    return v;
  }

  // numpy.bool_ passes for a number in Python; as a weight or a metric it is a mistake.
  static bool isBool(py::handle h) {
    return py::isinstance<py::bool_>(h) ||
           py::isinstance(h, py::module_::import("numpy").attr("bool_"));
  }

  // An integer in [1, registered]: the server refuses a weight above what the client registered.
  static uint64_t checkCount(py::handle h, const char* what, const char* name,
                             uint64_t registered) {
    PyObject* index = isBool(h) ? nullptr : PyNumber_Index(h.ptr());
    if (!index) {
      PyErr_Clear();
      throw py::type_error(std::string(what) + "() returned " + name + " that is not an integer");
    }
    const py::int_ n = py::reinterpret_steal<py::int_>(index);
    if (n < py::int_(1) || n > py::int_(uint64_t{1} << 53))
      throw py::value_error(std::string(what) + "() returned " + name + " = " +
                            std::string(py::str(py::handle(n))) + "; it must be in [1, 2^53]");
    const auto v = py::cast<uint64_t>(n);
    if (v > registered)
      throw py::value_error(std::string(what) + "() returned " + name + " = " + std::to_string(v) +
                            ", more than the " + std::to_string(registered) +
                            " this client registered (the server would refuse it)");
    return v;
  }

  static std::vector<Metric> checkMetrics(py::handle h, const char* what) {
    if (h.is_none()) return {};
    if (!py::isinstance<py::dict>(h))
      throw py::type_error(std::string(what) + "() must return metrics as a dict");
    std::vector<Metric> out;
    for (auto [k, v] : py::reinterpret_borrow<py::dict>(h)) {
      if (!py::isinstance<py::str>(k))
        throw py::type_error(std::string(what) + "() returned a metric name that is not a str");
      const std::string name = py::cast<std::string>(k);
      const double value = checkNumber(v, what, ("metrics['" + name + "']").c_str());
      // The server's default bound (bounds.max_metric_abs): it refuses an update over it.
      if (std::fabs(value) > aggregation::ValidationBounds{}.max_metric_abs)
        throw py::value_error(std::string(what) + "() returned metrics['" + name +
                              "'] = " + std::to_string(value) +
                              ", above the bound a server enforces (|value| <= " +
                              std::to_string(aggregation::ValidationBounds{}.max_metric_abs) + ")");
      out.push_back({name, value});
    }
    return out;
  }

  py::object client_;
  ParamLayout layout_;
  PythonThread& python_;
};

class Client {
 public:
  // The most examples a client may declare (each costs the view 8 bytes; a server's default cap,
  // bounds.max_examples, is 10 million).
  static constexpr uint64_t kMaxExamples = 100'000'000;

  Client(py::object client, std::string server, uint64_t client_id, const LayoutList& layout,
         uint64_t num_examples, uint64_t eval_examples, bool insecure, std::string key,
         std::string server_key, std::string state_file, const std::string& log_level,
         uint32_t register_retry_ms, uint32_t server_silence_ms, const std::string& secagg_threat,
         const std::string& secagg_authority, double secagg_min_noise, uint64_t secagg_min_clients)
      : trainer_(std::move(client), makeLayout(layout), python_) {
    if (num_examples == 0) throw py::value_error("num_examples must be at least 1");
    if (num_examples > kMaxExamples || eval_examples > kMaxExamples)
      throw py::value_error("num_examples and eval_examples may be at most " +
                            std::to_string(kMaxExamples));
    const auto level = spdlog::level::from_str(log_level);
    if (level == spdlog::level::off && log_level != "off")
      throw py::value_error("log_level '" + log_level +
                            "' is not one of trace, debug, info, warn, error, critical, off");
    indices_.assign(std::max(num_examples, eval_examples), 0);
    config_.server = std::move(server);
    config_.client_id = client_id;
    config_.state_file = std::move(state_file);
    config_.register_retry_ms = register_retry_ms;
    config_.server_silence_ms = server_silence_ms;
    config_.security.insecure = insecure;
    if (!insecure) {
      if (key.empty())
        throw py::value_error(
            "key (this client's NAME.key_secret file) is required unless insecure=True");
      if (server_key.empty())
        throw py::value_error(
            "server_key (the server's public key file) is required unless insecure=True");
      config_.security.own = transport::loadKeyPair(key);
      config_.security.server_public_key = transport::loadPublicKey(server_key);
    }
    if (secagg_threat != "semi-honest" && secagg_threat != "malicious-server")
      throw py::value_error("secagg_threat '" + secagg_threat +
                            "' is not one of semi-honest, malicious-server");
    // Its key file's certified signing key and the authority's public key (secure aggregation
    // under the malicious-server threat model, client/secure_party.h), as starling-client's.
    config_.secagg_trust =
        client::loadSecAggTrust(secagg_threat == "malicious-server", secagg_authority,
                                insecure ? std::string() : key, client_id);
    config_.secagg_trust.min_noise = secagg_min_noise;      // distributed DP's floor
    config_.secagg_trust.min_clients = secagg_min_clients;  // and the clients of a sum
    config_.secagg_trust.validate(client_id);
    config_.validate();
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    log_ = std::make_shared<spdlog::logger>("starling-py-" + std::to_string(client_id), sink);
    log_->set_pattern(insecure ? "[%H:%M:%S.%e] [%n] [INSECURE] [%^%l%$] %v"
                               : "[%H:%M:%S.%e] [%n] [%^%l%$] %v");
    log_->set_level(level);
    train_ = {nullptr, std::span<const size_t>(indices_.data(), num_examples)};
    eval_ = {nullptr, std::span<const size_t>(indices_.data(), eval_examples)};
    // A runtime now, and gone again: a state file that does not read back or an endpoint that is
    // not one fails here, before anything is sent. Each run() makes its own and drops it at its
    // end, so no socket lives (reconnecting, its events unread) between runs.
    client::ClientRuntime(ctx_, config_, trainer_, train_, eval_, log_);
  }

  // Serves the federation: true when the server ended it, false when stopped. Raises what the
  // Python side raised (nothing was sent for that task), KeyboardInterrupt on Ctrl-C.
  bool run() {
    if (running_) throw py::value_error("this client is already running");
    running_ = true;
    struct Reset {  // on every way out, error or not
      Client& c;
      ~Reset() {
        if (c.runtime_) c.stats_ = c.runtime_->stats();
        c.runtime_.reset();
        c.running_ = false;
        c.stop_ = false;  // a stop() counts for the run it came during (or the next one)
        c.trainer_.stop = nullptr;
        c.trainer_.stats = nullptr;
      }
    } reset{*this};
    trainer_.error.reset();
    runtime_ =
        std::make_unique<client::ClientRuntime>(ctx_, config_, trainer_, train_, eval_, log_);
    trainer_.stop = &stop_;
    trainer_.stats = &runtime_->stats();
    std::atomic<bool> done{false};
    bool ended = false;
    std::exception_ptr failure;
    std::optional<py::error_already_set> interrupt;
    {
      py::gil_scoped_release release;
      // The runtime's threads (this one, and the training thread it starts) block SIGINT and
      // SIGTERM, so that a Ctrl-C reaches the thread that runs Python (whose wait in a fit() it
      // then interrupts) rather than a C++ thread, where Python would see it only once fit()
      // returned. libzmq's I/O threads block every signal themselves.
      sigset_t block, previous;
      sigemptyset(&block);
      sigaddset(&block, SIGINT);
      sigaddset(&block, SIGTERM);
      pthread_sigmask(SIG_BLOCK, &block, &previous);
      std::thread t([&] {
        try {
          ended = runtime_->run(stop_);
        } catch (...) {
          failure = std::current_exception();
        }
        done = true;
      });
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      // The Python calls of the runtime's training thread run here; between them, signals.
      while (!done) {
        python_.serve(std::chrono::milliseconds(50));
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {
          if (!interrupt)
            interrupt.emplace();
          else
            PyErr_Clear();  // a second Ctrl-C while stopping: already stopping
          stop_ = true;
        }
      }
      t.join();
    }
    stats_ = runtime_->stats();
    if (interrupt) {
      if (trainer_.error)
        log_->error("client {}: stopped by Ctrl-C; the Python client had also raised: {}",
                    config_.client_id, trainer_.error->what());
      trainer_.error.reset();
      throw std::move(*interrupt);
    }
    if (trainer_.error) {
      py::error_already_set e = std::move(*trainer_.error);
      trainer_.error.reset();
      throw e;
    }
    if (failure) std::rethrow_exception(failure);
    return ended;
  }

  py::dict stats() const {
    const client::RuntimeStats& s = stats_;  // as the last run() left them
    py::dict d;
    d["tasks"] = s.tasks;
    d["updates_sent"] = s.updates_sent;
    d["evaluations_sent"] = s.evaluations_sent;
    d["resent"] = s.resent;
    d["rejects"] = s.rejects;
    d["registrations"] = s.registrations;
    d["heartbeats"] = s.heartbeats;
    d["uplink_bytes"] = s.uplink_bytes;
    d["downlink_bytes"] = s.downlink_bytes;
    d["update_bytes"] = s.update_bytes;
    d["last_round"] = s.last_round;
    return d;
  }

  uint64_t fingerprint() const { return trainer_.layout().fingerprint(); }

  // From another thread: the running run() (or the next one) returns False at its next turn; a
  // fit() in progress finishes, and its update is not sent.
  void stop() { stop_ = true; }

 private:
  PythonThread python_;  // before trainer_, which refers to it
  PyTrainer trainer_;
  client::RuntimeConfig config_;
  transport::Context ctx_;
  std::vector<size_t> indices_;
  client::DataView train_, eval_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<client::ClientRuntime> runtime_;  // during run() only
  client::RuntimeStats stats_;
  std::atomic<bool> running_{false}, stop_{false};
};

}  // namespace

PYBIND11_MODULE(_starling, m) {
  m.doc() = "Starling's deployed client runtime for Python clients (see the starling package).";
  py::register_exception<ConfigError>(m, "ConfigError", PyExc_ValueError);
  py::register_exception<IoError>(m, "IoError", PyExc_OSError);
  py::register_exception<InvalidArgument>(m, "InvalidArgument", PyExc_ValueError);
  // The server will not take this client (its key, its id, its model; client/upstream_link.h).
  py::register_exception<client::UpstreamRefused>(m, "UpstreamRefused",
                                                  PyExc_ConnectionRefusedError);

  m.def(
      "model_layout",
      [](const std::string& spec, size_t rows, size_t cols, uint32_t classes) {
        return layoutList(client::makeTrainer(spec, rows, cols, classes)->layout());
      },
      py::arg("spec"), py::arg("rows"), py::arg("cols"), py::arg("classes"));
  m.def(
      "shard",
      [](py::array_t<uint8_t, py::array::c_style | py::array::forcecast> labels,
         uint32_t num_classes, size_t num_clients, const std::string& partition, uint64_t seed,
         size_t client_id) {
        if (labels.ndim() != 1) throw py::value_error("labels must be a 1-dimensional array");
        if (client_id >= num_clients)
          throw py::value_error("client_id " + std::to_string(client_id) +
                                " is not below num_clients " + std::to_string(num_clients));
        const auto p = data::makePartitioner(partition);
        const std::span<const uint8_t> y(labels.data(), static_cast<size_t>(labels.size()));
        std::vector<size_t> mine;
        {
          py::gil_scoped_release release;
          mine = std::move(p->split(y, num_classes, num_clients, seed)[client_id]);
        }
        py::array_t<int64_t> out(static_cast<py::ssize_t>(mine.size()));
        std::copy(mine.begin(), mine.end(), out.mutable_data());
        return out;
      },
      py::arg("labels"), py::arg("num_classes"), py::arg("num_clients"), py::arg("partition"),
      py::arg("seed"), py::arg("client_id"));
  m.def(
      "layout_fingerprint",
      [](const LayoutList& layout) { return makeLayout(layout).fingerprint(); }, py::arg("layout"));
  m.def(
      "load_idx",
      [](const std::string& images, const std::string& labels, uint32_t num_classes) {
        data::IdxOptions o;
        o.num_classes = num_classes;
        data::Dataset d;
        {
          py::gil_scoped_release release;
          d = data::loadIdx(images, labels, o);
        }
        py::array_t<float> x({static_cast<py::ssize_t>(d.size()), static_cast<py::ssize_t>(d.rows),
                              static_cast<py::ssize_t>(d.cols)});
        std::copy(d.images.begin(), d.images.end(), x.mutable_data());
        py::array_t<uint8_t> y(static_cast<py::ssize_t>(d.size()));
        std::copy(d.labels.begin(), d.labels.end(), y.mutable_data());
        return py::make_tuple(x, y, d.num_classes);
      },
      py::arg("images"), py::arg("labels"), py::arg("num_classes"));

  py::class_<Client>(m, "Client")
      .def(py::init<py::object, std::string, uint64_t, const LayoutList&, uint64_t, uint64_t, bool,
                    std::string, std::string, std::string, std::string, uint32_t, uint32_t,
                    std::string, std::string, double, uint64_t>(),
           py::arg("client"), py::arg("server"), py::arg("client_id"), py::arg("layout"),
           py::arg("num_examples"), py::arg("eval_examples"), py::arg("insecure"), py::arg("key"),
           py::arg("server_key"), py::arg("state_file"), py::arg("log_level"),
           py::arg("register_retry_ms"), py::arg("server_silence_ms"), py::arg("secagg_threat"),
           py::arg("secagg_authority"), py::arg("secagg_min_noise"), py::arg("secagg_min_clients"))
      .def("run", &Client::run)
      .def("stop", &Client::stop)
      .def_property_readonly("stats", &Client::stats)
      .def_property_readonly("fingerprint", &Client::fingerprint);
}
