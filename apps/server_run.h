#pragma once
// starling-server's main (apps/server_run.cc), shared by starling-server (Eigen models) and
// starling-server-torch (LibTorch): the root of a federation (server.role = root) or an edge
// aggregator (server.role = aggregator). Built from the settings in steps: the refusals
// (checkServer), the trainer of the clients' model, the ZeroMQ fleet, then the aggregator's relay,
// the round engine (synchronous rounds) or the buffered engine (server/async_root.h).
// docs/deployment.md shows how to run one; docs/protocol.md what travels.

namespace starling::apps {

// Parses the command line (--help, --config FILE, --key value) and serves until the rounds are
// done or SIGINT / SIGTERM: 0 then, 2 with the reason on stderr for a bad configuration.
int serverMain(int argc, char** argv);

}  // namespace starling::apps
