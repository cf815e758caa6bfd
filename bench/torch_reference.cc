// torch::topk on the same inputs as topk_select, single thread. The only LibTorch TU of the bench.
#include <torch/torch.h>

#include "bench/bench_common.h"
#include "compression/compressor.h"

namespace starling::bench {

void registerTorchReferences() {
  torch::set_num_threads(1);
  for (size_t n : {size_t{1000000}, size_t{25000000}}) {
    for (const char* d : {"0.001", "0.01"}) {
      const double density = std::stod(d);
      benchmark::RegisterBenchmark(
          ("torch_topk/" + sizeName(n) + "/density:" + d).c_str(),
          [n, density](benchmark::State& st) {
            const auto& x = input(n);
            auto t = torch::from_blob(const_cast<float*>(x.data()), {static_cast<int64_t>(n)},
                                      torch::kFloat32);
            const auto k = static_cast<int64_t>(compression::countForDensity(density, n));
            for (auto _ : st) {
              auto r = torch::topk(t.abs(), k);
              benchmark::DoNotOptimize(std::get<1>(r).data_ptr());
            }
            st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) *
                                 static_cast<int64_t>(n * sizeof(float)));
          });
    }
  }
}

}  // namespace starling::bench
