// starling-client on a slow device, for the deployment tests
// (tests/integration/federation.h, slowClient). `--test.wait_ms N` (the first two arguments, not
// a key of the settings) makes every fit wait N ms first (tests/wait_trainer.h); an optional
// `--test.fits FILE` after it appends a line to FILE as each fit begins (before its wait), the
// event a test waits on when it must act while the client trains. The rest of the command line
// is starling-client's.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "apps/client_main.h"
#include "wait_trainer.h"

namespace {

// Appends "fit\n" to `path` as each fit begins, in one write (O_APPEND): a reader counts whole
// lines.
class FitEvents final : public starling::testing::WrappedTrainer {
 public:
  FitEvents(std::unique_ptr<starling::client::Trainer> inner, std::string path)
      : WrappedTrainer(std::move(inner)), path_(std::move(path)) {}
  starling::client::FitResult fit(std::span<float> params, const starling::client::DataView& data,
                                  const starling::client::FitConfig& cfg,
                                  starling::RngStream& rng) override {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ::write(fd, "fit\n", 4) != 4)
      std::fprintf(stderr, "starling-test-slow-client: cannot append to %s\n", path_.c_str());
    if (fd >= 0) ::close(fd);
    return WrappedTrainer::fit(params, data, cfg, rng);
  }

 private:
  std::string path_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || std::strcmp(argv[1], "--test.wait_ms") != 0) {
    std::fprintf(stderr,
                 "usage: %s --test.wait_ms N [--test.fits FILE] [starling-client's arguments]\n",
                 argv[0]);
    return 2;
  }
  char* end = nullptr;
  const unsigned long long wait_ms = std::strtoull(argv[2], &end, 10);
  // strtoull takes "-1" as 2^64 - 1: digits only, at most an hour.
  if (end == argv[2] || *end != '\0' || argv[2][0] < '0' || argv[2][0] > '9' ||
      wait_ms > 3'600'000) {
    std::fprintf(stderr, "%s: --test.wait_ms takes 0 to 3600000 milliseconds, got '%s'\n", argv[0],
                 argv[2]);
    return 2;
  }
  int next = 3;
  std::string fits;
  if (argc > 4 && std::strcmp(argv[3], "--test.fits") == 0) {
    fits = argv[4];
    next = 5;
  }
  std::vector<char*> rest{argv[0]};
  for (int i = next; i < argc; ++i) rest.push_back(argv[i]);
  return starling::apps::clientMain(
      static_cast<int>(rest.size()), rest.data(),
      [wait_ms, fits](std::unique_ptr<starling::client::Trainer> inner)
          -> std::unique_ptr<starling::client::Trainer> {
        auto slow = std::make_unique<starling::testing::WaitTrainer>(
            std::move(inner), starling::steadyClock(), std::chrono::milliseconds(wait_ms));
        if (fits.empty()) return slow;
        return std::make_unique<FitEvents>(std::move(slow), fits);
      });
}
