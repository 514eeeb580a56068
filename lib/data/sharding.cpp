#include "data/sharding.h"

#include <random>
#include <string>

#include "common/errors.h"

namespace dltrain::data {

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = i;
  std::mt19937_64 rng(mix64(seed) ^ mix64(static_cast<std::uint64_t>(epoch) + 0x5DEECE66DULL));
  for (std::int64_t i = n - 1; i > 0; --i) {
    // Uniform j in [0, i] by rejection from the largest multiple of (i + 1).
    const auto range = static_cast<std::uint64_t>(i) + 1;
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % range);
    std::uint64_t r = rng();
    while (r >= limit) r = rng();
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(r % range)]);
  }
  return p;
}

std::int64_t shard_size(std::int64_t n, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw ConfigError("rank", "expected 0 <= rank < workers, got rank " + std::to_string(rank) + " of " +
                                  std::to_string(world));
  }
  return n > rank ? (n - rank + world - 1) / world : 0;
}

std::vector<std::int64_t> epoch_shard(std::int64_t n, int rank, int world, std::uint64_t seed, std::int64_t epoch) {
  const auto size = shard_size(n, rank, world);
  const auto perm = epoch_permutation(n, seed, epoch);
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(size));
  for (std::int64_t i = rank; i < n; i += world) out.push_back(perm[static_cast<std::size_t>(i)]);
  return out;
}

}  // namespace dltrain::data
