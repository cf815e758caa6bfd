// starling-server: the root of a federation (--server.role root, the default) or an edge
// aggregator (--server.role aggregator --server.upstream tcp://HOST:PORT); apps/server_run.h
// builds it from the settings. docs/deployment.md shows how to run one; docs/protocol.md what
// travels.
#include "apps/server_run.h"

int main(int argc, char** argv) { return starling::apps::serverMain(argc, argv); }
