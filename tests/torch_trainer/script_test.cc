// TorchScript models built and saved here in C++ (no Python), and the independence from
// LibTorch's global generator. The only LibTorch translation unit of test_torch_trainer.
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "check_throws.h"
#ifdef STARLING_BIN_DIR
#include "integration/federation.h"
#include "model_diff.h"
#endif
#include "client/synthetic.h"
#include "torch_trainer/threads.h"
#include "torch_trainer/torch_trainer.h"

using namespace starling;
using namespace starling::torch_trainer;
using Catch::Matchers::Contains;
using client::DataView;
using client::FitConfig;

namespace {

// A file in the temp directory, removed at the end of the test.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path((std::filesystem::temp_directory_path() /
              ("starling_torch_" + std::to_string(::getpid()) + "_" + name))
                 .string()) {}
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

// A linear classifier as a scripted module with a submodule, a float buffer and an integer
// buffer: forward(x) = flatten(x) @ fc.weight^T * scale + fc.bias.
torch::jit::Module linearModule(int64_t features, int64_t classes,
                                const std::string& forward = "default") {
  torch::jit::Module fc("Fc");
  // requires_grad as nn.Parameter has it in Python (the trainer respects the saved flags).
  fc.register_parameter("weight", (torch::randn({classes, features}) * 0.01).requires_grad_(true),
                        /*is_buffer=*/false);
  fc.register_parameter("bias", torch::zeros({classes}).requires_grad_(true), false);
  torch::jit::Module m("Linear");
  m.register_module("fc", fc);
  m.register_buffer("scale", torch::ones({1}));
  m.register_buffer("steps", torch::zeros({1}, torch::kInt64));
  if (forward == "default") {
    m.define(R"(
def forward(self, x):
    h = torch.flatten(x, 1)
    return torch.matmul(h, self.fc.weight.t()) * self.scale + self.fc.bias
)");
  } else if (!forward.empty()) {
    m.define(forward);
  }
  return m;
}

std::string save(const torch::jit::Module& m, const TempFile& f) {
  m.save(f.path);
  return f.path;
}

}  // namespace

TEST_CASE("a TorchScript module saved from C++ loads through the registry and trains",
          "[torch_trainer]") {
  torch::manual_seed(0);
  const data::Dataset d = testing::separableData(200, 8, 4, 9);  // images of 1 x 8
  const auto idx = testing::allIndices(d);
  const DataView view{&d, idx};
  const TempFile file("linear.pt");
  const torch::jit::Module m = linearModule(8, 4);
  save(m, file);

  for (const char* input : {"image", "flat"}) {
    INFO(input);
    auto t = makeTorchTrainer("torchscript:path=" + file.path + ",input=" + input, d);
    CHECK(t->name() == "torchscript");
    CHECK(t->spec() == "torchscript:path=" + file.path + ",input=" + input + ",init=file");
    // Parameters in named_parameters order with LibTorch's names, then the float buffer; the
    // int64 buffer is left out.
    const ParamLayout& l = t->layout();
    REQUIRE(l.size() == 3);
    CHECK(l[0].name == "fc.weight");
    CHECK(l[0].shape == std::vector<int64_t>{4, 8});
    CHECK(l[1].name == "fc.bias");
    CHECK(l[2].name == "scale");
    // init=file: the saved values, whatever the seed.
    std::vector<float> params(l.numel());
    t->initParameters(params, 123);
    const torch::Tensor w = m.attr("fc").toModule().attr("weight").toTensor();
    for (size_t i = 0; i < 32; ++i) REQUIRE(params[i] == w.data_ptr<float>()[i]);
    CHECK(params[l[2].offset] == 1.0f);

    const client::EvalResult before = t->evaluate(params, view);
    RngStream rng(StreamKey{1, 1, 0, StreamPurpose::kTraining, 0});
    const client::FitResult fit =
        t->fit(params, view, FitConfig{.epochs = 5, .batch_size = 16, .lr = 0.1}, rng);
    const client::EvalResult after = t->evaluate(params, view);
    CHECK(fit.num_examples == 200);
    CHECK(after.accuracy > 0.95);
    CHECK(after.loss < 0.3 * before.loss);
    CHECK(params[l[2].offset] == 1.0f);  // a buffer: SGD leaves it alone
  }

  // init=seed: PyTorch's Linear defaults for the weight and its bias; the buffer keeps its value.
  auto seeded = makeTorchTrainer("torchscript:path=" + file.path + ",init=seed", d);
  const ParamLayout& l = seeded->layout();
  std::vector<float> a(l.numel()), b(l.numel());
  seeded->initParameters(a, 5);
  seeded->initParameters(b, 5);
  CHECK(a == b);
  const double bound = 1.0 / std::sqrt(8.0);
  bool any_large = false;
  for (size_t i = 0; i < 36; ++i) {
    REQUIRE(std::abs(a[i]) <= bound);
    any_large |= std::abs(a[i]) > 0.05;  // not the saved 0.01-scale values
  }
  CHECK(any_large);
  CHECK(a[l[2].offset] == 1.0f);
}

