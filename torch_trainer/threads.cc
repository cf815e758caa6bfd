#include "torch_trainer/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include "core/error.h"

namespace starling::torch_trainer {

namespace {
// OpenBLAS (Debian's LibTorch does its matrix products through libopenblas0-pthread) keeps a
// thread pool of its own, one thread per core, which at::set_num_threads does not touch: two
// "one-thread" workers on two cores then ran four busy threads (millions of sched_yield calls,
// about 15% slower; docs/performance.md). Its setter is looked up at run time, so that a LibTorch
// built on another BLAS (or none) is fine: then there is nothing to limit.
void setBlasThreads(int n) {
  using Setter = void (*)(int);
  if (auto* set = reinterpret_cast<Setter>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(n);
}
int blasThreads() {
  using Getter = int (*)();
  auto* get = reinterpret_cast<Getter>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : 0;
}
}  // namespace

void setThreads(int n) {
  STARLING_CHECK_ARG(n >= 1, "setThreads: the thread count must be at least 1, got ", n);
  at::set_num_threads(n);
  setBlasThreads(n);
}

int threads() { return at::get_num_threads(); }

int blasThreadsForTesting() { return blasThreads(); }

}  // namespace starling::torch_trainer
