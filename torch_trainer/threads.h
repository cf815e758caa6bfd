#pragma once
// LibTorch's intra-op thread count is one setting for the whole process, so no trainer touches
// it: the program decides once, at start, before any trainer runs. A simulator worker process
// trains one client at a time and scales by running W processes, which is fastest with 1 thread
// each (docs/models.md).
namespace starling::torch_trainer {

// Sets LibTorch's intra-op thread count (at::set_num_threads) and, when the process uses OpenBLAS,
// OpenBLAS's own thread pool to the same n; n >= 1 (InvalidArgument otherwise).
void setThreads(int n);
// The current intra-op thread count.
int threads();
// OpenBLAS's thread count (openblas_get_num_threads), 0 when the process has no OpenBLAS.
int blasThreadsForTesting();

}  // namespace starling::torch_trainer
