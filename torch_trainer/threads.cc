#include "torch_trainer/threads.h"

#include <ATen/Parallel.h>

#include "core/error.h"

namespace starling::torch_trainer {

void setThreads(int n) {
  STARLING_CHECK_ARG(n >= 1, "setThreads: the thread count must be at least 1, got ", n);
  at::set_num_threads(n);
}

int threads() { return at::get_num_threads(); }

}  // namespace starling::torch_trainer
