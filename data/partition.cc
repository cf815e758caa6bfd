#include "data/partition.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "data/sampling.h"

namespace starling::data {
namespace {

// The n-th of `parts` near-equal consecutive pieces of [0, total): the first total % parts
// pieces are one longer. No product of large numbers, so no overflow.
std::pair<size_t, size_t> piece(size_t total, size_t parts, size_t n) {
  const size_t base = total / parts, extra = total % parts;
  const size_t begin = n * base + std::min(n, extra);
  return {begin, begin + base + (n < extra ? 1 : 0)};
}

// Example indices of each class, ascending.
std::vector<std::vector<size_t>> byClass(std::span<const uint8_t> labels, uint32_t num_classes) {
  std::vector<std::vector<size_t>> out(num_classes);
  for (size_t i = 0; i < labels.size(); ++i) out[labels[i]].push_back(i);
  return out;
}

StreamKey partitionStreamKey(uint64_t seed) {
  return StreamKey{seed, 0, kAnyClient, StreamPurpose::kDataPartition, 0};
}

std::string formatNumber(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

class IidPartitioner final : public Partitioner {
 public:
  std::string name() const override { return "iid"; }
  std::string spec() const override { return "iid"; }

 protected:
  Partition assign(std::span<const uint8_t> labels, uint32_t, size_t clients,
                   uint64_t seed) const override {
    RngStream rng(partitionStreamKey(seed));
    std::vector<size_t> order(labels.size());
    std::iota(order.begin(), order.end(), size_t{0});
    shuffleInPlace(std::span<size_t>(order), rng);
    Partition shards(clients);
    for (size_t k = 0; k < clients; ++k) {
      const auto [b, e] = piece(order.size(), clients, k);
      shards[k].assign(order.begin() + static_cast<std::ptrdiff_t>(b),
                       order.begin() + static_cast<std::ptrdiff_t>(e));
    }
    return shards;
  }
};

struct DirichletOptions {
  double alpha = 0.5;
  uint32_t min_size = 0;
  bool balance = false;
};

class DirichletPartitioner final : public Partitioner {
 public:
  // Resampling for min_size stops after this many draws of the whole split.
  static constexpr int kMaxAttempts = 1000;

  explicit DirichletPartitioner(const DirichletOptions& o) : o_(o) {
    if (!(o_.alpha > 0) || !std::isfinite(o_.alpha))
      STARLING_THROW(
          ConfigError, "partitioner 'dirichlet': alpha=", o_.alpha,
          " must be a finite number > 0 (small = strong label skew, large = close to iid)");
  }
  std::string name() const override { return "dirichlet"; }
  std::string spec() const override {
    return "dirichlet:alpha=" + formatNumber(o_.alpha) +
           ",min_size=" + std::to_string(o_.min_size) +
           ",balance=" + (o_.balance ? "true" : "false");
  }

 protected:
  Partition assign(std::span<const uint8_t> labels, uint32_t num_classes, size_t clients,
                   uint64_t seed) const override {
    const size_t n = labels.size();
    if (o_.min_size > n / clients)
      STARLING_THROW(ConfigError, spec(), ": ", clients,
                     " clients with at least min_size=", o_.min_size,
                     " examples each need more than the ", n, " examples there are");
    const auto classes = byClass(labels, num_classes);
    RngStream rng(partitionStreamKey(seed));
    std::vector<double> p(clients);
    std::vector<size_t> idx;
    for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
      Partition shards(clients);
      for (const auto& members : classes) {
        if (members.empty()) continue;
        idx = members;
        shuffleInPlace(std::span<size_t>(idx), rng);
        sampleDirichlet(rng, o_.alpha, std::span<double>(p));
        // NIID-Bench's balance rule: a client already holding n / clients examples takes no more.
        if (o_.balance) capFullClients(shards, n, p);
        // Cut the shuffled class at the cumulative proportions; the last client takes the rest.
        double cum = 0;
        size_t start = 0;
        const double m = static_cast<double>(idx.size());
        for (size_t k = 0; k < clients; ++k) {
          cum += p[k];
          size_t end =
              k + 1 == clients ? idx.size() : std::min(idx.size(), static_cast<size_t>(cum * m));
          end = std::max(end, start);
          shards[k].insert(shards[k].end(), idx.begin() + static_cast<std::ptrdiff_t>(start),
                           idx.begin() + static_cast<std::ptrdiff_t>(end));
          start = end;
        }
      }
      const bool ok = std::all_of(shards.begin(), shards.end(), [&](const std::vector<size_t>& s) {
        return s.size() >= o_.min_size;
      });
      if (ok) return shards;
    }
    STARLING_THROW(ConfigError, spec(), ": no draw in ", kMaxAttempts, " gave every one of the ",
                   clients, " clients at least min_size=", o_.min_size,
                   " examples; raise alpha, lower min_size or use fewer clients");
  }

 private:
  static void capFullClients(const Partition& shards, size_t n, std::vector<double>& p) {
    double total = 0;
    for (size_t k = 0; k < p.size(); ++k) {
      // size >= n / clients (real division) is size >= ceil(n / clients) in integers.
      if (shards[k].size() >= (n + p.size() - 1) / p.size()) p[k] = 0;
      total += p[k];
    }
    // Not every client can be full while examples remain; keep the draw if rounding says so.
    if (total > 0)
      for (double& x : p) x /= total;
  }

  DirichletOptions o_;
};

class ShardsPartitioner final : public Partitioner {
 public:
  explicit ShardsPartitioner(uint32_t per_client) : per_client_(per_client) {
    if (per_client_ == 0)
      STARLING_THROW(ConfigError, "partitioner 'shards': per_client=0 must be at least 1");
  }
  std::string name() const override { return "shards"; }
  std::string spec() const override { return "shards:per_client=" + std::to_string(per_client_); }

