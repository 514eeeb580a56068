// Fuzzes the PS shard checkpoint and worker replica files (ps/checkpoint.h):
// decode_checkpoint, what a restarted PS shard runs on its shard.ckpt before it listens,
// then ShardState::restore; and replica_into, what a worker of a re-assigned job runs on
// a replica.ckpt.
//
// Input: one byte of mode, then the file. With mode bit 0 the file's last 4 bytes are
// replaced by the right CRC-32 (so that the fuzzer gets past the checksum to the fields
// behind it); the job and shard the reader expects are the file's own, or, with mode bit
// 1, others. Checks, beyond "no crash" and "only ProtocolError escapes":
//   - a file that decodes is exactly what encode_checkpoint writes for its snapshot (one
//     encoding per state), and every length in it is within its bounds;
//   - a snapshot that a shard restores comes back unchanged from snapshot();
//   - replica_into accepts a replica exactly when its keys are 0..n-1 with the layout's
//     lengths, and then copies every value to its offset.
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/errors.h"
#include "fuzz_check.h"
#include "ps/checkpoint.h"
#include "ps/partition.h"
#include "ps/shard_state.h"

using namespace dltrain;
using dltrain::fuzz::same_float;

namespace {

template <typename T>
T load(const std::vector<std::byte>& b, std::size_t off) {
  T v{};
  if (off + sizeof v <= b.size()) std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

bool same_values(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!same_float(a[i], b[i])) return false;
  }
  return true;
}

void check_restore(const ps::ShardSnapshot& snap) {
  bool any_momentum = false;
  for (const auto& p : snap.partitions) any_momentum = any_momentum || !p.v.empty();
  ps::ShardState st(any_momentum ? 0.9 : 0.0);
  try {
    st.restore(snap);
  } catch (const ProtocolError&) {
    // Mixed partitions: some with a momentum buffer, some without.
    bool mixed = false;
    for (const auto& p : snap.partitions) mixed = mixed || (p.v.empty() == any_momentum);
    FUZZ_CHECK(mixed, "restore refused a snapshot whose momentum buffers all match the shard");
    return;
  }
  const auto back = st.snapshot();
  FUZZ_CHECK(back.pushes == snap.pushes && back.done == snap.done && back.partitions.size() == snap.partitions.size(),
             "snapshot() after restore() differs");
  for (std::size_t i = 0; i < snap.partitions.size(); ++i) {
    FUZZ_CHECK(back.partitions[i].key == snap.partitions[i].key &&
                   same_values(back.partitions[i].x, snap.partitions[i].x) &&
                   same_values(back.partitions[i].v, snap.partitions[i].v),
               "a partition changed through restore() and snapshot()");
  }
}

void check_replica(const ps::ShardSnapshot& snap) {
  // The layout the replica describes when its keys are 0..n-1.
  ps::PartitionLayout layout;
  bool dense_keys = true;
  for (std::size_t i = 0; i < snap.partitions.size(); ++i) {
    const auto& p = snap.partitions[i];
    dense_keys = dense_keys && p.key == i;
    layout.partitions.push_back({static_cast<std::uint32_t>(i), layout.total_floats,
                                 static_cast<std::int64_t>(p.x.size()), 0});
    layout.total_floats += static_cast<std::int64_t>(p.x.size());
  }
  std::vector<float> params(static_cast<std::size_t>(layout.total_floats), -1.0f);
  try {
    const auto steps = ps::replica_into(snap, params, layout);
    FUZZ_CHECK(dense_keys, "replica_into accepted keys that are not 0..n-1");
    FUZZ_CHECK(steps == snap.pushes, "replica_into returned another step count");
    std::size_t off = 0;
    for (const auto& p : snap.partitions) {
      for (float v : p.x) FUZZ_CHECK(same_float(params[off++], v), "replica_into put a value elsewhere");
    }
  } catch (const ProtocolError&) {
    FUZZ_CHECK(!dense_keys, "replica_into refused a replica that matches its layout");
  }
  // A layout of another model: refused unless the lengths happen to match.
  ps::PartitionLayout other = ps::make_layout({3, 5}, 4, 1);
  std::vector<float> small(static_cast<std::size_t>(other.total_floats));
  try {
    ps::replica_into(snap, small, other);
    FUZZ_CHECK(snap.partitions.size() == other.partitions.size(), "replica_into accepted the wrong partition count");
  } catch (const ProtocolError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  std::vector<std::byte> file(size - 1);
  if (!file.empty()) std::memcpy(file.data(), data + 1, file.size());
  if ((mode & 1) != 0 && file.size() >= 4) {
    const auto crc = static_cast<std::uint32_t>(
        crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(file.data()), static_cast<uInt>(file.size() - 4)));
    std::memcpy(file.data() + file.size() - 4, &crc, 4);
  }
  std::uint64_t job = load<std::uint64_t>(file, 8);
  std::uint32_t shard = load<std::uint32_t>(file, 16);
  if ((mode & 2) != 0) {
    job ^= 1;
    shard ^= mode;
  }
  ps::ShardSnapshot snap;
  try {
    snap = ps::decode_checkpoint(file, job, shard);
  } catch (const ProtocolError&) {
    return 0;
  }
  FUZZ_CHECK(ps::encode_checkpoint(snap, job, shard) == file, "encode_checkpoint(decode_checkpoint(f)) != f");
  for (std::size_t i = 0; i < snap.partitions.size(); ++i) {
    const auto& p = snap.partitions[i];
    FUZZ_CHECK(!p.x.empty() && p.x.size() <= ps::kCheckpointMaxPartitionLength, "a partition length out of bounds");
    FUZZ_CHECK(p.v.empty() || p.v.size() == p.x.size(), "a momentum buffer of another length");
    FUZZ_CHECK(i == 0 || p.key > snap.partitions[i - 1].key, "partition keys not ascending");
  }
  for (std::size_t i = 1; i < snap.done.size(); ++i) FUZZ_CHECK(snap.done[i] > snap.done[i - 1], "ranks not ascending");
  check_restore(snap);
  check_replica(snap);
  return 0;
}
