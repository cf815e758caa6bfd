// starling-test-slow-client: starling-client on a slow device, for the deployment tests
// (tests/integration/federation.h, slowClient). `--test.wait_ms N` (the first two arguments, not
// a key of the settings) makes every fit wait N ms first (tests/wait_trainer.h); the rest of the
// command line is starling-client's.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "apps/client_main.h"
#include "wait_trainer.h"

int main(int argc, char** argv) {
  if (argc < 3 || std::strcmp(argv[1], "--test.wait_ms") != 0) {
    std::fprintf(stderr, "usage: %s --test.wait_ms N [starling-client's arguments]\n", argv[0]);
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
  std::vector<char*> rest{argv[0]};
  for (int i = 3; i < argc; ++i) rest.push_back(argv[i]);
  return starling::apps::clientMain(static_cast<int>(rest.size()), rest.data(),
                                    [wait_ms](std::unique_ptr<starling::client::Trainer> inner) {
                                      return std::make_unique<starling::testing::WaitTrainer>(
                                          std::move(inner), starling::steadyClock(),
                                          std::chrono::milliseconds(wait_ms));
                                    });
}
