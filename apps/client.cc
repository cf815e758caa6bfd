// starling-client: one lightweight client of a federation (no LibTorch; runs on arm64 edge
// devices). It trains an Eigen model on its own data, compresses its update with its own
// error-feedback state (persisted in --state.file), and talks to a starling-server over ZeroMQ
// with CurveZMQ. Its data is shard client.id of the data.* files, split among data.num_clients as
// data.partition with model.seed: the split the simulator makes of the same files.
#include "apps/client_main.h"

int main(int argc, char** argv) { return starling::apps::clientMain(argc, argv); }
