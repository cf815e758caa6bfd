// starling-bench: Google Benchmark over compression, aggregation and the Eigen trainers' fit, with
// the references each target is compared against measured in the same run (memcpy of the same
// bytes, torch::topk on the same input, the two Eigen matrix products of PowerSGD). After the run
// it prints the ratios to stderr (stdout stays valid JSON with --benchmark_format=json) and, with
// --ratios_out=FILE, writes them as JSON. docs/performance.md records them.
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "bench/bench_common.h"
#include "bench/ratios.h"

using starling::bench::Ratio;
using starling::bench::Recorder;

int main(int argc, char** argv) {
  starling::bench::CommandLine cl;
  if (!starling::bench::initBenchmarks(argc, argv, cl)) return 1;

  starling::bench::registerCompressionBenchmarks();
  starling::bench::registerAggregationBenchmarks();
  starling::bench::registerClientFitBenchmarks();
#ifdef STARLING_BENCH_TORCH
  starling::bench::registerTorchReferences();
#endif
  const auto rec_ptr = starling::bench::runBenchmarks(cl.json);
  const Recorder& rec = *rec_ptr;

  // ratio = time(numerator) / time(denominator); "speedup" style ratios put the reference first.
  std::vector<Ratio> ratios;
  for (const char* sz : {"1M", "25M"}) {
    for (const char* d : {"0.001", "0.01"}) {
      const std::string s = std::string(sz) + "/density:" + d;
      ratios.push_back({std::string("topk_speedup_vs_torch/") + s, "torch_topk/" + s,
                        "topk_select/" + s, ">= 15"});
      ratios.push_back({std::string("topk_speed_vs_memcpy/") + s, std::string("memcpy/") + sz,
                        "topk_select/" + s, ">= 0.33"});
      ratios.push_back({std::string("randblock_speed_vs_memcpy/") + s, std::string("memcpy/") + sz,
                        "compress/randblock/" + s, ">= 0.5"});
      ratios.push_back({std::string("randblock_select_speed_vs_memcpy/") + s,
                        std::string("memcpy/") + sz, "randblock_select/" + s, ">= 0.5"});
    }
  }
  ratios.push_back({"powersgd_time_vs_two_matmuls/4096x6144/rank:4",
                    "compress/powersgd/4096x6144/rank:4", "two_matmuls/4096x6144/rank:4",
                    "<= 1.5"});
  ratios.push_back({"accumulate_dense_speed_vs_memcpy/1000x1M", "memcpy_ref/1000x1M",
                    "accumulate/dense/1000x1M", ">= 0.5"});
  ratios.push_back({"accumulate_sparse_nnz100k_vs_nnz10k/1000x25M",
                    "accumulate/sparse_nnz100000/1000x25M", "accumulate/sparse_nnz10000/1000x25M",
                    "~= 10 (cost follows non-zeros)"});
  for (const char* kind : {"dense", "topk1pct"}) {
    const std::string k = kind;
    ratios.push_back({"ingest_zerocopy_speedup_vs_copy/" + k + "/1000x1M",
                      "ingest/copy/" + k + "/1000x1M", "ingest/zerocopy/" + k + "/1000x1M",
                      "> 1 (the zero-copy path beats the copying one)"});
    ratios.push_back({"ingest_zerocopy_speed_vs_memcpy/" + k + "/1000x1M",
                      "ingest/memcpy/" + k + "/1000x1M", "ingest/zerocopy/" + k + "/1000x1M",
                      "no target: decode + validate + accumulate vs one memcpy"});
  }
  // STC against top-k on the same support: the client's cost (selection + Rice coding) and the
  // server's (decoding the positions bit by bit, with and without validation).
  for (const char* d : {"0.001", "0.01"})
    for (const char* sz : {"1M", "25M"}) {
      const std::string s = std::string(sz) + "/density:" + d;
      ratios.push_back({"stc_time_vs_topk/" + s, "compress/stc/" + s, "compress/topk/" + s,
                        "no target: what Rice coding adds to top-k"});
    }
  ratios.push_back({"accumulate_ternary_time_vs_sparse/nnz10000/1000x1M",
                    "accumulate/ternary_nnz10000/1000x1M", "accumulate/sparse_nnz10000/1000x1M",
                    "no target: Rice-coded positions vs u32 indices"});
  ratios.push_back({"ingest_zerocopy_stc_time_vs_topk/1000x1M", "ingest/zerocopy/stc1pct/1000x1M",
                    "ingest/zerocopy/topk1pct/1000x1M",
                    "no target: decode + validate + accumulate, 7x fewer bytes"});
  ratios.push_back({"accumulate_sparse_25M_vs_1M_model/nnz10000",
                    "accumulate/sparse_nnz10000/1000x25M", "accumulate/sparse_nnz10000/1000x1M",
                    "no target: same work, cache misses in the larger model"});

  // The Eigen trainers' fit against the model's bare forward/backward and SGD steps on the same
  // batches (what the trainer adds: shuffle, gather, the aligned working copy, checks).
  for (const char* spec : {"softmax", "mlp:hidden=128"})
    ratios.push_back({std::string("client_fit_time_vs_bare/") + spec,
                      std::string("client_fit/") + spec, std::string("client_fit_bare/") + spec,
                      "no target: the trainer's overhead on the model's work"});

  if (!starling::bench::reportRatios(rec, ratios, cl.ratios_out)) return 1;
  benchmark::Shutdown();
  return 0;
}
