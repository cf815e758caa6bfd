#pragma once
// Partitioners split a labelled data set among simulated clients: which example indices each
// client owns. Picked at run time by spec from a registry:
//
//   iid                          shuffle, then deal equal shards (sizes differ by at most 1)
//   dirichlet:alpha=0.5          per class, Dirichlet(alpha) proportions over the clients
//   shards:per_client=2          McMahan et al.'s pathological split: label-sorted shards
//   quantity:alpha=0.5           client sizes in Dirichlet(alpha) proportions, labels iid
//   sampled:size=600             each client draws `size` examples with replacement: a pool of
//                                clients larger than the data set; with alpha=0.5 its classes in
//                                Dirichlet(alpha) proportions of its own, with classes=2 from that
//                                many classes of its own (label skew in a pool of any size)
//
// docs/data-and-training.md gives the exact definitions. Every result is a pure function of
// (labels, num_classes, clients, seed, options): randomness comes only from the RngStream
// {seed, round 0, kAnyClient, kDataPartition} and is drawn by Starling's own code (no
// std::shuffle or std::*_distribution, whose algorithms differ between standard libraries).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/registry.h"

namespace starling::data {

// shards[k] = the indices of the examples client k owns, ascending.
using Partition = std::vector<std::vector<size_t>>;

// A rule that splits a data set among clients. Immutable once built (options only), so one
// object may be used from many threads.
class Partitioner {
 public:
  virtual ~Partitioner() = default;
  virtual std::string name() const = 0;
  // The full spec with every option, e.g. "dirichlet:alpha=0.5,min_size=0,balance=false".
  virtual std::string spec() const = 0;

  // True for a rule that draws with replacement (sampled): its shards may repeat an index and
  // overlap, need not cover the data set, and there may be more clients than examples.
  virtual bool withReplacement() const { return false; }

  // True for a rule that draws each client's shard on its own (sampled): client k's shard is a
  // function of the data set's labels, the seed and k alone, so it can be drawn whenever it is
  // asked for and a pool of any size holds nothing per client (ClientShards).
  virtual bool drawsEachClient() const { return false; }
  // What draws such a rule's shards from one data set (what it needs of the labels prepared once,
  // e.g. the examples of each class): draw(k) is client k's shard, ascending, into `out`
  // (replaced), of size() examples. Immutable: one may draw from many threads.
  class Drawer {
   public:
    virtual ~Drawer() = default;
    virtual uint64_t size() const = 0;
    virtual void draw(uint64_t client, std::vector<size_t>& out) const = 0;
  };
  // The drawer of this rule over `labels` (split()'s checks of them, as check() does), which it
  // does not keep. InvalidArgument for a rule that does not draw each client; ConfigError for
  // options the data set cannot meet (more classes a client than it has with examples).
  virtual std::shared_ptr<const Drawer> drawer(std::span<const uint8_t> labels,
                                               uint32_t num_classes, uint64_t seed) const;

  // Splits examples 0 .. labels.size() - 1 among `clients` clients.
  // Guarantees: exactly `clients` shards, each sorted ascending, every index below labels.size().
  // Unless withReplacement(): the shards are disjoint and together hold every index once.
  // (Whether a shard may be empty depends on the rule: never for iid, shards and sampled; for
  // dirichlet unless min_size >= 1.)
  // Throws ConfigError for 0 clients, more clients than examples (unless withReplacement()), or a
  // split the options make impossible; InvalidArgument for num_classes 0 or > 256 or a label >=
  // num_classes.
  Partition split(std::span<const uint8_t> labels, uint32_t num_classes, size_t clients,
                  uint64_t seed) const;
  // split()'s checks of its arguments alone (the same errors), without splitting.
  void check(std::span<const uint8_t> labels, uint32_t num_classes, size_t clients) const;

 protected:
  // The rule itself, called by split() with checked arguments. It may return shards in any
  // order within each shard; split() sorts them.
  virtual Partition assign(std::span<const uint8_t> labels, uint32_t num_classes, size_t clients,
                           uint64_t seed) const = 0;
};

// The shards of a population of clients: held (split() once, for the rules that split the data
// set among its clients), or drawn again each time a client's is asked for (a rule that
// drawsEachClient(): nothing is held per client, so a pool of ten million clients costs what a
// pool of one does). Immutable once made: one object may be read from many threads.
class ClientShards {
 public:
  ClientShards() = default;
  // Held: `shards` as split() gives them (each ascending).
  explicit ClientShards(Partition shards) : held_(std::move(shards)), clients_(held_.size()) {}
  // `clients` clients of `rule` over the data set's `labels`: drawn when the rule draws each
  // client on its own, else split() once and held. split()'s checks and errors either way.
  static ClientShards make(std::shared_ptr<const Partitioner> rule, std::span<const uint8_t> labels,
                           uint32_t num_classes, size_t clients, uint64_t seed);

  size_t size() const { return clients_; }
  bool drawn() const { return drawer_ != nullptr; }
  // How many examples `client` holds (with repeats); client < size().
  uint64_t examples(uint64_t client) const;
  // Its example indices, ascending: the held shard, or drawn into `scratch` (the span is valid
  // until `scratch` changes).
  std::span<const size_t> shard(uint64_t client, std::vector<size_t>& scratch) const;

 private:
  Partition held_;
  std::shared_ptr<const Partitioner::Drawer> drawer_;  // drawn: what draws a client's shard
  size_t clients_ = 0;
};

// The registered partitioners (iid, dirichlet, quantity, shards, sampled).
const Registry<Partitioner>& partitioners();

// makePartitioner("dirichlet:alpha=0.1"). Throws ConfigError for an unknown name, an unknown
// option or a bad value.
std::unique_ptr<Partitioner> makePartitioner(std::string_view spec);

}  // namespace starling::data