TEST_CASE("a TorchScript module's BatchNorm statistics travel in the layout", "[torch_trainer]") {
  torch::jit::Module m("WithNorm");
  m.register_parameter("weight", (torch::randn({3, 8}) * 0.1).requires_grad_(true), false);
  m.register_parameter("gamma", torch::ones({8}).requires_grad_(true), false);
  m.register_parameter("beta", torch::zeros({8}).requires_grad_(true), false);
  m.register_buffer("running_mean", torch::zeros({8}));
  m.register_buffer("running_var", torch::ones({8}));
  // Modules scripted in Python have it; a module built in C++ must declare it to read it.
  m.register_attribute("training", c10::BoolType::get(), true);
  m.define(R"(
def forward(self, x):
    h = torch.batch_norm(torch.flatten(x, 1), self.gamma, self.beta, self.running_mean,
                         self.running_var, self.training, 0.1, 1e-5, False)
    return torch.matmul(h, self.weight.t())
)");
  const TempFile file("norm.pt");
  save(m, file);
  data::Dataset d = testing::separableData(48, 8, 3, 3);
  for (float& x : d.images) x += 2.0f;  // a mean far from the initial running_mean of 0
  const auto idx = testing::allIndices(d);
  auto t = makeTorchTrainer("torchscript:path=" + file.path, d);
  const ParamLayout& l = t->layout();
  REQUIRE(l.size() == 5);
  CHECK(l[3].name == "running_mean");
  CHECK(l[4].name == "running_var");
  std::vector<float> p(l.numel());
  t->initParameters(p, 1);
  RngStream rng(StreamKey{1, 1, 0, StreamPurpose::kTraining, 0});
  t->fit(p, DataView{&d, idx}, FitConfig{.epochs = 2, .batch_size = 8, .lr = 0.05}, rng);
  // Training-mode forward passes moved the statistics (toward a mean near 2) in the flat buffer.
  for (float x : l.slice(std::span<const float>(p), 3)) CHECK(x > 0.5f);
  // evaluate (eval mode) uses them and leaves them alone.
  const auto e1 = t->evaluate(p, DataView{&d, idx});
  CHECK(t->evaluate(p, DataView{&d, idx}).loss == e1.loss);
  std::vector<float> q = p;
  for (float& x : l.slice(std::span<float>(q), 3)) x = 0.0f;
  CHECK(t->evaluate(q, DataView{&d, idx}).loss != e1.loss);
}