 protected:
  Partition assign(std::span<const uint8_t> labels, uint32_t num_classes, size_t clients,
                   uint64_t seed) const override {
    const size_t n = labels.size();
    if (per_client_ > n / clients)
      STARLING_THROW(ConfigError, spec(), ": ", clients, " clients x ", per_client_,
                     " shards need at least one example per shard, but there are only ", n,
                     " examples");
    const size_t num_shards = clients * per_client_;
    RngStream rng(partitionStreamKey(seed));
    // Sorted by label; within a class in random order, so the split does not depend on the
    // order of the file.
    std::vector<size_t> order;
    order.reserve(n);
    for (auto& members : byClass(labels, num_classes)) {
      shuffleInPlace(std::span<size_t>(members), rng);
      order.insert(order.end(), members.begin(), members.end());
    }
    std::vector<size_t> shard_ids(num_shards);
    std::iota(shard_ids.begin(), shard_ids.end(), size_t{0});
    shuffleInPlace(std::span<size_t>(shard_ids), rng);
    Partition shards(clients);
    for (size_t k = 0; k < clients; ++k)
      for (size_t j = 0; j < per_client_; ++j) {
        const auto [b, e] = piece(n, num_shards, shard_ids[k * per_client_ + j]);
        shards[k].insert(shards[k].end(), order.begin() + static_cast<std::ptrdiff_t>(b),
                         order.begin() + static_cast<std::ptrdiff_t>(e));
      }
    return shards;
  }

 private:
  uint32_t per_client_;
};

// Quantity skew (NIID-Bench's "quantity-based label-iid"): client sizes in Dirichlet(alpha)
// proportions, each client at least min_size examples, the examples themselves shuffled (labels
// iid).
class QuantityPartitioner final : public Partitioner {
 public:
  QuantityPartitioner(double alpha, uint32_t min_size) : alpha_(alpha), min_size_(min_size) {
    if (!(alpha > 0) || !std::isfinite(alpha))
      STARLING_THROW(ConfigError, "quantity: alpha must be positive, got ", alpha);
  }
  std::string name() const override { return "quantity"; }
  std::string spec() const override {
    return "quantity:alpha=" + formatNumber(alpha_) + ",min_size=" + std::to_string(min_size_);
  }

