// Which training examples each worker reads in an epoch. Plain C++, no LibTorch.
#pragma once

#include <cstdint>
#include <vector>

namespace dltrain::data {

/// SplitMix64's output function (Steele, Lea & Flood 2014, "Fast splittable pseudorandom
/// number generators"): a bijective 64-bit mix, used to derive independent seeds from
/// (job seed, epoch, example). Pure.
std::uint64_t mix64(std::uint64_t x);

/// A uniformly random permutation of [0, n) drawn from (seed, epoch) by the Fisher–Yates
/// shuffle (Knuth, TAOCP vol. 2, §3.4.2, Algorithm P) over a std::mt19937_64 seeded with
/// mix64(seed) ^ mix64(epoch), indices drawn by rejection (no modulo bias). The same on
/// every worker and every platform for the same arguments. Pure; O(n).
std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch);

/// Worker `rank`'s examples for `epoch`: positions i ≡ rank (mod world) of
/// epoch_permutation(n, seed, epoch), in that order. Over the ranks of one epoch the
/// shards are disjoint, their union is [0, n), and their sizes differ by at most one
/// (⌈(n − rank)/world⌉). Every worker computes its own shard from the same seed, so no
/// coordination is needed. Throws ConfigError("rank", …) unless 0 <= rank < world.
std::vector<std::int64_t> epoch_shard(std::int64_t n, int rank, int world, std::uint64_t seed, std::int64_t epoch);

/// Size of epoch_shard(n, rank, world, …) without building it.
std::int64_t shard_size(std::int64_t n, int rank, int world);

}  // namespace dltrain::data