TEST_CASE("bad TorchScript files and modules give clear errors", "[torch_trainer]") {
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript", 1, 8, 4), ConfigError,
                        Contains("path=FILE is required"));
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=/nonexistent/model.pt", 1, 8, 4),
                        IoError, Contains("'/nonexistent/model.pt' does not exist"));
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=/tmp", 1, 8, 4), IoError,
                        Contains("cannot be read"));
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=x.pt,input=nchw", 1, 8, 4), ConfigError,
                        Contains("input='nchw'"));

  const TempFile garbage("garbage.pt");
  std::ofstream(garbage.path) << "this is not a zip archive of a TorchScript module\n";
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=" + garbage.path, 1, 8, 4), IoError,
                        Contains("is not a TorchScript module"));

  torch::manual_seed(0);
  const TempFile no_forward("no_forward.pt");
  save(linearModule(8, 4, ""), no_forward);
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=" + no_forward.path, 1, 8, 4),
                        ConfigError, Contains("has no forward method"));

  const TempFile linear("linear4.pt");
  save(linearModule(8, 4), linear);
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=" + linear.path, 1, 8, 5), ConfigError,
                        Contains("expected float [2, 5]"));
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=" + linear.path, 1, 9, 4), ConfigError,
                        Contains("fails on an input [2, 1, 1, 9]"));

  // forward that expects [N, features]: fine with input=flat, a clear error with input=image.
  const TempFile flat_only("flat_only.pt");
  save(linearModule(8, 4, R"(
def forward(self, x):
    return torch.matmul(x, self.fc.weight.t()) + self.fc.bias
)"),
       flat_only);
  CHECK_NOTHROW(makeTorchTrainer("torchscript:path=" + flat_only.path + ",input=flat", 1, 8, 4));
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=" + flat_only.path, 1, 8, 4),
                        ConfigError, Contains("input=image"));

  const TempFile not_tensor("tuple.pt");
  save(linearModule(8, 4, R"(
def forward(self, x):
    return (x, x)
)"),
       not_tensor);
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=" + not_tensor.path, 1, 8, 4),
                        ConfigError, Contains("not a Tensor"));

  torch::jit::Module dbl("Double");
  dbl.register_parameter("weight", torch::zeros({4, 8}, torch::kFloat64).requires_grad_(true),
                         false);
  dbl.define(R"(
def forward(self, x):
    return torch.matmul(torch.flatten(x, 1).double(), self.weight.t()).float()
)");
  const TempFile dbl_file("double.pt");
  save(dbl, dbl_file);
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=" + dbl_file.path, 1, 8, 4), ConfigError,
                        Contains("not float32"));

  torch::jit::Module frozen("Frozen");
  frozen.register_parameter("weight", torch::zeros({4, 8}), false);  // requires_grad false
  frozen.define(R"(
def forward(self, x):
    return torch.matmul(torch.flatten(x, 1), self.weight.t())
)");
  const TempFile frozen_file("frozen.pt");
  save(frozen, frozen_file);
  CHECK_THROWS_MATCHING(makeTorchTrainer("torchscript:path=" + frozen_file.path, 1, 8, 4),
                        ConfigError, Contains("requires grad"));
}

TEST_CASE("LibTorch trainers never draw from LibTorch's global generator", "[torch_trainer]") {
  const auto t = makeTorchTrainer("cnn", 12, 12, 3);
  std::vector<float> a(t->layout().numel()), b(t->layout().numel());
  torch::manual_seed(1);
  t->initParameters(a, 7);
  torch::manual_seed(2);
  t->initParameters(b, 7);
  CHECK(a == b);

  // Construction, initialisation, training and evaluation leave the global stream where it was.
  torch::manual_seed(5);
  {
    const auto r = makeTorchTrainer("resnet", 12, 12, 3);
    std::vector<float> p(r->layout().numel());
    r->initParameters(p, 3);
    data::Dataset d = testing::separableData(16, 144, 3, 1);
    d.rows = 12;
    d.cols = 12;
    const auto idx = testing::allIndices(d);
    RngStream rng(StreamKey{1, 1, 0, StreamPurpose::kTraining, 0});
    r->fit(p, DataView{&d, idx}, FitConfig{.epochs = 1, .batch_size = 8, .lr = 0.01}, rng);
    r->evaluate(p, DataView{&d, idx});
  }
  const torch::Tensor after = torch::rand({4});
  torch::manual_seed(5);
  CHECK(torch::equal(after, torch::rand({4})));
}

TEST_CASE("the thread count is set by the program, not by trainers", "[torch_trainer]") {
  const int before = threads();
  CHECK_THROWS_AS(setThreads(0), InvalidArgument);
  const int blas_before = blasThreadsForTesting();
  // OpenBLAS (Debian's LibTorch's BLAS) keeps a pool of its own: set alike, when present. Two, then
  // one, so that the count moves whichever the process started with (OMP_NUM_THREADS=1 starts
  // both pools at one).
  setThreads(2);
  CHECK(threads() == 2);
  if (blas_before > 0) CHECK(blasThreadsForTesting() == 2);
  setThreads(1);
  CHECK(threads() == 1);
  if (blas_before > 0) CHECK(blasThreadsForTesting() == 1);
  auto t = makeTorchTrainer("logreg", 1, 4, 2);
  const data::Dataset d = testing::separableData(8, 4, 2, 1);
  const auto idx = testing::allIndices(d);
  std::vector<float> p(t->layout().numel());
  t->initParameters(p, 1);
  RngStream rng(StreamKey{1, 1, 0, StreamPurpose::kTraining, 0});
  t->fit(p, DataView{&d, idx}, FitConfig{}, rng);
  CHECK(threads() == 1);
  setThreads(before);
  CHECK(threads() == before);
}

