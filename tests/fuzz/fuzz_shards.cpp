// Fuzzes what a worker and the leader read of a sharded data set (data/shards.h): a shard's
// tar bytes (read_tar, read_shard_samples) and a manifest's text (parse_manifest), both of
// which come from a store the user controls.
//
// Input: the first byte picks the parser (even: a shard, odd: a manifest), the rest is the
// file. Checks, beyond "no crash" and "only ProtocolError / ConfigError escape":
//   - a shard's samples have distinct keys, labels in [0, 10), and no more samples than
//     the archive has members;
//   - an accepted manifest is consistent (each split's sample and byte totals are the
//     sums of its shards', names distinct), and manifest_json of it parses back to the
//     same figures.
#include <cstdint>
#include <set>
#include <span>
#include <string>

#include "common/errors.h"
#include "data/shards.h"
#include "fuzz_check.h"

using namespace dltrain;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::uint8_t> file(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    try {
      const auto members = data::read_tar(file, "fuzz.tar");
      const auto samples = data::read_shard_samples(file, 10, "fuzz.tar");
      FUZZ_CHECK(samples.size() <= members.size(), "more samples than members");
      std::set<std::string> keys;
      for (const auto& s : samples) {
        FUZZ_CHECK(keys.insert(s.key).second, "a key twice");
        FUZZ_CHECK(s.label >= 0 && s.label < 10, "a label outside [0, 10)");
      }
    } catch (const ProtocolError&) {
    }
    return 0;
  }
  try {
    const auto m = data::parse_manifest(std::string(file.begin(), file.end()), "fuzz");
    for (const auto* split : {&m.train, &m.test}) {
      std::int64_t samples = 0, bytes = 0;
      std::set<std::string> names;
      for (const auto& s : split->shards) {
        samples += s.samples;
        bytes += s.bytes;
        FUZZ_CHECK(names.insert(s.name).second, "a shard name twice");
      }
      FUZZ_CHECK(samples == split->samples && bytes == split->bytes, "totals that are not the sums");
    }
    const auto back = data::parse_manifest(data::manifest_json(m).dump(), "again");
    FUZZ_CHECK(back.train.samples == m.train.samples && back.test.bytes == m.test.bytes && back.classes == m.classes,
               "manifest_json does not parse back");
  } catch (const ConfigError&) {
  }
  return 0;
}
