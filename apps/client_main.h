#pragma once
// starling-client's main (apps/client_run.cc), shared by starling-client (Eigen models),
// starling-client-torch (LibTorch) and the deployment tests' slow device
// (tests/integration/slow_client.cc), which wraps the trainer.
#include <functional>
#include <memory>

#include "client/trainer.h"

namespace starling::apps {

// Given the trainer the settings make, the one to train with (null: that one).
using TrainerWrap =
    std::function<std::unique_ptr<client::Trainer>(std::unique_ptr<client::Trainer>)>;

// Parses the command line (--help, --config FILE, --key value), runs the client and returns the
// exit status: 0 when the federation ended or SIGTERM stopped it, 2 with the reason on stderr for
// a bad configuration or a refusal.
int clientMain(int argc, char** argv, const TrainerWrap& wrap = {});

}  // namespace starling::apps
