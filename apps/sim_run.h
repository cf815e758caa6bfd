#pragma once
// starling-sim's main (apps/sim_run.cc): a federated training of many simulated clients on few
// workers, in the style of FedML Parrot (simulator/sim_fleet.h). A simulation is built from the
// settings in steps a reader can follow: the refusals that need no data (planSimulation), the
// launch of the workers, the data, clients, devices and trainer (loadSimulation, which refuses a
// model that does not fit the data), the client states (simulator::planClientStates, which refuses
// states no checkpoint resumes), then the synchronous round engine (server/engine.h) or the
// buffered one (server/async_engine.h) on the simulated fleet, each round's line on the terminal.

namespace starling::apps {

// Parses the command line (--help, --config FILE, --key value) and runs the simulation on this
// worker: 0 when done, 2 with the reason on stderr for a bad configuration, 1 when a worker it
// started failed. `starling-sim --sim.workers W` starts W-1 more processes of itself on this
// machine; under torchrun or srun each process is one worker.
int simMain(int argc, char** argv);

}  // namespace starling::apps