 protected:
  Partition assign(std::span<const uint8_t> labels, uint32_t, size_t clients,
                   uint64_t seed) const override {
    const size_t n = labels.size();
    if (uint64_t{min_size_} * clients > n)
      STARLING_THROW(ConfigError, spec(), ": ", clients, " clients of at least ", min_size_,
                     " examples need ", uint64_t{min_size_} * clients, ", the data set has ", n);
    RngStream rng(partitionStreamKey(seed));
    std::vector<double> p(clients);
    sampleDirichlet(rng, alpha_, p);
    // Sizes: min_size each, the rest in the drawn proportions (largest remainders get the last
    // few examples, so the sizes add up exactly).
    const size_t rest = n - size_t{min_size_} * clients;
    std::vector<size_t> size(clients, min_size_);
    std::vector<std::pair<double, size_t>> frac(clients);
    size_t given = 0;
    for (size_t k = 0; k < clients; ++k) {
      const double want = p[k] * static_cast<double>(rest);
      const auto whole = static_cast<size_t>(std::floor(want));
      size[k] += whole;
      given += whole;
      frac[k] = {want - static_cast<double>(whole), k};
    }
    std::sort(frac.begin(), frac.end(), [](auto& a, auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (size_t i = 0; given < rest; ++i, ++given) ++size[frac[i % clients].second];
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    shuffleInPlace(std::span<size_t>(order), rng);
    Partition shards(clients);
    size_t at = 0;
    for (size_t k = 0; k < clients; ++k) {
      shards[k].assign(order.begin() + static_cast<std::ptrdiff_t>(at),
                       order.begin() + static_cast<std::ptrdiff_t>(at + size[k]));
      at += size[k];
    }
    return shards;
  }

 private:
  double alpha_;
  uint32_t min_size_;
};

// A pool larger than the data set: client k draws `size` examples with replacement from its own
// stream {seed, round 0, client k, kDataPartition}, so its data depend only on the seed and k (not
// on the pool size), and any client's shard can be drawn alone. Uniformly over the data set; with
// alpha, first its class proportions p ~ Dirichlet(alpha) over the classes that have examples,
// then each example's class from p; with classes=m, first m distinct classes of those, then each
// example's class uniformly among them; an example of a class uniformly among the class's.
struct SampledOptions {
  uint32_t size = 0;
  double alpha = 0.0;    // 0: no label skew
  uint32_t classes = 0;  // 0: every class
};

class SampledDrawer final : public Partitioner::Drawer {
 public:
  SampledDrawer(const SampledOptions& o, const std::string& spec, std::span<const uint8_t> labels,
                uint32_t num_classes, uint64_t seed)
      : o_(o), examples_(labels.size()), seed_(seed) {
    if (o_.alpha == 0.0 && o_.classes == 0) return;  // uniform: the labels are not needed
    for (auto& c : byClass(labels, num_classes))
      if (!c.empty()) classes_.push_back(std::move(c));
    if (o_.classes > classes_.size())
      STARLING_THROW(ConfigError, spec, ": classes=", o_.classes, " but the data set has ",
                     classes_.size(), " classes with examples");
  }
  uint64_t size() const override { return o_.size; }
  void draw(uint64_t client, std::vector<size_t>& out) const override {
    RngStream rng(StreamKey{seed_, 0, client, StreamPurpose::kDataPartition, 0});
    out.resize(o_.size);
    if (classes_.empty()) {
      for (size_t& i : out) i = static_cast<size_t>(rng.below(examples_));
    } else if (o_.classes > 0) {
      // m distinct classes: the first m of a partial Fisher-Yates shuffle of their positions.
      std::vector<uint32_t> pick(classes_.size());
      std::iota(pick.begin(), pick.end(), 0u);
      for (uint32_t j = 0; j < o_.classes; ++j)
        std::swap(pick[j], pick[j + rng.below(pick.size() - j)]);
      for (size_t& i : out) {
        const auto& c = classes_[pick[rng.below(o_.classes)]];
        i = c[rng.below(c.size())];
      }
    } else {
      std::vector<double> p(classes_.size());
      sampleDirichlet(rng, o_.alpha, p);
      for (size_t k = 1; k < p.size(); ++k) p[k] += p[k - 1];  // cumulative
      for (size_t& i : out) {
        const double u = rng.uniform() * p.back();
        const size_t k = std::min<size_t>(
            static_cast<size_t>(std::upper_bound(p.begin(), p.end(), u) - p.begin()), p.size() - 1);
        i = classes_[k][rng.below(classes_[k].size())];
      }
    }
    std::sort(out.begin(), out.end());
  }

 private:
  SampledOptions o_;
  size_t examples_;
  uint64_t seed_;
  std::vector<std::vector<size_t>> classes_;  // with skew: the examples of each class that has any
};

class SampledPartitioner final : public Partitioner {
 public:
  explicit SampledPartitioner(const SampledOptions& o) : o_(o) {
    if (o_.size == 0)
      STARLING_THROW(
          ConfigError,
          "partitioner 'sampled': size=N is required (examples each client draws, >= 1)");
    if (!(o_.alpha >= 0) || !std::isfinite(o_.alpha) || (o_.alpha > 0 && o_.alpha < 1e-100))
      STARLING_THROW(ConfigError, "partitioner 'sampled': alpha=", o_.alpha,
                     " must be 0 (no label skew) or a finite number from 1e-100 (small: strong "
                     "skew; below, the Dirichlet draws underflow)");
    if (o_.alpha > 0 && o_.classes > 0)
      STARLING_THROW(ConfigError,
                     "partitioner 'sampled': alpha and classes are two kinds of label skew; give "
                     "one");
  }
  std::string name() const override { return "sampled"; }
  std::string spec() const override {
    std::string s = "sampled:size=" + std::to_string(o_.size);
    if (o_.alpha > 0) s += ",alpha=" + formatNumber(o_.alpha);
    if (o_.classes > 0) s += ",classes=" + std::to_string(o_.classes);
    return s;
  }
  bool withReplacement() const override { return true; }
  bool drawsEachClient() const override { return true; }
  std::shared_ptr<const Drawer> drawer(std::span<const uint8_t> labels, uint32_t num_classes,
                                       uint64_t seed) const override {
    // Examples to draw, labels below num_classes (byClass indexes by them). ClientShards::make and
    // split() checked already: a second O(labels) pass, once per data set.
    check(labels, num_classes, 1);
    return std::make_shared<const SampledDrawer>(o_, spec(), labels, num_classes, seed);
  }

 protected:
  Partition assign(std::span<const uint8_t> labels, uint32_t num_classes, size_t clients,
                   uint64_t seed) const override {
    const auto d = drawer(labels, num_classes, seed);
    Partition shards(clients);
    for (size_t k = 0; k < clients; ++k) d->draw(k, shards[k]);
    return shards;
  }

 private:
  SampledOptions o_;
};

}  // namespace

std::shared_ptr<const Partitioner::Drawer> Partitioner::drawer(std::span<const uint8_t>, uint32_t,
                                                               uint64_t) const {
  STARLING_THROW(InvalidArgument, spec(), " does not draw each client's shard on its own");
}

void Partitioner::check(std::span<const uint8_t> labels, uint32_t num_classes,
                        size_t clients) const {
  if (clients == 0)
    STARLING_THROW(ConfigError, spec(), ": cannot split a data set among 0 clients");
  if (labels.empty()) STARLING_THROW(ConfigError, spec(), ": the data set has no examples");
  if (clients > labels.size() && !withReplacement())
    STARLING_THROW(ConfigError, spec(), ": ", clients, " clients but only ", labels.size(),
                   " examples; use at most one client per example, or a pool drawn with "
                   "replacement (sampled:size=N)");
  STARLING_CHECK_ARG(num_classes >= 1 && num_classes <= 256, spec(), ": num_classes ", num_classes,
                     " is not in [1, 256]");
  for (size_t i = 0; i < labels.size(); ++i)
    STARLING_CHECK_ARG(labels[i] < num_classes, spec(), ": label ", int{labels[i]}, " of example ",
                       i, " is not below num_classes ", num_classes);
}

Partition Partitioner::split(std::span<const uint8_t> labels, uint32_t num_classes, size_t clients,
                             uint64_t seed) const {
  check(labels, num_classes, clients);
  Partition shards = assign(labels, num_classes, clients, seed);
  STARLING_ENFORCE(shards.size() == clients, spec(), " returned ", shards.size(), " shards for ",
                   clients, " clients");
  size_t total = 0;
  for (auto& s : shards) {
    std::sort(s.begin(), s.end());
    total += s.size();
    STARLING_ENFORCE(s.empty() || s.back() < labels.size(), spec(), " assigned example ", s.back(),
                     " of ", labels.size());
  }
  STARLING_ENFORCE(withReplacement() || total == labels.size(), spec(), " assigned ", total, " of ",
                   labels.size(), " examples");
  return shards;
}

ClientShards ClientShards::make(std::shared_ptr<const Partitioner> rule,
                                std::span<const uint8_t> labels, uint32_t num_classes,
                                size_t clients, uint64_t seed) {
  STARLING_CHECK_ARG(rule != nullptr, "ClientShards::make: no partitioner");
  if (!rule->drawsEachClient())
    return ClientShards(rule->split(labels, num_classes, clients, seed));
  rule->check(labels, num_classes, clients);
  ClientShards s;
  s.drawer_ = rule->drawer(labels, num_classes, seed);
  s.clients_ = clients;
  return s;
}

uint64_t ClientShards::examples(uint64_t client) const {
  STARLING_CHECK_ARG(client < clients_, "client ", client, " of only ", clients_);
  return drawer_ ? drawer_->size() : held_[client].size();
}

std::span<const size_t> ClientShards::shard(uint64_t client, std::vector<size_t>& scratch) const {
  STARLING_CHECK_ARG(client < clients_, "client ", client, " of only ", clients_);
  if (!drawer_) return held_[client];
  drawer_->draw(client, scratch);
  return scratch;
}

const Registry<Partitioner>& partitioners() {
  using Entry = Registry<Partitioner>::Entry;
  static const Registry<Partitioner> registry(
      "partitioner",
      {
          Entry{"iid", "shuffle, then deal equal shards (sizes differ by at most 1)", "",
                [](OptionReader&) -> std::unique_ptr<Partitioner> {
                  return std::make_unique<IidPartitioner>();
                }},
          Entry{"dirichlet",
                "label skew: each class is split among the clients in Dirichlet(alpha) proportions",
                "alpha=0.5 (concentration, > 0; small = strong skew), min_size=0 (redraw until "
                "every client "
                "has this many examples), balance=false (NIID-Bench: a client with n/clients "
                "examples takes "
                "no more)",
                [](OptionReader& r) -> std::unique_ptr<Partitioner> {
                  DirichletOptions o;
                  o.alpha = r.number("alpha", o.alpha);
                  o.min_size = r.count("min_size", o.min_size);
                  o.balance = r.flag("balance", o.balance);
                  return std::make_unique<DirichletPartitioner>(o);
                }},
          Entry{"quantity",
                "quantity skew: client sizes in Dirichlet(alpha) proportions, labels iid",
                "alpha=0.5 (concentration, > 0; small = strong skew), min_size=1 (examples every "
                "client gets)",
                [](OptionReader& r) -> std::unique_ptr<Partitioner> {
                  const double alpha = r.number("alpha", 0.5);
                  return std::make_unique<QuantityPartitioner>(alpha, r.count("min_size", 1));
                }},
          Entry{"shards",
                "pathological non-iid (McMahan et al. 2017): sort by label, cut clients*per_client "
                "equal "
                "shards, deal per_client random shards to each client",
                "per_client=2 (shards per client, >= 1)",
                [](OptionReader& r) -> std::unique_ptr<Partitioner> {
                  return std::make_unique<ShardsPartitioner>(r.count("per_client", 2));
                }},
          Entry{"sampled",
                "a pool larger than the data set: each client draws size examples with "
                "replacement from its own seeded stream (labels iid, or skewed by alpha or "
                "classes), drawn whenever asked: a pool of millions holds nothing per client",
                "size=N (required: examples per client, >= 1), alpha=0 (> 0: each client's "
                "classes in Dirichlet(alpha) proportions of its own), classes=0 (> 0: each "
                "client draws from that many classes of its own)",
                [](OptionReader& r) -> std::unique_ptr<Partitioner> {
                  SampledOptions o;
                  o.size = r.count("size", 0);
                  o.alpha = r.number("alpha", 0.0);
                  o.classes = r.count("classes", 0);
                  return std::make_unique<SampledPartitioner>(o);
                }},
      });
  return registry;
}

std::unique_ptr<Partitioner> makePartitioner(std::string_view spec) {
  return partitioners().make(spec);
}

}  // namespace starling::data
