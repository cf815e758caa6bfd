#pragma once
// System heterogeneity with FedScale's semantics: every simulated client has a compute speed, a
// network bandwidth and an availability, from distributions in the configuration or from a trace
// file, and a round runs on a simulated clock: a client takes compute time (examples x epochs x
// the reference seconds per example / its speed) plus transfer time (its task's and its update's
// exact wire bytes / its bandwidth); the round lasts until the last client it accepts. With
// over-commitment the fastest `target` clients are accepted; a deadline drops the stragglers.
// Clients unavailable in a round (by their trace) are not sampled.
//
// Trace file (CSV, header required, one row per client, ids 0..n-1 in any order, every client
// present):   client,speed,bandwidth,availability
//   speed: relative compute speed (1 = the reference device), > 0
//   bandwidth: bytes per second, > 0 (uplink and downlink alike)
//   availability: probability in [0, 1] that the client can be sampled in a round
// Everything is a pure function of the seed: which clients are available in round r is drawn
// from the stream (seed, r, client, kClientSampling, sub 1). Or availability follows the
// simulated clock through windows of time (loadWindows(): FedScale's behaviour traces).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace starling::simulator {

struct DeviceProfile {
  double speed = 1.0;
  double bandwidth = 1.25e6;  // bytes/s (10 Mbit/s)
  double availability = 1.0;
};

// Log-normal speed and bandwidth (the shape FedScale's device traces show), uniform availability.
struct DeviceDistributions {
  double speed_median = 1.0, speed_sigma = 0.0;  // sigma 0: every device the same
  double bandwidth_median = 1.25e6, bandwidth_sigma = 0.0;
  double availability = 1.0;  // every client, every round
  void validate() const;
};

class DevicePopulation {
 public:
  // `n` clients drawn from `d` with the run seed: each client's profile from a stream of its own,
  // drawn again whenever it is asked for (nothing held per client: a pool of ten million costs
  // what one of ten does).
  static DevicePopulation sample(size_t n, const DeviceDistributions& d, uint64_t seed);
  // From a trace file; IoError for an unreadable file, ConfigError naming the line for a bad row,
  // a missing client, a duplicate, or a row count other than `n`.
  static DevicePopulation fromCsv(const std::string& path, size_t n);

  size_t size() const { return size_; }
  // A hash of every client's speed, bandwidth and availability and of the windows of time (their
  // bits): a checkpoint keeps it, and a run resumed with another population is refused. Computed
  // on the first call (O(clients); the first call is not safe beside another) and kept.
  uint64_t fingerprint() const;
  // `client`'s profile (client < size(); InvalidArgument otherwise).
  DeviceProfile operator[](uint64_t client) const;
  // Whether `client` can be sampled in `round` (its availability probability, drawn per round).
  bool available(uint64_t client, uint64_t round, uint64_t seed) const;
  // Whether every client can be sampled in every round (no windows of time, every availability
  // 1): a fleet then need not ask client by client.
  bool alwaysAvailable() const { return windows_.empty() && always_; }

  // Availability over simulated time instead (FedScale's behaviour traces, converted by
  // tools/fedscale_traces.py): per client a period P and the intervals [start, end] within it when
  // it is online; the client is online at time t when t mod P falls in one of them. CSV, header
  // required, one interval per row, every client present, a client's rows all with one period:
  //   client,period,start,end      (0 <= start <= end <= period, period > 0, seconds)
  // IoError for an unreadable file, ConfigError naming the line for a bad row, a missing client or
  // a period that disagrees. Replaces the availability probabilities (which must then be 1).
  void loadWindows(const std::string& path);
  bool hasWindows() const { return !windows_.empty(); }
  // Whether `client` is online at simulated time `t` (always without windows).
  bool onlineAt(uint64_t client, double t) const;
  // The first time at or after `t` when `client` is online (`t` without windows; infinity if
  // none can be represented, for a `t` so large that its period's intervals have no double).
  double nextOnline(uint64_t client, double t) const;
  // The longest the client stays online at a stretch (infinity without windows, or when always).
  double longestOnline(uint64_t client) const;
  // The first time after `t` when `client` is offline (`t` when it is offline at `t`; infinity
  // without windows, or when it is always online).
  double nextOffline(uint64_t client, double t) const;

 private:
  struct Windows {
    double period = 0.0;
    std::vector<std::pair<double, double>> active;  // sorted by start
  };
  std::vector<DeviceProfile> devices_;  // from a trace; empty when drawn
  DeviceDistributions drawn_;           // what a drawn population's profiles come from
  uint64_t seed_ = 0;
  size_t size_ = 0;
  bool always_ = true;            // every availability is 1
  std::vector<Windows> windows_;  // per client; empty: none loaded
  mutable std::optional<uint64_t> fingerprint_;
};

struct ClientTiming {
  uint64_t client_id = 0;
  double compute_seconds = 0.0;
  double transfer_seconds = 0.0;
  double total() const { return compute_seconds + transfer_seconds; }
};

ClientTiming timeClient(const DeviceProfile& d, uint64_t client_id, uint64_t examples,
                        uint32_t epochs, double reference_seconds_per_example,
                        uint64_t downlink_bytes, uint64_t uplink_bytes);

struct RoundTiming {
  std::vector<uint64_t> accepted;  // in order of finishing
  std::vector<uint64_t> dropped;   // stragglers past the deadline, and those beyond the target
  double seconds = 0.0;            // simulated duration: the last accepted client's finish
};

// The fastest `target` clients that finish within `deadline_seconds` (<= 0: no deadline) are
// accepted. Ties by client id.
RoundTiming simulateRound(std::span<const ClientTiming> clients, size_t target,
                          double deadline_seconds);

}  // namespace starling::simulator