#ifdef STARLING_BIN_DIR
// A TorchScript model deployed: the LibTorch-backed starling-server-torch and
// starling-client-torch train the module file a simulation trains, from one configuration file,
// to the same model; the plain (Eigen) programs refuse the spec and name the ones that take it.
TEST_CASE("a TorchScript model runs deployed on the LibTorch-backed programs as it runs simulated",
          "[torch_trainer][integration][deployment]") {
  using starling::testing::Federation;
  using starling::testing::field;
  using starling::testing::Proc;
  using starling::testing::readLines;
  using std::chrono::seconds;
  torch::manual_seed(3);
  Federation f("torchscript-deploy");
  const std::string model = f.path("linear.pt");
  linearModule(28 * 28, 10).save(model);
  const std::string toml = f.path("federation.toml");
  std::ofstream(toml) << "[model]\nspec = \"torchscript:path=" << model
                      << ",input=flat\"\nseed = 3\n"
                      << "[data]\nnum_clients = 3\npartition = \"sampled:size=200\"\n"
                      << "[train]\nrounds = 2\nbatch_size = 16\nlr = 0.1\n"
                      << "[sampling]\nclients_per_round = 3\n"
                      << "[compression]\ncompressor = \"topk:density=0.1\"\n"
                      << "[eval]\nevery = 0\n[sim]\nworkers = 1\ndevice = \"cpu\"\n"
                      << "[net]\nheartbeat_ms = 200\nsilence_ms = 20000\n";
  const std::string bin = STARLING_BIN_DIR;
  Proc sim({bin + "/starling-sim", "--config", toml, "--state.checkpoint", f.path("sim.ckpt"),
            "--state.metrics", f.path("sim.jsonl")},
           f.path("sim.log"));
  REQUIRE(sim.wait(seconds(300)) == 0);

  f.clientKeys(0, 3);
  const std::string allow = f.allowList("allow", {"client-0", "client-1", "client-2"});
  // The plain server has no LibTorch: the spec is a configuration error naming the programs.
  const int port = starling::testing::freePort();
  const std::string ep = "tcp://127.0.0.1:" + std::to_string(port);
  const std::vector<std::string> root_args{"--config",           toml,
                                           "--server.bind",      ep,
                                           "--security.key",     f.keys() + "/server.key_secret",
                                           "--security.clients", allow,
                                           "--state.checkpoint", f.path("root.ckpt"),
                                           "--state.metrics",    f.path("root.jsonl")};
  std::vector<std::string> plain{bin + "/starling-server"};
  plain.insert(plain.end(), root_args.begin(), root_args.end());
  f.start("plain", plain);
  CHECK(f.proc("plain").wait(seconds(30)) == 2);
  CHECK(f.log("plain").find("starling-server-torch") != std::string::npos);

  std::vector<std::string> root{bin + "/starling-server-torch"};
  root.insert(root.end(), root_args.begin(), root_args.end());
  f.start("root", root);
  for (int id = 0; id < 3; ++id)
    f.start("client-" + std::to_string(id),
            {bin + "/starling-client-torch", "--config", toml, "--client.server", ep, "--client.id",
             std::to_string(id), "--security.key",
             f.keys() + "/client-" + std::to_string(id) + ".key_secret", "--security.server_key",
             f.keys() + "/server.key"});
  const int rc = f.proc("root").wait(seconds(300));
  INFO(f.allLogs());
  REQUIRE(rc == 0);
  const auto s = readLines(f.path("sim.jsonl")), d = readLines(f.path("root.jsonl"));
  REQUIRE(s.size() == 2);
  REQUIRE(d.size() == 2);
  for (size_t r = 0; r < 2; ++r) {
    CHECK(field(d[r], "clients_completed") == "3");
    CHECK(field(s[r], "uplink_bytes") == field(d[r], "uplink_bytes"));
    const double ls = std::stod(field(s[r], "train_loss")),
                 ld = std::stod(field(d[r], "train_loss"));
    CHECK(std::fabs(ls - ld) <= 1e-4 * std::fabs(ls));
  }
  const auto a = starling::testing::readCheckpoint(f.path("sim.ckpt")).model;
  const auto b = starling::testing::readCheckpoint(f.path("root.ckpt")).model;
  REQUIRE(a.size() == b.size());
  // fc.weight, fc.bias and the float buffer "scale" (the integer buffer "steps" does not travel).
  REQUIRE(a.size() == 28 * 28 * 10 + 10 + 1);
  const auto [diff, scale] = starling::testing::modelDiff(a, b);
  CHECK(scale > 0);
  CHECK(diff <= 1e-4 * scale);
}
#endif
