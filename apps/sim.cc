// starling-sim: a federated training of many simulated clients on few workers, in the style of
// FedML Parrot (simulator/sim_fleet.h): W worker processes, each training its share of every
// round's clients one after another on one model replica, aggregating them locally, then all
// workers aggregating globally through c10d (Gloo on CPU). The round loop is the server's
// RoundEngine (FedBuff's and semi-synchronous rounds: its buffered engine); apps/sim_run.h builds
// the simulation from the settings, and docs/simulation.md explains the configuration and the
// launch modes.
//
// Launch: `starling-sim --config FILE --sim.workers W` starts W-1 more processes of itself on this
// machine; under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) or srun
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) each process is one worker and --sim.workers is
// ignored.
#include "apps/sim_run.h"

int main(int argc, char** argv) { return starling::apps::simMain(argc, argv); }
