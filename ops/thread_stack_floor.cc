// Linked into the programs that also link LibTorch (starling-sim, starling-server-torch), never
// into a library: a floor of 1 MiB under every thread stack size a library asks pthread for.
//
// Why: Debian's civetweb (the status server, ops/status_server.h) starts its threads with a fixed
// 100 KiB stack (pthread_attr_setstacksize(102400), compiled in). In a program linked with LibTorch
// the static thread-local storage of its libraries (OpenBLAS, glog, libtorch_cpu, ...) is carved
// from every thread's stack, and glibc's pthread_create refuses such a small one (EINVAL), so
// civetweb could not start. This definition, in the executable, comes before libc's in the dynamic
// linker's search order, so every library's call lands here; it only ever raises the size, and
// passes the call on to libc's own (dlsym(RTLD_NEXT)). A thread that asked for more is unchanged.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace {
constexpr size_t kStackFloor = size_t{1} << 20;
}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using Fn = int (*)(pthread_attr_t*, size_t);
  static const Fn libc = [] {
    const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
    if (!fn) {
      std::fprintf(stderr, "starling: libc's pthread_attr_setstacksize not found (%s)\n",
                   dlerror());
      std::abort();
    }
    return fn;
  }();
  return libc(attr, std::max(size, kStackFloor));
}
